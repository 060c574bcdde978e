// Command fleetgraph serves one GraphQL view of many Kubernetes clusters.
//
//	fleetgraph serve   collect from clusters and serve the API
//	fleetgraph edge    run next to one cluster and push its state to a manager
//	fleetgraph demo    start local clusters, seed them, and serve them
//	fleetgraph rbac    print the least-privilege RBAC serve or edge needs
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts a graceful shutdown (bounded by serve's
	// --shutdown-timeout); a second one ends the process at once.
	context.AfterFunc(ctx, stop)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetgraph:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	var logLevel, logFormat string
	root := &cobra.Command{
		Use:           "fleetgraph",
		Short:         "One GraphQL view of many Kubernetes clusters, filtered by each cluster's RBAC",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			opts := &slog.HandlerOptions{Level: level}
			var handler slog.Handler
			switch logFormat {
			case "text":
				handler = slog.NewTextHandler(cmd.ErrOrStderr(), opts)
			case "json":
				handler = slog.NewJSONHandler(cmd.ErrOrStderr(), opts)
			default:
				return fmt.Errorf("--log-format: %q is neither text nor json", logFormat)
			}
			logger := slog.New(handler)
			slog.SetDefault(logger)
			klog.SetSlogLogger(logger) // client-go logs through slog too
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "log format: text, or json (one object per line, for log collectors)")
	root.AddCommand(newServeCommand(), newEdgeCommand(), newDemoCommand(), newRBACCommand())
	root.AddCommand(newReferenceCommand(root))
	return root
}
