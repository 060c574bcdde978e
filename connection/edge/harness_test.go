package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// hubHarness is a Hub on a real HTTP server over an index.
type hubHarness struct {
	hub   *Hub
	store *index.Store
	url   string // ws://.../edge
	rec   *conntest.Recorder
	// stop shuts the hub down and waits for it; the test's cleanup
	// does, if the test did not.
	stop func()
}

// tokens used by the tests: one per cluster.
var testTokens = map[string]string{"tok-a": "edge-a", "tok-b": "edge-b", "tok-c": "edge-c", "tok-d": "edge-d"}

func tokenFor(cluster string) string {
	for tok, c := range testTokens {
		if c == cluster {
			return tok
		}
	}
	return "tok-" + cluster
}

func newHubHarness(t testing.TB, opts HubOptions) *hubHarness {
	t.Helper()
	h := &hubHarness{store: index.New(memtables.Open)}
	if g, ok := opts.Store.(*gatedStore); ok {
		h.store = g.Store
	} else {
		opts.Store = h.store
	}
	if opts.Tokens == nil {
		opts.Tokens = NewStaticTokens(testTokens)
	}
	hub, err := NewHub(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.hub = hub
	h.rec = conntest.NewRecorder(t, h.store)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	srv := httptest.NewServer(hub)
	h.url = "ws" + strings.TrimPrefix(srv.URL, "http") + "/edge"
	h.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("hub: %v", err)
		}
		srv.Close()
	})
	t.Cleanup(h.stop)
	return h
}

// waitReleased waits until no session holds cluster's claim, and returns
// when it saw that, which is no earlier than the release. A session's end
// writes DISCONNECTED before it releases its claim, so that every outage
// is reported even when a reconnect races the release: a test that next
// claims the cluster as another instance waits for the release, not the
// transition, or it is refused already_claimed now and then.
func (h *hubHarness) waitReleased(t *testing.T, cluster string) time.Time {
	t.Helper()
	conntest.Eventually(t, 5*time.Second, "the claim of "+cluster+" released", func() error {
		if s, _ := h.hub.active(cluster); s != nil {
			return errString("a session holds it")
		}
		return nil
	})
	return time.Now()
}

// rawClient speaks the protocol by hand, to send what a real edge never
// would.
type rawClient struct {
	t    *testing.T
	conn *conn
	seq  uint64
}

// dialRaw dials the hub, with compression unless a mode is given.
func dialRaw(t *testing.T, url string, compression ...websocket.CompressionMode) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := newConn()
	mode := websocket.CompressionNoContextTakeover
	if len(compression) > 0 {
		mode = compression[0]
	}
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{ //nolint:bodyclose // coder closes it
		Subprotocols: []string{Subprotocol}, CompressionMode: mode, OnPongReceived: c.pong,
	})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.ws = ws
	t.Cleanup(c.closeNow)
	return &rawClient{t: t, conn: c}
}

// send numbers and writes a message.
func (c *rawClient) send(m *Message) {
	c.t.Helper()
	c.seq++
	if m.Seq == 0 {
		m.Seq = c.seq
	}
	m.Time = time.Now()
	if _, err := c.conn.write(m); err != nil {
		c.t.Fatalf("send %s: %v", m.Type, err)
	}
}

// rawReadWait bounds how long a raw client waits for the hub's next
// message. A failure bound only: under -race on a loaded 2-core machine
// the hub took over 10 s, the bound before, to apply a resync's part and
// ack it (TestResyncKeepsTwoPartsInFlight, 1 run in 5 at load 14).
const rawReadWait = relayWait

func (c *rawClient) read() (*Message, error) {
	m, _, err := c.conn.read(DefaultMaxMessageBytes, rawReadWait)
	return m, err
}

// hello claims a cluster, speaking the given features, and returns the
// manager's answer.
func (c *rawClient) hello(cluster, instance, token string, features ...string) *Message {
	c.t.Helper()
	c.send(&Message{Type: TypeHello, Hello: &Hello{Version: ProtocolVersion, Cluster: cluster, Instance: instance, Token: token, Features: features}})
	m, err := c.read()
	if err != nil {
		c.t.Fatalf("reading the answer to hello: %v", err)
	}
	return m
}

// welcome claims a cluster, speaking the given features, fails unless
// welcomed, and returns the features the manager accepted.
func (c *rawClient) welcome(cluster, instance string, features ...string) []string {
	c.t.Helper()
	m := c.hello(cluster, instance, tokenFor(cluster), features...)
	if m.Type != TypeWelcome {
		c.t.Fatalf("hello for %s/%s: got %s %+v", cluster, instance, m.Type, m.Reject)
	}
	return m.Welcome.Features
}

// synced dials the hub as an edge instance of cluster, which sends rows as
// its first full snapshot and waits for the ack.
func synced(t *testing.T, url, cluster, instance string, rows []index.Object) *rawClient {
	t.Helper()
	c := dialRaw(t, url)
	c.welcome(cluster, instance)
	c.send(snapshotMsg(t, 1, rows))
	c.awaitAck(c.seq)
	return c
}

// awaitAck reads until the ack of seq.
func (c *rawClient) awaitAck(seq uint64) {
	c.t.Helper()
	for {
		m, err := c.read()
		if err != nil {
			c.t.Fatalf("waiting for ack %d: %v", seq, err)
		}
		if m.Type == TypeReject {
			c.t.Fatalf("waiting for ack %d: rejected: %+v", seq, m.Reject)
		}
		if m.Type == TypeAck && m.Ack.Seq >= seq {
			return
		}
	}
}

// expectReject reads until a Reject and then the close frame, and checks
// both carry reason.
func (c *rawClient) expectReject(reason Reason) {
	c.t.Helper()
	var rej *Reject
	for rej == nil {
		m, err := c.read()
		if err != nil {
			c.t.Fatalf("expected a %s reject, got %v", reason, err)
		}
		if m.Type == TypeReject {
			rej = m.Reject
		}
	}
	if rej.Reason != reason {
		c.t.Fatalf("rejected with %s (%s), want %s", rej.Reason, rej.Message, reason)
	}
	_, err := c.read()
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		c.t.Fatalf("after the reject: %v, want a close frame", err)
	}
	if int(ce.Code) != CloseCode(reason) || !strings.HasPrefix(ce.Reason, string(reason)+": ") {
		c.t.Fatalf("close frame %d %q, want %d %q...", ce.Code, ce.Reason, CloseCode(reason), reason)
	}
}

// testKind is the kind raw clients send rows of.
var testKind = index.Kind{Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}

func testRows(cluster string, n int, rv string) []index.Object {
	rows := make([]index.Object, n)
	for i := range rows {
		rows[i] = index.Object{
			Cluster: cluster, Namespace: "default", Version: "v1", Kind: "ConfigMap", Resource: "configmaps",
			Name: fmt.Sprintf("cm-%05d", i), UID: fmt.Sprintf("uid-%d", i), ResourceVersion: rv,
			Status: index.StatusHealthy, Labels: index.LabelsOf(map[string]string{"app": "demo", "n": fmt.Sprint(i % 10)}),
			CreatedAt: time.Unix(1700000000, 0).UTC(),
		}
	}
	return rows
}

// withLabel returns l with key set to value.
func withLabel(l index.Labels, key, value string) index.Labels {
	m := l.Map()
	m[key] = value
	return index.LabelsOf(m)
}

func rawRows(t *testing.T, rows []index.Object) []json.RawMessage {
	t.Helper()
	out := make([]json.RawMessage, len(rows))
	for i := range rows {
		data, err := json.Marshal(&rows[i])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = data
	}
	return out
}

// snapshotMsg is a one-part full snapshot of testKind.
func snapshotMsg(t *testing.T, id uint64, rows []index.Object) *Message {
	return &Message{Type: TypeSnapshot, Snapshot: &Snapshot{
		ID: id, Final: true, Full: true, Kinds: []KindState{{Kind: testKind, Synced: true}}, Rows: rawRows(t, rows),
	}}
}

// names returns the sorted names of a cluster's rows in the index.
func names(t *testing.T, store *index.Store, cluster string) []string {
	t.Helper()
	var out []string
	for _, o := range conntest.AllRows(t, store, cluster) {
		out = append(out, o.Kind+"/"+o.Namespace+"/"+o.Name)
	}
	slices.Sort(out)
	return out
}

// writeRaw writes one message as is.
func (c *rawClient) writeRaw(typ websocket.MessageType, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.conn.ws.Write(ctx, typ, data)
}
