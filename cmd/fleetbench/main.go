// Command fleetbench runs fleetgraph's benchmarks and prints one
// machine-readable summary line per benchmark ("name: key=value ..."), so
// results can be compared run to run.
//
//	fleetbench index [flags]       the index benchmark at 1M objects
//	fleetbench scale [flags]       the index at 10M objects (1,000 clusters)
//	fleetbench collector [flags]   first full sync of a real cluster of 50,000+ objects
//	fleetbench compare [flags]     fleetgraph beside PostgreSQL, SQLite and Redis on the same fleet
//	fleetbench fleet [flags]       the real collector against 10, 50 and 200 simulated leaf clusters
//	fleetbench edge [flags]        a real edge pushing 50,000 objects to a real manager
//	fleetbench replication [flags] an owner and query replicas of the 1M-object fleet over JetStream
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGTERM too: the servers compare starts must be stopped either way.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	commands := map[string]func(context.Context, []string) error{
		"index":       runIndex,
		"collector":   runCollector,
		"compare":     runCompare,
		"scale":       runScale,
		"fleet":       runFleet,
		"edge":        runEdge,
		"replication": runReplication,
		// fleet-server is the load generator fleet starts; not for direct use.
		"fleet-server": runFleetServer,
	}
	if len(args) == 0 || commands[args[0]] == nil {
		return fmt.Errorf("usage: fleetbench index|scale|collector|compare|fleet|edge|replication [flags]")
	}
	return commands[args[0]](ctx, args[1:])
}
