package fleetgraph_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestOneProbeLoopForManySubscribers: however many viewers watch a
// cluster, fleetgraph probes its API server once per ProbeInterval (one
// probe loop per cluster, DESIGN.md; seed 000's health check polled once
// per client). 100 viewers hold real websocket subscriptions to the
// cluster's connection state, the fleet status and its object changes,
// and every /readyz request fleetgraph sends to the cluster is counted on
// the way out, whatever code sends it.
func TestOneProbeLoopForManySubscribers(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "probe"})
	var readyz atomic.Int64
	spec := connection.Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) {
		cfg := rest.CopyConfig(c.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.URL.Path == "/readyz" {
					readyz.Add(1)
				}
				return rt.RoundTrip(r)
			})
		})
		return cfg, nil
	}}
	const viewers = 100
	var tokens strings.Builder
	for i := range viewers {
		fmt.Fprintf(&tokens, "token-%d,viewer-%d,uid-%d,admins\n", i, i, i)
	}
	users, err := authz.ParseStaticTokens(strings.NewReader(tokens.String()), "test", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	const interval = 200 * time.Millisecond
	srv, err := fleetgraph.New(fleetgraph.Config{
		Clusters: []connection.Spec{spec}, Authenticator: users, AdminGroups: []string{"admins"},
		Connection: connection.Options{ProbeInterval: interval},
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitConnected(t, hs.URL, "token-0", c.Name)

	// Every viewer subscribes three ways; the fleet status answers at once
	// (the others send only changes), so its first answer shows the
	// socket's subscriptions are running.
	subs := []string{
		fmt.Sprintf(`subscription { clusterConnection(clusters: [%q]) { cluster state } }`, c.Name),
		"subscription { fleet { message } }",
		"subscription { objectChanges { type } }",
	}
	for i := range viewers {
		ws := graphqlSocket(t, hs.URL, fmt.Sprintf("token-%d", i))
		for j, q := range subs {
			if err := wsjson.Write(t.Context(), ws, map[string]any{"id": fmt.Sprint(j), "type": "subscribe", "payload": map[string]any{"query": q}}); err != nil {
				t.Fatal(err)
			}
		}
		readFirst(t, ws, "1")
	}

	before := readyz.Load()
	const window = 3 * time.Second
	time.Sleep(window)
	n := readyz.Load() - before
	// One loop sends at most one probe per interval (a ticker drops the
	// ticks it misses), 15 in 3 s; a loop per viewer would send 1,500.
	t.Logf("%d /readyz requests in %s with %d viewers subscribed", n, window, viewers)
	if most := int64(window/interval) + 2; n > most || n < 3 {
		t.Fatalf("%d /readyz requests in %s, want 3 to %d: one probe loop every %s", n, window, most, interval)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// waitConnected polls Query.clusters until the cluster is CONNECTED.
func waitConnected(t *testing.T, url, token, cluster string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := query(t, url, token, `{ clusters { name connection { state } } }`)
		if strings.Contains(string(r.Data), fmt.Sprintf(`{"name":%q,"connection":{"state":%q}}`, cluster, index.StateConnected)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster %s not CONNECTED within 60s: %s %v", cluster, r.Data, r.Errors)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readFirst reads from a socket until each operation id has sent a next
// message, answering pings; any error message fails the test.
func readFirst(t *testing.T, ws *websocket.Conn, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for len(want) > 0 {
		var m struct {
			ID, Type string
			Payload  any
		}
		if err := wsjson.Read(ctx, ws, &m); err != nil {
			t.Fatalf("waiting for the first answers of %v: %v", ids, err)
		}
		switch m.Type {
		case "ping":
			_ = wsjson.Write(ctx, ws, map[string]any{"type": "pong"})
		case "next":
			delete(want, m.ID)
		case "error", "complete":
			t.Fatalf("operation %s: %s %v", m.ID, m.Type, m.Payload)
		}
	}
}
