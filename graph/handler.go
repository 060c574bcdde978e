package graph

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/fleetgraph/fleetgraph/graph/generated"
	"github.com/fleetgraph/fleetgraph/ui"
)

// Handler serves fleetgraph's GraphQL API and its companion endpoints:
//
//	POST /graphql      GraphQL over HTTP (JSON), Authorization: Bearer <token>
//	GET  /graphql      websocket upgrade: graphql-transport-ws or graphql-ws,
//	                   token in the connection_init payload
//	GET, POST /graphql with Accept: text/event-stream: server-sent events
//	GET  /             the dashboard (also /objects and /object; unless Options.DisableDashboard)
//	GET  /graphiql     GraphiQL (unless Options.DisableGraphiQL)
//	GET  /assets/...   the pages' embedded scripts and styles
//	GET  /healthz      liveness: the process serves HTTP
//	GET  /readyz       readiness: Options.Ready
//	GET  /metrics      Prometheus metrics of Options.Registry, for fleet
//	                   admins only (their labels name every cluster); serve
//	                   MetricsHandler on a separate listener for scrapers
//
// It is an http.Handler, so a program can mount it as is or under its own
// mux. Close ends subscriptions, websockets and event streams;
// http.Server.Shutdown does not, because websockets are hijacked
// connections and event streams never end by themselves.
type Handler struct {
	opts    Options
	svc     *service
	streams *openStreams
	fast    *fastPath // nil when an extension intercepts fields
	metrics *metrics
	scrape  http.Handler // /metrics without authentication
	log     *slog.Logger
	mux     *http.ServeMux

	// queries ends every query in flight when Close begins (their reads
	// stop; subscriptions end through their streams).
	queries     context.Context
	stopQueries context.CancelFunc

	connMu sync.Mutex
	conns  map[*wsConn]struct{}
	closed bool
	sse    sseStreams
}

// NewHandler builds the API from its dependencies. It starts no goroutine:
// the subscription fan-out starts with the first subscription and stops
// after the last one.
func NewHandler(opts Options) (*Handler, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registry, opts.Store)
	if err != nil {
		return nil, err
	}
	var seed [8]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("graph: seeding the cursor epoch: %w", err)
	}
	h := &Handler{opts: opts, metrics: m, log: opts.Logger, conns: map[*wsConn]struct{}{}}
	h.queries, h.stopQueries = context.WithCancel(context.Background())
	h.streams = newOpenStreams()
	h.svc = &service{
		store: opts.Store, authz: opts.Authorizer, authn: opts.Authenticator, leaf: opts.LeafClients,
		adminGroups: opts.AdminGroups, allAccess: allFleet(), streams: h.streams, metrics: m, log: opts.Logger,
		subBuffer: opts.SubscriptionBuffer, limits: opts.Limits, admission: newAdmission(opts.Limits, m.reads, m.readsDone), epoch: binary.LittleEndian.Uint64(seed[:]), now: time.Now,
	}

	es := generated.NewExecutableSchema(generated.Config{Resolvers: &Resolver{svc: h.svc}, Complexity: complexityRoot(opts.Limits)})
	srv := handler.New(es)
	srv.AddTransport(h.wsTransport())
	srv.AddTransport(h.sseTransport()) // before POST, which would claim its requests
	srv.AddTransport(postTransport{})
	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(opts.Limits.MaxTokens)
	srv.SetErrorPresenter(presentError(opts.Logger))
	srv.SetRecoverFunc(recoverPanic(opts.Logger))
	// Extensions are installed from one list, Options.Extensions last,
	// because the objects fast path runs no field middleware: it is
	// installed only when none of them intercepts fields. Add field
	// middleware to this list, never with srv.AroundFields.
	var exts []graphql.HandlerExtension
	if !opts.DisableIntrospection {
		exts = append(exts, extension.Introspection{})
	}
	exts = append(exts,
		&operationLimits{maxDepth: opts.Limits.MaxDepth, maxAliases: opts.Limits.MaxAliases, maxComplexity: opts.Limits.MaxComplexity},
		operationMetrics{m: m},
		subscriptionEnd{},
		sseEnd{},
	)
	exts = append(exts, opts.Extensions...)
	for _, e := range exts {
		srv.Use(e)
	}
	srv.AroundOperations(func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		ctx = withOperation(ctx)
		if graphql.GetOperationContext(ctx).Operation.Operation == ast.Subscription {
			return next(ctx)
		}
		// A query answers once: its reads stop at the deadline, or when
		// the client goes away (which cancels ctx), and its context ends
		// with its answer.
		ctx, cancel := context.WithTimeout(ctx, opts.Limits.RequestTimeout)
		unlink := context.AfterFunc(h.queries, cancel)
		responses := next(ctx)
		return func(ctx context.Context) *graphql.Response {
			defer unlink()
			defer cancel()
			return responses(ctx)
		}
	})
	if name, ok := firstExtension[graphql.FieldInterceptor](exts); ok {
		opts.Logger.Info("graph: the objects fast path is off: an extension intercepts fields", "extension", name)
	} else {
		h.fast = newFastPath(h.svc, es.Schema())
		srv.AroundRootFields(h.fast.middleware())
		// Last: the innermost response interceptor (fastevents.go).
		h.svc.events = newEventPath(h.fast)
		srv.Use(eventsInterceptor{})
		srv.Use(wsOperationIDs{})
		if name, ok := firstExtension[graphql.ResponseInterceptor](opts.Extensions); ok {
			// Events written to the websocket directly are not responses.
			opts.Logger.Info("graph: subscription events go through gqlgen: an extension intercepts responses", "extension", name)
			h.svc.events.wsOff.Store(true)
		}
	}

	mux := http.NewServeMux()
	mux.Handle("/graphql", h.endpoint(srv))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", h.readyz)
	h.scrape = promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry})
	mux.Handle("GET /metrics", h.requireAuth(h.adminOnly(h.scrape)))
	if !opts.DisableDashboard || !opts.DisableGraphiQL {
		pages, err := ui.NewHandler()
		if err != nil {
			return nil, err
		}
		mux.Handle("GET /assets/", pages)
		if !opts.DisableGraphiQL {
			mux.Handle("GET "+ui.GraphiQLPath, pages)
		}
		if !opts.DisableDashboard {
			for _, p := range ui.Pages {
				if p == "/" {
					p = "/{$}"
				}
				mux.Handle("GET "+p, pages)
			}
		}
	}
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// endpoint serves /graphql: websocket upgrades (origin check, then the
// token in connection_init), server-sent events (GET or POST with Accept:
// text/event-stream; see sse.go) and POST (content type, bearer token,
// body cap).
func (h *Handler) endpoint(srv *handler.Server) http.Handler {
	post := h.requireAuth(h.limitBody(srv))
	sse := h.serveSSE(srv)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isUpgradeRequest(r) {
			if h.isClosed() {
				writeHTTPError(w, http.StatusServiceUnavailable, CodeShuttingDown, "server is shutting down")
				return
			}
			if r.Method != http.MethodGet {
				h.metrics.rejected("method")
				writeHTTPError(w, http.StatusMethodNotAllowed, CodeBadRequest, "websocket upgrades use GET")
				return
			}
			if err := checkOrigin(r, h.opts.Websocket.OriginPatterns); err != nil {
				h.metrics.rejected("origin")
				writeHTTPError(w, http.StatusForbidden, CodeBadRequest, err.Error())
				return
			}
			srv.ServeHTTP(&upgradeWriter{ResponseWriter: w}, r.WithContext(withUpgrade(r.Context(), r)))
			return
		}
		if wantsEventStream(r) && r.Method == http.MethodGet {
			sse.ServeHTTP(w, r)
			return
		}
		if h.isClosed() {
			writeHTTPError(w, http.StatusServiceUnavailable, CodeShuttingDown, "server is shutting down")
			return
		}
		if r.Method != http.MethodPost {
			h.metrics.rejected("method")
			w.Header().Set("Allow", http.MethodPost)
			writeHTTPError(w, http.StatusMethodNotAllowed, CodeBadRequest,
				"use POST with a JSON body, a websocket, or server-sent events (Accept: text/event-stream)")
			return
		}
		form, problem := postBody(r)
		if problem == "" && form && wantsEventStream(r) {
			problem = "an event stream request is JSON: send it with Content-Type: application/json"
		}
		if problem != "" {
			h.metrics.rejected("media_type")
			w.Header().Set("Accept", mediaJSON) // what a 415 may name (RFC 9110, 15.5.16)
			writeHTTPError(w, http.StatusUnsupportedMediaType, CodeBadRequest, problem)
			return
		}
		if wantsEventStream(r) {
			sse.ServeHTTP(w, r)
			return
		}
		post.ServeHTTP(w, r)
	})
}

// MetricsHandler serves the Prometheus metrics of Options.Registry without
// authentication, for a listener of its own that only scrapers reach
// (fleetgraph serve --metrics-listen). Its labels name every cluster of the
// fleet and their states, which /metrics on the API listener shows to
// fleet admins only.
func (h *Handler) MetricsHandler() http.Handler { return h.scrape }

// adminOnly lets fleet admins through and answers everyone else with 403:
// what it guards describes the whole fleet.
func (h *Handler) adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := viewerFrom(r.Context())
		if err != nil {
			writeHTTPError(w, http.StatusUnauthorized, CodeUnauthenticated, "authentication required")
			return
		}
		if !v.admin {
			writeHTTPError(w, http.StatusForbidden, CodeForbidden, "only fleet admins may read /metrics on this listener")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readyz answers 200 when Options.Ready says so, 503 otherwise.
func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if h.opts.Ready != nil {
		if err := h.opts.Ready(r.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
			return
		}
	}
	_, _ = w.Write([]byte("ok\n"))
}

// closeGrace bounds how long Close waits for the final messages of ended
// operations before closing their websockets.
const closeGrace = time.Second

// Close ends every subscription (with SHUTTING_DOWN), closes every
// websocket with 1001 and ends every event stream, each after its final
// messages, then waits for the sockets to close and the streams to end, at
// most until ctx ends. Queries in flight, over any transport, are canceled
// first (they answer CANCELED), so a flood of expensive reads cannot hold
// the server up. Later websockets, streams and queries are refused with
// SHUTTING_DOWN; http.Server.Shutdown then finds the HTTP requests done.
func (h *Handler) Close(ctx context.Context) error {
	h.stopQueries()
	h.sse.shut()
	h.connMu.Lock()
	h.closed = true
	conns := make([]*wsConn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.connMu.Unlock()
	select {
	case <-h.streams.close():
	case <-ctx.Done():
		return fmt.Errorf("graph: waiting for subscriptions to end: %w", ctx.Err())
	}
	// Let the operations' final messages out before the close frames.
	quiet, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	for _, c := range conns {
		c.waitQuiet(quiet)
	}
	for _, c := range conns {
		_ = c.WriteClose(closeGoingAway, "server shutting down")
	}
	// Streams end with their subscriptions; a stream still open after
	// the grace (a query still running, a write still pending) is ended.
	if h.sse.wait(quiet) != nil {
		h.sse.cancelAll(errStreamShutdown)
		if err := h.sse.wait(ctx); err != nil {
			return fmt.Errorf("graph: waiting for event streams to end: %w", err)
		}
	}
	for _, c := range conns {
		select {
		case <-c.closed:
		case <-ctx.Done():
			return fmt.Errorf("graph: waiting for websockets to close: %w", ctx.Err())
		}
	}
	return nil
}

func (h *Handler) isClosed() bool {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	return h.closed
}

// track registers an open websocket; it fails once Close has begun.
func (h *Handler) track(c *wsConn) bool {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if h.closed {
		return false
	}
	h.conns[c] = struct{}{}
	h.metrics.wsConnected(1)
	return true
}

func (h *Handler) untrack(c *wsConn) {
	h.connMu.Lock()
	defer h.connMu.Unlock()
	if _, ok := h.conns[c]; ok {
		delete(h.conns, c)
		h.metrics.wsConnected(-1)
	}
}

// upgradeWriter keeps a failed upgrade to one response: coder/websocket
// writes its own error response, after which gqlgen would write a second
// one. Hijack and Unwrap reach the real writer.
type upgradeWriter struct {
	http.ResponseWriter
	wrote, frozen bool
}

func (u *upgradeWriter) WriteHeader(code int) {
	if u.wrote {
		u.frozen = true
		return
	}
	u.wrote = true
	u.ResponseWriter.WriteHeader(code)
}

func (u *upgradeWriter) Write(b []byte) (int, error) {
	if u.frozen {
		return len(b), nil
	}
	u.wrote = true
	return u.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController and coder/websocket find the
// hijacker.
func (u *upgradeWriter) Unwrap() http.ResponseWriter { return u.ResponseWriter }
