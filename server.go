package fleetgraph

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/connection/sources"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/replication"
)

// DefaultShutdownTimeout bounds how long Run waits, once its context ends,
// for open websockets and event streams to be told the server is going
// away.
const DefaultShutdownTimeout = 5 * time.Second

// Config configures a Server. Authenticator is required; everything else
// has a working default.
type Config struct {
	// Clusters are collected in pull mode from the start. More can be
	// added while running with AddCluster.
	Clusters []connection.Spec
	// Sources are inventories of clusters that Run watches (kubeconfig
	// contexts, Cluster API, Argo CD, ...): their clusters come, change
	// and go while the server runs. /readyz waits until each has listed
	// once.
	Sources []sources.Source
	// Kinds, if set, restricts collection to these kinds ("Pod",
	// "Kustomization.kustomize.toolkit.fluxcd.io"); RBAC kinds are always
	// collected. ExtraKinds adds kinds as "group/version/Kind".
	Kinds      []string
	ExtraKinds []string
	// Namespaces and ExcludeNamespaces filter collected objects.
	Namespaces, ExcludeNamespaces []string
	// Relist is the anti-entropy relist interval (default
	// collector.DefaultRelist, 5m).
	Relist time.Duration
	// ShutdownTimeout bounds how long Run waits, once its context ends,
	// for websockets and event streams to be told the server is going away
	// (default DefaultShutdownTimeout). Queries in flight are canceled at
	// once.
	ShutdownTimeout time.Duration
	// Connection tunes probes, health checks and backoff; its Store,
	// Registry and Logger are set by New.
	Connection connection.Options
	// EdgeTokens, if set, turns on push mode: edge agents connect to /edge
	// and claim the cluster their token names (edge.LoadTokenFile reads
	// the "token,cluster" file). Edge tunes the sessions; its Store,
	// Tokens, IsPull, Fallback, Registerer and Logger are set by New.
	EdgeTokens edge.Tokens
	Edge       edge.HubOptions

	// Authenticator turns request credentials into viewers.
	Authenticator authz.Authenticator
	// Authz configures identity mapping per cluster.
	Authz authz.Options
	// AdminGroups see everything in every cluster.
	AdminGroups []string
	// DisableDetails turns off live object details (Query.object), so
	// fleetgraph's credentials need not impersonate viewers in the leaves.
	DisableDetails bool
	// Graph configures the API: limits, websocket, introspection. Its
	// Store, Authorizer, Authenticator, LeafClients, Registry, Logger and
	// Ready are set by New.
	Graph graph.Options

	// Replication, if set, makes this server one process of a replicated
	// fleetgraph over NATS JetStream (a collector, a query replica, or
	// both); nil is the single process, with no NATS at all.
	Replication *Replication

	// ReplayBuffer is how many change events the index keeps for
	// subscriptions that resume or fall behind (default
	// index.DefaultReplayBuffer). It also bounds how long the index holds
	// the strings of rows that are gone (see docs/security.md).
	ReplayBuffer int

	// Registry receives every metric and is served at /metrics; nil means
	// a new registry. The Go runtime and process collectors are the
	// caller's to register on it (see the package doc).
	Registry *prometheus.Registry
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Server is an embeddable fleetgraph: an index fed by pull collectors, an
// RBAC authorizer over it, and the GraphQL API.
type Server struct {
	store    *index.Store
	authz    *authz.Authorizer
	manager  *connection.Manager
	registry *sources.Registry
	sources  []sources.Source
	stopping *atomic.Bool   // set when Run's context ends: /readyz fails from then on
	edges    *edge.Hub      // nil without EdgeTokens
	repl     *replicated    // nil for the single process
	handler  *graph.Handler // nil on a collector
	root     http.Handler
	scrape   http.Handler // /metrics without authentication
	logger   *slog.Logger
	// shutdownTimeout is Config.ShutdownTimeout with its default.
	shutdownTimeout time.Duration
}

// New wires a Server. It starts nothing: Run collects and Handler serves.
func New(cfg Config) (*Server, error) {
	if cfg.ShutdownTimeout < 0 {
		return nil, errors.New("fleetgraph: Config.ShutdownTimeout must not be negative")
	}
	if cfg.Authenticator == nil && (cfg.Replication == nil || cfg.Replication.Role != RoleCollector) {
		return nil, errors.New("fleetgraph: Config.Authenticator is required (anonymous access must be explicit)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	registry, err := collector.RegistryFor(cfg.Kinds, cfg.ExtraKinds)
	if err != nil {
		return nil, fmt.Errorf("fleetgraph: %w", err)
	}

	var iopts []index.Option
	if cfg.ReplayBuffer > 0 {
		iopts = append(iopts, index.WithReplayBuffer(cfg.ReplayBuffer))
	}
	store := index.New(memtables.Open, iopts...)
	var sink index.Sink = store
	var repl *replicated
	if cfg.Replication != nil {
		if repl, err = newReplicated(cfg, store); err != nil {
			return nil, err
		}
		sink = repl.node // writes go to the stream through the node
	}
	copts := cfg.Connection
	copts.Store, copts.Registry, copts.Logger, copts.Registerer = sink, registry, cfg.Logger, cfg.Registry
	copts.Namespaces, copts.ExcludeNamespaces, copts.Relist = cfg.Namespaces, cfg.ExcludeNamespaces, cfg.Relist
	if repl != nil {
		copts.Resume = resume(store)
	}
	manager, err := connection.NewManager(copts)
	if err != nil {
		return nil, err
	}
	var fleet sources.Fleet = manager
	if repl != nil && repl.collects() {
		repl.collector, err = replication.NewCollector(replication.CollectorOptions{
			Node: repl.node, Manager: manager, Leases: repl.cfg.Leases, Registerer: cfg.Registry, Logger: cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("fleetgraph: %w", err)
		}
		fleet = repl.collector // it adds to the manager what it owns
	}
	for _, spec := range cfg.Clusters {
		if err := fleet.Add(spec); err != nil {
			return nil, err
		}
	}
	claims := sources.NewRegistry(fleet, cfg.Logger)
	for _, src := range cfg.Sources {
		claims.Expect(src.Name())
	}

	var leaf graph.LeafClients = manager
	var edges *edge.Hub
	if cfg.EdgeTokens != nil {
		eopts := cfg.Edge
		eopts.Store, eopts.Tokens, eopts.Fallback = store, cfg.EdgeTokens, manager
		eopts.Registerer, eopts.Logger = cfg.Registry, cfg.Logger
		eopts.IsPull = func(name string) bool { return slices.Contains(manager.Clusters(), name) }
		if repl != nil {
			eopts.Store = edgeStore{Sink: sink, reads: store}
			eopts.IsPull, eopts.Claims, eopts.Resume = repl.collector.IsPull, repl.collector, resume(store)
		}
		if edges, err = edge.NewHub(eopts); err != nil {
			return nil, err
		}
		leaf = edges // push clusters through their edge, the rest through the manager
		if repl != nil {
			repl.collector.UseHub(edges)
		}
	}
	stopping := &atomic.Bool{}
	if repl != nil {
		// Details go to whichever collector holds the cluster.
		leaf = replication.NewDetails(repl.cfg.Conn, repl.cfg.Prefix)
		if !repl.serves() {
			ready := func() error {
				if stopping.Load() {
					return errors.New("shutting down")
				}
				return errors.Join(repl.node.Ready(), claims.Ready())
			}
			return &Server{
				store: store, manager: manager, registry: claims, sources: cfg.Sources, stopping: stopping,
				edges: edges, repl: repl, root: collectorHandler(edges, ready), scrape: scrapeHandler(cfg), logger: cfg.Logger,
				shutdownTimeout: cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout),
			}, nil
		}
	}

	az := authz.NewAuthorizer(store, cfg.Authz)
	gopts := cfg.Graph
	gopts.Store, gopts.Authorizer, gopts.Authenticator = store, az, cfg.Authenticator
	gopts.LeafClients, gopts.AdminGroups = leaf, cfg.AdminGroups
	if cfg.DisableDetails {
		gopts.LeafClients = nil
	}
	gopts.Registry, gopts.Logger = cfg.Registry, cfg.Logger
	// Ready once every source has listed once and every cluster has
	// synced or reported why it cannot (and, replicated, once caught up
	// with the stream); not ready again once stopping, so that load
	// balancers send nothing new while websockets are closed.
	gopts.Ready = func(context.Context) error {
		if stopping.Load() {
			return errors.New("shutting down")
		}
		if repl != nil {
			if err := repl.node.Ready(); err != nil {
				return err
			}
		}
		if err := claims.Ready(); err != nil {
			return err
		}
		if f := store.Fleet(&index.Access{All: true}); f.Rebuilding {
			return errors.New(f.Message)
		}
		return nil
	}
	h, err := graph.NewHandler(gopts)
	if err != nil {
		return nil, err
	}
	var root http.Handler = h
	if edges != nil {
		mux := http.NewServeMux()
		mux.Handle("/edge", edges)
		mux.Handle("/", h)
		root = mux
	}
	return &Server{
		store: store, authz: az, manager: manager, registry: claims, sources: cfg.Sources, stopping: stopping,
		edges: edges, repl: repl, handler: h, root: root, scrape: h.MetricsHandler(), logger: cfg.Logger,
		shutdownTimeout: cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout),
	}, nil
}

// Handler serves the API: /graphql (POST and websocket), the dashboard at /,
// GraphiQL at /graphiql, /healthz, /readyz (ready once every source has
// listed once and every cluster has synced or reported an error) and
// /metrics (fleet admins only; see MetricsHandler), and /edge for edge
// agents when EdgeTokens is set.
func (s *Server) Handler() http.Handler { return s.root }

// MetricsHandler serves /metrics without authentication, for a listener
// only scrapers reach; on Handler, /metrics is for fleet admins only,
// because its labels name every cluster.
func (s *Server) MetricsHandler() http.Handler { return s.scrape }

// Edges is the push-mode hub, nil without EdgeTokens.
func (s *Server) Edges() *edge.Hub { return s.edges }

// Store is the index, for programs that query it directly.
func (s *Server) Store() *index.Store { return s.store }

// Manager owns the pull-mode clusters, for programs that add sources.
func (s *Server) Manager() *connection.Manager { return s.manager }

// AddCluster starts collecting a cluster.
func (s *Server) AddCluster(spec connection.Spec) error { return s.manager.Add(spec) }

// RemoveCluster stops collecting a cluster and drops its rows.
func (s *Server) RemoveCluster(ctx context.Context, name string) error {
	return s.manager.Remove(ctx, name)
}

// Run watches the sources, collects from the clusters and serves edge
// sessions until ctx ends, then tells websocket clients the server is going
// away. A source that can never work (for example a missing provider file)
// stops the server with its error.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	edgeErr, srcErr := make(chan error, 1), make(chan error, 1)
	if s.edges != nil {
		go func() { edgeErr <- s.edges.Run(ctx) }()
	} else {
		edgeErr <- nil
	}
	go func() {
		err := sources.Run(ctx, s.registry, s.sources...)
		if err != nil {
			cancel()
		}
		srcErr <- err
	}()
	// The API closes as soon as ctx ends, beside the collectors stopping:
	// its queries in flight are canceled at once rather than after every
	// cluster has let go. /readyz fails from then on.
	closed := make(chan error, 1)
	go func() {
		<-ctx.Done()
		s.stopping.Store(true)
		if s.handler == nil {
			closed <- nil
			return
		}
		closeCtx, cancelClose := context.WithTimeout(context.Background(), s.shutdownTimeout)
		defer cancelClose()
		closed <- s.handler.Close(closeCtx)
	}()
	replErr := make(chan error, 1)
	go func() { replErr <- s.repl.run(ctx, cancel) }()
	err := errors.Join(s.manager.Run(ctx), <-edgeErr, <-srcErr, <-replErr)
	cancel()
	return errors.Join(err, <-closed)
}
