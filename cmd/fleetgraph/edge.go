package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newEdgeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "edge",
		Short: "Run next to one cluster and push its state to a fleetgraph manager",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("edge: %w", errNotImplemented)
		},
	}
}
