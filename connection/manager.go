package connection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// Defaults for Options. They are chosen so that a frozen or black-holed
// API server is noticed within about five seconds, a killed one within a
// fraction of a second (its watches break at once), and a recovered one is
// reconnected within a few seconds, while a busy but healthy server is not
// declared lost: two probes in a row must fail.
const (
	DefaultProbeInterval    = time.Second
	DefaultProbeTimeout     = 1500 * time.Millisecond
	DefaultProbeFailures    = 2
	DefaultHTTP2ReadIdle    = 3 * time.Second
	DefaultHTTP2PingTimeout = 2 * time.Second
	// DefaultBackoffInitial and DefaultBackoffMax bound the wait before
	// reconnecting; internal/retry gives the reasons for the numbers.
	DefaultBackoffInitial = retry.PullReconnectInitial
	DefaultBackoffMax     = retry.PullReconnectMax
	// DefaultMaxConcurrentSyncs bounds how many clusters list their kinds
	// at once. A first sync decodes and indexes every object of the
	// cluster, so a fleet connected at once does all of that at once:
	// fleetbench fleet, 200 clusters of 5,560 objects on 2 cores, without
	// a bound: first sync 100.7 s, peak RSS 7,038 MiB against 2,283 MiB
	// after it, and 56 clusters reported lost because the starved manager
	// answered its own probes late. A leaf's list is bounded by its API
	// server and the network as much as by the manager, so a few clusters
	// list side by side; more only add to the peak.
	DefaultMaxConcurrentSyncs = 8
)

// Options configures a Manager.
type Options struct {
	// Store receives the clusters' rows and cluster rows. It is only
	// written, never read, so anything that carries the Sink calls to an
	// index (a *index.Store) will do.
	Store index.Sink
	// Resume, if set, gives the last known row of a cluster when its
	// lifecycle starts, and the cluster's state continues from it (a
	// replicated collector taking a cluster over from another, package
	// replication). nil, or no row, starts the cluster afresh.
	Resume func(cluster string) (*index.Cluster, bool)
	// Registry lists the kinds to collect; nil means collector.NewRegistry().
	Registry *collector.Registry
	// Namespaces and ExcludeNamespaces filter collected objects.
	Namespaces, ExcludeNamespaces []string
	// Relist is the collectors' anti-entropy interval; zero means
	// collector.DefaultRelist.
	Relist time.Duration
	// ProbeInterval, ProbeTimeout and ProbeFailures tune the /readyz probe
	// loop: a cluster is lost after ProbeFailures failed probes in a row.
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	ProbeFailures int
	// HTTP2ReadIdle and HTTP2PingTimeout tune the HTTP/2 health check that
	// closes half-open connections: after ReadIdle without a frame, a ping
	// is sent, and the connection is closed if no answer comes within
	// PingTimeout.
	HTTP2ReadIdle    time.Duration
	HTTP2PingTimeout time.Duration
	// BackoffInitial and BackoffMax bound the exponential, jittered wait
	// between reconnect attempts.
	BackoffInitial, BackoffMax time.Duration
	// MaxConcurrentSyncs bounds how many clusters may be in a connection's
	// initial sync at once (listing every kind, after connecting or
	// reconnecting). The others wait their turn before they build a
	// client: the row says CONNECTING (or DISCONNECTED, while
	// reconnecting after an outage), and nothing probes them meanwhile,
	// so waiting cannot make a cluster lost. Zero means
	// DefaultMaxConcurrentSyncs; a negative value means no limit.
	MaxConcurrentSyncs int
	// Registerer, if set, receives the manager's metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Registry == nil {
		o.Registry = collector.NewRegistry()
	}
	setDefault(&o.ProbeInterval, DefaultProbeInterval)
	setDefault(&o.ProbeTimeout, DefaultProbeTimeout)
	setDefault(&o.HTTP2ReadIdle, DefaultHTTP2ReadIdle)
	setDefault(&o.HTTP2PingTimeout, DefaultHTTP2PingTimeout)
	setDefault(&o.BackoffInitial, DefaultBackoffInitial)
	setDefault(&o.BackoffMax, DefaultBackoffMax)
	if o.ProbeFailures <= 0 {
		o.ProbeFailures = DefaultProbeFailures
	}
	if o.MaxConcurrentSyncs == 0 {
		o.MaxConcurrentSyncs = DefaultMaxConcurrentSyncs
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Manager owns the connection lifecycle of every pull-mode cluster: one
// goroutine and one probe loop per cluster, however many clients watch.
//
// Concurrency: Run starts a lifecycle goroutine per cluster added before
// or while it runs, each with its own context in the cancels map, guarded
// by mu. Remove cancels one cluster's context, waits for its goroutine,
// and removes its rows. When Run's context ends, every cluster is
// cancelled and Run returns after their goroutines have. syncs is shared
// by every lifecycle: a session holds one of its slots from before it
// builds its client until its initial sync is done or it ends.
type Manager struct {
	opts    Options
	metrics *metrics
	syncs   chan struct{} // a slot per cluster in its initial sync; nil: no limit

	mu       sync.Mutex
	ctx      context.Context // set by Run; nil before
	stopping bool            // Run is waiting for wg: no cluster starts any more
	clusters map[string]*cluster
	wg       sync.WaitGroup // cluster goroutines; joined only under mu, before stopping
}

// ErrUnknownCluster is returned for a cluster the manager does not have.
var ErrUnknownCluster = errors.New("unknown cluster")

// NewManager returns a Manager. Clusters added before Run start when Run
// does.
func NewManager(opts Options) (*Manager, error) {
	if opts.Store == nil {
		return nil, errors.New("connection: Options.Store is required")
	}
	opts.setDefaults()
	m := &Manager{opts: opts, clusters: map[string]*cluster{}, metrics: newMetrics()}
	if opts.MaxConcurrentSyncs > 0 {
		m.syncs = make(chan struct{}, opts.MaxConcurrentSyncs)
	}
	if opts.Registerer != nil {
		if err := m.metrics.register(opts.Registerer); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// syncTurn waits until a session may start its initial sync, or ctx ends.
// It returns the function that gives the turn back, which may be called
// more than once (at the end of the sync, and when the session ends).
func (m *Manager) syncTurn(ctx context.Context) (func(), error) {
	if m.syncs == nil {
		return func() {}, nil
	}
	m.metrics.waitingToSync.Inc()
	select {
	case m.syncs <- struct{}{}:
		m.metrics.waitingToSync.Dec()
	case <-ctx.Done():
		m.metrics.waitingToSync.Dec()
		return nil, ctx.Err()
	}
	m.metrics.syncing.Inc()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.metrics.syncing.Dec()
			<-m.syncs
		})
	}, nil
}

// Add adds a cluster. Adding a name twice is an error.
func (m *Manager) Add(spec Spec) error {
	if spec.Name == "" || spec.Config == nil {
		return errors.New("connection: a cluster needs a name and a Config function")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.clusters[spec.Name]; ok {
		return fmt.Errorf("cluster %q is added already", spec.Name)
	}
	c := newCluster(m, spec)
	m.clusters[spec.Name] = c
	// Once Run is stopping, a cluster added late (a collector taking one
	// over while the process shuts down) is not started: joining wg then
	// would race Run's Wait and outlive Run.
	if m.ctx != nil && !m.stopping {
		m.start(c)
	}
	return nil
}

// start runs a cluster's lifecycle. mu must be held and m.ctx set.
func (m *Manager) start(c *cluster) {
	ctx, cancel := context.WithCancel(m.ctx)
	c.cancel = cancel
	c.done = make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(c.done)
		c.run(ctx)
	}()
}

// Remove stops collecting a cluster and removes its rows from the index.
func (m *Manager) Remove(ctx context.Context, name string) error {
	m.mu.Lock()
	c, ok := m.clusters[name]
	delete(m.clusters, name)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownCluster, name)
	}
	if c.cancel != nil {
		c.cancel()
		<-c.done
	}
	if err := m.opts.Store.RemoveCluster(ctx, name); err != nil {
		return fmt.Errorf("remove cluster %q: %w", name, err)
	}
	return nil
}

// Reconnect drops a cluster's connection and connects again with a fresh
// client, for example after its credentials changed.
func (m *Manager) Reconnect(name string) error {
	c, err := m.cluster(name)
	if err != nil {
		return err
	}
	c.poke(sigReconnect)
	return nil
}

// SetLabels replaces a cluster's labels without reconnecting it, for a
// source object that was relabelled.
func (m *Manager) SetLabels(ctx context.Context, name string, labels map[string]string) error {
	c, err := m.cluster(name)
	if err != nil {
		return err
	}
	c.state.SetLabels(ctx, labels)
	return nil
}

// Clusters returns the names of the managed clusters, sorted.
func (m *Manager) Clusters() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.clusters))
}

// RESTConfig returns the client config of a cluster's current connection,
// for requests that go to the leaf directly (object details). It fails
// while the cluster is not connected.
func (m *Manager) RESTConfig(name string) (*rest.Config, error) {
	c, err := m.cluster(name)
	if err != nil {
		return nil, err
	}
	cfg := c.currentConfig()
	if cfg == nil {
		return nil, fmt.Errorf("cluster %q is not connected", name)
	}
	return rest.CopyConfig(cfg), nil
}

func (m *Manager) cluster(name string) (*cluster, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clusters[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownCluster, name)
	}
	return c, nil
}

// Run runs every cluster's lifecycle until ctx ends, then stops them all.
// It returns nil after a clean stop.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil {
		m.mu.Unlock()
		return errors.New("connection: Manager.Run called twice")
	}
	m.ctx = ctx
	for _, c := range m.clusters {
		m.start(c)
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}
