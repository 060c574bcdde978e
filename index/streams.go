package index

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// Streams deliver changes to one viewer, filtered and access-checked the
// way queries are, resumable from a sequence number, without ever making
// the writer or the fan-out wait for a slow reader (see fanout). Each
// stream is read by one goroutine through Next, which blocks until the
// next change; End may be called from any goroutine to make Next return an
// error, and Close releases the stream once its reader is done.
//
// The viewer's access is a function (for fleetgraph,
// authz.Authorizer.Access for the viewer), not a value: a stream asks for
// it when it starts and again whenever a cluster's RBAC or kinds change
// (EventPolicy), so a grant or a revocation applies to open streams from
// the next change on, within the time it takes the reader to reach the
// policy event.

// AccessFunc returns a viewer's current access. Streams call it at start
// and after every policy change of a cluster, so it must be cheap when
// nothing changed (authz.Authorizer.Access is a cached lookup).
type AccessFunc func() *Access

// ObjectChangesRequest asks for the object changes one viewer may see.
type ObjectChangesRequest struct {
	// Filter selects objects, as in Query. Changes are shown through it:
	// an object that starts matching is ADDED, one that stops matching is
	// DELETED.
	Filter Filter
	// After is the sequence number to deliver changes after: Page.Seq to
	// follow a query, ObjectChange.Seq to resume, LastSeq for from now.
	After uint64
	// Access is the viewer's access; nil sees nothing.
	Access AccessFunc
	// Buffer is how many routed events may wait before the stream catches
	// up from the replay buffer instead; 0 means DefaultStreamBuffer.
	Buffer int
}

// ObjectChange is one change as the viewer sees it.
type ObjectChange struct {
	// Type is EventAdded, EventModified or EventDeleted, through the
	// filter (see ObjectChangesRequest.Filter).
	Type EventType
	// Object is the object's new state (for EventDeleted, its last
	// state). It is shared; do not mutate it.
	Object *Object
	// Stale is true when the object's cluster is stale (Cluster.Stale).
	Stale bool
	// Seq resumes the stream after this change.
	Seq uint64
}

// stream is what the stream types share: the fan-out's subscriber and
// the events it handed out that the reader has not looked at yet.
type stream struct {
	sub     *sub
	pending []*Event
}

// End makes Next return err. It may be called from any goroutine.
func (st *stream) End(err error) { st.sub.end(err) }

// Close releases the stream; call it from the reader's goroutine, after
// its last Next.
func (st *stream) Close() { st.sub.close() }

// nextChange hands the stream's events to handle, in order, until handle
// returns a change, waiting for events as needed.
func nextChange[C any](ctx context.Context, st *stream, handle func(*Event) (C, bool)) (C, error) {
	for {
		for len(st.pending) > 0 {
			ev := st.pending[0]
			st.pending = st.pending[1:]
			if c, ok := handle(ev); ok {
				return c, nil
			}
		}
		evs, err := st.sub.next(ctx)
		if err != nil {
			var zero C
			return zero, err
		}
		st.pending = evs
	}
}

// ObjectStream delivers ObjectChanges.
type ObjectStream struct {
	stream
	s       *Store
	filter  Filter
	access  AccessFunc
	matcher *Matcher
	// clusters are the cluster rows the reader read last, for the
	// staleness of each change: a read transaction per change and
	// subscriber was a tenth of the server's CPU per delivery on
	// bench-graph's fan-out; a row is read again once its watch fires.
	clusters map[string]clusterRow
}

// clusterRow is a cluster's row as a stream read it, current until changed
// is closed.
type clusterRow struct {
	c       *Cluster
	changed <-chan struct{}
}

// cluster returns a cluster's current row, or nil.
func (st *ObjectStream) cluster(name string) *Cluster {
	if r, ok := st.clusters[name]; ok {
		select {
		case <-r.changed:
		default:
			return r.c
		}
	}
	c, changed := st.s.clusterWatch(name)
	if changed != nil {
		if st.clusters == nil {
			st.clusters = map[string]clusterRow{}
		}
		st.clusters[name] = clusterRow{c: c, changed: changed}
	}
	return c
}

// ObjectChanges starts a stream of the object changes after req.After that
// the viewer may see through req.Filter. It fails with ErrInvalidQuery
// (wrapped) for an invalid filter or a position ahead of the feed; a
// position the replay buffer no longer holds makes the first Next fail
// with ErrResyncRequired.
func (s *Store) ObjectChanges(req ObjectChangesRequest) (*ObjectStream, error) {
	if _, err := s.NewMatcher(req.Filter, nil); err != nil {
		return nil, err
	}
	if last := s.LastSeq(); req.After > last {
		return nil, fmt.Errorf("%w: change position %d is ahead of the change feed (%d)", ErrInvalidQuery, req.After, last)
	}
	if req.Access == nil {
		req.Access = func() *Access { return nil }
	}
	// The access is read after the caller read After: a policy change
	// since then is replayed or routed to the stream, which reads the
	// access again then.
	acc := req.Access()
	sb, err := s.fan.register(StreamObjects, bufferOf(req.Buffer), acc != nil && acc.All, req.After)
	if err != nil {
		return nil, err
	}
	st := &ObjectStream{stream: stream{sub: sb}, s: s, filter: req.Filter, access: req.Access}
	st.resetAccess(acc)
	// The stream is in the firehose until its routes are set, so nothing
	// is lost meanwhile.
	s.fan.setInterests(sb, st.interests(), sb.from)
	return st, nil
}

func bufferOf(n int) int {
	if n <= 0 {
		return DefaultStreamBuffer
	}
	return n
}

// Next returns the next change the viewer may see, waiting for it. It
// returns ctx.Err() when ctx ends, ErrResyncRequired (wrapped) when the
// stream started from a position that is gone or the fan-out fell behind,
// ErrSlowConsumer (wrapped) when the reader fell out of the replay buffer,
// and the error given to End.
func (st *ObjectStream) Next(ctx context.Context) (ObjectChange, error) {
	return nextChange(ctx, &st.stream, st.handle)
}

// handle turns one event into the viewer's change, or re-reads the access
// on a policy event.
func (st *ObjectStream) handle(ev *Event) (ObjectChange, bool) {
	if ev.Type == EventPolicy {
		st.policyChanged(ev)
		return ObjectChange{}, false
	}
	t, ok := st.matcher.Classify(ev)
	if !ok {
		return ObjectChange{}, false
	}
	o := ev.Object()
	c := st.cluster(o.Cluster)
	return ObjectChange{Type: t, Object: o, Stale: c != nil && c.Stale(), Seq: ev.Seq}, true
}

// resetAccess installs the viewer's access.
func (st *ObjectStream) resetAccess(a *Access) {
	m, err := st.s.NewMatcher(st.filter, a)
	if err != nil {
		panic(fmt.Sprintf("index: a filter that compiled failed to compile again: %v", err))
	}
	st.matcher = m
}

// policyChanged re-evaluates access after a cluster's policy changed:
// revoked objects stop streaming from the next event on, newly granted ones
// start, and the cluster's route follows.
func (st *ObjectStream) policyChanged(ev *Event) {
	if st.sub.all {
		return
	}
	st.resetAccess(st.access())
	st.s.fan.setInterest(st.sub, ev.Cluster, interestIn(st.filter, ev.Cluster, st.matcher.access.clusterAccess(ev.Cluster)), ev.Seq)
}

// interests returns the routes for the current access.
func (st *ObjectStream) interests() map[string]interest {
	out := map[string]interest{}
	a := st.matcher.access
	if a == nil {
		return out
	}
	for c, ca := range a.Clusters {
		if in := interestIn(st.filter, c, ca); in.whole || len(in.namespaces) > 0 {
			out[c] = in
		}
	}
	return out
}

// clusterAccess returns the part of a for one cluster.
func (a *Access) clusterAccess(cluster string) *ClusterAccess {
	if a == nil {
		return nil
	}
	return a.Clusters[cluster]
}

// interestIn says which object events of a cluster can pass a filter and a
// cluster access: the whole cluster, some namespaces, or none. A name
// granted in any namespace (a Named entry without a namespace) may be in
// every namespace, so it routes the whole cluster.
func interestIn(f Filter, cluster string, ca *ClusterAccess) interest {
	if ca.Empty() || (len(f.Clusters) > 0 && !slices.Contains(f.Clusters, cluster)) {
		return interest{}
	}
	anyNS := ca.All || ca.Everywhere.Len() > 0
	for n := range ca.Named {
		anyNS = anyNS || n.Namespace == ""
	}
	if anyNS {
		if len(f.Namespaces) > 0 {
			// Once each: a namespace named twice must not route twice.
			return interest{namespaces: slices.Compact(slices.Sorted(slices.Values(f.Namespaces)))}
		}
		return interest{whole: true}
	}
	set := map[string]struct{}{}
	for ns := range ca.Namespaces {
		set[ns] = struct{}{}
	}
	for n := range ca.Named {
		set[n.Namespace] = struct{}{}
	}
	if len(f.Namespaces) > 0 {
		for ns := range set {
			if !slices.Contains(f.Namespaces, ns) {
				delete(set, ns)
			}
		}
	}
	return interest{namespaces: slices.Sorted(maps.Keys(set))}
}

// ClusterChangesRequest asks for the connection transitions of the
// clusters one viewer may see.
type ClusterChangesRequest struct {
	// Clusters limits the stream to these clusters; empty means all.
	Clusters []string
	// Access is the viewer's access; a cluster is shown when
	// Access.SeesCluster says so at the time of its transition.
	Access AccessFunc
	// Buffer is as in ObjectChangesRequest.
	Buffer int
}

// ClusterChange is one connection state transition of a cluster, or a new
// cluster: a row that changed only its lastSeen, labels or error within
// one state is not one. An empty State reads as StateConnecting.
type ClusterChange struct {
	// Cluster is the new row, Previous the one it replaced (nil for a new
	// cluster). They are shared; do not mutate them.
	Cluster, Previous *Cluster
	Seq               uint64
}

// ClusterStream delivers ClusterChanges.
type ClusterStream struct {
	stream
	only   []string
	access AccessFunc
}

// ClusterChanges starts a stream of the cluster transitions from now on.
func (s *Store) ClusterChanges(req ClusterChangesRequest) (*ClusterStream, error) {
	if req.Access == nil {
		req.Access = func() *Access { return nil }
	}
	sb, err := s.fan.register(StreamClusters, bufferOf(req.Buffer), false, s.LastSeq())
	if err != nil {
		return nil, err
	}
	return &ClusterStream{stream: stream{sub: sb}, only: slices.Clone(req.Clusters), access: req.Access}, nil
}

// Next returns the next transition, waiting for it; errors are as for
// ObjectStream.Next.
func (st *ClusterStream) Next(ctx context.Context) (ClusterChange, error) {
	return nextChange(ctx, &st.stream, func(ev *Event) (ClusterChange, bool) {
		if !isTransition(ev) || (len(st.only) > 0 && !slices.Contains(st.only, ev.Cluster)) || !st.access().SeesCluster(ev.Cluster) {
			return ClusterChange{}, false
		}
		return ClusterChange{Cluster: ev.ClusterRow, Previous: ev.PreviousCluster, Seq: ev.Seq}, true
	})
}

// isTransition reports whether ev is a new cluster or a change of a
// cluster's connection state.
func isTransition(ev *Event) bool {
	if ev.Type != EventCluster || ev.ClusterRow == nil {
		return false
	}
	return ev.PreviousCluster == nil || ev.PreviousCluster.ConnectionState() != ev.ClusterRow.ConnectionState()
}

// ConnectionState returns the cluster's state, StateConnecting for a row
// written before its first probe (an empty State).
func (c *Cluster) ConnectionState() ConnectionState {
	if c.State == "" {
		return StateConnecting
	}
	return c.State
}

// FleetChangesRequest asks for the fleet status one viewer sees.
type FleetChangesRequest struct {
	// Access is the viewer's access; the status counts the clusters
	// Access.SeesCluster shows (Fleet).
	Access AccessFunc
}

// FleetStream delivers the fleet status: the current one first, then the
// status after every change that alters it. A status is a level, so a slow
// reader gets the latest, never a backlog.
type FleetStream struct {
	stream
	s      *Store
	access AccessFunc
	last   *FleetStatus
}

// FleetChanges starts a fleet status stream.
func (s *Store) FleetChanges(req FleetChangesRequest) (*FleetStream, error) {
	if req.Access == nil {
		req.Access = func() *Access { return nil }
	}
	sb, err := s.fan.register(StreamFleet, 0, false, s.LastSeq())
	if err != nil {
		return nil, err
	}
	return &FleetStream{stream: stream{sub: sb}, s: s, access: req.Access}, nil
}

// Next returns the current status the first time, then waits for a
// status different from the last one returned; errors are as for
// ObjectStream.Next.
func (st *FleetStream) Next(ctx context.Context) (FleetStatus, error) {
	for {
		cur := st.s.Fleet(st.access())
		if st.last == nil || cur != *st.last {
			st.last = &cur
			return cur, nil
		}
		select {
		case <-ctx.Done():
			return FleetStatus{}, ctx.Err()
		case <-st.sub.notify:
		}
		if _, _, _, err := st.sub.take(nil); err != nil {
			return FleetStatus{}, err
		}
	}
}
