package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
)

// assertAlive checks that the server still answers an ordinary query after
// a hostile request.
func (f *fixture) assertAlive() {
	f.t.Helper()
	var r struct{ Viewer struct{ Username string } }
	f.query("alice", `{ viewer { username } }`, nil, &r)
	if r.Viewer.Username != "alice" {
		f.t.Fatalf("server answered %+v after the hostile request", r)
	}
}

func TestHTTPSecurity(t *testing.T) {
	f := newFixture(t)
	deep := "{ __schema { types { name " + strings.Repeat("ofType { name ", 20) + strings.Repeat("}", 20) + " } } }"
	var aliases strings.Builder
	aliases.WriteString("{")
	for i := range 1000 {
		fmt.Fprintf(&aliases, " a%d: viewer { username }", i)
	}
	aliases.WriteString(" }")
	fullObjects := `edges { cursor node { id cluster namespace group version kind resource name uid status message
      labels { key value } ownerReferences { kind name } createdAt updatedAt resourceVersion summary stale } }`
	complex := fmt.Sprintf("{ a: objects(first: 1000) { %s } b: objects(first: 1000) { %s } }", fullObjects, fullObjects)
	tokens := "{" + strings.Repeat(" __typename", 12000) + " }"
	cycle := `query { ...A } fragment A on Query { viewer { username } ...B } fragment B on Query { ...A }`

	tests := []struct {
		name       string
		user       string
		query      string
		wantStatus int
		wantCode   string
		wantLimit  string
		wantMsg    string
	}{
		{name: "anonymous", query: `{ viewer { username } }`, wantStatus: 401, wantCode: CodeUnauthenticated, wantMsg: "authentication required"},
		{name: "bad token", user: "not-a-token", query: `{ viewer { username } }`, wantStatus: 401, wantCode: CodeUnauthenticated, wantMsg: "not accepted"},
		{name: "too deep", user: "alice", query: deep, wantStatus: 200, wantCode: codeValidationFailed, wantLimit: "depth", wantMsg: "at most 15"},
		{name: "too complex", user: "alice", query: complex, wantStatus: 200, wantCode: codeValidationFailed, wantLimit: "complexity", wantMsg: "at most 50000"},
		{name: "1000 aliases", user: "alice", query: aliases.String(), wantStatus: 200, wantCode: codeValidationFailed, wantLimit: "aliases", wantMsg: "1000 aliases"},
		{name: "token flood", user: "alice", query: tokens, wantStatus: 200, wantCode: "GRAPHQL_PARSE_FAILED", wantMsg: "token limit"},
		{name: "fragment cycle", user: "alice", query: cycle, wantStatus: 200, wantCode: codeValidationFailed, wantMsg: "Cannot spread fragment"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := f.post(tc.user, tc.query, nil)
			if status != tc.wantStatus || resp.code() != tc.wantCode {
				t.Fatalf("status %d, errors %+v; want %d %s", status, resp.Errors, tc.wantStatus, tc.wantCode)
			}
			if len(resp.Data) > 0 && string(resp.Data) != "null" {
				t.Errorf("a rejected request returned data %s", resp.Data)
			}
			if !strings.Contains(resp.Errors[0].Message, tc.wantMsg) {
				t.Errorf("message %q does not say %q", resp.Errors[0].Message, tc.wantMsg)
			}
			if tc.wantLimit != "" && resp.Errors[0].Extensions["limit"] != tc.wantLimit {
				t.Errorf("limit %v, want %s", resp.Errors[0].Extensions["limit"], tc.wantLimit)
			}
			f.assertAlive()
		})
	}
}

func TestHTTPBodyCap(t *testing.T) {
	f := newFixture(t)
	big := bytes.Repeat([]byte(" "), 10<<20)
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			body := append([]byte(`{"query":"{ viewer { username } }"`), big...)
			body = append(body, '}')
			var rd interface {
				Read([]byte) (int, error)
			} = bytes.NewReader(body)
			if chunked {
				rd = struct{ *bytes.Reader }{bytes.NewReader(body)} // hides the length
			}
			req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/graphql", rd)
			must(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+f.tokens["alice"])
			status, resp := f.do(req)
			if status != http.StatusRequestEntityTooLarge || resp.code() != CodeRequestTooLarge {
				t.Fatalf("status %d, errors %+v; want 413 %s", status, resp.Errors, CodeRequestTooLarge)
			}
			if !strings.Contains(resp.Errors[0].Message, "exceeds 1048576 bytes") {
				t.Errorf("message %q", resp.Errors[0].Message)
			}
			f.assertAlive()
		})
	}
}

func TestHTTPMethodsAndIntrospection(t *testing.T) {
	f := newFixture(t)
	resp, err := http.Get(f.srv.URL + "/graphql")
	must(t, err)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET /graphql: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	var r struct {
		Schema struct{ QueryType struct{ Name string } } `json:"__schema"`
	}
	f.query("alice", `{ __schema { queryType { name } } }`, nil, &r)
	if r.Schema.QueryType.Name != "Query" {
		t.Errorf("introspection: %+v", r)
	}

	off := newFixture(t, func(o *Options) { o.DisableIntrospection = true })
	status, gr := off.post("alice", `{ __schema { queryType { name } } }`, nil)
	if status != http.StatusOK || len(gr.Errors) == 0 || !strings.Contains(gr.Errors[0].Message, "introspection disabled") {
		t.Errorf("introspection off: %d %+v", status, gr.Errors)
	}
}

func TestEndpoints(t *testing.T) {
	ready := fmt.Errorf("still syncing")
	f := newFixture(t, func(o *Options) {
		o.Ready = func(context.Context) error { return ready }
	})
	get := func(path string) (int, string) {
		resp, err := http.Get(f.srv.URL + path)
		must(t, err)
		defer func() { _ = resp.Body.Close() }()
		var b bytes.Buffer
		_, err = b.ReadFrom(resp.Body)
		must(t, err)
		return resp.StatusCode, b.String()
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "still syncing") {
		t.Errorf("/readyz %d %q", code, body)
	}
	ready = nil
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz when ready: %d", code)
	}
	if code, body := get("/"); code != 200 || !strings.Contains(body, `<div id="app">`) {
		t.Errorf("/ %d, no dashboard", code)
	}
	if code, body := get("/graphiql"); code != 200 || !strings.Contains(body, `<main id="graphiql">`) {
		t.Errorf("/graphiql %d, no GraphiQL page", code)
	}
	if code, _ := get("/nothing-here"); code != 404 {
		t.Errorf("/nothing-here %d", code)
	}
	f.assertAlive()
	f.post("", `{ viewer { username } }`, nil)
	// /metrics names every cluster: on the API listener only fleet admins
	// read it; the scrape handler for a listener of its own needs nothing.
	body := f.get("/metrics")
	scrape := httptest.NewServer(f.h.MetricsHandler())
	defer scrape.Close()
	resp, err := http.Get(scrape.URL)
	must(t, err)
	scraped, err := io.ReadAll(resp.Body)
	must(t, err)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(scraped), `fleetgraph_clusters{state="CONNECTED"} 2`) {
		t.Errorf("MetricsHandler: %d %.200s", resp.StatusCode, scraped)
	}
	for _, tc := range []struct {
		user     string
		wantCode int
	}{{"", 401}, {"alice", 403}, {"admin", 403}} {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/metrics", nil)
		must(t, err)
		if tc.user != "" {
			req.Header.Set("Authorization", "Bearer "+f.tokens[tc.user])
		}
		code, b := f.send(req)
		if code != tc.wantCode || strings.Contains(string(b), "east") {
			t.Errorf("/metrics as %q: %d %s; want %d and no cluster names", tc.user, code, b, tc.wantCode)
		}
	}
	for _, want := range []string{
		`fleetgraph_clusters{state="CONNECTED"} 2`,
		`fleetgraph_clusters{state="DISCONNECTED"} 1`,
		`fleetgraph_cluster_up{cluster="east"} 1`,
		`fleetgraph_cluster_up{cluster="north"} 0`,
		`fleetgraph_cluster_last_seen_timestamp_seconds{cluster="east"} 1.7672256e+09`,
		`fleetgraph_cluster_kind_errors{cluster="west"} 0`,
		`fleetgraph_graphql_operations_total{operation="viewer",outcome="ok",type="query"}`,
		`fleetgraph_graphql_operation_duration_seconds_bucket{operation="viewer",type="query"`,
		`fleetgraph_graphql_authentication_failures_total{transport="http"} 1`,
		`fleetgraph_graphql_subscriptions_active{subscription="objectChanges"} 0`,
		`fleetgraph_graphql_subscription_events_dropped_total{subscription="objectChanges"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// wsOptions shortens the websocket timers for tests.
func wsOptions(o *Options) {
	o.Websocket.InitTimeout = 300 * time.Millisecond
	o.Websocket.MaxOperations = 2
	o.Websocket.ReadLimit = 64 << 10
}

func TestWebsocketSecurity(t *testing.T) {
	f := newFixture(t, wsOptions)
	initMsg := func(token string) wsMessage {
		return wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"Authorization": "Bearer " + token})}
	}
	sub := func(id string) wsMessage {
		return wsMessage{ID: id, Type: "subscribe", Payload: mustJSON(t, map[string]any{"query": "subscription { fleet { message } }"})}
	}
	tests := []struct {
		name     string
		protocol string
		send     []wsMessage
		raw      string
		wantCode websocket.StatusCode
		wantMsg  string
	}{
		{name: "no init", protocol: "graphql-transport-ws", wantCode: closeInitTimeout, wantMsg: "initialisation timeout"},
		{name: "bad token", protocol: "graphql-transport-ws", send: []wsMessage{initMsg("nope")}, wantCode: closeForbidden, wantMsg: "Forbidden"},
		{name: "no token", protocol: "graphql-transport-ws", send: []wsMessage{{Type: "connection_init"}}, wantCode: closeForbidden, wantMsg: "Forbidden"},
		{name: "legacy bad token", protocol: "graphql-ws", send: []wsMessage{initMsg("nope")}, wantCode: closeForbidden, wantMsg: "Forbidden"},
		{name: "subscribe before init", protocol: "graphql-transport-ws", send: []wsMessage{sub("1")}, wantCode: closeUnauthorized, wantMsg: "Unauthorized"},
		{name: "duplicate id", protocol: "graphql-transport-ws", send: []wsMessage{initMsg(f.tokens["alice"]), sub("1"), sub("1")}, wantCode: closeDuplicateID, wantMsg: "Subscriber for 1 already exists"},
		{name: "second init", protocol: "graphql-transport-ws", send: []wsMessage{initMsg(f.tokens["alice"]), initMsg(f.tokens["alice"])}, wantCode: closeTooManyInits, wantMsg: "Too many initialisation requests"},
		{name: "unknown message", protocol: "graphql-transport-ws", send: []wsMessage{initMsg(f.tokens["alice"]), {Type: "launch"}}, wantCode: closeBadRequest, wantMsg: "Invalid message"},
		{name: "not json", protocol: "graphql-transport-ws", raw: "{nope", wantCode: closeBadRequest, wantMsg: "Invalid message"},
		{name: "oversized message", protocol: "graphql-transport-ws", raw: `{"type":"connection_init","payload":{"x":"` + strings.Repeat("x", 100<<10) + `"}}`, wantCode: websocket.StatusMessageTooBig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := f.dial(tc.protocol, nil)
			if tc.raw != "" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = c.c.Write(ctx, websocket.MessageText, []byte(tc.raw))
				cancel()
			}
			for _, m := range tc.send {
				c.send(m)
			}
			start := time.Now()
			code, reason := c.closeStatus(5 * time.Second)
			if code != tc.wantCode || !strings.Contains(reason, tc.wantMsg) {
				t.Errorf("closed with %d %q, want %d %q", code, reason, tc.wantCode, tc.wantMsg)
			}
			if tc.name == "no init" && time.Since(start) > 3*time.Second {
				t.Errorf("init timeout took %v", time.Since(start))
			}
			f.assertAlive()
		})
	}
}

func TestWebsocketOrigin(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Websocket.OriginPatterns = []string{"dash.example.com"} })
	dial := func(origin string) (*http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, f.wsURL(), &websocket.DialOptions{
			Subprotocols: []string{"graphql-transport-ws"}, HTTPHeader: http.Header{"Origin": {origin}},
		})
		if c != nil {
			_ = c.CloseNow()
		}
		return resp, err
	}
	resp, err := dial("https://evil.example.org")
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("disallowed origin: err %v, response %+v; want 403", err, resp)
	}
	var body gqlResponse
	must(t, json.NewDecoder(resp.Body).Decode(&body))
	_ = resp.Body.Close()
	if !strings.Contains(body.Errors[0].Message, "not allowed") {
		t.Errorf("403 body %+v", body)
	}
	for _, ok := range []string{"https://dash.example.com", f.srv.URL} {
		if _, err := dial(ok); err != nil {
			t.Errorf("origin %s refused: %v", ok, err)
		}
	}
	f.assertAlive()
}

func TestWebsocketAckHasNoPayloadAndLimitsOperations(t *testing.T) {
	f := newFixture(t, wsOptions)
	c := f.dial("graphql-transport-ws", nil)
	c.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"Authorization": "Bearer " + f.tokens["alice"]})})
	ack := c.read()
	if ack.Type != "connection_ack" || len(ack.Payload) != 0 {
		t.Fatalf("ack %+v: want connection_ack without payload", ack)
	}
	for _, id := range []string{"1", "2", "3"} {
		c.subscribe(id, "subscription { fleet { message } }", nil)
	}
	got := map[string]string{}
	for len(got) < 3 {
		m := c.read()
		if _, seen := got[m.ID]; !seen {
			got[m.ID] = m.Type
			if m.ID == "3" && (m.Type != "error" || !strings.Contains(string(m.Payload), CodeTooManyOperations)) {
				t.Errorf("third operation: %+v", m)
			}
		}
	}
	if got["1"] != "next" || got["2"] != "next" {
		t.Errorf("first two operations got %v", got)
	}
	// Completing one frees a slot, and the id can be used again.
	c.send(wsMessage{ID: "1", Type: "complete"})
	c.subscribe("1", "subscription { fleet { message } }", nil)
	for {
		m := c.read()
		if m.ID == "1" && m.Type == "next" {
			break
		}
		if m.ID == "1" && m.Type == "error" {
			t.Fatalf("reusing a completed id: %+v", m)
		}
	}
}

func TestSubscriptionOverHTTPIsRejected(t *testing.T) {
	f := newFixture(t)
	status, resp := f.post("alice", `subscription { fleet { message } }`, nil)
	if status != http.StatusOK || resp.code() != CodeBadRequest || !strings.Contains(resp.Errors[0].Message, "websocket") {
		t.Errorf("status %d, errors %+v", status, resp.Errors)
	}
}

// TestIntrospectionQueryFitsTheLimits runs the full introspection query of
// graphql-js (GraphiQL's, saved in testdata by
// `node -e "console.log(require('graphql').getIntrospectionQuery({...}))"`)
// under the default limits, which must admit it.
func TestIntrospectionQueryFitsTheLimits(t *testing.T) {
	f := newFixture(t)
	q, err := os.ReadFile("testdata/introspection.graphql")
	must(t, err)
	var r struct {
		Schema struct{ Types []struct{ Name string } } `json:"__schema"`
	}
	f.query("alice", string(q), nil, &r)
	if len(r.Schema.Types) < 20 {
		t.Errorf("introspection returned %d types", len(r.Schema.Types))
	}
}

func TestTokenFromPayload(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload map[string]any
		want    string
	}{
		{"Authorization bearer", map[string]any{"Authorization": "Bearer t1"}, "t1"},
		{"lower-case, no scheme", map[string]any{"authorization": "t2"}, "t2"},
		{"token", map[string]any{"token": "t3"}, "t3"},
		{"authToken", map[string]any{"authToken": "Bearer t4"}, "t4"},
		{"headers", map[string]any{"headers": map[string]any{"AUTHORIZATION": "bearer t5"}}, "t5"},
		{"none", map[string]any{"other": "x"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tokenFromPayload(tc.payload); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLegacyGraphQLWS(t *testing.T) {
	f := newFixture(t)
	c := f.dial("graphql-ws", nil)
	c.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"authToken": f.tokens["alice"]})})
	if m := c.read(); m.Type != "connection_ack" {
		t.Fatalf("got %+v", m)
	}
	c.send(wsMessage{ID: "1", Type: "start", Payload: mustJSON(t, map[string]any{"query": "subscription { fleet { message } }"})})
	if m := c.readFor("1"); m.Type != "data" || !strings.Contains(string(m.Payload), "All 1 clusters synced") {
		t.Fatalf("got %+v %s", m, m.Payload)
	}
	c.send(wsMessage{ID: "1", Type: "stop"})
	if m := c.readFor("1"); m.Type != "complete" {
		t.Fatalf("after stop got %+v", m)
	}
	c.send(wsMessage{Type: "connection_terminate"})
	if code, _ := c.closeStatus(5 * time.Second); code != websocket.StatusNormalClosure {
		t.Errorf("terminate closed with %d", code)
	}
}

// expiringAuth authenticates tokens "expiring-<user>" as that test user
// with credentials that expire, as an OIDC ID token does, at the time the
// test last set with expireIn: once its fixture is ready, so that a slow
// start-up cannot eat the window.
type expiringAuth struct{ exp atomic.Int64 } // Unix nanoseconds

// expireIn makes the credentials expire d from now and returns when.
func (a *expiringAuth) expireIn(d time.Duration) time.Time {
	exp := time.Now().Add(d)
	a.exp.Store(exp.UnixNano())
	return exp
}

type expiringUser struct {
	user.DefaultInfo
	exp time.Time
}

func (u *expiringUser) ExpiresAt() time.Time { return u.exp }

func (a *expiringAuth) Authenticate(_ context.Context, c authz.Credentials) (user.Info, error) {
	name, ok := strings.CutPrefix(c.Token, "expiring-")
	if !ok {
		return nil, authz.ErrNotApplicable
	}
	return &expiringUser{DefaultInfo: user.DefaultInfo{Name: name, Groups: testUsers[name]}, exp: time.Unix(0, a.exp.Load())}, nil
}

// TestWebsocketClosesWhenCredentialsExpire: a websocket authenticated with
// expiring credentials is closed with 4403 when they expire, and its
// subscriptions end; already expired credentials are refused at init; a
// socket with credentials that do not expire stays open.
func TestWebsocketClosesWhenCredentialsExpire(t *testing.T) {
	auth := &expiringAuth{}
	f := newFixture(t, wsOptions, func(o *Options) {
		o.Authenticator = &authz.Union{Authenticators: []authz.Authenticator{auth, o.Authenticator}}
	})
	exp := auth.expireIn(1500 * time.Millisecond)
	init := func(c *wsClient, token string) {
		c.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"Authorization": "Bearer " + token})})
	}
	const fleetSub = "subscription { fleet { message } }"

	expiring := f.dial("graphql-transport-ws", nil)
	init(expiring, "expiring-alice")
	if m := expiring.read(); m.Type != "connection_ack" {
		t.Fatalf("expected connection_ack, got %+v", m)
	}
	expiring.subscribe("1", fleetSub, nil)
	if m := expiring.readFor("1"); m.Type != "next" {
		t.Fatalf("expected a fleet event, got %+v", m)
	}
	lasting := f.connect("alice")

	code, reason := expiring.closeStatus(5 * time.Second)
	if code != closeForbidden || !strings.Contains(reason, "expired") {
		t.Errorf("closed with %d %q, want %d and a reason saying the credentials expired", code, reason, closeForbidden)
	}
	if early := time.Until(exp); early > 0 {
		t.Errorf("closed %v before the credentials expired", early)
	}
	lasting.subscribe("1", fleetSub, nil)
	if m := lasting.readFor("1"); m.Type != "next" {
		t.Fatalf("a socket with lasting credentials: expected a fleet event, got %+v", m)
	}

	late := f.dial("graphql-transport-ws", nil)
	init(late, "expiring-alice")
	if code, reason := late.closeStatus(5 * time.Second); code != closeForbidden || !strings.Contains(reason, "Forbidden") {
		t.Errorf("expired credentials at init: closed with %d %q, want %d", code, reason, closeForbidden)
	}
	f.assertAlive()
}
