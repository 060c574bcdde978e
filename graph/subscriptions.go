package graph

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// Subscriptions: each resolver validates its arguments synchronously (so a
// bad filter or cursor is an error on the subscribe message), registers a
// subscriber with the hub, and starts one pump goroutine that owns the
// returned channel. The pump is the only writer and closes the channel when
// the client completes the operation (ctx ends), when the hub ends it
// (shutdown, resync), or when the client is too slow (SLOW_CONSUMER). gqlgen
// keys operations by their websocket operation id and cancels ctx on the
// client's complete message; graph's websocket layer rejects a second
// operation with an id in use (4409).

// errNeedsWebsocket rejects subscriptions sent over plain HTTP.
func errNeedsWebsocket() error {
	return newError(CodeBadRequest, nil, "subscriptions need a websocket (graphql-transport-ws or graphql-ws) on /graphql")
}

// endWith records err as the subscription's final error. The pump calls it
// just before closing its channel; subscriptionEnd hands it to gqlgen when
// gqlgen sees the channel closed, on gqlgen's own goroutine, so the error
// is never written while gqlgen reads it.
func endWith(ctx context.Context, err error) {
	if op, ok := ctx.Value(operationKey{}).(*operation); ok {
		op.mu.Lock()
		op.endErr = err
		op.mu.Unlock()
	}
}

// subscriptionEnd is a gqlgen response interceptor that turns a pump's
// final error into the subscription's error message (instead of
// complete). It runs on the goroutine that sends the subscription's
// responses, which is also the one that reads the errors afterwards.
type subscriptionEnd struct{}

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
} = subscriptionEnd{}

// ExtensionName implements graphql.HandlerExtension.
func (subscriptionEnd) ExtensionName() string { return "fleetgraph.SubscriptionEnd" }

// Validate implements graphql.HandlerExtension.
func (subscriptionEnd) Validate(graphql.ExecutableSchema) error { return nil }

// InterceptResponse implements graphql.ResponseInterceptor.
func (subscriptionEnd) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp != nil || !isWebsocket(ctx) {
		return resp
	}
	if op, ok := ctx.Value(operationKey{}).(*operation); ok {
		op.mu.Lock()
		err := op.endErr
		op.mu.Unlock()
		if err != nil {
			transport.AddSubscriptionError(ctx, gqlError(err))
		}
	}
	return nil
}

// objectChanges answers Subscription.objectChanges.
func (s *service) objectChanges(ctx context.Context, filter *model.ObjectFilter, after *string) (<-chan *model.ObjectChangeEvent, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !isWebsocket(ctx) {
		return nil, errNeedsWebsocket()
	}
	f := toFilter(filter)
	if _, err := s.store.NewMatcher(f, nil); err != nil {
		return nil, indexError(err)
	}
	start := s.store.LastSeq()
	if after != nil {
		seq, err := s.decodeChangeCursor(*after)
		if err != nil {
			return nil, err
		}
		if seq > start {
			return nil, newError(CodeBadUserInput, nil, "change cursor is ahead of the change feed")
		}
		start = seq
	}
	sub := newSubscriber(subObjects, s.subBuffer, v.admin)
	from, err := s.hub.register(sub, start)
	if err != nil {
		return nil, err
	}
	p := &objectsPump{s: s, v: v, sub: sub, filter: f, out: make(chan *model.ObjectChangeEvent)}
	s.metrics.subscriptionStarted(subObjects)
	go p.run(ctx, start, from)
	return p.out, nil
}

// objectsPump turns routed events into the viewer's change events.
type objectsPump struct {
	s      *service
	v      *viewer
	sub    *subscriber
	filter index.Filter
	out    chan *model.ObjectChangeEvent

	access  *index.Access
	matcher *index.Matcher
}

// run is the pump goroutine; it owns and closes p.out.
func (p *objectsPump) run(ctx context.Context, after, from uint64) {
	reason := "completed"
	defer func() {
		close(p.out)
		p.s.hub.unregister(p.sub)
		p.s.metrics.subscriptionEnded(subObjects, reason)
	}()
	if err := p.resetAccess(); err != nil {
		reason = "error"
		endWith(ctx, err)
		return
	}
	p.s.hub.setInterests(p.sub, p.interests(), from)
	handle := func(ev *index.Event) bool { return p.handle(ctx, ev) }
	p.sub.last = after
	// The hub routes the events after from; the ones in between come
	// straight from the index's replay ring.
	if err := p.s.hub.catchUp(ctx, p.sub, after, from, handle); err != nil {
		reason = "resync"
		endWith(ctx, resyncError(err))
		return
	}
	if err := p.s.hub.drain(ctx, p.sub, handle); err != nil {
		reason = endReason(err)
		endWith(ctx, err)
	}
}

// resyncError maps a change feed position that is gone.
func resyncError(err error) error {
	if errors.Is(err, index.ErrResyncRequired) {
		return newError(CodeResyncRequired, err, "the change cursor is older than the server retains; query objects again and subscribe with its changesCursor")
	}
	return err
}

// handle delivers one event if the viewer sees it through the filter, or
// re-evaluates access on a policy event. It returns false when ctx ended.
func (p *objectsPump) handle(ctx context.Context, ev *index.Event) bool {
	if ev.Type == index.EventPolicy {
		p.policyChanged(ev)
		return true
	}
	t, ok := p.matcher.Classify(ev)
	if !ok {
		return true
	}
	o := ev.Object()
	change := &model.ObjectChangeEvent{
		Type:   model.ChangeType(t.String()),
		Object: toObject(o, p.s.clusterStale(o.Cluster)),
		Cursor: p.s.encodeChangeCursor(ev.Seq),
	}
	select {
	case p.out <- change:
		p.s.metrics.delivered(subObjects)
		return true
	case <-ctx.Done():
		return false
	}
}

// resetAccess computes the viewer's access in every cluster.
func (p *objectsPump) resetAccess() error {
	p.access = p.s.access(p.v)
	m, err := p.s.store.NewMatcher(p.filter, p.access)
	if err != nil {
		return indexError(err)
	}
	p.matcher = m
	return nil
}

// policyChanged re-evaluates access in one cluster: revoked objects stop
// streaming from the next event on, and newly granted ones start.
func (p *objectsPump) policyChanged(ev *index.Event) {
	if p.v.admin {
		return
	}
	next := p.s.access(p.v)
	m, err := p.s.store.NewMatcher(p.filter, next)
	if err != nil {
		// The filter compiled before; it cannot fail now.
		p.s.log.Error("graph: recompiling a subscription filter", "err", err)
		return
	}
	p.access, p.matcher = next, m
	p.s.hub.setInterest(p.sub, ev.Cluster, interestIn(p.filter, ev.Cluster, next.Clusters[ev.Cluster]), ev.Seq)
}

// interests returns the routes for the current access.
func (p *objectsPump) interests() map[string]interest {
	out := map[string]interest{}
	for c, ca := range p.access.Clusters {
		if in := interestIn(p.filter, c, ca); in.whole || len(in.namespaces) > 0 {
			out[c] = in
		}
	}
	return out
}

// interestIn says which object events of a cluster can pass a filter and a
// cluster access: the whole cluster, some namespaces, or none.
func interestIn(f index.Filter, cluster string, ca *index.ClusterAccess) interest {
	if ca.Empty() || (len(f.Clusters) > 0 && !slices.Contains(f.Clusters, cluster)) {
		return interest{}
	}
	if ca.All || ca.Everywhere.Len() > 0 {
		if len(f.Namespaces) > 0 {
			return interest{namespaces: slices.Clone(f.Namespaces)}
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

// clusterStale reports whether a cluster's rows are last-known state.
func (s *service) clusterStale(name string) bool {
	c, ok := s.store.GetCluster(nil, name)
	return ok && c.Stale()
}

// endReason labels why a subscription ended, for metrics.
func endReason(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		switch ae.code {
		case CodeShuttingDown:
			return "shutdown"
		case CodeResyncRequired:
			return "resync"
		case CodeSlowConsumer:
			return "slow_consumer"
		}
	}
	if errors.Is(err, context.Canceled) {
		return "completed"
	}
	return "error"
}

// clusterConnection answers Subscription.clusterConnection: one event per
// state transition of a cluster the viewer can see, checked at the moment
// of the event so that RBAC changes apply.
func (s *service) clusterConnection(ctx context.Context, clusters []string) (<-chan *model.ClusterConnectionEvent, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !isWebsocket(ctx) {
		return nil, errNeedsWebsocket()
	}
	sub := newSubscriber(subClusters, s.subBuffer, v.admin)
	from, err := s.hub.register(sub, s.store.LastSeq())
	if err != nil {
		return nil, err
	}
	sub.last = from
	out := make(chan *model.ClusterConnectionEvent)
	s.metrics.subscriptionStarted(subClusters)
	go s.clusterPump(ctx, v, sub, clusters, out)
	return out, nil
}

// clusterPump is the clusterConnection pump goroutine; it owns and closes
// out.
func (s *service) clusterPump(ctx context.Context, v *viewer, sub *subscriber, only []string, out chan<- *model.ClusterConnectionEvent) {
	reason := "completed"
	defer func() {
		close(out)
		s.hub.unregister(sub)
		s.metrics.subscriptionEnded(subClusters, reason)
	}()
	err := s.hub.drain(ctx, sub, func(ev *index.Event) bool {
		e := transition(ev)
		if e == nil || (len(only) > 0 && !slices.Contains(only, e.Cluster)) || !s.clusterVisible(v, e.Cluster) {
			return true
		}
		select {
		case out <- e:
			s.metrics.delivered(subClusters)
			return true
		case <-ctx.Done():
			return false
		}
	})
	if err != nil {
		reason = endReason(err)
		endWith(ctx, err)
	}
}

// transition returns the event of a cluster row change that is a state
// transition (or a new cluster), nil otherwise: a row that changed only its
// lastSeen or labels is not a transition.
func transition(ev *index.Event) *model.ClusterConnectionEvent {
	if ev.Type != index.EventCluster || ev.ClusterRow == nil {
		return nil
	}
	c, prev := ev.ClusterRow, ev.PreviousCluster
	if prev != nil && toState(prev.State) == toState(c.State) {
		return nil
	}
	e := &model.ClusterConnectionEvent{Cluster: c.Name, State: toState(c.State), At: c.Since}
	if prev != nil {
		p := toState(prev.State)
		e.Previous = &p
	}
	if c.State == index.StateDisconnected || c.State == index.StateDegraded {
		e.Message = optString(c.LastError)
	}
	return e
}

// fleet answers Subscription.fleet: the current status, then the status
// after every change that alters it. Statuses are levels, so a slow client
// gets the latest one, never a backlog.
func (s *service) fleetSubscription(ctx context.Context) (<-chan *model.FleetStatus, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !isWebsocket(ctx) {
		return nil, errNeedsWebsocket()
	}
	sub := newSubscriber(subFleet, 0, v.admin)
	if _, err := s.hub.register(sub, s.store.LastSeq()); err != nil {
		return nil, err
	}
	out := make(chan *model.FleetStatus)
	s.metrics.subscriptionStarted(subFleet)
	go s.fleetPump(ctx, v, sub, out)
	return out, nil
}

// fleetPump is the fleet pump goroutine; it owns and closes out.
func (s *service) fleetPump(ctx context.Context, v *viewer, sub *subscriber, out chan<- *model.FleetStatus) {
	reason := "completed"
	defer func() {
		close(out)
		s.hub.unregister(sub)
		s.metrics.subscriptionEnded(subFleet, reason)
	}()
	var last *model.FleetStatus
	for {
		cur := toFleetStatus(s.store.Fleet(s.access(v)))
		if last == nil || *cur != *last {
			select {
			case out <- cur:
				s.metrics.delivered(subFleet)
				last = cur
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-sub.notify:
		}
		if _, _, _, endErr := sub.take(nil); endErr != nil {
			reason = endReason(endErr)
			endWith(ctx, endErr)
			return
		}
	}
}
