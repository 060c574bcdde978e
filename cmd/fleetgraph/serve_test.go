package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(natsNodeEnv); spec != "" {
		os.Exit(runNATSNode(spec))
	}
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

func TestServeFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		f    serveFlags
		want string
	}{
		{"no authenticator", serveFlags{}, "no authenticator"},
		{"missing token file", serveFlags{tokensFile: "/nonexistent/tokens.csv"}, "tokens.csv"},
		{"oidc without client id", serveFlags{oidcIssuer: "https://issuer.example"}, "--oidc-client-id"},
		{"request header without TLS", serveFlags{requestHeaderCA: "ca.pem"}, "--tls-cert-file"},
		{"unknown authenticator allowed system names", serveFlags{tokensFile: "t.csv", allowSystemNames: []string{"ldap"}}, `unknown authenticator "ldap"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.f.authenticator(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestServe runs `fleetgraph serve` in-process against a real cluster and
// queries it over HTTP as a restricted user and as an admin.
func TestServe(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "served"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 2, Pods: 2}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte("admin-token,root,root,\"ops\"\nnobody-token,nobody,nobody,\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	specs, err := connection.KubeconfigSpecs(c.Kubeconfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, metricsAddr := freeAddr(t), freeAddr(t)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	f := serveFlags{listen: addr, metricsListen: metricsAddr, tokensFile: tokens, adminGroups: []string{"ops"}, relist: 30 * time.Second}
	go func() { done <- serve(ctx, &f, specs) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	query := func(token string) (int, string) {
		body := `{"query":"{ fleet { message } objects(filter: {kinds: [\"Pod\"]}) { totalCount } }"}`
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/graphql", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := query("admin-token")
		var r struct {
			Data struct {
				Fleet   struct{ Message string }
				Objects struct{ TotalCount int }
			}
		}
		// Pods can be listed before every kind has synced, so wait for
		// both: the 4 pods and the fleet reported synced.
		if code == http.StatusOK && json.Unmarshal([]byte(body), &r) == nil && r.Data.Objects.TotalCount == 4 &&
			r.Data.Fleet.Message == "All 1 clusters synced" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin never saw the 4 pods with the fleet synced (want message %q): %d %s", "All 1 clusters synced", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, body := query("nobody-token"); code != http.StatusOK || !strings.Contains(body, `"totalCount":0`) {
		t.Errorf("a user without RBAC bindings: %d %s", code, body)
	}
	if code, body := query(""); code != http.StatusUnauthorized {
		t.Errorf("anonymous: %d %s", code, body)
	}
	if code, body := query("wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d %s", code, body)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/readyz", addr))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz %d after the first sync", resp.StatusCode)
	}

	// /metrics names the clusters: scrapers read it on --metrics-listen,
	// and on --listen only --admin-group members do.
	get := func(url, token string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	const clusterLabel = `cluster="served"`
	if code, body := get("http://"+metricsAddr+"/metrics", ""); code != http.StatusOK || !strings.Contains(body, clusterLabel) {
		t.Errorf("--metrics-listen: %d, %d bytes, cluster label present: %v", code, len(body), strings.Contains(body, clusterLabel))
	}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"nobody-token", http.StatusForbidden}, {"admin-token", http.StatusOK}} {
		code, body := get("http://"+addr+"/metrics", tc.token)
		if code != tc.want || (code != http.StatusOK && strings.Contains(body, "served")) {
			t.Errorf("/metrics on --listen with token %q: %d %.200s; want %d", tc.token, code, body, tc.want)
		}
	}
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}
