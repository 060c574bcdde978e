package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// DefaultRelist is the default interval of the full relist that every kind
// repeats as anti-entropy. A relist goes through Replace, whose change
// detection makes an unchanged relist cost no events, and runs beside the
// kind's watch, which keeps delivering changes while it lists (see
// rowStore.reconcile): it only repairs what a watch missed.
//
// Its cost grows with the fleet, not with its churn: every object is
// decoded and normalized again each interval. Measured with fleetbench
// fleet at 50 simulated clusters (278,000 objects), relisting every 30 s
// took about half of the collector's CPU (protobuf decoding, rows and their
// garbage), more than the watches of 1,000 changes a second; at 200
// clusters it alone would need more than this 2-core machine. Every 5
// minutes it costs a tenth of that. Watches do not lose events while they
// run, and a kind whose watch fails or whose resource version expired
// lists afresh (at once, or after a backoff when its watches keep ending
// soon after their list), so the interval bounds only how long a change
// missed in some other way can stay wrong.
const DefaultRelist = 5 * time.Minute

const (
	// relistJitter spreads relists of many kinds and clusters over time,
	// so they do not all hit the API servers in the same second.
	relistJitter = 0.1
	// relistFailuresWarn is how many relists of a kind in a row must fail
	// before each failure is logged as a warning rather than at debug
	// level: a relist that fails once (a connection lost while it listed,
	// a 429) is retried at the next interval, while one that keeps failing
	// means the kind's anti-entropy never runs (a paged list that takes
	// longer than etcd's compaction interval, 5 min by default, gets a 410
	// on its continue token every time).
	relistFailuresWarn = 3
	// goneRelistDelay keeps a server that answers 410 to everything from
	// turning relists into a busy loop.
	goneRelistDelay = 100 * time.Millisecond
	// watchLasted is how long a list and watch must have run for its end
	// to count as ordinary (a watch ends after an error event, or a 410,
	// now and then), so that the kind lists again at once. One that ends
	// sooner, again and again (a proxy or load balancer that closes watch
	// streams at once), would list the whole kind back to back: it backs
	// off like a failing list instead. A minute is a small fraction of a
	// healthy watch's life (the server ends it after 5 to 10 minutes,
	// and the reflector watches again without listing).
	watchLasted = time.Minute
)

// EventType says what happened to a kind.
type EventType int

// The events a collector reports.
const (
	// KindSynced: a full list of the kind reached the sink: the
	// reflector's, or an anti-entropy relist's. A relist replaces only
	// while the kind is not failing, so it never clears a KindFailed the
	// reflector still stands by.
	KindSynced EventType = iota
	// KindFailed: the kind cannot be collected (listing failed); it is
	// retried with backoff and its rows are kept as last known.
	KindFailed
	// WatchFailed: a watch request failed or a watch stream ended. It is
	// the fastest sign of a lost connection, and also happens on normal
	// watch timeouts, so the owner should check the connection, not
	// assume the worst.
	WatchFailed
	// RelistFailed: an anti-entropy relist of the kind failed. The kind
	// is not failing (its watch keeps its rows), but what a watch missed
	// is not repaired; the owner counts these.
	RelistFailed
)

// Event is a report from a collector to its owner.
type Event struct {
	Type EventType
	Kind index.Kind
	Err  error
}

// Config configures the collection of one cluster.
type Config struct {
	Cluster  string
	Clients  *Clients
	Sink     index.RowSink
	Registry *Registry
	// Namespaces, if not empty, limits collection to these namespaces;
	// ExcludeNamespaces drops namespaces. RBAC rows are always collected:
	// authz needs every binding.
	Namespaces        []string
	ExcludeNamespaces []string
	// Relist is the anti-entropy interval; zero means DefaultRelist.
	Relist time.Duration
	// OnEvent receives progress and trouble. It is called from collector
	// goroutines and must not block.
	OnEvent func(Event)
	Logger  *slog.Logger
}

// Run is one collection of one cluster, started by Start.
//
// Concurrency: Start runs discovery on the caller's goroutine, then starts
// two goroutines per present kind (its reflector's list and watch, and its
// anti-entropy relist) plus one that re-runs discovery (see rediscover)
// to pick up kinds that appear later (a CRD installed after start). All of them stop when the context passed to Start ends; Wait
// returns after the last one has, so that no write from this run reaches
// the sink after Wait.
type Run struct {
	cfg     Config
	filter  namespaceFilter
	wg      sync.WaitGroup
	mu      sync.Mutex
	running map[string]bool // GroupKind -> started
	// Present lists the kinds discovery found and that are being
	// collected, at start.
	Present []index.Kind
	// Missing lists the kinds the cluster does not serve, at start, with
	// the reason. They were reported to the sink as kind errors.
	Missing []MissingKind
}

// MissingKind is a kind a cluster does not serve.
type MissingKind struct {
	Kind index.Kind
	Err  error
}

// ErrKindNotServed is the reason of a kind discovery does not list.
var ErrKindNotServed = errors.New("kind not served by the cluster (is its CRD installed?)")

// Start discovers which kinds the cluster serves, reports the missing ones
// as kind errors, and starts collecting the rest. It fails only when
// discovery itself fails, which means the cluster is unreachable.
func Start(ctx context.Context, cfg Config) (*Run, error) {
	if cfg.Relist <= 0 {
		cfg.Relist = DefaultRelist
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnEvent == nil {
		cfg.OnEvent = func(Event) {}
	}
	r := &Run{cfg: cfg, filter: newNamespaceFilter(cfg.Namespaces, cfg.ExcludeNamespaces), running: map[string]bool{}}
	present, missing, err := r.discover()
	if err != nil {
		return nil, err
	}
	r.Missing = missing
	for _, m := range missing {
		if err := cfg.Sink.ReportKindError(ctx, cfg.Cluster, m.Kind, m.Err); err != nil {
			return nil, fmt.Errorf("report missing kind %s: %w", m.Kind.GroupKind(), err)
		}
	}
	for _, p := range present {
		r.Present = append(r.Present, p.kind)
		r.startKind(ctx, p)
	}
	r.wg.Add(1)
	go r.rediscover(ctx)
	return r, nil
}

// Wait blocks until every goroutine of the run has returned. Call it after
// cancelling the context given to Start.
func (r *Run) Wait() { r.wg.Wait() }

type plannedKind struct {
	adapter *Adapter
	kind    index.Kind
}

// discover matches the registry against the cluster's API resources.
// Partial discovery failures (one aggregated API down) make only that
// group's kinds missing.
func (r *Run) discover() ([]plannedKind, []MissingKind, error) {
	groups, resources, err := r.cfg.Clients.Discovery.ServerGroupsAndResources()
	failed := map[schema.GroupVersion]error{}
	if err != nil {
		var partial *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &partial) {
			return nil, nil, describeDiscoveryError(err)
		}
		failed = partial.Groups
	}
	preferred := map[string]string{}
	for _, g := range groups {
		preferred[g.Name] = g.PreferredVersion.Version
	}
	// served[group][kind][version] = resource
	served := map[string]map[string]map[string]metav1.APIResource{}
	for _, list := range resources {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, res := range list.APIResources {
			if slices.Contains([]rune(res.Name), '/') {
				continue // a subresource
			}
			if served[gv.Group] == nil {
				served[gv.Group] = map[string]map[string]metav1.APIResource{}
			}
			if served[gv.Group][res.Kind] == nil {
				served[gv.Group][res.Kind] = map[string]metav1.APIResource{}
			}
			served[gv.Group][res.Kind][gv.Version] = res
		}
	}

	var present []plannedKind
	var missing []MissingKind
	for _, a := range r.cfg.Registry.Adapters() {
		versions := served[a.Group][a.Kind]
		version := a.Version
		if version == "" {
			version = preferred[a.Group]
			if _, ok := versions[version]; !ok {
				version = firstVersion(versions)
			}
		}
		res, ok := versions[version]
		if !ok {
			reason := ErrKindNotServed
			for gv, gerr := range failed {
				if gv.Group == a.Group {
					reason = fmt.Errorf("discovery of %s failed: %w", gv, gerr)
				}
			}
			missing = append(missing, MissingKind{Kind: index.Kind{Group: a.Group, Version: a.Version, Kind: a.Kind}, Err: reason})
			continue
		}
		present = append(present, plannedKind{adapter: a, kind: index.Kind{
			Group: a.Group, Version: version, Kind: a.Kind, Resource: res.Name, Namespaced: res.Namespaced,
		}})
	}
	return present, missing, nil
}

func firstVersion(versions map[string]metav1.APIResource) string {
	keys := make([]string, 0, len(versions))
	for v := range versions {
		keys = append(keys, v)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// rediscoverEvery bounds how often discovery runs again, to start kinds
// that appeared (a CRD installed after start) or whose group's discovery
// failed at start: a few small documents, unlike a relist, so it keeps the
// 30 s it had when relists were that frequent.
const rediscoverEvery = 30 * time.Second

// rediscover re-runs discovery every relist interval or rediscoverEvery,
// whichever is shorter, and starts kinds that appeared since.
func (r *Run) rediscover(ctx context.Context) {
	defer r.wg.Done()
	t := time.NewTicker(min(r.cfg.Relist, rediscoverEvery))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		present, _, err := r.discover()
		if err != nil {
			r.cfg.OnEvent(Event{Type: WatchFailed, Err: err})
			continue
		}
		for _, p := range present {
			r.startKind(ctx, p)
		}
	}
}

// startKind starts collecting a kind unless it runs already.
func (r *Run) startKind(ctx context.Context, p plannedKind) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gk := p.kind.GroupKind()
	if r.running[gk] {
		return
	}
	r.running[gk] = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.collectKind(ctx, p)
	}()
}

// collectKind lists and watches one kind until ctx ends: a reflector lists
// everything (a Replace) and watches from there, re-watching from its last
// resource version when a watch times out and listing again only when the
// watch fails or its resource version expired (410). Beside it, antiEntropy
// relists the kind every relist interval without stopping the watch. A
// failing list is reported and retried with the retry.KindList backoff.
//
// Measured with fleetbench fleet (10 simulated clusters, 1,000 pod changes
// a second): when the relist stopped the watch and listed afresh every
// 30 s, a change made while its kind relisted waited for the whole listing
// (0.6-3.4 s for 3,000 pods on a loaded machine), and the p99 from a
// change on a leaf to its row was 2.1-2.3 s against a p50 of 0.6 ms.
func (r *Run) collectKind(ctx context.Context, p plannedKind) {
	gvr := schema.GroupVersionResource{Group: p.kind.Group, Version: p.kind.Version, Resource: p.kind.Resource}
	lw := &signallingListWatch{inner: p.adapter.listWatch(r.cfg.Clients, gvr), report: func(err error) {
		r.cfg.OnEvent(Event{Type: WatchFailed, Kind: p.kind, Err: err})
	}}
	store := &rowStore{ctx: ctx, run: r, adapter: p.adapter, kind: p.kind}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.antiEntropy(ctx, lw, store)
	}()
	r.listAndWatch(ctx, lw, store, p.adapter.newObject())
}

// listAndWatch runs a reflector of one kind into store until ctx ends,
// listing again after its watch failed (at once if it had run for
// watchLasted, with backoff otherwise), after a 410 (goneRelistDelay) and
// after a failed list (backoff, and the kind is reported failing).
func (r *Run) listAndWatch(ctx context.Context, lw cache.ListerWatcher, store *rowStore, expected runtime.Object) {
	kind := store.kind
	reflector := cache.NewReflectorWithOptions(lw, expected, store, cache.ReflectorOptions{
		Name:            r.cfg.Cluster + "/" + kind.GroupKind(),
		TypeDescription: kind.GroupKind(),
	})
	backoff := retry.New(retry.KindList, nil)
	for ctx.Err() == nil {
		start := time.Now()
		err := reflector.ListAndWatchWithContext(ctx)
		if ctx.Err() != nil {
			return
		}
		lasted := time.Since(start) >= watchLasted
		if lasted {
			backoff.Reset()
		}
		if err == nil {
			// The watch failed after a good list: list again, at once
			// if it had lasted, after a backoff if it ended soon.
			if lasted {
				continue
			}
			r.cfg.Logger.Debug("watch ended soon after its list; backing off", "cluster", r.cfg.Cluster, "kind", kind.GroupKind())
			if !backoff.Sleep(ctx, backoff.Next()) {
				return
			}
			continue
		}
		if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
			// The resource version is too old (410): an ordinary
			// event that a fresh list resolves.
			r.cfg.Logger.Debug("resource version expired; relisting", "cluster", r.cfg.Cluster, "kind", kind.GroupKind())
			if !backoff.Sleep(ctx, goneRelistDelay) {
				return
			}
			continue
		}
		wait := backoff.Next()
		r.cfg.Logger.Warn("collecting kind failed", "cluster", r.cfg.Cluster, "kind", kind.GroupKind(), "err", err, "retry_in", wait.Round(time.Millisecond))
		store.failed(err)
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// antiEntropy relists a kind every relist interval (jittered) while its
// watch runs, so that a missed watch event cannot leave a row wrong for
// longer. A failed relist is reported as a RelistFailed event and retried
// at the next interval; it is logged at debug level, and as a warning
// once relistFailuresWarn relists in a row have failed. It does not make
// the kind failing: its watch still delivers, and the reflector, which
// fails on the same trouble when it is the kind's, owns reporting that.
func (r *Run) antiEntropy(ctx context.Context, lw cache.ListerWatcher, store *rowStore) {
	failures := 0
	for {
		t := time.NewTimer(retry.Jitter(r.cfg.Relist, relistJitter))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := store.reconcile(ctx, lw)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			failures = 0
			continue
		}
		failures++
		level := slog.LevelDebug
		if failures >= relistFailuresWarn {
			level = slog.LevelWarn
		}
		r.cfg.Logger.Log(ctx, level, "anti-entropy relist failed", "cluster", r.cfg.Cluster, "kind", store.kind.GroupKind(), "failures_in_a_row", failures, "err", err)
		r.cfg.OnEvent(Event{Type: RelistFailed, Kind: store.kind, Err: err})
	}
}

// describeDiscoveryError says what a failed discovery means for the user.
func describeDiscoveryError(err error) error {
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("discovery: unauthorized: the cluster rejected fleetgraph's credentials: %w", err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("discovery: forbidden: fleetgraph's credentials may not read the API discovery documents: %w", err)
	default:
		return fmt.Errorf("discovery: %w", err)
	}
}

// describeListError turns a list failure into the message users see on the
// kind.
func describeListError(kind index.Kind, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("forbidden: fleetgraph's credentials may not list %s: %w", kind.Resource, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s is no longer served: %w", kind.Resource, err)
	case apierrors.IsTooManyRequests(err):
		return fmt.Errorf("throttled by the API server (429), retrying: %w", err)
	default:
		return err
	}
}
