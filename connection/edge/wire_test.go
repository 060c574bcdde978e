package edge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestStalledMessageEndsSession plays an edge that starts a message and
// never finishes it while answering every ping: pongs in the middle of a
// message do not keep a session alive, so the manager ends it within
// PongWait of the last byte instead of holding it open forever.
func TestStalledMessageEndsSession(t *testing.T) {
	const pongWait = time.Second
	h := newHubHarness(t, HubOptions{PingInterval: 100 * time.Millisecond, PongWait: pongWait})
	c := dialRaw(t, h.url, websocket.CompressionDisabled) // so the fragment goes out as written
	c.welcome("edge-a", "stall")
	// Answer pings (and nothing else) from now on.
	c.conn.ws.CloseRead(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := c.conn.ws.Writer(ctx, websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	// More than the writer buffers, so the first fragment goes out now;
	// the pongs that follow flush the rest.
	part := `{"type":"delta","seq":2,"delta":{"upserts":[` + strings.Repeat(" ", 16<<10)
	if _, err := w.Write([]byte(part)); err != nil {
		t.Fatal(err)
	}
	stalled := time.Now()
	at := h.rec.WaitFor(t, "edge-a", index.StateDisconnected, 1, 5*pongWait)
	if d := at.Sub(stalled); d > 3*pongWait {
		t.Errorf("DISCONNECTED %s after the stall, want within about %s", d, pongWait)
	}
	row, _ := h.store.GetCluster(nil, "edge-a")
	if !strings.Contains(row.LastError, "nothing heard") {
		t.Errorf("lastError %q does not say the edge went silent", row.LastError)
	}
}

// TestSilenceIsTheCause: when the liveness rule closes a connection, a
// write on another goroutine fails because of it and must say why, not
// "use of closed network connection": a session keeps whichever error it
// hears first (an agent's sender races its reader this way).
func TestSilenceIsTheCause(t *testing.T) {
	c, _, _ := wsPair(t) // the peer never reads, so it never answers a ping

	const wait = 50 * time.Millisecond
	if _, _, err := c.read(DefaultMaxMessageBytes, wait); err == nil || !strings.Contains(err.Error(), "nothing heard") {
		t.Fatalf("read from a silent peer: %v, want nothing heard", err)
	}
	if _, err := c.write(&Message{Type: TypeAck, Ack: &Ack{Seq: 1}}); err == nil || !strings.Contains(err.Error(), "nothing heard") {
		t.Errorf("write after the silence closed the connection: %v, want nothing heard", err)
	}
}

// TestOriginRefused: a browser page cannot open an edge session, not even
// one served by the manager's own host.
func TestOriginRefused(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, h.url, &websocket.DialOptions{ //nolint:bodyclose // coder closes it
		Subprotocols: []string{Subprotocol},
		HTTPHeader:   http.Header{"Origin": {"http" + strings.TrimPrefix(strings.TrimSuffix(h.url, "/edge"), "ws")}},
	})
	if err == nil {
		_ = ws.CloseNow()
	}
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("dial with an Origin: err %v, response %v; want 403", err, resp)
	}
}

// wsPair connects a websocket through a test server and returns the
// server's side as a conn, the client's side, and the server's URL; all
// close when the test ends.
func wsPair(t *testing.T) (*conn, *websocket.Conn, string) {
	t.Helper()
	accepted := make(chan *conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := newConn()
		ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OnPongReceived: c.pong})
		if err != nil {
			return
		}
		c.ws = ws
		accepted <- c
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	peer, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil) //nolint:bodyclose // coder closes it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.CloseNow() })
	c := <-accepted
	t.Cleanup(c.closeNow)
	return c, peer, srv.URL
}
