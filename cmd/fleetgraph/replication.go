package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/replication"
)

// replicationFlags are serve's flags for running fleetgraph as more than
// one process over NATS JetStream (docs/scale-out.md).
type replicationFlags struct {
	role           string
	natsEmbedded   string
	natsListen     string
	natsURL        string
	natsReplicas   int
	stream         string
	collectorID    string
	leaseNamespace string
	leaseDuration  time.Duration
}

func (f *replicationFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.role, "role", string(fleetgraph.RoleAll), "all: collect and serve queries (one process, no NATS unless --nats-* is given); collector: collect and publish to NATS JetStream, serve /edge but no queries; query: build the index from NATS JetStream and serve queries")
	fl.StringVar(&f.natsEmbedded, "nats-embedded", "", "run a NATS JetStream server in this process, keeping the stream in this directory (a one-node install that restarts warm)")
	fl.StringVar(&f.natsListen, "nats-listen", "", "with --nats-embedded: also accept NATS clients (other fleetgraph processes) on this host:port")
	fl.StringVar(&f.natsURL, "nats-url", "", "join an external NATS cluster (comma-separated URLs)")
	fl.IntVar(&f.natsReplicas, "nats-stream-replicas", 1, "replicas of the stream when this process creates it (3 on a 3-node NATS cluster survives the loss of a node)")
	fl.StringVar(&f.stream, "nats-stream", replication.DefaultStream, "name of the JetStream stream")
	fl.StringVar(&f.collectorID, "collector-id", "", "this collector's name among the others, the same across its restarts (default the host name)")
	fl.StringVar(&f.leaseNamespace, "lease-namespace", "", "shard the clusters over every collector with Kubernetes Leases in this namespace of the management cluster (--management-kubeconfig); without it a collector owns every cluster it is given")
	fl.DurationVar(&f.leaseDuration, "lease-duration", replication.DefaultLeaseDuration, "how long a collector's clusters wait for it after its last lease renewal before another takes them over")
}

// replicated reports whether serve runs as part of a replicated install.
func (f *replicationFlags) replicated() bool {
	return f.natsEmbedded != "" || f.natsURL != "" || f.role != string(fleetgraph.RoleAll)
}

// setup connects to NATS (or starts the embedded server) and returns the
// server's Replication; nil for the single process. close ends what it
// started.
func (f *replicationFlags) setup(mgmt func() (*rest.Config, error)) (cfg *fleetgraph.Replication, closeFn func(), err error) {
	if f.role == "" { // serveFlags built by demo and tests, not by the flags
		f.role = string(fleetgraph.RoleAll)
	}
	role, err := fleetgraph.ParseRole(f.role)
	if err != nil {
		return nil, nil, fmt.Errorf("--role: %w", err)
	}
	if !f.replicated() {
		return nil, func() {}, nil
	}
	var conn *nats.Conn
	stop := func() {}
	switch {
	case f.natsEmbedded != "" && f.natsURL != "":
		return nil, nil, errors.New("give --nats-embedded or --nats-url, not both")
	case f.natsEmbedded != "":
		srv, err := replication.StartEmbedded(replication.EmbeddedOptions{Dir: f.natsEmbedded, Listen: f.natsListen, Name: "fleetgraph"})
		if err != nil {
			return nil, nil, err
		}
		if f.natsListen != "" {
			slog.Info("serving NATS", "url", srv.ClientURL())
		}
		if conn, err = replication.ConnectEmbedded(srv); err != nil {
			srv.Shutdown()
			return nil, nil, err
		}
		stop = func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
	case f.natsURL != "":
		// Every URL of the list is tried, on start and on every reconnect
		// (a dead node is skipped); a NATS cluster not up yet is waited
		// for (the stream is opened once it is), not a reason to exit.
		conn, err = nats.Connect(f.natsURL, nats.Name("fleetgraph "+f.role), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
			nats.RetryOnFailedConnect(true),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { slog.Warn("NATS disconnected", "err", err) }),
			nats.ReconnectHandler(func(c *nats.Conn) { slog.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }))
		if err != nil {
			return nil, nil, fmt.Errorf("--nats-url: %w", err)
		}
	default:
		return nil, nil, fmt.Errorf("--role %s needs NATS: --nats-url or --nats-embedded", f.role)
	}
	closeFn = func() {
		conn.Close()
		stop()
	}
	cfg = &fleetgraph.Replication{Role: role, Conn: conn, Stream: f.stream, Replicas: f.natsReplicas, ID: f.collectorID}
	if cfg.ID == "" {
		if cfg.ID, err = os.Hostname(); err != nil {
			closeFn()
			return nil, nil, fmt.Errorf("--collector-id: no host name to default to: %w", err)
		}
	}
	if f.leaseNamespace != "" && role != fleetgraph.RoleQuery {
		rc, err := mgmt()
		if err != nil {
			closeFn()
			return nil, nil, fmt.Errorf("--lease-namespace: %w", err)
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			closeFn()
			return nil, nil, fmt.Errorf("--lease-namespace: %w", err)
		}
		cfg.Leases = &replication.LeaseOptions{Client: client, Namespace: f.leaseNamespace, ID: cfg.ID, Duration: f.leaseDuration}
	}
	return cfg, closeFn, nil
}
