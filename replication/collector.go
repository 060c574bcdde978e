package replication

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/index"
)

// CollectorOptions configures a Collector.
type CollectorOptions struct {
	// Node publishes the writes of the clusters the collector owns, and
	// Manager collects its pull clusters; both required. Manager's Store
	// must be Node.
	Node    *Node
	Manager *connection.Manager
	// Leases shards the clusters over every collector that shares the
	// lease namespace. nil means this collector owns every cluster it is
	// given: one collector (a one-process install).
	Leases *LeaseOptions
	// Registerer, if set, receives the collector's metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Collector decides which clusters this process collects and takes them
// over: it is the sources' Fleet (the clusters of the inventory, pull
// mode) and the edge Hub's Claims (push mode, one edge per cluster across
// every replica). With leases, every collector reads the same inventory
// and the same leases, and computes the same balanced assignment of the
// pull clusters over the live collectors; each takes the clusters
// assigned to it whose lease is free, released or held by a collector
// whose own lease expired, and hands a cluster over to its assigned
// collector (releasing the lease) once that one has been alive for a lease
// duration. A push cluster belongs to the collector its edge is connected
// to.
//
// Taking a cluster over is: win its lease (a conditional update), then
// Node.Acquire (bring the cluster's state up to the end of its log and
// write a new owner's snapshot, which fences the old owner), then, if the
// old owner died with the cluster live, mark it DISCONNECTED with the
// reason (its rows stay, stale), then collect (Manager.Add; a push cluster
// waits for its edge). The cluster's state machine resumes from the row
// the old owner left, so an outage is still one DISCONNECTED and one
// CONNECTED.
//
// Concurrency: Run's goroutine renews the collector's lease and
// reconciles every second and on every lease change; each take-over or
// release of a cluster runs with that cluster's lock held, on a goroutine
// of its own (reconcile) or the edge's handler (Claim). Both judge the
// other collectors (view: members is written by Run's goroutine and by
// Claim handlers), one confirming read at a time (confirming, taken
// before mu). mu guards the maps and is never held across a call to the
// API server, NATS or the Manager.
type Collector struct {
	opts        CollectorOptions
	node        *Node
	manager     *connection.Manager
	ls          *leases // nil without leases
	id          string
	incarnation string
	log         *slog.Logger
	metrics     *collectorMetrics
	kick        chan struct{}
	// clock measures lease liveness: its monotonic readings, never a
	// comparison with another process's clock (tests pass a fake one, set
	// before Run: it is read without mu). Its wall reading is also compared
	// with a push cluster's edge-released time (the grace period), which
	// another process wrote with time.Now: under a fake clock that tests
	// step, the grace period is shorter than it is in production.
	clock clock.PassiveClock

	confirming    sync.Mutex // one confirming read at a time (see view)
	confirmWarned time.Time  // when a failed confirming read was last logged; Run's goroutine only

	hubMu sync.Mutex
	hub   *edge.Hub

	mu       sync.Mutex
	desired  map[string]connection.Spec // pull clusters of the inventory
	held     map[string]*held           // clusters this process owns
	locks    map[string]*sync.Mutex     // per cluster, across a take-over or release
	members  map[string]*member         // collector leases seen, by lease name
	mine     *coordinationv1.Lease      // this collector's lease as last written
	renewed  time.Time                  // when it was last written
	cached   cache.Store                // the leases as the informer last saw them (set by Run's watchLeases, or a test)
	ctx      context.Context            // Run's
	stopping bool                       // Run is waiting for wg: nothing joins it any more
	wg       sync.WaitGroup             // goroutines Run waits for; joined only by Run's goroutine or under mu
}

// held is a cluster this process owns.
type held struct {
	mode       string // modePull or modePush
	generation int32  // of its lease (0 without leases)
	lease      *coordinationv1.Lease
	detail     func() // stops answering detail requests
}

// member is a collector's lease as this collector observed it. The cache
// may be behind (a stalled watch; this process paused), so the cache alone
// never proves a collector dead: a read from the API server confirms it
// (see confirm).
type member struct {
	id, holder string
	rv         string
	observed   time.Time // read just after the cache showed rv first, on this process's clock
	firstSeen  time.Time // when this process first saw this holder alive
	// What the API server answered when the cache made the collector look
	// dead: readRV, first read at readAt; dead once a read confirmed it
	// (until the cache shows the lease change).
	readRV string
	readAt time.Time
	dead   bool
}

// NewCollector returns a Collector; Run starts it.
func NewCollector(opts CollectorOptions) (*Collector, error) {
	if opts.Node == nil || opts.Manager == nil {
		return nil, errors.New("replication: CollectorOptions.Node and Manager are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	c := &Collector{
		opts: opts, node: opts.Node, manager: opts.Manager, log: opts.Logger.With("component", "collector"),
		metrics: newCollectorMetrics(), kick: make(chan struct{}, 1), clock: clock.RealClock{},
		desired: map[string]connection.Spec{}, held: map[string]*held{}, locks: map[string]*sync.Mutex{},
		members: map[string]*member{},
	}
	c.incarnation = opts.Node.opts.Name
	c.id = collectorOf(c.incarnation)
	if l := opts.Leases; l != nil {
		if l.Client == nil || l.Namespace == "" || l.ID == "" {
			return nil, errors.New("replication: LeaseOptions.Client, Namespace and ID are required")
		}
		if l.Duration <= 0 {
			l.Duration = DefaultLeaseDuration
		}
		if l.Grace <= 0 {
			l.Grace = edge.DefaultGrace
		}
		c.ls = &leases{client: l.Client, namespace: l.Namespace, duration: l.Duration}
		if l.ID != c.id {
			return nil, fmt.Errorf("replication: the Node's Name %q is not an incarnation of collector %q (see NewIncarnation)", c.incarnation, l.ID)
		}
	}
	if c.id == "" || c.id == c.incarnation {
		return nil, errors.New("replication: a collector's Node needs a Name made by NewIncarnation")
	}
	if opts.Registerer != nil {
		if err := c.metrics.register(opts.Registerer); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// NewIncarnation returns the name a collector's Node owns clusters under:
// the collector's ID and a suffix that differs on every start, so that
// the clusters a previous run of the same collector held are taken over
// (and resynced), never silently continued.
func NewIncarnation(id string) string {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails (Go 1.24+)
	return id + "/" + hex.EncodeToString(suffix[:])
}

// UseHub connects the edge Hub, so that a push cluster another replica
// takes over ends its session here. Call it before Run.
func (c *Collector) UseHub(h *edge.Hub) {
	c.hubMu.Lock()
	c.hub = h
	c.hubMu.Unlock()
}

func (c *Collector) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// lock returns a cluster's lock, locked.
func (c *Collector) lock(cluster string) *sync.Mutex {
	c.mu.Lock()
	l := c.locks[cluster]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[cluster] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l
}

// Add implements sources.Fleet: a cluster of the inventory, collected by
// whichever collector it is assigned to.
func (c *Collector) Add(spec connection.Spec) error {
	c.mu.Lock()
	if _, ok := c.desired[spec.Name]; ok {
		c.mu.Unlock()
		return fmt.Errorf("cluster %q is added already", spec.Name)
	}
	c.desired[spec.Name] = spec
	c.mu.Unlock()
	c.wake()
	return nil
}

// Remove implements sources.Fleet: the cluster left the inventory. Its
// owner removes its rows from every replica and gives its lease up.
func (c *Collector) Remove(ctx context.Context, name string) error {
	c.mu.Lock()
	_, ok := c.desired[name]
	delete(c.desired, name)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", connection.ErrUnknownCluster, name)
	}
	c.wake()
	return nil
}

// Reconnect implements sources.Fleet: new credentials for a cluster.
func (c *Collector) Reconnect(name string) error {
	c.mu.Lock()
	_, ok := c.desired[name]
	h := c.held[name]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", connection.ErrUnknownCluster, name)
	}
	if h == nil {
		return nil // its owner, elsewhere, reads the same source
	}
	return c.manager.Reconnect(name)
}

// SetLabels implements sources.Fleet: new labels from the inventory.
func (c *Collector) SetLabels(ctx context.Context, name string, labels map[string]string) error {
	c.mu.Lock()
	spec, ok := c.desired[name]
	if ok {
		spec.Labels = maps.Clone(labels)
		c.desired[name] = spec
	}
	h := c.held[name]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", connection.ErrUnknownCluster, name)
	}
	if h == nil {
		return nil // its owner, elsewhere, reads the same source
	}
	return c.manager.SetLabels(ctx, name, labels)
}

// IsPull reports whether a cluster is in the inventory (collected in pull
// mode by some collector): edges may not claim it.
func (c *Collector) IsPull(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.desired[name]
	return ok
}

// Run takes and gives up clusters until ctx ends. It returns after the
// clusters this process owns have been released.
func (c *Collector) Run(ctx context.Context) error {
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	if c.ls != nil {
		stop, err := c.watchLeases(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	t := time.NewTicker(leaseRetry)
	defer t.Stop()
	for {
		if c.ls != nil {
			c.reconcileLeases(ctx)
		} else {
			c.reconcileStatic(ctx)
		}
		select {
		case <-ctx.Done():
			c.mu.Lock()
			c.stopping = true
			c.mu.Unlock()
			c.wg.Wait()
			c.releaseAll()
			return nil
		case <-t.C:
		case <-c.kick:
		}
	}
}

// watchLeases starts the informer that keeps the lease cache, and waits
// for its first list. stop ends it.
func (c *Collector) watchLeases(ctx context.Context) (stop func(), err error) {
	f := informers.NewSharedInformerFactoryWithOptions(c.ls.client, 0, informers.WithNamespace(c.ls.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelLease }))
	informer := f.Coordination().V1().Leases().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.wake() },
		UpdateFunc: func(any, any) { c.wake() },
		DeleteFunc: func(any) { c.wake() },
	}); err != nil {
		return nil, fmt.Errorf("replication: watch leases: %w", err)
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		f.Shutdown()
		return nil, ctx.Err()
	}
	c.mu.Lock()
	c.cached = informer.GetStore()
	c.mu.Unlock()
	return f.Shutdown, nil
}

// reconcileStatic takes every cluster of the inventory and gives up those
// that left it: the one-collector case.
func (c *Collector) reconcileStatic(ctx context.Context) {
	c.mu.Lock()
	var take, drop []string
	for name := range c.desired {
		if c.held[name] == nil {
			take = append(take, name)
		}
	}
	for name, h := range c.held {
		if _, ok := c.desired[name]; !ok && h.mode == modePull {
			drop = append(drop, name)
		}
	}
	c.mu.Unlock()
	for _, name := range take {
		c.async(name, func() { c.takeStatic(ctx, name, modePull) })
	}
	for _, name := range drop {
		c.async(name, func() { c.removeCluster(ctx, name) })
	}
}

// async runs fn with the cluster's lock on a goroutine of its own, unless
// the cluster is busy already (the next round tries again).
func (c *Collector) async(cluster string, fn func()) {
	c.mu.Lock()
	l := c.locks[cluster]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[cluster] = l
	}
	c.mu.Unlock()
	if !l.TryLock() {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer l.Unlock()
		fn()
	}()
}

// takeStatic takes a cluster without a lease. The cluster lock is held.
func (c *Collector) takeStatic(ctx context.Context, name, mode string) {
	if c.isHeld(name) {
		return
	}
	if err := c.take(ctx, name, mode, nil, ""); err != nil && ctx.Err() == nil {
		c.log.Error("taking a cluster failed; trying again", "cluster", name, "err", err)
	}
}

func (c *Collector) isHeld(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[name] != nil
}

// take makes this process the owner of a cluster whose lease (l, nil
// without leases) it has just won, and starts collecting it. failover is
// the reason to mark it DISCONNECTED if its previous owner left it live;
// "" for a first owner or a handed-over cluster. The cluster lock is held.
func (c *Collector) take(ctx context.Context, name, mode string, l *clusterLease, failover string) error {
	var gen int32
	var obj *coordinationv1.Lease
	if l != nil {
		gen, obj = l.generation, l.obj
	}
	tk, err := c.node.Acquire(ctx, name, uint64(max(gen, 0)))
	if err != nil {
		if l != nil { // let another try
			_, _ = c.ls.updateCluster(context.WithoutCancel(ctx), obj, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
		}
		return err
	}
	if failover == "" && l == nil && tk.Previous != "" && tk.Previous != c.incarnation {
		failover = fmt.Sprintf("fleetgraph %s restarted; it resyncs the cluster", collectorOf(tk.Previous))
	}
	reason := "first"
	switch {
	case failover != "":
		reason = "failover"
	case tk.Previous != "":
		reason = "handover"
	}
	if failover != "" && tk.Row != nil && !tk.Row.Stale() {
		row := *tk.Row
		row.State, row.Since, row.LastError = index.StateDisconnected, time.Now(), failover
		if err := c.node.UpsertCluster(ctx, row); err != nil {
			c.log.Error("marking a taken-over cluster stale", "cluster", name, "err", err)
		}
	}
	h := &held{mode: mode, generation: gen, lease: obj}
	h.detail = c.node.serveDetails(name, c.leaf)
	c.mu.Lock()
	spec, desired := c.desired[name]
	c.held[name] = h
	c.mu.Unlock()
	c.metrics.takeovers.WithLabelValues(reason).Inc()
	c.metrics.owned.WithLabelValues(name, mode).Set(1)
	c.log.Info("collecting a cluster", "cluster", name, "mode", mode, "epoch", tk.Epoch, "lease", gen, "previous", tk.Previous, "why", reason)
	if mode == modePull && desired {
		if err := c.manager.Add(spec); err != nil {
			c.log.Error("starting a taken-over cluster", "cluster", name, "err", err)
		}
	}
	return nil
}

// drop stops collecting a cluster this process owned and no longer does
// (released, handed over, lost): its writes, if any still come, are
// dropped by the Node. A push cluster's edge session has ended when drop
// returns (Hub.Disown). The cluster lock is held.
func (c *Collector) drop(ctx context.Context, name string, why string) {
	if c.stop(ctx, name, why) == modePush {
		if hub := c.edgeHub(); hub != nil {
			hub.Disown(name, why)
		}
	}
}

// stop is drop but for ending a push cluster's edge session, which is the
// caller's (Hub.Disown or DisownAll) while it still holds the cluster
// lock. It returns the cluster's mode, "" if it was not held.
func (c *Collector) stop(ctx context.Context, name string, why string) (mode string) {
	c.mu.Lock()
	h := c.held[name]
	delete(c.held, name)
	c.mu.Unlock()
	if h == nil {
		return ""
	}
	if err := c.node.Release(ctx, name); err != nil && !errors.Is(err, ErrNotOwner) && !errors.Is(err, ErrTakenOver) {
		c.log.Warn("releasing a cluster", "cluster", name, "err", err)
	}
	h.detail()
	if h.mode == modePull {
		// The Node no longer owns the cluster, so the Manager's removal
		// of its rows goes nowhere.
		if err := c.manager.Remove(ctx, name); err != nil && !errors.Is(err, connection.ErrUnknownCluster) {
			c.log.Warn("stopping a cluster", "cluster", name, "err", err)
		}
	}
	c.metrics.owned.DeleteLabelValues(name, h.mode)
	c.log.Info("stopped collecting a cluster", "cluster", name, "why", why)
	return h.mode
}

func (c *Collector) edgeHub() *edge.Hub {
	c.hubMu.Lock()
	defer c.hubMu.Unlock()
	return c.hub
}

// leaf is where detail requests for owned clusters go: the hub (which
// hands pull clusters to the manager) or the manager.
func (c *Collector) leaf(cluster string) (*rest.Config, error) {
	if hub := c.edgeHub(); hub != nil {
		return hub.RESTConfig(cluster)
	}
	return c.manager.RESTConfig(cluster)
}

// removeCluster removes a cluster that left the inventory: its rows from
// every replica, and its lease. The cluster lock is held.
func (c *Collector) removeCluster(ctx context.Context, name string) {
	c.mu.Lock()
	h := c.held[name]
	c.mu.Unlock()
	if h == nil {
		return
	}
	// While the Node still owns it, the Manager's removal is published.
	if err := c.manager.Remove(ctx, name); err != nil && !errors.Is(err, connection.ErrUnknownCluster) {
		c.log.Warn("removing a cluster", "cluster", name, "err", err)
	}
	c.drop(ctx, name, "removed from the inventory")
	if c.ls != nil && h.lease != nil {
		if err := c.ls.deleteCluster(ctx, h.lease); err != nil {
			c.log.Warn("deleting the lease of a removed cluster", "cluster", name, "err", err)
		}
	}
}

// releaseAll gives up every cluster at shutdown: queued writes are
// published, and with leases the clusters are released so that the
// other collectors take them at once instead of after the lease expires.
// Its deadline bounds the Node's publishing and the lease writes, which
// go first for every cluster; then the push clusters' edge sessions are
// ended all at once and waited for (Hub.DisownAll), so that stalled edges
// cost one session's end (the hub cuts a disowned connection off after
// 3 s), not one each, and no cluster's release waits behind another's
// session. That wait is not cut
// at the deadline: every cluster lock is held until it returns, so no
// edge claims a cluster here again before its old session ended; Hub.Run
// waits for the same sessions anyway.
func (c *Collector) releaseAll() {
	c.mu.Lock()
	names := slices.Collect(maps.Keys(c.held))
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var push []string
	for _, name := range names {
		l := c.lock(name)
		defer l.Unlock() // after the sessions ended
		c.mu.Lock()
		h := c.held[name]
		c.mu.Unlock()
		if c.stop(ctx, name, "shutting down") == modePush {
			push = append(push, name)
		}
		if c.ls != nil && h != nil && h.lease != nil {
			if _, err := c.ls.updateCluster(ctx, h.lease, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }); err != nil {
				c.log.Warn("releasing a lease at shutdown", "cluster", name, "err", err)
			}
		}
	}
	if hub := c.edgeHub(); hub != nil {
		hub.DisownAll(push, "shutting down")
	}
}

// OnLost is the Node's OnLost: another owner took a cluster over.
func (c *Collector) OnLost(cluster string, err error) {
	l := c.lock(cluster)
	defer l.Unlock()
	c.mu.Lock()
	ctx := c.ctx
	c.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	c.drop(ctx, cluster, err.Error())
	c.metrics.lost.Inc()
}

// collectorOf returns the collector ID of an incarnation ("id/suffix").
func collectorOf(incarnation string) string {
	if i := strings.LastIndexByte(incarnation, '/'); i > 0 {
		return incarnation[:i]
	}
	return incarnation
}

// assign spreads clusters over collectors (IDs): rendezvous hashing with
// bounded load. Each cluster goes to the collector that ranks highest for
// it among those with fewer than ceil(clusters/collectors); so every
// collector computes the same assignment from the same inputs, loads
// differ by at most one, and a collector joining or leaving moves few
// clusters.
func assign(clusters, collectors []string) map[string]string {
	out := make(map[string]string, len(clusters))
	if len(collectors) == 0 {
		return out
	}
	clusters = slices.Sorted(slices.Values(clusters))
	limit := (len(clusters) + len(collectors) - 1) / len(collectors)
	load := map[string]int{}
	for _, cl := range clusters {
		best, bestScore := "", uint64(0)
		for _, co := range collectors {
			if load[co] >= limit {
				continue
			}
			h := fnv.New64a()
			_, _ = h.Write([]byte(cl))
			_, _ = h.Write([]byte{0})
			_, _ = h.Write([]byte(co))
			if s := h.Sum64(); best == "" || s > bestScore || (s == bestScore && co < best) {
				best, bestScore = co, s
			}
		}
		out[cl] = best
		load[best]++
	}
	return out
}
