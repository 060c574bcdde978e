package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// TestReleaseAllDisownsLast: at shutdown the collector stops every cluster
// and releases every cluster lease before it ends any edge session, with
// one Hub.DisownAll (hub13b): the lease writes are bound by releaseAll's
// deadline and must not wait behind a stalled edge's session, and the
// other collectors find the leases free at once. The hub outlives the
// collector (an embedder's UseHub), so only releaseAll ends the sessions.
// Each edge reads until its Reject and looks then: the collector must hold
// nothing and every cluster lease must be free. It reads nothing more, so
// its session's end waits for its close (closeGrace, 2 s): a collector
// that disowned one cluster at a time, before releasing the next, is
// still in that wait, holding the other clusters and their leases, while
// the edge looks.
func TestReleaseAllDisownsLast(t *testing.T) {
	lt := startLeaseTest(t)
	clusters := []string{"edge-0", "edge-1", "edge-2"}
	tokens := map[string]string{}
	for _, c := range clusters {
		tokens["tok-"+c] = c
	}
	a := newCollector(t, natsServer(t), "a", lt.cluster.Config, lt.ns, nil)
	hub, err := edge.NewHub(edge.HubOptions{
		Store: index.New(memtables.Open), Tokens: edge.NewStaticTokens(tokens),
		Claims: a.collector, IsPull: a.collector.IsPull,
	})
	must(t, err)
	a.collector.UseHub(hub)
	a.running, a.driven = a.running+1, false
	go func() { a.done <- a.collector.Run(a.ctx) }()
	hubCtx, stopHub := context.WithCancel(context.Background())
	hubDone := make(chan error, 1)
	go func() { hubDone <- hub.Run(hubCtx) }()
	srv := httptest.NewServer(hub)
	t.Cleanup(func() {
		stopHub()
		must(t, <-hubDone)
		srv.Close()
	})
	waitOwnLease(t, a.collector)

	type look struct {
		cluster string
		reason  edge.Reason
		held    []string
		leased  []string // clusters whose lease names a holder
		err     error
	}
	looks := make(chan look, len(clusters))
	for _, cluster := range clusters {
		ws := dialEdge(t, "ws"+strings.TrimPrefix(srv.URL, "http")+"/edge", cluster, "tok-"+cluster)
		go func() {
			l := look{cluster: cluster}
			defer func() { looks <- l }()
			m, err := readEdge(ws, time.Minute)
			for err == nil && m.Type != edge.TypeReject {
				m, err = readEdge(ws, time.Minute)
			}
			if err != nil {
				l.err = err
				return
			}
			l.reason, l.held = m.Reject.Reason, a.holds()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, c := range clusters {
				lease, err := lt.kube.CoordinationV1().Leases(lt.ns).Get(ctx, clusterLeaseName(c), metav1.GetOptions{})
				if err != nil {
					l.err = err
					return
				}
				if cl, ok := parseClusterLease(lease); !ok || cl.holder != "" {
					l.leased = append(l.leased, c)
				}
			}
		}()
	}
	for _, cluster := range clusters {
		if l := lt.clusterLease(t, cluster); l.holder != a.collector.incarnation {
			t.Fatalf("the lease of %s names %q, want collector a (%s)", cluster, l.holder, a.collector.incarnation)
		}
	}

	a.cancel()
	for range clusters {
		l := <-looks
		switch {
		case l.err != nil:
			t.Errorf("edge of %s: %v", l.cluster, l.err)
		case l.reason != edge.ReasonSuperseded:
			t.Errorf("edge of %s was rejected with %s, want %s", l.cluster, l.reason, edge.ReasonSuperseded)
		case len(l.held) > 0 || len(l.leased) > 0:
			t.Errorf("the edge of %s was told to go while collector a still held %v and the leases of %v: releaseAll ended a session before it stopped and released every cluster (or a lease release failed: see the log)",
				l.cluster, l.held, l.leased)
		}
	}
}

// dialEdge connects to the hub as an edge of cluster and waits for the
// welcome.
func dialEdge(t *testing.T, url, cluster, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{edge.Subprotocol}}) //nolint:bodyclose // coder closes it
	must(t, err)
	t.Cleanup(func() { _ = ws.CloseNow() }) // the hub closed it already, as a rule
	hello, err := json.Marshal(&edge.Message{Type: edge.TypeHello, Seq: 1, Time: time.Now(), Hello: &edge.Hello{
		Version: edge.ProtocolVersion, Cluster: cluster, Instance: cluster + "-1", Token: token,
	}})
	must(t, err)
	must(t, ws.Write(ctx, websocket.MessageText, hello))
	m, err := readEdge(ws, 30*time.Second)
	must(t, err)
	if m.Type != edge.TypeWelcome {
		t.Fatalf("hello for %s answered with %s %+v", cluster, m.Type, m.Reject)
	}
	return ws
}

// readEdge reads the hub's next message, waiting at most wait.
func readEdge(ws *websocket.Conn, wait time.Duration) (*edge.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, data, err := ws.Read(ctx)
	if err != nil {
		return nil, err
	}
	var m edge.Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decoding %q: %w", data, err)
	}
	return &m, nil
}
