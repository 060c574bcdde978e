package graph

import (
	"context"
	"errors"
	"sync"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// Subscriptions are thin adapters over the index's streams
// (index.Store.ObjectChanges, ClusterChanges, FleetChanges), which route the
// change feed, apply the filter and the viewer's access (re-read from authz
// on every policy change), catch up from the replay buffer and end readers
// that fall out of it. Each resolver validates its arguments synchronously
// (so a bad filter or cursor is an error on the subscribe message), opens
// the stream and starts one pump goroutine that owns the returned channel:
// it reads the stream, converts each change to the GraphQL model, and is
// the only writer and closer of the channel. It closes it when the client
// completes the operation (ctx ends), when the handler closes
// (SHUTTING_DOWN), or when the stream ends (RESYNC_REQUIRED,
// SLOW_CONSUMER). gqlgen keys operations by their websocket operation id
// and cancels ctx on the client's complete message; graph's websocket
// layer rejects a second operation with an id in use (4409).

// errNoOperation is a wiring mistake: a subscription resolved outside the
// operation state that AroundOperations adds.
var errNoOperation = errors.New("graph: a subscription without its operation state")

// errNeedsStream rejects subscriptions sent over plain HTTP.
func errNeedsStream() error {
	return newError(CodeBadRequest, nil, "subscriptions need a websocket (graphql-transport-ws or graphql-ws) or server-sent events (Accept: text/event-stream) on /graphql")
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
	if !isStream(ctx) {
		return nil, errNeedsStream()
	}
	f, err := s.filterOf(filter)
	if err != nil {
		return nil, err
	}
	start := s.store.LastSeq()
	if after != nil {
		if start, err = s.decodeChangeCursor(*after); err != nil {
			return nil, err
		}
	}
	st, err := s.store.ObjectChanges(index.ObjectChangesRequest{Filter: f, After: start, Access: s.accessFunc(v), Buffer: s.subBuffer})
	if err != nil {
		return nil, indexError(err)
	}
	if sh, ok := s.events.shape(ctx); ok {
		if conn, id, ok := s.events.directConn(ctx); ok {
			out, err := startDirectEvents(ctx, s, st, sh, conn, id)
			if err != nil {
				s.events.release(sh)
				st.Close()
			}
			return out, err
		}
		return startEventPump(ctx, s, st, sh)
	}
	return startPump(ctx, s, subObjects, st, func(c index.ObjectChange) *model.ObjectChangeEvent {
		return &model.ObjectChangeEvent{
			Type:   model.ChangeType(c.Type.String()),
			Object: toObject(c.Object, c.Stale),
			Cursor: s.encodeChangeCursor(c.Seq),
		}
	})
}

// startEventPump starts the pump of an objectChanges subscription on the
// events fast path (fastevents.go): it sends each change encoded, shared
// with the other subscriptions of the same shape, on the operation's
// events channel. The channel it returns to gqlgen carries nothing; the
// pump closes it just before the events channel, so that gqlgen, asked
// for the next response once the events end, ends the operation.
func startEventPump(ctx context.Context, s *service, st *index.ObjectStream, sh *eventShape) (<-chan *model.ObjectChangeEvent, error) {
	op, ok := ctx.Value(operationKey{}).(*operation)
	if !ok {
		s.events.release(sh)
		st.Close()
		return nil, errNoOperation
	}
	s.events.served.Add(1) // before the stream is seen open (tests wait for that)
	if err := s.streams.add(st); err != nil {
		s.events.release(sh)
		st.Close()
		return nil, err
	}
	out := make(chan *model.ObjectChangeEvent)
	events := make(chan []byte)
	op.mu.Lock()
	op.events = events
	op.mu.Unlock()
	s.metrics.subscriptionStarted(subObjects)
	go pump(ctx, s, subObjects, st, events, func(c index.ObjectChange) []byte { return sh.encode(s, c) }, func() {
		close(out)
		s.events.release(sh)
	})
	return out, nil
}

// clusterConnection answers Subscription.clusterConnection: one event per
// state transition of a cluster the viewer can see, checked at the moment
// of the event so that RBAC changes apply.
func (s *service) clusterConnection(ctx context.Context, clusters []string) (<-chan *model.ClusterConnectionEvent, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !isStream(ctx) {
		return nil, errNeedsStream()
	}
	st, err := s.store.ClusterChanges(index.ClusterChangesRequest{Clusters: clusters, Access: s.accessFunc(v), Buffer: s.subBuffer})
	if err != nil {
		return nil, err
	}
	return startPump(ctx, s, subClusters, st, toConnectionEvent)
}

// toConnectionEvent converts a cluster's state transition.
func toConnectionEvent(c index.ClusterChange) *model.ClusterConnectionEvent {
	row := c.Cluster
	e := &model.ClusterConnectionEvent{Cluster: row.Name, State: toState(row.State), At: row.Since}
	if c.Previous != nil {
		p := toState(c.Previous.State)
		e.Previous = &p
	}
	if row.State == index.StateDisconnected || row.State == index.StateDegraded {
		e.Message = optString(row.LastError)
	}
	return e
}

// fleetSubscription answers Subscription.fleet: the current status, then
// the status after every change that alters it. Statuses are levels, so a
// slow client gets the latest one, never a backlog.
func (s *service) fleetSubscription(ctx context.Context) (<-chan *model.FleetStatus, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !isStream(ctx) {
		return nil, errNeedsStream()
	}
	st, err := s.store.FleetChanges(index.FleetChangesRequest{Access: s.accessFunc(v)})
	if err != nil {
		return nil, err
	}
	return startPump(ctx, s, subFleet, st, toFleetStatus)
}

// accessFunc is the viewer's access as streams ask for it: from authz on
// every call (a cached lookup), so that RBAC changes reach open streams.
func (s *service) accessFunc(v *viewer) index.AccessFunc {
	return func() *index.Access { return s.access(v) }
}

// stream is what the index's streams have in common.
type stream[C any] interface {
	Next(ctx context.Context) (C, error)
	End(err error)
	Close()
}

// startPump registers a stream with the handler (so that Close can end it)
// and starts its pump goroutine, which owns the returned channel.
func startPump[C, M any](ctx context.Context, s *service, kind subKind, st stream[C], convert func(C) M) (<-chan M, error) {
	if err := s.streams.add(st); err != nil {
		st.Close()
		return nil, err
	}
	out := make(chan M)
	s.metrics.subscriptionStarted(kind)
	go pump(ctx, s, kind, st, out, convert, nil)
	return out, nil
}

// pump is the goroutine of one subscription: the only writer of out, which
// it closes when the client completes the operation or the stream ends,
// right after calling ending (if not nil).
func pump[C, M any](ctx context.Context, s *service, kind subKind, st stream[C], out chan<- M, convert func(C) M, ending func()) {
	reason := "completed"
	defer func() {
		if ending != nil {
			ending()
		}
		close(out)
		st.Close()
		s.streams.remove(st)
		s.metrics.subscriptionEnded(kind, reason)
	}()
	for {
		c, err := st.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			err = streamError(err)
			reason = endReason(err)
			endWith(ctx, err)
			return
		}
		select {
		case out <- convert(c):
			s.metrics.delivered(kind)
		case <-ctx.Done():
			return
		}
	}
}

// errShuttingDown ends every subscription when the handler closes.
var errShuttingDown = newError(CodeShuttingDown, nil, "server is shutting down")

// streamError maps the error a stream ended with.
func streamError(err error) error {
	switch {
	case errors.Is(err, index.ErrSlowConsumer):
		return newError(CodeSlowConsumer, err, "the client fell too far behind the change feed; query again and resubscribe with the answer's changesCursor")
	case errors.Is(err, index.ErrResyncRequired):
		return newError(CodeResyncRequired, err, "the change feed no longer holds the changes this subscription needs; query objects again and subscribe with its changesCursor")
	}
	return err
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

// openStreams tracks a handler's open subscriptions, so that Close can end
// them with SHUTTING_DOWN and wait until their pumps have left.
type openStreams struct {
	mu      sync.Mutex
	closed  bool
	set     map[ender]struct{}
	drained chan struct{} // closed once closed and empty
}

// ender is a stream as openStreams sees it.
type ender interface{ End(err error) }

func newOpenStreams() *openStreams {
	return &openStreams{set: map[ender]struct{}{}, drained: make(chan struct{})}
}

// add registers a stream, or fails with SHUTTING_DOWN after close.
func (o *openStreams) add(e ender) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return errShuttingDown
	}
	o.set[e] = struct{}{}
	return nil
}

// remove forgets a stream whose pump has left.
func (o *openStreams) remove(e ender) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.set, e)
	if o.closed && len(o.set) == 0 {
		closeOnce(o.drained)
	}
}

// len returns the number of open streams.
func (o *openStreams) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.set)
}

// close ends every stream with SHUTTING_DOWN; later adds fail. The
// returned channel is closed once every pump has left, after which the
// websockets may be closed without cutting off the pumps' final errors.
func (o *openStreams) close() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for e := range o.set {
		e.End(errShuttingDown)
	}
	if len(o.set) == 0 {
		closeOnce(o.drained)
	}
	return o.drained
}

// closeOnce closes ch unless it is closed already.
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}
