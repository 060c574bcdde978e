package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetgraph/fleetgraph/connection/edge"
)

// suspect is a collector's lease that look found unchanged for a lease
// duration: the member, and its version and observed time then. confirm
// judges that, and skips a member another view saw change meanwhile.
type suspect struct {
	name     string
	m        *member
	rv       string
	observed time.Time
}

// view is the leases as one reconcile round sees them.
type view struct {
	now      time.Time
	clusters map[string]*clusterLease
	alive    map[string]string // live incarnation -> collector ID
	settled  map[string]bool   // collector IDs alive for at least a lease duration
	ids      []string          // live collector IDs, sorted
}

// renew writes this collector's lease when a third of its duration has
// passed since the last write.
func (c *Collector) renew(ctx context.Context, now time.Time) {
	c.mu.Lock()
	mine, renewed := c.mine, c.renewed
	if mine == nil && c.cached != nil {
		if obj, ok, _ := c.cached.GetByKey(c.ls.namespace + "/" + collectorLeaseName(c.id)); ok {
			mine = obj.(*coordinationv1.Lease)
		}
	}
	c.mu.Unlock()
	if now.Sub(renewed) < c.ls.duration/3 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, c.ls.callTimeout())
	defer cancel()
	l, err := c.ls.renewCollector(rctx, c.id, c.incarnation, mine)
	if err != nil {
		if !errors.Is(err, errLeaseTaken) {
			c.log.Warn("renewing the collector's lease failed", "err", err)
		}
		c.mu.Lock()
		c.mine = nil // read it again from the cache
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	c.mine, c.renewed = l, now
	c.mu.Unlock()
	c.metrics.renewals.Inc()
}

// view works out which collectors are alive, from the lease cache (look),
// and judges none dead on the cache's word alone: a collector whose lease
// the cache has shown unchanged for a lease duration is a suspect, and
// the leases are read from the API server to confirm it (confirm). The
// cache can be behind the API server by any time (its watch stalled, or
// this process was paused: SIGSTOP, a VM migration), and then it shows a
// live collector's lease as it was before; its renewals made meanwhile
// arrive later. Without a confirmed verdict, this process took a live
// collector's clusters the moment it resumed from a pause.
//
// Run's goroutine and Claim handlers both call view. One confirm runs at a
// time, and it judges the suspects of a look made under the same lock: a
// view waiting for another's confirm looks again, and finds the suspects
// that one judged.
//
// When the read fails, view returns the cache's view, with the suspects
// counted alive (the safe answer), and the error.
func (c *Collector) view(ctx context.Context) (*view, error) {
	v, suspects := c.look()
	if len(suspects) == 0 || v.alive[c.incarnation] == "" {
		return v, nil // without a live lease of its own, it takes nothing anyway
	}
	c.confirming.Lock()
	defer c.confirming.Unlock()
	if v, suspects = c.look(); len(suspects) == 0 {
		return v, nil
	}
	if err := c.confirm(ctx, suspects); err != nil {
		return v, err
	}
	v, _ = c.look()
	return v, nil
}

// look reads the leases from the cache and works out which collectors are
// alive: a collector's lease is alive while the cache showed it change
// (on this process's clock) less than a lease duration ago. One older than
// that is dead once a read confirmed it, and a suspect (returned, and
// counted alive) until then. A verdict holds for the version and time it
// judged: it is cleared whenever observed moves forward.
//
// The clock is read after the cache: a version the cache shows now reached
// it at that time or before, so the time is a safe start of the interval
// the version stays unchanged (client-go's leaderelection stamps its
// observedTime after the read in the same way). A time read before the
// cache, and a pause or a slow call in between, would date a fresh
// renewal back and judge a live collector dead.
func (c *Collector) look() (v *view, suspects []suspect) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	var cached []any
	if c.cached != nil {
		cached = c.cached.List()
	}
	now := c.clock.Now()
	v = &view{now: now, clusters: map[string]*clusterLease{}, alive: map[string]string{}, settled: map[string]bool{}}
	for _, obj := range cached {
		l := obj.(*coordinationv1.Lease)
		switch l.Labels[labelLease] {
		case leaseCluster:
			if cl, ok := parseClusterLease(l); ok {
				v.clusters[cl.cluster] = cl
			}
		case leaseCollector:
			seen[l.Name] = true
			holder := ptr.Deref(l.Spec.HolderIdentity, "")
			m := c.members[l.Name]
			if m == nil || m.rv != l.ResourceVersion {
				if m == nil || m.holder != holder {
					m = &member{id: l.Annotations[annCollector], holder: holder, firstSeen: now}
					c.members[l.Name] = m
				}
				observed := now
				if l.ResourceVersion == m.readRV {
					// A read showed this version first: it is as old as that.
					observed = m.readAt
				}
				if observed.After(m.observed) {
					m.dead = false
				}
				m.rv, m.observed = l.ResourceVersion, observed
			}
		}
	}
	for name, m := range c.members {
		if !seen[name] {
			delete(c.members, name)
			continue
		}
		if m.holder == c.incarnation || m.id == "" {
			continue
		}
		if now.Sub(m.observed) >= c.ls.duration {
			if m.dead {
				continue
			}
			suspects = append(suspects, suspect{name: name, m: m, rv: m.rv, observed: m.observed})
		}
		v.alive[m.holder] = m.id
		v.settled[m.id] = now.Sub(m.firstSeen) >= c.ls.duration
	}
	// This collector is alive while its own writes are recent: it does
	// not wait for its cache to show them.
	if now.Sub(c.renewed) < c.ls.duration {
		v.alive[c.incarnation] = c.id
		v.settled[c.id] = true
	}
	for _, id := range v.alive {
		if !slices.Contains(v.ids, id) {
			v.ids = append(v.ids, id)
		}
	}
	slices.Sort(v.ids)
	return v, suspects
}

// confirm reads each suspect's lease from the API server (a Get: one key,
// where a list of the namespace would read every cluster's lease too) and
// judges it: a collector is dead when its lease is gone or names another
// incarnation, when the read shows the very version the cache showed a
// lease duration ago, or when reads a lease duration apart show the same
// version (the cache is behind, and the collector stopped renewing
// since). A read that shows a version the cache has not (yet) is a
// renewal: the collector is alive, whatever the cache says. A suspect
// whose read fails, and the ones after it, stay alive.
//
// Every time is on this process's monotonic clock. before is taken before
// the request and ends an interval: what the read shows was still current
// at before or later, so a version unchanged from observed (or readAt) to
// before was not renewed for at least that long, however long this
// process was stopped in between. after is taken when the answer is in and
// starts one: a version the read shows was written before after, so
// readAt = after never dates a renewal back.
func (c *Collector) confirm(ctx context.Context, suspects []suspect) error {
	ctx, cancel := context.WithTimeout(ctx, c.ls.callTimeout())
	defer cancel()
	for _, s := range suspects {
		before := c.clock.Now()
		l, err := c.ls.getCollector(ctx, s.m.id) // id is set once, with the member
		if err != nil {
			return err
		}
		c.judge(s, l, before, c.clock.Now())
	}
	return nil
}

// judge records what a read of a suspect's lease (l, nil if there is none)
// between before and after shows; see confirm. It skips a member that the
// cache showed change (or another holder) since look.
func (c *Collector) judge(s suspect, l *coordinationv1.Lease, before, after time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := s.m
	if c.members[s.name] != m || m.rv != s.rv || !m.observed.Equal(s.observed) || m.dead {
		return
	}
	switch {
	case l == nil, ptr.Deref(l.Spec.HolderIdentity, "") != m.holder:
		m.dead = true
	case l.ResourceVersion == m.rv:
		m.dead = before.Sub(m.observed) >= c.ls.duration
	case l.ResourceVersion != m.readRV:
		m.readRV, m.readAt = l.ResourceVersion, after
		c.metrics.checks.WithLabelValues("alive").Inc()
		c.log.Info("the lease cache is behind: a collector it shows unchanged renewed its lease", "collector", m.id, "incarnation", m.holder)
	case before.Sub(m.readAt) >= c.ls.duration:
		m.dead = true
	}
	if m.dead {
		c.metrics.checks.WithLabelValues("dead").Inc()
		c.log.Info("a collector stopped renewing its lease", "collector", m.id, "incarnation", m.holder)
	}
}

// reconcileLeases is one round of the sharded case; see Collector.
func (c *Collector) reconcileLeases(ctx context.Context) {
	now := c.clock.Now()
	c.renew(ctx, now)
	v, err := c.view(ctx)
	if err != nil {
		// The suspects count as alive: the round goes on (drops,
		// handovers, releases), taking nothing from them.
		if now.Sub(c.confirmWarned) >= c.ls.duration {
			c.log.Warn("reading the collectors' leases to confirm one is dead; counting it alive", "err", err)
			c.confirmWarned = now
		}
	}
	if _, ok := v.alive[c.incarnation]; !ok {
		return // without a lease of its own, this collector takes nothing
	}
	c.mu.Lock()
	desired := make([]string, 0, len(c.desired))
	for name := range c.desired {
		desired = append(desired, name)
	}
	held := make(map[string]held, len(c.held))
	for name, h := range c.held {
		held[name] = *h
	}
	c.mu.Unlock()
	targets := assign(desired, v.ids)

	// Clusters another collector took.
	for name, h := range held {
		l := v.clusters[name]
		switch {
		case l != nil && l.generation < h.generation:
			// The cache has not seen this collector's own write yet.
		case l == nil || l.holder != c.incarnation:
			by := "its lease was deleted"
			if l != nil {
				by = "collector " + collectorOf(l.holder) + " took its lease"
			}
			c.async(name, func() { c.drop(ctx, name, by) })
		}
	}
	// Pull clusters: take the ones assigned here, hand over the others.
	// A lease naming this incarnation for a cluster it does not hold is
	// one it lost through the stream (fenced off: another owner wrote the
	// log) or could not take: nobody else takes a cluster whose lease
	// names a live collector, so it takes the cluster again (a new
	// generation) or, if the cluster is assigned elsewhere, releases it.
	for _, name := range desired {
		l, h, t := v.clusters[name], held[name], targets[name]
		switch {
		case h.mode == "" && t != c.id && l != nil && l.holder == c.incarnation:
			c.async(name, func() { c.releaseLost(ctx, name, l) })
		case h.mode == "" && t == c.id:
			failover := ""
			switch {
			case l == nil, l.holder == "", l.holder == c.incarnation:
			case v.alive[l.holder] == "":
				failover = fmt.Sprintf("collector %s stopped renewing its lease; collector %s took the cluster over and resyncs it", collectorOf(l.holder), c.id)
			default:
				continue // its live owner hands it over
			}
			c.async(name, func() { c.takeLeased(ctx, name, modePull, l, failover, nil) })
		case h.mode == modePull && t != c.id && t != "" && v.settled[t]:
			c.async(name, func() { c.handOver(ctx, name, t) })
		}
	}
	for name, h := range held {
		if h.mode == modePull && !slices.Contains(desired, name) {
			c.async(name, func() { c.removeCluster(ctx, name) })
		}
	}
	c.reconcilePush(ctx, v, held)
}

// reconcilePush looks after push clusters: one whose edge stayed away
// past the grace period is released, so any replica may take its next
// edge; one whose holder died is adopted by one live collector, which
// marks it DISCONNECTED (its edge's session died with the collector) and
// keeps the grace period for its instance.
func (c *Collector) reconcilePush(ctx context.Context, v *view, held map[string]held) {
	var orphans []string
	for name, l := range v.clusters {
		if l.mode != modePush {
			continue
		}
		h, ours := held[name]
		switch {
		case ours && !l.released.IsZero() && v.now.After(l.released.Add(c.opts.Leases.Grace)) && !c.edgeConnected(name):
			c.async(name, func() { c.releasePush(ctx, name, h.lease) })
		case !ours && l.holder != "" && v.alive[l.holder] == "":
			orphans = append(orphans, name)
		}
	}
	for name, t := range assign(orphans, v.ids) {
		if t != c.id {
			continue
		}
		l := v.clusters[name]
		failover := fmt.Sprintf("collector %s, which held the edge's session, stopped renewing its lease; waiting for the edge to reconnect", collectorOf(l.holder))
		c.async(name, func() {
			released := time.Now()
			c.takeLeased(ctx, name, modePush, l, failover, &released)
		})
	}
}

// takeLeased wins a cluster's lease (l is the lease as read, nil when
// there is none) and takes the cluster over. released, for an adopted
// push cluster, starts its edge's grace period. The cluster lock is held.
func (c *Collector) takeLeased(ctx context.Context, name, mode string, l *clusterLease, failover string, released *time.Time) {
	if c.isHeld(name) {
		return
	}
	var cur *coordinationv1.Lease
	if l != nil {
		cur = l.obj
	}
	won, err := c.ls.acquireCluster(ctx, name, c.incarnation, cur, func(ann map[string]string) {
		ann[annMode] = mode
		if released != nil {
			ann[annReleased] = released.UTC().Format(time.RFC3339Nano)
		}
	})
	if err != nil {
		if !errors.Is(err, errLeaseTaken) && ctx.Err() == nil {
			c.log.Warn("acquiring a cluster's lease", "cluster", name, "err", err)
		}
		return
	}
	if err := c.take(ctx, name, mode, won, failover); err != nil && ctx.Err() == nil {
		c.log.Error("taking a cluster over failed; its lease is released", "cluster", name, "err", err)
	}
}

// handOver gives a cluster to the collector it is assigned to: stop
// collecting, publish what is queued, release the lease. The cluster lock
// is held.
func (c *Collector) handOver(ctx context.Context, name, to string) {
	c.mu.Lock()
	h := c.held[name]
	c.mu.Unlock()
	if h == nil {
		return
	}
	c.drop(ctx, name, "handed over to collector "+to)
	if _, err := c.ls.updateCluster(ctx, h.lease, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }); err != nil {
		c.log.Warn("releasing a handed-over cluster's lease", "cluster", name, "err", err)
	}
}

// releaseLost releases the lease of a cluster this collector does not
// hold (lost) and that is assigned to another collector. The cluster lock
// is held.
func (c *Collector) releaseLost(ctx context.Context, name string, l *clusterLease) {
	if c.isHeld(name) {
		return
	}
	_, err := c.ls.updateCluster(ctx, l.obj, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil })
	if err != nil && !errors.Is(err, errLeaseTaken) && ctx.Err() == nil {
		c.log.Warn("releasing the lease of a lost cluster", "cluster", name, "err", err)
	}
}

// releasePush releases a push cluster whose edge stayed away past its
// grace period. Its rows stay, stale, until an edge claims it again.
func (c *Collector) releasePush(ctx context.Context, name string, lease *coordinationv1.Lease) {
	if c.edgeConnected(name) {
		return
	}
	c.drop(ctx, name, "its edge stayed away past the grace period")
	if _, err := c.ls.updateCluster(ctx, lease, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }); err != nil {
		c.log.Warn("releasing a push cluster's lease", "cluster", name, "err", err)
	}
}

func (c *Collector) edgeConnected(name string) bool {
	hub := c.edgeHub()
	return hub != nil && slices.Contains(hub.Connected(), name)
}

// Claim implements edge.Claims: the one-edge-per-cluster rule across every
// replica. A cluster held here is the Hub's own business; otherwise the
// cluster's lease decides: it is free, released, held by a dead collector,
// or held elsewhere for this very edge instance (the edge moved to this
// replica), and then this collector takes the cluster over; or another
// instance's edge is connected, or within its grace period, elsewhere,
// and the edge is refused as it would be by one Hub.
func (c *Collector) Claim(ctx context.Context, cluster, instance string) error {
	lk := c.lock(cluster)
	defer lk.Unlock()
	c.mu.Lock()
	h, renewed := c.held[cluster], c.renewed
	c.mu.Unlock()
	if c.ls == nil {
		if h == nil {
			if err := c.take(ctx, cluster, modePush, nil, ""); err != nil {
				return retryLater("taking the cluster over: %v", err)
			}
		}
		return nil
	}
	if h != nil {
		c.noteEdge(ctx, cluster, instance, time.Time{})
		return nil
	}
	// A collector takes nothing without a live lease of its own (as in
	// reconcileLeases): before its first renewal, a cluster lease it won
	// would name a holder the others see as dead, and one of them would
	// adopt the cluster at once; its lease cache would not be synced yet
	// either, so every other holder would look dead to it.
	if c.clock.Since(renewed) >= c.ls.duration {
		return retryLater("collector %s has no live lease of its own yet", c.id)
	}
	cur, err := c.ls.getCluster(ctx, cluster)
	if err != nil {
		return retryLater("%v", err)
	}
	now := c.clock.Now()
	failover := ""
	var obj *coordinationv1.Lease
	if cur != nil {
		obj = cur.obj
		dead := false
		if cur.holder != "" && cur.holder != c.incarnation {
			if dead, err = c.isDead(ctx, cur.holder); err != nil {
				return retryLater("%v", err)
			}
		}
		owner := collectorOf(cur.holder)
		switch {
		case cur.holder == "" || cur.holder == c.incarnation:
		case dead:
			failover = fmt.Sprintf("collector %s, which held the edge's session, stopped renewing its lease; the edge reconnected to collector %s", owner, c.id)
		case cur.mode == modePull:
			return &edge.Reject{Reason: edge.ReasonInvalid, Message: fmt.Sprintf("cluster %q is collected in pull mode by collector %s", cluster, owner)}
		case cur.instance == instance:
			// The edge moved to this replica: take the cluster from the
			// one it left.
		case cur.released.IsZero():
			return &edge.Reject{Reason: edge.ReasonAlreadyClaimed, Message: fmt.Sprintf("cluster %q is claimed by edge instance %q (at collector %s)", cluster, cur.instance, owner)}
		case now.Before(cur.released.Add(c.opts.Leases.Grace)):
			left := cur.released.Add(c.opts.Leases.Grace).Sub(now)
			return &edge.Reject{
				Reason:           edge.ReasonGracePeriod,
				Message:          fmt.Sprintf("cluster %q is reserved for edge instance %q for %s after its disconnect", cluster, cur.instance, left.Round(time.Second)),
				RetryAfterMillis: left.Milliseconds(),
			}
		}
	}
	won, err := c.ls.acquireCluster(ctx, cluster, c.incarnation, obj, func(ann map[string]string) {
		ann[annMode], ann[annInstance] = modePush, instance
		delete(ann, annReleased)
	})
	if err != nil {
		return retryLater("%v", err)
	}
	if err := c.take(ctx, cluster, modePush, won, failover); err != nil {
		return retryLater("taking the cluster over: %v", err)
	}
	return nil
}

// Released implements edge.Claims: the edge's session ended. The lease
// records when, so that every replica keeps the grace period.
func (c *Collector) Released(cluster, instance string) {
	if c.ls == nil {
		return
	}
	released := time.Now()
	// The goroutine joins wg under mu, before Run stops (which it does
	// under mu, then waits): an Add racing Run's Wait is a data race, and
	// one after it a goroutine outliving Run.
	c.mu.Lock()
	ctx := c.ctx
	if ctx == nil || c.stopping {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		lk := c.lock(cluster)
		defer lk.Unlock()
		if !c.edgeConnected(cluster) { // not reclaimed meanwhile
			c.noteEdge(ctx, cluster, instance, released)
		}
	}()
}

// noteEdge records a held push cluster's edge instance and when it went
// away (zero: it is connected). The cluster lock is held.
func (c *Collector) noteEdge(ctx context.Context, cluster, instance string, released time.Time) {
	c.mu.Lock()
	h := c.held[cluster]
	c.mu.Unlock()
	if h == nil || h.lease == nil {
		return
	}
	ann := h.lease.Annotations
	want := ""
	if !released.IsZero() {
		want = released.UTC().Format(time.RFC3339Nano)
	}
	if ann[annInstance] == instance && ann[annReleased] == want {
		return
	}
	l, err := c.ls.updateCluster(ctx, h.lease, func(l *coordinationv1.Lease) {
		l.Annotations[annInstance] = instance
		if want == "" {
			delete(l.Annotations, annReleased)
		} else {
			l.Annotations[annReleased] = want
		}
	})
	if err != nil {
		c.log.Warn("recording the edge of a cluster in its lease", "cluster", cluster, "err", err)
		return
	}
	c.mu.Lock()
	if c.held[cluster] == h {
		h.lease = l.obj
	}
	c.mu.Unlock()
}

// isDead judges the holder of a cluster's lease read from the API server
// (not the cache). A holder the view does not count alive is checked
// against its collector lease, read too: the cache may not know the holder
// yet (alive if that lease names it), or the view may keep a verdict the
// cache has not caught up with, on a collector that resumed and renewed
// since (alive if its lease shows a version other than the ones judged).
// Claims are rare, and a read of the cluster's lease came first anyway.
func (c *Collector) isDead(ctx context.Context, holder string) (bool, error) {
	v, err := c.view(ctx)
	if err != nil {
		return false, err
	}
	if v.alive[holder] != "" {
		return false, nil
	}
	l, err := c.ls.getCollector(ctx, collectorOf(holder))
	if err != nil {
		return false, err
	}
	if l == nil || ptr.Deref(l.Spec.HolderIdentity, "") != holder {
		return true, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.holder == holder && m.dead && (l.ResourceVersion == m.rv || l.ResourceVersion == m.readRV) {
			return true, nil
		}
	}
	return false, nil
}

// retryLater refuses an edge for now, for a reason on the manager's side.
func retryLater(format string, args ...any) error {
	return &edge.Reject{Reason: edge.ReasonGracePeriod, Message: "the manager cannot claim the cluster now: " + fmt.Sprintf(format, args...), RetryAfterMillis: time.Second.Milliseconds()}
}
