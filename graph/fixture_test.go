package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// The test fleet: three clusters, each with the same RBAC roles and a few
// namespaces of pods, services and Kustomizations, and users whose access
// differs.
//
//	east  (CONNECTED)    team-a, team-b
//	west  (CONNECTED)    team-a, team-c
//	north (DISCONNECTED) team-a           (stale, not synced)
//
//	admin  group system:masters → cluster-admin everywhere (via RBAC)
//	root   group fleet-admins   → Options.AdminGroups
//	alice  view in east/team-a
//	bob    view in west/team-c, and get on one pod in east/team-b
//	carol  nothing
var (
	podKind = index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	svcKind = index.Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
	ksKind  = index.Kind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true}
	nsKind  = index.Kind{Version: "v1", Kind: "Namespace", Resource: "namespaces"}

	clusterRoleKind = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}
	crbKind         = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings"}
	roleKind        = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles", Namespaced: true}
	rbKind          = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}

	testNamespaces = map[string][]string{"east": {"team-a", "team-b"}, "west": {"team-a", "team-c"}, "north": {"team-a"}}
	testUsers      = map[string][]string{
		"admin": {"system:masters"}, "root": {"fleet-admins"}, "alice": nil, "bob": nil, "carol": nil,
	}
)

// Objects per namespace of the test fleet.
const (
	podsPerNS = 5
	svcsPerNS = 2
	ksPerNS   = 1
	objsPerNS = podsPerNS + svcsPerNS + ksPerNS
)

var testStatuses = []index.Status{index.StatusHealthy, index.StatusHealthy, index.StatusUnhealthy, index.StatusProgressing, index.StatusHealthy}

func testObject(kind index.Kind, cluster, ns, name string, status index.Status) index.Object {
	return index.Object{
		Cluster: cluster, Namespace: ns, Group: kind.Group, Version: kind.Version, Kind: kind.Kind, Resource: kind.Resource,
		Name: name, UID: fmt.Sprintf("uid-%s-%s-%s", cluster, ns, name), Status: status,
		Labels:    index.LabelsOf(map[string]string{"app": name, "team": ns}),
		CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Message: "message of " + name,
		Summary: json.RawMessage(`{"phase":"Running"}`),
	}
}

func clusterRole(cluster, name string, rules ...index.PolicyRule) index.Object {
	return index.Object{
		Cluster: cluster, Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles",
		Name: name, Policy: &index.Policy{Rules: rules},
	}
}

func role(cluster, ns, name string, rules ...index.PolicyRule) index.Object {
	return index.Object{
		Cluster: cluster, Namespace: ns, Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles",
		Name: name, Policy: &index.Policy{Rules: rules},
	}
}

func binding(cluster, ns, name, roleKind, roleName string, subjects ...index.Subject) index.Object {
	kind, resource := index.KindRoleBinding, "rolebindings"
	if ns == "" {
		kind, resource = index.KindClusterRoleBinding, "clusterrolebindings"
	}
	return index.Object{
		Cluster: cluster, Namespace: ns, Group: index.RBACGroup, Version: "v1", Kind: kind, Resource: resource,
		Name: name, Policy: &index.Policy{RoleRef: index.RoleRef{APIGroup: index.RBACGroup, Kind: roleKind, Name: roleName}, Subjects: subjects},
	}
}

func userSubject(name string) index.Subject {
	return index.Subject{Kind: "User", APIGroup: index.RBACGroup, Name: name}
}

func groupSubject(name string) index.Subject {
	return index.Subject{Kind: "Group", APIGroup: index.RBACGroup, Name: name}
}

// viewRules may read the three object kinds of the test fleet.
var viewRules = []index.PolicyRule{
	{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "services"}},
	{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"kustomize.toolkit.fluxcd.io"}, Resources: []string{"kustomizations"}},
}

// seedCluster writes one cluster of the test fleet through the Sink.
func seedCluster(t testing.TB, s *index.Store, name string, state index.ConnectionState, synced bool) {
	t.Helper()
	ctx := context.Background()
	must(t, s.UpsertCluster(ctx, index.Cluster{
		Name: name, Mode: index.ModePull, State: state, Since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		LastSeen: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Synced:   synced, Labels: map[string]string{"region": name}, LastError: map[bool]string{true: "", false: "dial tcp: connection refused"}[state != index.StateDisconnected],
	}))
	var pods, svcs, kss, nss []index.Object
	for _, ns := range testNamespaces[name] {
		nss = append(nss, testObject(nsKind, name, "", ns, index.StatusHealthy))
		for i := range podsPerNS {
			pods = append(pods, testObject(podKind, name, ns, fmt.Sprintf("pod-%s-%d", ns, i), testStatuses[i]))
		}
		for i := range svcsPerNS {
			svcs = append(svcs, testObject(svcKind, name, ns, fmt.Sprintf("svc-%s-%d", ns, i), index.StatusHealthy))
		}
		for i := range ksPerNS {
			kss = append(kss, testObject(ksKind, name, ns, fmt.Sprintf("ks-%s-%d", ns, i), index.StatusUnhealthy))
		}
	}
	for _, r := range []struct {
		kind index.Kind
		rows []index.Object
	}{
		{nsKind, nss},
		{podKind, pods},
		{svcKind, svcs},
		{ksKind, kss},
		{clusterRoleKind, []index.Object{
			clusterRole(name, "view", viewRules...),
			clusterRole(name, "cluster-admin", index.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}),
		}},
		{crbKind, []index.Object{binding(name, "", "cluster-admin", index.KindClusterRole, "cluster-admin", groupSubject("system:masters"))}},
		{roleKind, rolesOf(name)},
		{rbKind, bindingsOf(name)},
	} {
		must(t, s.Replace(ctx, name, r.kind, r.rows))
	}
}

func rolesOf(cluster string) []index.Object {
	if cluster != "east" {
		return nil
	}
	return []index.Object{role(cluster, "team-b", "one-pod", index.PolicyRule{
		Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"pod-team-b-0"},
	})}
}

func bindingsOf(cluster string) []index.Object {
	switch cluster {
	case "east":
		return []index.Object{
			binding(cluster, "team-a", "alice-view", index.KindClusterRole, "view", userSubject("alice")),
			binding(cluster, "team-b", "bob-one-pod", index.KindRole, "one-pod", userSubject("bob")),
		}
	case "west":
		return []index.Object{binding(cluster, "team-c", "bob-view", index.KindClusterRole, "view", userSubject("bob"))}
	}
	return nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// fixture is a running API over the test fleet on a real HTTP server.
type fixture struct {
	t      testing.TB
	store  *index.Store
	h      *Handler
	srv    *httptest.Server
	reg    *prometheus.Registry
	tokens map[string]string
}

// newFixture starts the API over a fresh test fleet. Options may be
// adjusted by opt before the handler is built.
func newFixture(t testing.TB, opt ...func(*Options)) *fixture {
	t.Helper()
	return newFixtureWith(t, seededStore(t), opt...)
}

// seededStore returns a store holding the test fleet.
func seededStore(t testing.TB, opts ...index.Option) *index.Store {
	t.Helper()
	store := index.New(memtables.Open, opts...)
	seedCluster(t, store, "east", index.StateConnected, true)
	seedCluster(t, store, "west", index.StateConnected, true)
	seedCluster(t, store, "north", index.StateDisconnected, false)
	return store
}

// newFixtureWith starts the API over store.
func newFixtureWith(t testing.TB, store *index.Store, opt ...func(*Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, store: store, reg: prometheus.NewRegistry(), tokens: map[string]string{}}
	var csv strings.Builder
	for name, groups := range testUsers {
		tok := "token-" + name
		f.tokens[name] = tok
		fmt.Fprintf(&csv, "%s,%s,uid-%s,%q\n", tok, name, name, strings.Join(groups, ","))
	}
	st, err := authz.ParseStaticTokens(strings.NewReader(csv.String()), "test tokens", authz.Naming{AllowSystemNames: true})
	must(t, err)
	opts := Options{
		Store:         store,
		Authorizer:    authz.NewAuthorizer(store, authz.Options{}),
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{st}},
		AdminGroups:   []string{"fleet-admins"},
		Registry:      f.reg,
		Logger:        testLogger(t),
	}
	for _, o := range opt {
		o(&opts)
	}
	h, err := NewHandler(opts)
	must(t, err)
	f.h = h
	f.srv = httptest.NewServer(h)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.Close(ctx); err != nil {
			t.Errorf("closing handler: %v", err)
		}
		f.srv.Close()
	})
	return f
}

// gqlResponse is a GraphQL response as a client sees it.
type gqlResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []gqlErr        `json:"errors"`
}

type gqlErr struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

func (r gqlResponse) code() string {
	if len(r.Errors) == 0 {
		return ""
	}
	c, _ := r.Errors[0].Extensions["code"].(string)
	return c
}

// post sends a query over HTTP POST with a user's token ("" for none) and
// returns the status and the decoded body.
func (f *fixture) post(user, query string, vars map[string]any) (int, gqlResponse) {
	f.t.Helper()
	return f.decode(f.rawPost(user, query, vars))
}

// rawPost returns the status and exact body of a query.
func (f *fixture) rawPost(user, query string, vars map[string]any) (int, []byte) {
	f.t.Helper()
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	must(f.t, err)
	req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/graphql", bytes.NewReader(body))
	must(f.t, err)
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		tok, ok := f.tokens[user]
		if !ok {
			tok = user // a literal bad token
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return f.send(req)
}

// send sends a request and returns the status and body.
func (f *fixture) send(req *http.Request) (int, []byte) {
	f.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	must(f.t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	must(f.t, err)
	return resp.StatusCode, b
}

func (f *fixture) do(req *http.Request) (int, gqlResponse) {
	f.t.Helper()
	return f.decode(f.send(req))
}

// decode parses a GraphQL response body.
func (f *fixture) decode(status int, b []byte) (int, gqlResponse) {
	f.t.Helper()
	var out gqlResponse
	if err := json.Unmarshal(b, &out); err != nil {
		f.t.Fatalf("decoding %d response %q: %v", status, b, err)
	}
	return status, out
}

// query posts as user and fails the test on any error; it decodes data
// into out.
func (f *fixture) query(user, query string, vars map[string]any, out any) {
	f.t.Helper()
	status, resp := f.post(user, query, vars)
	if status != http.StatusOK || len(resp.Errors) > 0 {
		f.t.Fatalf("query as %s: status %d, errors %+v", user, status, resp.Errors)
	}
	must(f.t, json.Unmarshal(resp.Data, out))
}

// wsURL is the websocket URL of /graphql.
func (f *fixture) wsURL() string { return "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/graphql" }

// wsClient is a minimal client of graphql-transport-ws (or graphql-ws)
// for tests that need to see the protocol itself.
type wsClient struct {
	t       testing.TB
	c       *websocket.Conn
	pending []wsMessage // read while waiting for another operation id
	// reading is the result of the read in progress, if any. The
	// websocket library closes the connection when a read's context
	// ends, so a read that outlives a caller's deadline goes on in the
	// background, and the next call takes its message: a client that
	// waited in vain once still sees what comes later.
	reading chan readResult
}

type readResult struct {
	data []byte
	err  error
}

// errReadTimeout is readTimeout's answer when nothing arrived in time; the
// connection stays open.
var errReadTimeout = fmt.Errorf("no websocket message within the deadline: %w", context.DeadlineExceeded)

// readFor returns the next message of operation id, keeping messages of
// other operations for later.
func (c *wsClient) readFor(id string) wsMessage {
	c.t.Helper()
	for i, m := range c.pending {
		if m.ID == id {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return m
		}
	}
	for {
		m := c.read()
		if m.ID == id {
			return m
		}
		c.pending = append(c.pending, m)
	}
}

type wsMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
	raw     []byte          // the message as received
}

// dial opens a websocket with a subprotocol and optional headers.
func (f *fixture) dial(protocol string, header http.Header) *wsClient {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, f.wsURL(), &websocket.DialOptions{Subprotocols: []string{protocol}, HTTPHeader: header})
	if err != nil {
		f.t.Fatalf("dial: %v (response %+v)", err, resp)
	}
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	c.SetReadLimit(64 << 20)
	wc := &wsClient{t: f.t, c: c}
	f.t.Cleanup(func() { _ = c.CloseNow() })
	return wc
}

// connect dials graphql-transport-ws and completes connection_init as user.
func (f *fixture) connect(user string) *wsClient {
	f.t.Helper()
	c := f.dial("graphql-transport-ws", nil)
	c.send(wsMessage{Type: "connection_init", Payload: mustJSON(f.t, map[string]any{"Authorization": "Bearer " + f.tokens[user]})})
	if m := c.read(); m.Type != "connection_ack" {
		f.t.Fatalf("expected connection_ack, got %+v", m)
	}
	return c
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	must(t, err)
	return b
}

func (c *wsClient) send(m wsMessage) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(c.t, c.c.Write(ctx, websocket.MessageText, mustJSON(c.t, m)))
}

func (c *wsClient) subscribe(id, query string, vars map[string]any) {
	c.t.Helper()
	c.send(wsMessage{ID: id, Type: "subscribe", Payload: mustJSON(c.t, map[string]any{"query": query, "variables": vars})})
}

// read returns the next message that is not a ping (answering pings),
// failing the test after 10 s.
func (c *wsClient) read() wsMessage {
	c.t.Helper()
	m, err := c.readTimeout(10 * time.Second)
	if err != nil {
		c.t.Fatalf("reading websocket: %v", err)
	}
	return m
}

// readTimeout returns the next message that is not a ping or keep-alive
// within d, or errReadTimeout (or the connection's error). Reads happen
// only while a caller waits (or until the message a caller gave up on
// arrives), so a client that stops calling stops reading, as the slow
// consumer and read deadline tests need.
func (c *wsClient) readTimeout(d time.Duration) (wsMessage, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		if c.reading == nil {
			ch := make(chan readResult, 1)
			c.reading = ch
			go func() {
				_, b, err := c.c.Read(context.Background())
				ch <- readResult{b, err}
			}()
		}
		var b []byte
		select {
		case r := <-c.reading:
			if r.err != nil {
				// Read fails at once from now on; keep a read in
				// progress so that the next call gets the error too.
				c.reading <- r
				return wsMessage{}, r.err
			}
			c.reading, b = nil, r.data
		case <-timer.C:
			return wsMessage{}, errReadTimeout
		}
		m := wsMessage{raw: b}
		if err := json.Unmarshal(b, &m); err != nil {
			return wsMessage{}, fmt.Errorf("decoding %q: %w", b, err)
		}
		if m.Type == "ping" {
			c.send(wsMessage{Type: "pong"})
			continue
		}
		if m.Type == "ka" {
			continue
		}
		return m, nil
	}
}

// closeStatus waits for the server to close the socket and returns the
// close code and reason.
func (c *wsClient) closeStatus(d time.Duration) (websocket.StatusCode, string) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		_, err := c.readTimeout(time.Until(deadline))
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if ok := asCloseError(err, &ce); ok {
			return ce.Code, ce.Reason
		}
		c.t.Fatalf("expected a close frame, got %v", err)
	}
	c.t.Fatalf("no close within %v", d)
	return 0, ""
}

func asCloseError(err error, ce *websocket.CloseError) bool {
	if code := websocket.CloseStatus(err); code != -1 {
		*ce = websocket.CloseError{Code: code}
		var target websocket.CloseError
		if errors.As(err, &target) {
			*ce = target
		}
		return true
	}
	return false
}

// testLogger logs warnings and errors into the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// get fetches a path as a fleet admin (root) and returns the body, failing
// on a non-200 answer.
func (f *fixture) get(path string) string {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	must(f.t, err)
	req.Header.Set("Authorization", "Bearer "+f.tokens["root"])
	resp, err := http.DefaultClient.Do(req)
	must(f.t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	must(f.t, err)
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// waitSubscribers waits until the subscription fan-out has exactly n
// subscribers, so a test knows its subscriptions are registered before it
// makes changes.
func (f *fixture) waitSubscribers(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := f.h.streams.len()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("fan-out has %d subscribers, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
