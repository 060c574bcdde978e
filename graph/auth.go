package graph

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

// viewer is an authenticated caller. It is immutable: a websocket keeps one
// for its whole life, so anything that depends on RBAC (the access set) is
// computed per operation, never cached here.
type viewer struct {
	id    *authz.Identity
	admin bool // member of Options.AdminGroups: sees everything
	// expires is when the credentials expire (authz.Expiring); zero if
	// they do not. A websocket closes then.
	expires time.Time
	// revoked is closed when the credentials are revoked
	// (authz.Revocable); nil if they cannot be. A websocket closes then.
	revoked <-chan struct{}
}

// Context keys. Each is its own unexported type, so no other package can
// collide with them.
type (
	viewerKey    struct{}
	upgradeKey   struct{}
	operationKey struct{}
)

func withViewer(ctx context.Context, v *viewer) context.Context {
	return context.WithValue(ctx, viewerKey{}, v)
}

// viewerFrom returns the authenticated viewer. Every request that reaches a
// resolver has one; the error is a safety net against a wiring mistake.
func viewerFrom(ctx context.Context) (*viewer, error) {
	if v, ok := ctx.Value(viewerKey{}).(*viewer); ok {
		return v, nil
	}
	return nil, newError(CodeUnauthenticated, nil, "not authenticated")
}

// upgrade is what the websocket InitFunc needs from the HTTP upgrade
// request: headers and TLS state, for request-header authentication and
// for a bearer token sent as a header by non-browser clients.
type upgrade struct {
	header http.Header
	tls    *tls.ConnectionState
	conn   *wsConn // set by wsAcceptor.Accept
}

func withUpgrade(ctx context.Context, r *http.Request) context.Context {
	return context.WithValue(ctx, upgradeKey{}, &upgrade{header: r.Header, tls: r.TLS})
}

// isWebsocket reports whether ctx belongs to a websocket connection.
func isWebsocket(ctx context.Context) bool {
	_, ok := ctx.Value(upgradeKey{}).(*upgrade)
	return ok
}

// operation is per-operation state: the error a subscription's pump ended
// with (see endWith), and for an objectChanges subscription on the events
// fast path (fastevents.go) either the encoded events its pump sends and
// eventsInterceptor reads, or the writer that sends them to the websocket
// itself (directEvents), which eventsInterceptor runs.
type operation struct {
	mu     sync.Mutex
	endErr error
	events <-chan []byte
	direct *directEvents
}

func withOperation(ctx context.Context) context.Context {
	return context.WithValue(ctx, operationKey{}, &operation{})
}

// access returns what v may see in the whole fleet, as authz answers it
// (authz owns the one cache of access); fleet admins see everything.
func (s *service) access(v *viewer) *index.Access {
	if v.admin {
		return s.allAccess
	}
	return s.authz.Access(v.id)
}

// clusterVisible reports whether v can see anything in a cluster (fleet
// admins: every cluster). It decides which clusters a viewer is told about
// in clusters, cluster, fleet and clusterConnection.
func (s *service) clusterVisible(v *viewer, cluster string) bool {
	return s.access(v).SeesCluster(cluster)
}

// newViewer wraps an authenticated user.
func (s *service) newViewer(u user.Info) *viewer {
	v := &viewer{id: authz.NewIdentity(u)}
	v.expires, _ = authz.ExpiresAt(u)
	v.revoked = authz.RevokedChan(u)
	for _, g := range u.GetGroups() {
		if slices.Contains(s.adminGroups, g) {
			v.admin = true
			break
		}
	}
	return v
}

// authenticate runs the configured authenticator. Its errors say why
// credentials were rejected and never contain the credentials.
func (s *service) authenticate(ctx context.Context, c authz.Credentials) (*viewer, error) {
	u, err := s.authn.Authenticate(ctx, c)
	if err != nil {
		return nil, err
	}
	return s.newViewer(u), nil
}

// requireAuth authenticates plain HTTP requests from their Authorization
// header (or proxy headers) and answers 401 when that fails. Websocket
// upgrades pass through: their token comes in connection_init, which
// wsInit checks.
func (h *Handler) requireAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isUpgradeRequest(r) {
			next.ServeHTTP(w, r.WithContext(withUpgrade(r.Context(), r)))
			return
		}
		v, err := h.svc.authenticate(r.Context(), authz.CredentialsFromRequest(r))
		if err != nil {
			h.metrics.authFailures.WithLabelValues("http").Inc()
			h.log.DebugContext(r.Context(), "graphql: authentication failed", "err", err, "remote", r.RemoteAddr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleetgraph"`)
			writeHTTPError(w, http.StatusUnauthorized, CodeUnauthenticated, authMessage(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(withViewer(r.Context(), v)))
	})
}

// authMessage explains a failed authentication without echoing anything
// the caller sent or anything a verifier said: whether a token was
// malformed, expired, signed by an unknown key or for another audience
// helps an attacker more than a user, whose remedy is the same (get a new
// token). The reason goes to the debug log.
func authMessage(err error) string {
	if errors.Is(err, authz.ErrNoCredentials) {
		return "authentication required"
	}
	return "authentication failed: the credentials were not accepted"
}

// Close codes of the graphql-transport-ws protocol that gqlgen does not
// send itself.
const (
	closeBadRequest       = 4400 // malformed or unknown message
	closeUnauthorized     = 4401 // subscribe before connection_init
	closeForbidden        = 4403 // connection_init rejected, or its credentials expired
	closeInitTimeout      = 4408 // no connection_init in time
	closeDuplicateID      = 4409 // an operation id is already in use
	closeTooManyInits     = 4429 // a second connection_init
	closeGoingAway        = 1001 // server shutting down
	closePolicyViolation  = 1008 // a legacy graphql-ws client stopped answering pings
	closeReasonForbidden  = "Forbidden"
	closeReasonInitTimout = "Connection initialisation timeout"
	closeReasonExpired    = "Forbidden: credentials expired"
	closeReasonRevoked    = "Forbidden: credentials revoked"
)

// wsInit is the websocket InitFunc: it authenticates the connection_init
// payload and returns no payload, so connection_ack never echoes the token.
// On failure the socket closes with 4403.
func (h *Handler) wsInit(ctx context.Context, p transport.InitPayload) (context.Context, *transport.InitPayload, error) {
	c := authz.Credentials{Token: tokenFromPayload(p)}
	if up, ok := ctx.Value(upgradeKey{}).(*upgrade); ok {
		c.Header, c.TLS = up.header, up.tls
		if c.Token == "" {
			c.Token = authz.CredentialsFromRequest(&http.Request{Header: up.header}).Token
		}
	}
	v, err := h.svc.authenticate(ctx, c)
	if err == nil && !v.expires.IsZero() && !v.expires.After(time.Now()) {
		err = errors.New("credentials expired")
	}
	if err == nil && v.revoked != nil {
		select {
		case <-v.revoked:
			err = errors.New("credentials revoked")
		default:
		}
	}
	if err != nil {
		h.metrics.authFailures.WithLabelValues("websocket").Inc()
		h.log.DebugContext(ctx, "graphql: websocket authentication failed", "err", err)
		ctx = transport.WithWebsocketCloseCode(ctx, closeForbidden)
		ctx = transport.AppendCloseReason(ctx, closeReasonForbidden)
		return ctx, nil, errors.New(authMessage(err))
	}
	if up, ok := ctx.Value(upgradeKey{}).(*upgrade); ok && up.conn != nil {
		if !v.expires.IsZero() {
			up.conn.expireAt(v.expires)
		}
		if revoked := v.revoked; revoked != nil {
			go closeWhenRevoked(up.conn, revoked)
		}
	}
	return withViewer(ctx, v), nil, nil
}

// closeWhenRevoked closes a websocket with 4403 when the credentials it
// was initialized with are revoked (a token removed from the token file),
// or returns when the socket closes first.
func closeWhenRevoked(c *wsConn, revoked <-chan struct{}) {
	select {
	case <-revoked:
		_ = c.WriteClose(closeForbidden, closeReasonRevoked)
	case <-c.closed:
	}
}

// tokenFromPayload finds the bearer token in a connection_init payload. It
// accepts the shapes clients use: {"Authorization": "Bearer t"} (any case),
// {"token": "t"}, {"authToken": "t"} and {"headers": {"Authorization": ...}}.
func tokenFromPayload(p transport.InitPayload) string {
	bearer := func(s string) string {
		s = strings.TrimSpace(s)
		if scheme, tok, ok := strings.Cut(s, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return s
	}
	for k, v := range p {
		if s, ok := v.(string); ok && strings.EqualFold(k, "Authorization") {
			return bearer(s)
		}
	}
	for _, k := range []string{"token", "authToken"} {
		if s := p.GetString(k); s != "" {
			return bearer(s)
		}
	}
	if hdrs, ok := p["headers"].(map[string]any); ok {
		for k, v := range hdrs {
			if s, ok := v.(string); ok && strings.EqualFold(k, "Authorization") {
				return bearer(s)
			}
		}
	}
	return ""
}

// isUpgradeRequest reports whether r asks for a websocket.
// gqlgen's websocket transport claims any request with an Upgrade header,
// so this must agree with it.
func isUpgradeRequest(r *http.Request) bool {
	return r.Header.Get("Upgrade") != ""
}

// allFleet is the access of fleet admins.
func allFleet() *index.Access { return &index.Access{All: true} }
