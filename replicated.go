package fleetgraph

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/replication"
)

// Role is what one process of a replicated fleetgraph does
// (docs/scale-out.md).
type Role string

// The roles.
const (
	// RoleAll collects its clusters and serves queries: one process, or,
	// with Replication, one of several that share the collection.
	RoleAll Role = "all"
	// RoleCollector collects clusters (pull) and edge sessions (push) and
	// publishes every index write to the stream; it serves /edge,
	// /healthz and /readyz, no queries.
	RoleCollector Role = "collector"
	// RoleQuery builds its index from the stream and serves queries; it
	// asks no leaf cluster anything (object details go to the cluster's
	// collector over NATS).
	RoleQuery Role = "query"
)

// ParseRole reads a --role value.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleAll, RoleCollector, RoleQuery:
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q: want %s, %s or %s", s, RoleAll, RoleCollector, RoleQuery)
}

// Replication makes a Server one process of a replicated fleetgraph over
// NATS JetStream.
type Replication struct {
	Role Role
	// Conn reaches NATS: an external cluster, or a server embedded in
	// this process (replication.StartEmbedded). Required.
	Conn *nats.Conn
	// Stream, Prefix and Replicas name the stream and its subjects and
	// set its replica count (replication.Options).
	Stream, Prefix string
	Replicas       int
	// Leases shards the clusters over every collector that shares them.
	// nil means this process owns every cluster it is given (the only
	// collector). Its ID names this collector.
	Leases *replication.LeaseOptions
	// ID names this collector without leases (default "fleetgraph").
	ID string
}

// replicated is a Server's part of a replicated fleetgraph.
type replicated struct {
	cfg       Replication
	node      *replication.Node
	collector *replication.Collector // nil on a query replica
}

func (r *replicated) collects() bool { return r.cfg.Role != RoleQuery }
func (r *replicated) serves() bool   { return r.cfg.Role != RoleCollector }

// newReplicated makes the stream node of a Server. A collector keeps only
// the clusters it owns in store and does not follow the stream; the other
// roles follow it and serve store.
func newReplicated(cfg Config, store *index.Store) (*replicated, error) {
	rc := *cfg.Replication
	if _, err := ParseRole(string(rc.Role)); err != nil {
		return nil, fmt.Errorf("fleetgraph: %w", err)
	}
	if rc.Conn == nil {
		return nil, errors.New("fleetgraph: Replication.Conn is required")
	}
	if rc.Role == RoleQuery && (len(cfg.Clusters) > 0 || len(cfg.Sources) > 0 || cfg.EdgeTokens != nil) {
		return nil, errors.New("fleetgraph: a query replica collects nothing: it takes no clusters, sources or edge tokens")
	}
	r := &replicated{cfg: rc}
	id := rc.ID
	if rc.Leases != nil {
		id = rc.Leases.ID
	}
	if id == "" {
		id = "fleetgraph"
	}
	opts := replication.Options{
		Conn: rc.Conn, Stream: rc.Stream, Prefix: rc.Prefix, Replicas: rc.Replicas,
		Store: store, Follow: r.serves(), Registerer: cfg.Registry, Logger: cfg.Logger,
	}
	if r.collects() {
		opts.Name = replication.NewIncarnation(id)
		opts.OnLost = func(cluster string, err error) { r.collector.OnLost(cluster, err) }
	}
	node, err := replication.New(opts)
	if err != nil {
		return nil, fmt.Errorf("fleetgraph: %w", err)
	}
	r.node = node
	return r, nil
}

// resume is connection's and edge's Resume: a cluster taken over
// continues from the row its previous owner left in the index.
func resume(store *index.Store) func(string) (*index.Cluster, bool) {
	return func(name string) (*index.Cluster, bool) { return store.GetCluster(nil, name) }
}

// collectorHandler is a collector's HTTP surface: edges, health and
// readiness. It serves no queries: its index holds only what it owns.
func collectorHandler(edges http.Handler, ready func() error) http.Handler {
	mux := http.NewServeMux()
	if edges != nil {
		mux.Handle("/edge", edges)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// scrapeHandler serves a registry's metrics without authentication.
func scrapeHandler(cfg Config) http.Handler {
	return promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{})
}

// run runs the stream node and the collector until ctx ends; nil (the
// single process) runs nothing. A failure of either stops the server.
func (r *replicated) run(ctx context.Context, stop context.CancelFunc) error {
	if r == nil {
		return nil
	}
	errs := make(chan error, 2)
	go func() {
		err := r.node.Run(ctx)
		if err != nil {
			stop()
		}
		errs <- err
	}()
	if r.collector != nil {
		go func() {
			err := r.collector.Run(ctx)
			if err != nil {
				stop()
			}
			errs <- err
		}()
	} else {
		errs <- nil
	}
	return errors.Join(<-errs, <-errs)
}

// edgeStore is the edge.Store of a collector: writes go through the
// replication node, and the reads the hub's quotas need come from the
// collector's own index, which the node writes first and which holds
// exactly the clusters this collector owns.
type edgeStore struct {
	index.Sink
	reads *index.Store
}

func (e edgeStore) Kinds(cluster string) []index.Kind { return e.reads.Kinds(cluster) }

func (e edgeStore) Get(k index.Key) (*index.Object, bool) { return e.reads.Get(k) }

func (e edgeStore) Facets(ctx context.Context, f index.Filter, a *index.Access) (*index.Facets, error) {
	return e.reads.Facets(ctx, f, a)
}

func (e edgeStore) PolicyRows(cluster string) map[string]int { return e.reads.PolicyRows(cluster) }
