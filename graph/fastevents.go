package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"

	"github.com/fleetgraph/fleetgraph/index"
)

// The objectChanges fast path.
//
// A change that a hundred subscribers may see was executed a hundred times
// by gqlgen's generated code: the same field contexts, closures and
// marshalers per field as a query (see fast.go), for the same event and
// the same selection, once per subscriber. Measured on bench-graph's
// overlapping fan-out (1,000 subscribers, a mean fan-out of 100), that
// execution and the garbage it left were about a third of the server's
// CPU per delivery.
//
// The fast path encodes an event once per (change, selection, what the
// viewer gets of it) and hands the same bytes to every subscriber with
// that selection. What a viewer gets of a change is decided by its own
// stream (index.ObjectStream applies its filter and access), and is all in
// the index.ObjectChange it returns: the type, through the viewer's filter
// (a change can be MODIFIED for one viewer and DELETED for another), the
// object and its cluster's staleness. So the cache key is the selection's
// signature, the sequence number, the type, the staleness and the object.
//
// How the bytes reach the client. On a graphql-transport-ws websocket
// (the dashboard's and most clients' protocol) graph writes each event's
// next message itself (wsevents.go, directEvents): gqlgen would marshal
// every response and then every message again, for every subscriber,
// which was a third of the server's CPU per delivery after the encoding
// was shared. On server-sent events and legacy graphql-ws the resolver
// registers the operation's event channel on the operation (see
// operation.events), and its pump sends encoded events there instead of
// models on the channel it returns to gqlgen; eventsInterceptor, the
// innermost response interceptor, answers each of the operation's
// responses with the next encoded event, in gqlgen's exact output format
// ({"alias":{...}}). When the events end, either way, gqlgen's own handler
// sees its channel closed and ends the operation as before (complete, or
// the stream's error through subscriptionEnd and sseEnd).
// TestEventsFastPathMatchesGeneratedCode compares the bytes on the wire
// with those of gqlgen's generated code and transport.
//
// Like the objects fast path it runs no field middleware, so it is only on
// when no extension intercepts fields, and it is the last response
// interceptor, so every other extension's interceptor still sees each
// event that goes through gqlgen; events written directly are not
// responses, so direct writes are off when an extension of
// Options.Extensions intercepts responses.
type eventPath struct {
	f       *fastPath
	off     atomic.Bool  // tests: serve events through gqlgen's generated code
	served  atomic.Int64 // subscriptions the fast path served
	wsOff   atomic.Bool  // send events through gqlgen's websocket transport (see directEvents)
	written atomic.Int64 // subscriptions whose events were written to their websocket directly

	mu     sync.Mutex
	shapes map[string]*eventShape // by signature
}

func newEventPath(f *fastPath) *eventPath {
	return &eventPath{f: f, shapes: map[string]*eventShape{}}
}

// eventCacheSize is how many recent events a shape keeps encoded. Every
// subscriber of a change reads it within the delivery delay (100 ms is
// the target; 1,000 changes per second is 100 events); a reader further
// behind encodes again, which is only slower, but slower just when the
// server is behind already: with 256, a loaded run of bench-graph (delays
// of seconds) encoded each change many times over, a tenth of its CPU.
// 2,048 is two seconds at the target rate, about a megabyte per shape that
// two subscriptions or more share.
const eventCacheSize = 2048

// eventShape is one selection of ObjectChangeEvent under one alias, shared
// by the subscriptions that select it.
type eventShape struct {
	sig    string
	prefix []byte // {"alias":
	plan   *selPlan
	users  int // guarded by eventPath.mu

	mu     sync.Mutex
	recent []encodedEvent // by Seq % eventCacheSize; nil while one subscription uses it
}

// encodedEvent is the response data of one change for one shape: as
// gqlgen's transports take it (data), and as it goes into a websocket
// message (wire, see wireJSON; the same slice when no character needs
// escaping).
type encodedEvent struct {
	seq   uint64
	typ   index.EventType
	stale bool
	obj   *index.Object
	data  []byte
	wire  []byte
}

// shape returns the shared shape of the objectChanges field being
// resolved in ctx, or false when the fast path cannot write it (a field
// without a writer); release must be called when the subscription ends.
func (e *eventPath) shape(ctx context.Context) (*eventShape, bool) {
	if e == nil || e.off.Load() || !graphql.HasOperationContext(ctx) {
		return nil, false
	}
	fc := graphql.GetFieldContext(ctx)
	if fc == nil || fc.Field.Field == nil || fc.Field.Definition == nil {
		return nil, false
	}
	pl, ok := e.f.plan(graphql.GetOperationContext(ctx), fc.Field.Selections, fc.Field.Definition.Type.Name())
	if !ok {
		return nil, false
	}
	prefix := append(appendGQLString([]byte{'{'}, fc.Field.Alias), ':')
	var sig strings.Builder
	sig.Write(prefix)
	pl.signature(&sig)
	e.mu.Lock()
	defer e.mu.Unlock()
	sh := e.shapes[sig.String()]
	if sh == nil {
		sh = &eventShape{sig: sig.String(), prefix: prefix, plan: pl}
		e.shapes[sh.sig] = sh
	}
	sh.users++
	if sh.users == 2 {
		sh.mu.Lock()
		sh.recent = make([]encodedEvent, eventCacheSize)
		sh.mu.Unlock()
	}
	return sh, true
}

// release forgets a subscription's shape.
func (e *eventPath) release(sh *eventShape) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sh.users--; sh.users == 0 {
		delete(e.shapes, sh.sig)
	}
}

// signature writes what identifies the selection: field keys, field names
// and sub-selections, in response order.
func (p *selPlan) signature(w *strings.Builder) {
	w.WriteString(p.typeName)
	w.WriteByte('{')
	for i := range p.fields {
		f := &p.fields[i]
		w.Write(f.key)
		w.WriteString(f.name)
		if f.sub != nil {
			f.sub.signature(w)
		}
		w.WriteByte(',')
	}
	w.WriteByte('}')
}

// encode returns the response data of a change: from the shape's cache
// when another subscription encoded it already.
func (sh *eventShape) encode(s *service, c index.ObjectChange) []byte { return sh.event(s, c).data }

// event returns a change encoded (see encodedEvent), from the shape's
// cache when another subscription encoded it already.
func (sh *eventShape) event(s *service, c index.ObjectChange) encodedEvent {
	i := c.Seq % eventCacheSize
	sh.mu.Lock()
	if sh.recent != nil {
		if e := sh.recent[i]; e.data != nil && e.seq == c.Seq && e.typ == c.Type && e.stale == c.Stale && e.obj == c.Object {
			sh.mu.Unlock()
			return e
		}
	}
	sh.mu.Unlock()
	v := fastValue{edge: &index.Edge{Object: c.Object, Stale: c.Stale}, change: &c, cursor: s.encodeChangeCursor(c.Seq)}
	b := make([]byte, 0, 512)
	b = append(b, sh.prefix...)
	b = sh.plan.object(b, &v)
	b = append(b, '}')
	e := encodedEvent{seq: c.Seq, typ: c.Type, stale: c.Stale, obj: c.Object, data: b, wire: wireJSON(b)}
	sh.mu.Lock()
	if sh.recent != nil {
		sh.recent[i] = e
	}
	sh.mu.Unlock()
	return e
}

// wireJSON returns response data as encoding/json puts it in a message,
// which is how gqlgen's websocket transport sends it: json.Marshal writes a
// json.RawMessage with <, >, &, U+2028 and U+2029 in strings escaped
// (json.HTMLEscape); data itself when it has none of them (0xE2 starts the
// encoding of U+2028 and U+2029, and of other characters, which come
// through unchanged).
func wireJSON(data []byte) []byte {
	for _, ch := range data {
		if ch == '<' || ch == '>' || ch == '&' || ch == 0xE2 {
			var b bytes.Buffer
			b.Grow(len(data) + 16)
			json.HTMLEscape(&b, data)
			return b.Bytes()
		}
	}
	return data
}

// objectChangeEventWriters write ObjectChangeEvent (see fastWriters).
var objectChangeEventWriters = map[string]fieldWriter{
	"type": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
		return strconv.AppendQuote(b, v.change.Type.String()) // as the generated enum marshaler
	},
	"cursor": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.cursor) },
	"object": func(b []byte, f *fieldPlan, v *fastValue) []byte { return f.sub.object(b, v) },
}

// eventsInterceptor answers the responses of a subscription that has
// fast-path events (see operation.events). It is installed last, so it is
// the innermost response interceptor.
type eventsInterceptor struct{}

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
} = eventsInterceptor{}

// ExtensionName implements graphql.HandlerExtension.
func (eventsInterceptor) ExtensionName() string { return "fleetgraph.EventsFastPath" }

// Validate implements graphql.HandlerExtension.
func (eventsInterceptor) Validate(graphql.ExecutableSchema) error { return nil }

// InterceptResponse implements graphql.ResponseInterceptor.
func (eventsInterceptor) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	op, ok := ctx.Value(operationKey{}).(*operation)
	if !ok {
		return next(ctx)
	}
	op.mu.Lock()
	events, direct := op.events, op.direct
	op.mu.Unlock()
	if direct != nil {
		// The events go straight to the websocket; gqlgen's handler
		// then ends the operation.
		direct.run(ctx)
		return next(ctx)
	}
	if events == nil {
		return next(ctx)
	}
	select {
	case data, ok := <-events:
		if ok {
			return &graphql.Response{Data: data}
		}
	case <-ctx.Done():
	}
	// The pump has ended (it closed gqlgen's channel before ours), or
	// the client has gone: gqlgen's own handler ends the operation.
	return next(ctx)
}
