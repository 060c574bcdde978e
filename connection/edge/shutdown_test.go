package edge

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// stalledBuffer is the socket buffer each side of a stalled edge's
// connection asks for (the kernel doubles it), and stalledWrite a write
// that cannot fit in both: the hub's write waits for the edge to read.
const (
	stalledBuffer = 64 << 10
	stalledWrite  = 4 << 20
)

// shutdownBound is the failure detector of TestShutdownCutsOffStalledEdges:
// five times shutdownGrace (3 s), for a loaded machine, and half of
// writeTimeout (30 s), which the hub waited before.
const shutdownBound = 15 * time.Second

// TestShutdownCutsOffStalledEdges: the hub ends the connections of edges
// that stopped reading within shutdownGrace when it shuts down (Run's
// context ends) or disowns their clusters (DisownAll, as the replication
// collector does at shutdown), not writeTimeout: a stalled edge held the
// manager's shutdown for about 32 s, past --shutdown-timeout and
// Kubernetes' 30 s grace period. So it does when a new connection of the
// same edge instance supersedes a stalled session (the new one waits for
// the old one's end, holding a handshake slot) and when an edge's token is
// revoked. A Reject alone would not wait: it is
// small and the socket takes it. Each edge here has stopped reading with
// a detail request of stalledWrite bytes in flight, more than the socket
// buffers hold, so the session's write lock is held by a write that
// waits, and the Reject behind it; the cut-off ends both, through the
// session's reader or, when that has returned already (a session refused
// before the shutdown), through the write itself. PongWait is long, so the silent-peer
// rule (which would close the connections at 15 s) does not end the
// sessions first.
func TestShutdownCutsOffStalledEdges(t *testing.T) {
	clusters := []string{"edge-a", "edge-b", "edge-c"}
	shutdown := func(_ *Hub, cancel context.CancelFunc, stopped <-chan struct{}, _ []*session, _ []*rawClient) error {
		cancel()
		<-stopped
		return nil
	}
	for _, tc := range []struct {
		name string
		// refused: each edge sends a message out of sequence first, so
		// its session is ending already (its reader has returned) and
		// its Reject waits behind the detail request.
		refused bool
		// again: a second connection of each edge instance is dialed
		// before end, which says Hello on it.
		again bool
		end   func(h *Hub, cancel context.CancelFunc, stopped <-chan struct{}, stalled []*session, again []*rawClient) error
	}{
		{name: "shutdown", end: shutdown},
		{name: "shutdown of refused sessions", refused: true, end: shutdown},
		{name: "disown all", end: func(h *Hub, _ context.CancelFunc, _ <-chan struct{}, _ []*session, _ []*rawClient) error {
			h.DisownAll(clusters, "collector a is shutting down")
			return nil
		}},
		{name: "superseded", again: true, end: func(_ *Hub, _ context.CancelFunc, _ <-chan struct{}, _ []*session, again []*rawClient) error {
			for i, c := range again {
				c.seq = 1
				hello := &Hello{Version: ProtocolVersion, Cluster: clusters[i], Instance: clusters[i] + "-1", Token: tokenFor(clusters[i])}
				if _, err := c.conn.write(&Message{Type: TypeHello, Seq: 1, Time: time.Now(), Hello: hello}); err != nil {
					return fmt.Errorf("hello again for %s: %w", clusters[i], err)
				}
			}
			for i, c := range again {
				m, err := c.read()
				if err != nil {
					return fmt.Errorf("the answer to hello again for %s: %w", clusters[i], err)
				}
				if m.Reject != nil {
					return fmt.Errorf("hello again for %s: refused: %w", clusters[i], m.Reject)
				}
				if m.Type != TypeWelcome {
					return fmt.Errorf("hello again for %s: got %s, want a welcome", clusters[i], m.Type)
				}
			}
			return nil
		}},
		{name: "token revoked", end: func(h *Hub, _ context.CancelFunc, _ <-chan struct{}, stalled []*session, _ []*rawClient) error {
			h.opts.Tokens.(*revocableTokens).revoked.Store(true)
			h.recheckTokens()
			for _, s := range stalled {
				<-s.done
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hub, err := NewHub(HubOptions{
				Store: index.New(memtables.Open), Tokens: &revocableTokens{StaticTokens: NewStaticTokens(testTokens)}, PongWait: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				if err := hub.Run(ctx); err != nil {
					t.Errorf("hub: %v", err)
				}
			}()
			srv := httptest.NewUnstartedServer(hub)
			srv.Listener = smallSendBuffers{Listener: srv.Listener, t: t}
			srv.Start()
			t.Cleanup(func() {
				cancel()
				<-stopped
				srv.Close()
			})
			url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/edge"

			var stalled []*session
			details := make(chan error, len(clusters))
			for _, cluster := range clusters {
				c := dialStalled(t, url)
				c.welcome(cluster, cluster+"-1") // and reads nothing more
				cfg, err := hub.RESTConfig(cluster)
				if err != nil {
					t.Fatal(err)
				}
				req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, tunnelHost+"/api/v1/pods", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Impersonate-User", strings.Repeat("x", stalledWrite))
				go func() {
					_, err := cfg.Transport.RoundTrip(req) //nolint:bodyclose // an error is expected: no body
					details <- err
				}()
				s, _ := hub.active(cluster)
				stalled = append(stalled, s)
				conntest.Eventually(t, 10*time.Second, "the detail request to "+cluster+" holds the session's writes", func() error {
					if s.writeMu.TryLock() {
						s.writeMu.Unlock()
						return errString("not written yet, or written (the socket buffers took it)")
					}
					return nil
				})
				if tc.refused {
					c.send(&Message{Type: TypeDelta, Seq: 99, Delta: &Delta{}})
					<-s.stop
				}
			}

			var again []*rawClient
			if tc.again {
				for range clusters {
					again = append(again, dialRaw(t, url))
				}
			}
			start := time.Now()
			ended := make(chan error, 1)
			go func() { ended <- tc.end(hub, cancel, stopped, stalled, again) }()
			select {
			case err := <-ended:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(shutdownBound):
				t.Fatalf("%s had not returned %s after it started: the stalled edges' writes wait for writeTimeout (%s), not shutdownGrace (%s)",
					tc.name, shutdownBound, writeTimeout, shutdownGrace)
			}
			t.Logf("%s returned after %s with %d stalled edges", tc.name, time.Since(start).Round(time.Millisecond), len(clusters))
			for range clusters {
				if err := <-details; err == nil {
					t.Error("a detail request to a stalled edge succeeded")
				}
			}
		})
	}
}

// dialStalled dials the hub as a raw client without compression whose
// socket takes about 2*stalledBuffer bytes it has not read: once it stops
// reading, a larger write of the hub waits.
func dialStalled(t *testing.T, url string) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := newConn()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := nc.(*net.TCPConn).SetReadBuffer(stalledBuffer); err != nil {
			_ = nc.Close() // failed already
			return nil, err
		}
		return nc, nil
	}}}
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{ //nolint:bodyclose // coder closes it
		HTTPClient: client, Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionDisabled, OnPongReceived: c.pong,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.ws = ws
	t.Cleanup(c.closeNow)
	return &rawClient{t: t, conn: c}
}

// smallSendBuffers gives each connection it accepts a send buffer of
// stalledBuffer.
type smallSendBuffers struct {
	net.Listener
	t *testing.T
}

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if err := c.(*net.TCPConn).SetWriteBuffer(stalledBuffer); err != nil {
		l.t.Errorf("setting the send buffer: %v", err)
	}
	return c, nil
}

// TestAckFailureKeepsTheRefusal (review-shut14 L2): a session ending over
// a data refusal withholds its cluster's RBAC rows even when the ack of a
// message it was still applying fails because the connection has gone
// meanwhile (cut off shutdownGrace into a Disown, or the edge gone). The
// edge's delta is held in the index until the edge has sent a malformed
// message, which ends the session, and the connection is closed; the ack
// of the delta then fails.
func TestAckFailureKeepsTheRefusal(t *testing.T) {
	const cluster = "edge-a"
	policy := []index.Object{
		rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
		rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice")),
	}
	var armed atomic.Bool
	var once sync.Once
	held, gate := make(chan struct{}), make(chan struct{})
	g := &gatedStore{Store: index.New(memtables.Open), upsertGate: func() {
		if armed.Load() {
			once.Do(func() { close(held) })
			<-gate
		}
	}}
	h := newHubHarness(t, HubOptions{Store: g})
	// Registered after the harness, so it runs first: a test that fails
	// while the write is held still lets the session, and the hub, end.
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	c := dialRaw(t, h.url)
	c.welcome(cluster, "edge-a-1")
	c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{
		ID: 1, Final: true, Full: true, Rows: rawRows(t, policy), Kinds: []KindState{
			{Kind: clusterRoleKind, Synced: true}, {Kind: clusterRoleBindingKind, Synced: true},
		},
	}})
	c.awaitAck(c.seq)
	s, _ := h.hub.active(cluster)
	armed.Store(true)
	c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows(cluster, 1, "1"))}})
	awaitClosed(t, held, "the delta's index write")
	if err := c.writeRaw(websocket.MessageText, []byte("{")); err != nil {
		t.Fatal(err)
	}
	awaitClosed(t, s.stop, "the session's end after a malformed message")
	if re := asReject(s.stopErr); re == nil || re.Reason != ReasonMalformed {
		t.Fatalf("the session ends for %v, want a malformed refusal", s.stopErr)
	}
	s.conn.closeNow()
	release()
	awaitClosed(t, s.done, "the session's last step")
	if got := g.PolicyRows(cluster); len(got) != 0 {
		t.Errorf("RBAC rows after the refused session ended: %v, want none (withheld)", got)
	}
}

// awaitClosed fails the test if ch is not closed within a minute: a
// failure detector, so that a regression fails with what it waited for
// instead of running into go test's timeout.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
	}
}
