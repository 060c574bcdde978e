package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vektah/gqlparser/v2/parser"
)

// GraphQL over server-sent events, for frontends that read subscriptions
// with EventSource (or a fetch-based equivalent). It is gqlgen's
// transport.SSE, the "distinct connections" mode of the graphql-sse
// protocol: one operation per request, each result an "event: next" and
// the end an "event: complete".
//
//   - POST with Accept: text/event-stream and a JSON body, as fetch-based
//     clients send it; or GET with Accept: text/event-stream and the request
//     in the query string (query, operationName, variables and extensions as
//     JSON), as EventSource sends it. GET never runs a mutation (405).
//   - Authentication is the same as for POST: Authorization: Bearer, or an
//     authenticating proxy's headers. Never a token in the URL, where logs
//     would keep it.
//   - The limits are the websocket's: the operation limits and the body cap;
//     at most Websocket.MaxOperations open streams per viewer (429
//     TOO_MANY_OPERATIONS); each write within Websocket.WriteTimeout, or the
//     stream ends; a ": ping" comment every Websocket.KeepAlive.
//   - A stream ends with an error event (UNAUTHENTICATED) when the viewer's
//     credentials expire or are revoked, with the subscription's own error
//     (SLOW_CONSUMER, SHUTTING_DOWN, ...) when it ends that way, and with
//     SHUTTING_DOWN when Handler.Close runs; then "event: complete".
//
// RBAC is the resolvers' own, whatever the transport.

// mediaEventStream is the media type of server-sent events.
const mediaEventStream = "text/event-stream"

// wantsEventStream reports whether r asks for server-sent events.
func wantsEventStream(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept"), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == mediaEventStream {
			return true
		}
	}
	return false
}

// sseTransport returns the configured gqlgen SSE transport.
func (h *Handler) sseTransport() transport.SSE {
	return transport.SSE{KeepAlivePingInterval: h.opts.Websocket.KeepAlive}
}

// Why a stream ended, when the transport rather than the operation ended
// it.
var (
	errStreamExpired  = newError(CodeUnauthenticated, nil, "the credentials of this stream expired; reconnect with fresh ones")
	errStreamRevoked  = newError(CodeUnauthenticated, nil, "the credentials of this stream were revoked")
	errStreamShutdown = newError(CodeShuttingDown, nil, "server shutting down")
	errStreamSlow     = errors.New("the client did not take an event within the write timeout")
)

// sseStream is one open event stream.
type sseStream struct {
	viewer string
	cancel context.CancelCauseFunc
	// reported is set once the stream's end error was sent; only the
	// goroutine that sends the stream's responses touches it.
	reported bool
}

type sseKey struct{}

// isSSE reports whether ctx belongs to an event stream.
func isSSE(ctx context.Context) bool {
	_, ok := ctx.Value(sseKey{}).(*sseStream)
	return ok
}

// isStream reports whether ctx belongs to a transport that can carry a
// subscription: a websocket or an event stream.
func isStream(ctx context.Context) bool { return isWebsocket(ctx) || isSSE(ctx) }

// sseStreams counts the open event streams, per viewer and in all, so that
// the per-viewer limit holds and Close can end them.
type sseStreams struct {
	mu        sync.Mutex
	perViewer map[string]int
	open      map[*sseStream]struct{}
	idle      idleWaiter // until no stream is open
	closed    bool
}

// acquire's refusals.
var (
	errTooManyStreams = errors.New("too many streams")
	errClosed         = errors.New("closed")
)

// acquire registers a stream of a viewer, unless it already has max open
// or Close has begun.
func (s *sseStreams) acquire(st *sseStream, max int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perViewer == nil {
		s.perViewer, s.open = map[string]int{}, map[*sseStream]struct{}{}
	}
	if s.closed {
		return errClosed
	}
	if s.perViewer[st.viewer] >= max {
		return errTooManyStreams
	}
	s.perViewer[st.viewer]++
	s.open[st] = struct{}{}
	return nil
}

func (s *sseStreams) release(st *sseStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, st)
	if s.perViewer[st.viewer]--; s.perViewer[st.viewer] == 0 {
		delete(s.perViewer, st.viewer)
	}
	if len(s.open) == 0 {
		s.idle.wake()
	}
}

// wait waits until no stream is open or ctx ends, and reports which.
func (s *sseStreams) wait(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle.channel(len(s.open) == 0)
	s.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shut refuses new streams from now on.
func (s *sseStreams) shut() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// cancelAll ends every open stream with err.
func (s *sseStreams) cancelAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for st := range s.open {
		st.cancel(err)
	}
}

// serveSSE serves event streams with srv (which holds the SSE transport):
// GET requests are turned into the POST the transport reads, then
// authentication, the body cap, the per-viewer limit and the credential
// watch apply.
func (h *Handler) serveSSE(srv http.Handler) http.Handler {
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := viewerFrom(r.Context())
		if err != nil { // requireAuth ran; this is a wiring safety net
			writeHTTPError(w, http.StatusUnauthorized, CodeUnauthenticated, "authentication required")
			return
		}
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		st := &sseStream{viewer: v.id.Key(), cancel: cancel}
		switch err := h.sse.acquire(st, h.opts.Websocket.MaxOperations); {
		case errors.Is(err, errClosed):
			writeHTTPError(w, http.StatusServiceUnavailable, CodeShuttingDown, "server is shutting down")
			return
		case err != nil:
			h.metrics.rejected("too_many_streams")
			writeHTTPError(w, http.StatusTooManyRequests, CodeTooManyOperations,
				fmt.Sprintf("this viewer already has %d event streams open, the maximum", h.opts.Websocket.MaxOperations))
			return
		}
		defer h.sse.release(st)
		defer endOnCredentials(ctx, v, cancel)()
		// Proxies such as nginx buffer responses unless told otherwise.
		w.Header().Set("X-Accel-Buffering", "no")
		sw := &streamWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: h.opts.Websocket.WriteTimeout, fail: cancel}
		srv.ServeHTTP(sw, r.WithContext(context.WithValue(ctx, sseKey{}, st)))
	})
	auth := h.requireAuth(h.limitBody(stream))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.isClosed() {
			writeHTTPError(w, http.StatusServiceUnavailable, CodeShuttingDown, "server is shutting down")
			return
		}
		if r.Method == http.MethodGet {
			post, status, err := sseFromGet(r)
			if err != nil {
				h.metrics.rejected("bad_request")
				if status == http.StatusMethodNotAllowed {
					w.Header().Set("Allow", http.MethodPost)
				}
				writeHTTPError(w, status, CodeBadRequest, err.Error())
				return
			}
			r = post
		}
		auth.ServeHTTP(w, r)
	})
}

// sseFromGet turns a GET event stream request into the POST with a JSON
// body that gqlgen's SSE transport reads. It refuses mutations (405), as
// GET is a safe method, and parameters that are not what the GraphQL over
// HTTP spec says (400).
func sseFromGet(r *http.Request) (*http.Request, int, error) {
	q := r.URL.Query()
	params := map[string]any{"query": q.Get("query")}
	if params["query"] == "" {
		return nil, http.StatusBadRequest, errors.New("the query parameter is missing")
	}
	if name := q.Get("operationName"); name != "" {
		params["operationName"] = name
	}
	for _, key := range []string{"variables", "extensions"} {
		if raw := q.Get(key); raw != "" {
			var m map[string]any
			if err := json.Unmarshal([]byte(raw), &m); err != nil {
				return nil, http.StatusBadRequest, fmt.Errorf("the %s parameter is not a JSON object", key)
			}
			params[key] = json.RawMessage(raw)
		}
	}
	if isMutation(q.Get("query"), q.Get("operationName")) {
		return nil, http.StatusMethodNotAllowed, errors.New("mutations are not run over GET; use POST")
	}
	body, err := json.Marshal(params)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	post := r.Clone(r.Context())
	post.Method = http.MethodPost
	post.Header.Set("Content-Type", mediaJSON)
	post.Body = io.NopCloser(bytes.NewReader(body))
	post.ContentLength = int64(len(body))
	return post, 0, nil
}

// isMutation reports whether a document's selected operation is a
// mutation. A document that does not parse is left to gqlgen to report.
func isMutation(query, operationName string) bool {
	doc, err := parser.ParseQuery(&ast.Source{Input: query})
	if err != nil {
		return false
	}
	for _, op := range doc.Operations {
		if (operationName == "" && len(doc.Operations) == 1) || op.Name == operationName {
			return op.Operation == ast.Mutation
		}
	}
	return false
}

// endOnCredentials ends a stream when the viewer's credentials expire or
// are revoked. The returned func stops watching.
func endOnCredentials(ctx context.Context, v *viewer, cancel context.CancelCauseFunc) (stop func()) {
	if v.expires.IsZero() && v.revoked == nil {
		return func() {}
	}
	var expired <-chan time.Time
	if !v.expires.IsZero() {
		t := time.NewTimer(time.Until(v.expires))
		defer func() {
			inner := stop
			stop = func() { inner(); t.Stop() }
		}()
		expired = t.C
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-expired:
			cancel(errStreamExpired)
		case <-v.revoked: // nil when the credentials cannot be revoked
			cancel(errStreamRevoked)
		case <-ctx.Done():
		case <-done:
		}
	}()
	return func() { close(done) }
}

// streamWriter bounds every write of an event stream by the write timeout:
// a client that does not take an event within it ends the stream instead
// of holding its goroutines.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	fail    context.CancelCauseFunc
}

func (s *streamWriter) Write(b []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout)) // not every writer supports deadlines
	n, err := s.ResponseWriter.Write(b)
	if err != nil {
		s.fail(errStreamSlow)
	}
	return n, err
}

// Flush implements http.Flusher, which gqlgen's SSE transport requires.
func (s *streamWriter) Flush() {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if err := s.rc.Flush(); err != nil {
		s.fail(errStreamSlow)
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (s *streamWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// sseEnd is a gqlgen response interceptor that sends the reason an event
// stream ends as a last result with an error, before gqlgen's "event:
// complete": the transport's reason (credentials, shutdown) or the
// subscription's own (see endWith). Websockets get theirs as an error
// message from subscriptionEnd.
type sseEnd struct{}

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
} = sseEnd{}

// ExtensionName implements graphql.HandlerExtension.
func (sseEnd) ExtensionName() string { return "fleetgraph.SSEEnd" }

// Validate implements graphql.HandlerExtension.
func (sseEnd) Validate(graphql.ExecutableSchema) error { return nil }

// InterceptResponse implements graphql.ResponseInterceptor.
func (sseEnd) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	st, ok := ctx.Value(sseKey{}).(*sseStream)
	if resp != nil || !ok || st.reported {
		return resp
	}
	var err error
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, errStreamSlow) {
		err = cause
	} else if op, ok := ctx.Value(operationKey{}).(*operation); ok {
		op.mu.Lock()
		err = op.endErr
		op.mu.Unlock()
	}
	if err == nil {
		return nil
	}
	st.reported = true
	return &graphql.Response{Errors: gqlerror.List{gqlError(err)}}
}
