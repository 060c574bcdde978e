package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newServeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Collect from every cluster of a kubeconfig and serve the GraphQL API",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("serve: %w", errNotImplemented)
		},
	}
}
