package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/connection/edge"
)

// runtimeMetrics are metrics of the Go runtime and process collectors that
// newMetricsRegistry registers: defaults of each, and one of each
// runtime/metrics set it adds.
var runtimeMetrics = []string{
	"go_goroutines", "go_memstats_heap_inuse_bytes", "go_gc_duration_seconds", "go_gc_gogc_percent",
	"go_gc_heap_live_bytes", "go_sched_latencies_seconds",
	"process_resident_memory_bytes", "process_cpu_seconds_total",
}

// TestRuntimeMetrics scrapes /metrics of `fleetgraph serve` and of
// `fleetgraph edge` on --metrics-listen, over HTTP, and finds the Go
// runtime and process metrics (the command registers them, not the
// library), and on the edge's the agent's own counters (which
// TestAgentMetrics in connection/edge checks one by one). Neither needs a
// cluster: serve has none, and the edge's manager and local cluster do
// not answer.
func TestRuntimeMetrics(t *testing.T) {
	dir := t.TempDir()
	t.Run("serve", func(t *testing.T) {
		tokens := filepath.Join(dir, "tokens.csv")
		if err := os.WriteFile(tokens, []byte("admin-token,root,root,\"ops\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		metricsAddr := freeAddr(t)
		f := serveFlags{listen: freeAddr(t), metricsListen: metricsAddr, tokensFile: tokens, adminGroups: []string{"ops"}}
		runUntilCleanup(t, func(ctx context.Context) error { return serve(ctx, &f, nil) })
		body := scrape(t, "http://"+metricsAddr+"/metrics")
		checkRuntimeMetrics(t, body)
		if !strings.Contains(body, "\n# TYPE fleetgraph_clusters ") {
			t.Errorf("serve's /metrics lacks fleetgraph's own metrics:\n%.2000s", body)
		}
	})
	t.Run("edge", func(t *testing.T) {
		token, kubeconfig := filepath.Join(dir, "edge-token"), filepath.Join(dir, "kubeconfig")
		if err := os.WriteFile(token, []byte("edge-token\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: leaf, cluster: {server: "https://`+freeAddr(t)+`"}}]
users: [{name: edge, user: {token: t}}]
contexts: [{name: leaf, context: {cluster: leaf, user: edge}}]
current-context: leaf
`), 0o600); err != nil {
			t.Fatal(err)
		}
		metricsAddr := freeAddr(t)
		f := edgeFlags{
			manager: "http://" + freeAddr(t) + "/edge", cluster: "leaf", tokenFile: token, kubeconfig: kubeconfig,
			resync: edge.DefaultResyncInterval, resyncMin: edge.DefaultResyncMin, resyncMax: edge.DefaultResyncMax,
			metricsListen: metricsAddr,
		}
		opts, err := f.options()
		if err != nil {
			t.Fatal(err)
		}
		reg := newMetricsRegistry()
		opts.Registerer = reg
		agent, err := edge.NewAgent(opts)
		if err != nil {
			t.Fatal(err)
		}
		runUntilCleanup(t, func(ctx context.Context) error { return f.run(ctx, agent, reg) })
		body := scrape(t, "http://"+metricsAddr+"/metrics")
		checkRuntimeMetrics(t, body)
		// The agent's own counters (review-s10-rest L7), at 0: its
		// manager does not answer.
		for _, name := range []string{
			"fleetgraph_edge_agent_sessions_total", "fleetgraph_edge_agent_rejects_total", "fleetgraph_edge_agent_messages_sent_total",
			"fleetgraph_edge_agent_sent_bytes_total", "fleetgraph_edge_agent_snapshot_rows_sent_total", "fleetgraph_edge_agent_rows_over_quota_total",
			"fleetgraph_edge_agent_buffer_overflows_total", "fleetgraph_edge_agent_most_parts_in_flight",
		} {
			if !strings.Contains(body, "\n"+name+" 0\n") {
				t.Errorf("edge's /metrics lacks %s 0", name)
			}
		}
		if t.Failed() {
			t.Logf("/metrics:\n%.3000s", body)
		}
	})
}

// runUntilCleanup runs run in a goroutine until the test ends, and fails
// the test if run returns an error.
func runUntilCleanup(t *testing.T, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// scrape GETs url until it answers (the listener opens in the background)
// and returns the body of a 200.
func scrape(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := client.Get(url)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d %v %.500s", url, resp.StatusCode, rerr, body)
			}
			return string(body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkRuntimeMetrics fails the test for each of runtimeMetrics that body,
// in the text exposition format, does not declare.
func checkRuntimeMetrics(t *testing.T, body string) {
	t.Helper()
	for _, name := range runtimeMetrics {
		if !strings.Contains(body, "\n# TYPE "+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%.3000s", body)
	}
}
