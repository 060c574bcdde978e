package fleetgraph_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
	"github.com/fleetgraph/fleetgraph/internal/testissuer"
)

// This file plays an attacker against identities (issue 12, item 4): a
// real cluster's RBAC, a real OIDC issuer over TLS, a token file on disk,
// and fleetgraph over real HTTP and websockets.

// testIssuer is a real OIDC issuer that signs tokens for fleetgraph.
type testIssuer struct{ *testissuer.Issuer }

func newTestIssuer(t *testing.T) *testIssuer { return &testIssuer{testissuer.New(t)} }

// token signs an ID token for sub with groups, valid for ttl (negative:
// already expired).
func (i *testIssuer) token(t *testing.T, sub string, ttl time.Duration, groups ...string) string {
	t.Helper()
	now := time.Now()
	return i.Sign(t, i.Key, map[string]any{
		"iss": i.URL(), "aud": "fleetgraph", "sub": sub, "groups": groups,
		"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(ttl).Unix(),
	})
}

func (i *testIssuer) authenticator(t *testing.T, prefix string) *authz.OIDC {
	t.Helper()
	a, err := authz.NewOIDC(t.Context(), authz.OIDCConfig{
		IssuerURL: i.URL(), ClientID: "fleetgraph", GroupsClaim: "groups",
		UsernamePrefix: prefix, HTTPClient: i.Server.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// runServer serves a fleetgraph server over real HTTP until the test ends.
func runServer(t *testing.T, cfg fleetgraph.Config) (*fleetgraph.Server, string) {
	t.Helper()
	srv, err := fleetgraph.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
		hs.Close()
	})
	return srv, hs.URL
}

// waitSynced waits until the admin token sees want pods in a synced fleet.
func waitSynced(t *testing.T, url, adminToken string, want int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := query(t, url, adminToken, `{ fleet { rebuilding } objects(filter: {kinds: ["Pod"]}) { totalCount } }`)
		if strings.Contains(string(r.Data), fmt.Sprintf(`"totalCount":%d`, want)) && strings.Contains(string(r.Data), `"rebuilding":false`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet never synced %d pods: %s %v", want, r.Data, r.Errors)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bindView binds the built-in view ClusterRole in ns to a subject.
func bindView(t *testing.T, c *testcluster.Cluster, ns string, subject rbacv1.Subject) {
	t.Helper()
	_, err := kubernetes.NewForConfigOrDie(c.DirectConfig).RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "view-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{subject},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

// podNamespaces returns the namespaces of the pods token sees, with the
// viewer's username, failing on any GraphQL error.
func podNamespaces(t *testing.T, url, token string) (string, []string) {
	t.Helper()
	r := query(t, url, token, `{ viewer { username } objects(first: 100, filter: {kinds: ["Pod"]}) { edges { node { namespace } } } }`)
	if len(r.Errors) > 0 {
		t.Fatalf("query: %v", r.Errors)
	}
	var d struct {
		Viewer  struct{ Username string }
		Objects struct {
			Edges []struct{ Node struct{ Namespace string } }
		}
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		t.Fatal(err)
	}
	var nss []string
	for _, e := range d.Objects.Edges {
		if !slices.Contains(nss, e.Node.Namespace) {
			nss = append(nss, e.Node.Namespace)
		}
	}
	slices.Sort(nss)
	return d.Viewer.Username, nss
}

// post sends a query and returns the HTTP status and body.
func post(t *testing.T, url, token, q string) (int, string) {
	t.Helper()
	body, err := json.Marshal(map[string]string{"query": q})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/graphql", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// graphqlSocket opens a graphql-transport-ws websocket authenticated with
// token and waits for connection_ack.
func graphqlSocket(t *testing.T, url, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/graphql", &websocket.DialOptions{ //nolint:bodyclose // coder closes it
		Subprotocols: []string{"graphql-transport-ws"},
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	if err := wsjson.Write(ctx, c, map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + token}}); err != nil {
		t.Fatal(err)
	}
	var ack struct{ Type string }
	if err := wsjson.Read(ctx, c, &ack); err != nil || ack.Type != "connection_ack" {
		t.Fatalf("connection_init: %+v %v", ack, err)
	}
	return c
}

// closedWith reads from a websocket until it closes and returns the close
// code and how long that took; it fails after within.
func closedWith(t *testing.T, c *websocket.Conn, within time.Duration) (int, string, time.Duration) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	for {
		var m map[string]any
		err := wsjson.Read(ctx, c, &m)
		if err == nil {
			if m["type"] == "ping" {
				_ = wsjson.Write(ctx, c, map[string]any{"type": "pong"})
			}
			continue
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return int(ce.Code), ce.Reason, time.Since(start)
		}
		t.Fatalf("websocket: no close frame within %v: %v", within, err)
	}
}

// TestIdentitiesCannotCollide: every authenticator names its users in its
// own namespace (OIDC users carry the issuer by default), no credential
// makes its holder a ServiceAccount or a system: group member unless the
// authenticator is allowed to, and a token removed from the token file
// stops working within 5 s, websockets included.
func TestIdentitiesCannotCollide(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "ids"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 4, Pods: 1}); err != nil {
		t.Fatal(err)
	}
	prefixed, unprefixed := newTestIssuer(t), newTestIssuer(t)
	oidcAlice := prefixed.URL() + "#alice"
	bindView(t, c, "ns-0", userSubject("alice"))                                                              // the token file's alice
	bindView(t, c, "ns-1", userSubject(oidcAlice))                                                            // the prefixed issuer's alice
	bindView(t, c, "ns-2", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "ns-2", Name: "robot"}) // a ServiceAccount
	bindView(t, c, "ns-3", rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts"})

	tokensPath := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens := func(content string) {
		t.Helper()
		if err := os.WriteFile(tokensPath+".new", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tokensPath+".new", tokensPath); err != nil {
			t.Fatal(err)
		}
	}
	writeTokens("root-token,root,0,ops\nalice-token,alice,1\nbob-token,bob,2\n")
	tokens, err := authz.OpenTokenFile(tokensPath, authz.TokenFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watchCtx, stopWatching := context.WithCancel(context.Background())
	watching := make(chan struct{})
	go func() { defer close(watching); tokens.Run(watchCtx) }()
	t.Cleanup(func() { stopWatching(); <-watching })

	specs, err := connection.KubeconfigSpecs(c.Kubeconfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, url := runServer(t, fleetgraph.Config{
		Clusters: specs, AdminGroups: []string{"ops"},
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{
			tokens, prefixed.authenticator(t, ""), unprefixed.authenticator(t, "-"),
		}},
	})
	waitSynced(t, url, "root-token", 4)

	t.Run("each authenticator names its own users", func(t *testing.T) {
		for _, tc := range []struct {
			name, token, user string
			nss               []string
		}{
			{"token file", "alice-token", "alice", []string{"ns-0"}},
			{"OIDC, default prefix", prefixed.token(t, "alice", time.Hour), oidcAlice, []string{"ns-1"}},
			{"OIDC, no prefix by choice", unprefixed.token(t, "alice", time.Hour), "alice", []string{"ns-0"}},
		} {
			user, nss := podNamespaces(t, url, tc.token)
			if user != tc.user || !slices.Equal(nss, tc.nss) {
				t.Errorf("%s: viewer %q sees pods in %v; want %q seeing %v", tc.name, user, nss, tc.user, tc.nss)
			}
		}
		// The live read impersonates the prefixed name on the cluster,
		// whose RBAC decides.
		tok := prefixed.token(t, "alice", time.Hour)
		detail := `{ object(cluster: "ids", kind: "Pod", namespace: "%s", name: "pod-0") { name } }`
		if r := query(t, url, tok, fmt.Sprintf(detail, "ns-1")); len(r.Errors) > 0 || !strings.Contains(string(r.Data), `"pod-0"`) {
			t.Errorf("OIDC alice reading her own pod: %s %v", r.Data, r.Errors)
		}
		if r := query(t, url, tok, fmt.Sprintf(detail, "ns-0")); len(r.Errors) != 1 || r.Errors[0].Extensions["code"] != "FORBIDDEN" {
			t.Errorf("OIDC alice reading the token file alice's pod: %s %v; want FORBIDDEN", r.Data, r.Errors)
		}
	})

	t.Run("a claim cannot make a ServiceAccount or a system group", func(t *testing.T) {
		// With the default prefix the name is harmless: a plain user.
		user, nss := podNamespaces(t, url, prefixed.token(t, "system:serviceaccount:ns-2:robot", time.Hour))
		if user != prefixed.URL()+"#system:serviceaccount:ns-2:robot" || len(nss) != 0 {
			t.Errorf("a prefixed ServiceAccount-looking sub is %q and sees %v; want a plain user seeing nothing", user, nss)
		}
		for _, tc := range []struct{ name, token string }{
			{"unprefixed ServiceAccount sub", unprefixed.token(t, "system:serviceaccount:ns-2:robot", time.Hour)},
			{"system:masters group", prefixed.token(t, "mallory", time.Hour, "system:masters")},
			{"ServiceAccount group", prefixed.token(t, "mallory", time.Hour, "system:serviceaccounts")},
		} {
			code, body := post(t, url, tc.token, `{ objects(filter: {kinds: ["Pod"]}) { totalCount } }`)
			if code != http.StatusUnauthorized || !strings.Contains(body, "UNAUTHENTICATED") {
				t.Errorf("%s: %d %s; want 401", tc.name, code, body)
			}
		}
	})

	t.Run("401 says nothing of why", func(t *testing.T) {
		for _, tok := range []string{
			prefixed.token(t, "alice", -time.Hour),                    // expired
			prefixed.token(t, "mallory", time.Hour, "system:masters"), // reserved group
			"not-a-token",
		} {
			code, body := post(t, url, tok, `{ viewer { username } }`)
			if code != http.StatusUnauthorized || !strings.Contains(body, "the credentials were not accepted") {
				t.Errorf("%d %s; want 401 with the fixed message", code, body)
			}
			for _, leak := range []string{"expired", "oidc", "system:", "signature", "issuer", "token is"} {
				if strings.Contains(strings.ToLower(body), leak) {
					t.Errorf("the 401 body echoes the verifier (%q): %s", leak, body)
				}
			}
		}
	})

	t.Run("a removed token stops working within 5 s", func(t *testing.T) {
		aliceWS := graphqlSocket(t, url, "alice-token")
		bobWS := graphqlSocket(t, url, "bob-token")
		writeTokens("root-token,root,0,ops\nbob-token,bob,2\n")
		code, reason, took := closedWith(t, aliceWS, 5*time.Second)
		if code != 4403 || !strings.Contains(reason, "revoked") {
			t.Errorf("alice's websocket closed with %d %q; want 4403 saying the credentials were revoked", code, reason)
		}
		t.Logf("alice's websocket closed %v after the token file changed", took)
		if code, body := post(t, url, "alice-token", `{ viewer { username } }`); code != http.StatusUnauthorized {
			t.Errorf("the removed token still works over HTTP: %d %s", code, body)
		}
		// bob's socket stays and answers.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := wsjson.Write(ctx, bobWS, map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{"query": "{ viewer { username } }"}}); err != nil {
			t.Fatal(err)
		}
		var m struct {
			Type    string
			Payload json.RawMessage
		}
		if err := wsjson.Read(ctx, bobWS, &m); err != nil || m.Type != "next" || !strings.Contains(string(m.Payload), `"bob"`) {
			t.Errorf("bob's websocket after alice's token was removed: %+v %s %v", m, m.Payload, err)
		}
	})
}
