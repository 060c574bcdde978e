package graph

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// Events written straight to the websocket.
//
// gqlgen sends a subscription's event by marshaling its response
// (json.Marshal compacts the data again) and then the graphql-transport-ws
// message around it (compacting it a third time), on a goroutine that has
// gone through every response interceptor to get it; on bench-graph's
// fan-out (1,000 subscribers, 100 per change) that was the largest part of
// the server's CPU per delivery once the events fast path (fastevents.go)
// encoded each change once per selection. gqlgen's only hook is
// WebsocketConn.WriteJSON(v any) with a message type of its own, so graph
// writes these messages itself: an objectChanges subscription on the events
// fast path, on a graphql-transport-ws connection, writes each event as
//
//	{"payload":{"data":<the shared encoded data>},"id":<id>,"type":"next"}
//
// which is byte for byte what gqlgen writes for the same response (its
// field order, encoding/json's escaping, see wireJSON), on the same
// connection (wsConn.writeEvent), from gqlgen's goroutine for the
// operation: eventsInterceptor runs the subscription's loop (directEvents.run)
// when gqlgen asks for the first response, and returns only when the
// stream has ended; gqlgen then sends complete, or the stream's error
// (subscriptionEnd), after the last event, as it would have. Every other
// message (connection_init, subscribe, complete, errors, ping and pong) and
// every other subscription still go through gqlgen.
//
// The operation id. A resolver does not learn its operation's id from
// gqlgen, so wsOperationIDs, an operation context mutator, binds the
// operation context gqlgen creates for a subscribe message to the id in
// that message (wsConn.bindOperation): gqlgen reads a connection's
// messages on one goroutine and creates the operation context before it
// reads the next one.

// wsOperationIDs binds websocket operations' contexts to their ids (see
// above).
type wsOperationIDs struct{}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationContextMutator
} = wsOperationIDs{}

// ExtensionName implements graphql.HandlerExtension.
func (wsOperationIDs) ExtensionName() string { return "fleetgraph.WebsocketOperationIDs" }

// Validate implements graphql.HandlerExtension.
func (wsOperationIDs) Validate(graphql.ExecutableSchema) error { return nil }

// MutateOperationContext implements graphql.OperationContextMutator.
func (wsOperationIDs) MutateOperationContext(ctx context.Context, rc *graphql.OperationContext) *gqlerror.Error {
	if up, ok := ctx.Value(upgradeKey{}).(*upgrade); ok && up.conn != nil {
		up.conn.bindOperation(rc)
	}
	return nil
}

// directConn returns the websocket connection and operation id that the
// objectChanges subscription being resolved in ctx can write its events to,
// or false when gqlgen must send them: direct writes are off, the
// connection speaks legacy graphql-ws, or ctx is not a websocket's.
func (e *eventPath) directConn(ctx context.Context) (*wsConn, string, bool) {
	if e.wsOff.Load() || !graphql.HasOperationContext(ctx) {
		return nil, "", false
	}
	up, ok := ctx.Value(upgradeKey{}).(*upgrade)
	if !ok || up.conn == nil || up.conn.Subprotocol() != "graphql-transport-ws" {
		return nil, "", false
	}
	id, ok := up.conn.operationID(graphql.GetOperationContext(ctx))
	return up.conn, id, ok
}

// nextHead starts every next message (see above).
const nextHead = `{"payload":{"data":`

// directEvents is an objectChanges subscription whose events are written
// to its websocket by run, on gqlgen's goroutine for the operation; there
// is no pump goroutine. The subscription ends exactly once: in run when
// the stream ends, or, when gqlgen never asks for a response (the client
// completed the operation or left first), when its context ends
// (cancelled); mu and state decide which.
type directEvents struct {
	s     *service
	st    *index.ObjectStream
	shape *eventShape
	conn  *wsConn
	msg   []byte                        // the message being written; starts with nextHead
	tail  []byte                        // },"id":<id>,"type":"next"}
	out   chan *model.ObjectChangeEvent // gqlgen's channel; carries nothing, closed at the end

	mu    sync.Mutex
	state directState
	stop  func() bool // stops the context.AfterFunc of cancelled
}

type directState uint8

const (
	directIdle    directState = iota // gqlgen has not asked for a response yet
	directRunning                    // run is reading the stream
	directDone                       // the subscription has ended
)

// startDirectEvents starts an objectChanges subscription whose events go
// straight to the websocket (see above). The channel it returns to gqlgen
// carries nothing; it is closed when the subscription ends, so that
// gqlgen, asked for the next response then, ends the operation.
func startDirectEvents(ctx context.Context, s *service, st *index.ObjectStream, sh *eventShape, conn *wsConn, id string) (<-chan *model.ObjectChangeEvent, error) {
	op, ok := ctx.Value(operationKey{}).(*operation)
	if !ok {
		return nil, errNoOperation
	}
	idJSON, err := json.Marshal(id) // as gqlgen's message marshals it
	if err != nil {
		return nil, err
	}
	s.events.served.Add(1) // before the stream is seen open (tests wait for that)
	s.events.written.Add(1)
	if err := s.streams.add(st); err != nil {
		return nil, err
	}
	d := &directEvents{
		s: s, st: st, shape: sh, conn: conn,
		msg:  append(make([]byte, 0, 1024), nextHead...),
		tail: append(append([]byte(`},"id":`), idJSON...), `,"type":"next"}`...),
		out:  make(chan *model.ObjectChangeEvent),
	}
	op.mu.Lock()
	op.direct = d
	op.mu.Unlock()
	s.metrics.subscriptionStarted(subObjects)
	d.mu.Lock() // cancelled may run at once; it must see stop set
	d.stop = context.AfterFunc(ctx, d.cancelled)
	d.mu.Unlock()
	return d.out, nil
}

// run writes the subscription's events until its stream ends, the client
// completes the operation or leaves (ctx ends), or a write fails (the
// websocket is gone); then it ends the subscription, having recorded the
// stream's error for gqlgen (endWith). It returns at once when the
// subscription has ended already.
func (d *directEvents) run(ctx context.Context) {
	d.mu.Lock()
	if d.state != directIdle {
		d.mu.Unlock()
		return
	}
	d.state = directRunning
	d.mu.Unlock()
	reason := "completed"
	for {
		c, err := d.st.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				err = streamError(err)
				reason = endReason(err)
				endWith(ctx, err)
			}
			break
		}
		d.msg = append(append(d.msg[:len(nextHead)], d.shape.event(d.s, c).wire...), d.tail...)
		if err := d.conn.writeEvent(d.msg); err != nil {
			break // the connection is closed; gqlgen ends the operation
		}
		d.s.metrics.delivered(subObjects)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.endLocked(reason)
}

// cancelled ends the subscription when its context ends before gqlgen
// asked for a response; a running run sees the context end itself.
func (d *directEvents) cancelled() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == directIdle {
		d.endLocked("completed")
	}
}

// endLocked releases the subscription, once; d.mu is held.
func (d *directEvents) endLocked(reason string) {
	if d.state == directDone {
		return
	}
	d.state = directDone
	d.stop()
	close(d.out)
	d.st.Close()
	d.s.streams.remove(d.st)
	d.s.events.release(d.shape)
	d.s.metrics.subscriptionEnded(subObjects, reason)
}
