// Package exampletest runs fleetgraph over real test clusters for the
// tests of the examples: the server as a program that embeds it runs it
// (fleetgraph.New, Server.Run, Server.Handler on a real listener), static
// token users, and a GraphQL-over-HTTP client.
//
// It is test support only: the examples themselves use nothing from it.
package exampletest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// AdminGroup is the fleet-admin group of the "admin" user.
const AdminGroup = "platform"

// Fleet is a running fleetgraph server over test clusters.
type Fleet struct {
	// URL is the server's base URL (http://127.0.0.1:port).
	URL string
	// Server is the embedded server.
	Server *fleetgraph.Server
	// Registry holds the server's metrics.
	Registry *prometheus.Registry
	tokens   map[string]string
}

// Cluster is a test cluster and the labels fleetgraph gives it.
type Cluster struct {
	*testcluster.Cluster
	Labels map[string]string
}

// Serve starts fleetgraph collecting clusters (through their fault
// proxies) and serving on a loopback port until the test ends. Users get a
// static token each (see Token), under their own name, with no groups;
// "admin" is always there and is a fleet admin.
func Serve(t *testing.T, clusters []Cluster, users ...string) *Fleet {
	t.Helper()
	tokens := map[string]string{"admin": "admin-token"}
	csv := fmt.Sprintf("admin-token,admin,admin,%q\n", AdminGroup)
	for _, u := range users {
		tokens[u] = u + "-token"
		csv += fmt.Sprintf("%s-token,%s,%s\n", u, u, u)
	}
	authn, err := authz.ParseStaticTokens(strings.NewReader(csv), "example users", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	specs := make([]connection.Spec, 0, len(clusters))
	for _, c := range clusters {
		cfg := c.Config
		specs = append(specs, connection.Spec{
			Name: c.Name, Labels: c.Labels,
			Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(cfg), nil },
		})
	}
	reg := prometheus.NewRegistry()
	srv, err := fleetgraph.New(fleetgraph.Config{
		Clusters: specs, Authenticator: authn, AdminGroups: []string{AdminGroup}, Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleetgraph: %v", err)
		}
		hs.Close()
	})
	return &Fleet{URL: hs.URL, Server: srv, Registry: reg, tokens: tokens}
}

// Token returns a user's bearer token.
func (f *Fleet) Token(user string) string {
	tok, ok := f.tokens[user]
	if !ok {
		panic(fmt.Sprintf("exampletest: no user %q", user))
	}
	return tok
}

// WaitConnected waits until each named cluster is in state (CONNECTED
// also needs a completed sync) and fails the test after timeout.
func (f *Fleet) WaitConnected(t *testing.T, timeout time.Duration, state index.ConnectionState, clusters ...string) {
	t.Helper()
	Eventually(t, timeout, fmt.Sprintf("clusters %v %s", clusters, state), func() error {
		for _, name := range clusters {
			row, ok := f.Server.Store().GetCluster(nil, name)
			switch {
			case !ok:
				return fmt.Errorf("no cluster %s", name)
			case row.State != state:
				return fmt.Errorf("cluster %s is %s (%s)", name, row.State, row.LastError)
			case state == index.StateConnected && !row.Synced:
				return fmt.Errorf("cluster %s has not synced", name)
			}
		}
		return nil
	})
}

// Eventually polls cond until it returns nil, and fails the test with its
// last error after timeout.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Response is a GraphQL response.
type Response struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

// Post sends one GraphQL request with a bearer token and returns the HTTP
// status and the decoded response.
func Post(ctx context.Context, url, token, query string, variables map[string]any) (int, Response, error) {
	body, err := json.Marshal(map[string]any{"query": query, "variables": variables})
	if err != nil {
		return 0, Response{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/graphql", bytes.NewReader(body))
	if err != nil {
		return 0, Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, Response{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, Response{}, err
	}
	var out Response
	if err := json.Unmarshal(raw, &out); err != nil {
		return resp.StatusCode, Response{}, fmt.Errorf("HTTP %d, not a GraphQL response: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, out, nil
}

// Query runs a query as user and decodes its data into out; a transport
// error or any GraphQL error fails the test.
func (f *Fleet) Query(t *testing.T, user, query string, variables map[string]any, out any) {
	t.Helper()
	code, resp, err := Post(t.Context(), f.URL, f.Token(user), query, variables)
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK || len(resp.Errors) > 0 {
		t.Fatalf("HTTP %d, errors %+v", code, resp.Errors)
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		t.Fatalf("decoding %s: %v", resp.Data, err)
	}
}

// Metric reads one gauge or counter of the server's metrics, 0 when it
// has no sample with exactly these labels.
func (f *Fleet) Metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := f.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if maps.Equal(got, labels) {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Sorted returns a sorted copy of s, for comparing sets.
func Sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
