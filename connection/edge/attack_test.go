package edge

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// The tests of this file play an edge that attacks the manager over a real
// session: past each quota the session ends with a reason, the rows the
// cluster had stay exactly as they were, and the manager keeps serving.

// svcKind is a second kind for the tests that need two.
var svcKind = index.Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}

func svcRows(cluster string, n int) []index.Object {
	rows := make([]index.Object, n)
	for i := range rows {
		rows[i] = index.Object{
			Cluster: cluster, Namespace: "default", Version: "v1", Kind: "Service", Resource: "services",
			Name: fmt.Sprintf("svc-%03d", i), Status: index.StatusHealthy,
		}
	}
	return rows
}

func TestQuotas(t *testing.T) {
	h := newHubHarness(t, HubOptions{
		Grace:            time.Nanosecond, // no grace period to speak of (0 is the default)
		MaxSnapshotBytes: 32 << 10,
		Quotas:           Quotas{RowsPerCluster: 50, KindsPerCluster: 3, LabelsPerRow: 16, StringBytes: 1024},
	})
	long := strings.Repeat("x", 2000)
	row := func(mut func(o *index.Object)) []index.Object {
		rows := testRows("edge-c", 1, "9")
		rows[0].Name = "attack"
		mut(&rows[0])
		return rows
	}
	delta := func(t *testing.T, c *rawClient, rows []index.Object) {
		c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, rows)}})
	}
	kind := func(name string) index.Kind {
		return index.Kind{Version: "v1", Kind: name, Resource: strings.ToLower(name) + "s", Namespaced: true}
	}
	cases := []struct {
		name   string
		reason Reason
		says   string
		bad    func(t *testing.T, c *rawClient)
	}{
		{"labels per row", ReasonQuota, "labels", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) {
				for i := range 17 {
					o.Labels = withLabel(o.Labels, fmt.Sprint("k", i), "v")
				}
			}))
		}},
		{"long message", ReasonQuota, "message is 2000 bytes", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) { o.Message = long }))
		}},
		{"long label value", ReasonQuota, "value of label", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) { o.Labels = withLabel(o.Labels, "app", long) }))
		}},
		{"long label key", ReasonQuota, "label key", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) { o.Labels = withLabel(o.Labels, long, "v") }))
		}},
		// An honest edge does not send these (TestRowsOverAQuotaAreLeftOut);
		// the manager refuses them from any edge.
		{"long owner reference", ReasonQuota, "an owner reference is 2000 bytes", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) { o.OwnerRefs = []index.OwnerRef{{Kind: "Widget", Name: long}} }))
		}},
		{"long summary", ReasonQuota, "summary", func(t *testing.T, c *rawClient) {
			delta(t, c, row(func(o *index.Object) { o.Summary = []byte(`{"x":"` + long + `"}`) }))
		}},
		{"rows per cluster by delta", ReasonQuota, "rows", func(t *testing.T, c *rawClient) {
			delta(t, c, testRows("edge-c", 51, "9")) // 5 are updates, 46 new: 51 rows
		}},
		{"rows per cluster by snapshot", ReasonQuota, "rows", func(t *testing.T, c *rawClient) {
			c.send(snapshotMsg(t, 2, testRows("edge-c", 51, "9")))
		}},
		{"rows of untouched kinds count", ReasonQuota, "rows", func(t *testing.T, c *rawClient) {
			// A partial snapshot of Services: 46 Services and the 5
			// ConfigMaps it leaves alone make 51.
			c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{
				ID: 2, Final: true, Kinds: []KindState{{Kind: svcKind, Synced: true}}, Rows: rawRows(t, svcRows("edge-c", 46)),
			}})
		}},
		{"kinds by snapshot", ReasonQuota, "kinds", func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Final: true, Full: true, Kinds: []KindState{
				{Kind: kind("A"), Synced: true}, {Kind: kind("B"), Synced: true}, {Kind: kind("C"), Synced: true}, {Kind: kind("D"), Synced: true},
			}, Rows: rawRows(t, nil)}})
		}},
		{"kinds by delta", ReasonQuota, "kinds", func(t *testing.T, c *rawClient) {
			var rows []index.Object
			for _, k := range []string{"A", "B", "C"} {
				rows = append(rows, index.Object{Cluster: "edge-c", Namespace: "default", Version: "v1", Kind: k, Resource: strings.ToLower(k) + "s", Name: "x"})
			}
			delta(t, c, rows) // ConfigMap and three more
		}},
		{"snapshot bytes counted decoded", ReasonOversize, "decoded", func(t *testing.T, c *rawClient) {
			// 50 rows of 16 one-byte labels: about 13 KiB of JSON,
			// under the 32 KiB bound, but each label costs a map entry
			// to hold, and held they cost over 60 KiB.
			rows := make([]index.Object, 50)
			for i := range rows {
				rows[i] = index.Object{Cluster: "edge-c", Namespace: "d", Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Name: fmt.Sprint(i)}
				for j := range 16 {
					rows[i].Labels = withLabel(rows[i].Labels, fmt.Sprint(j%10, j/10), "")
				}
			}
			raws := rawRows(t, rows)
			wire := 0
			for _, r := range raws {
				wire += len(r)
			}
			if wire >= 32<<10 {
				t.Fatalf("the attack's JSON is %d bytes; it must fit the bound to show rows are counted decoded", wire)
			}
			c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Final: true, Full: true, Kinds: []KindState{{Kind: testKind, Synced: true}}, Rows: raws}})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.url)
			c.welcome("edge-c", "quota")
			c.send(snapshotMsg(t, 1, testRows("edge-c", 5, "1")))
			c.awaitAck(c.seq)
			before := conntest.AllRows(t, h.store, "edge-c")
			tc.bad(t, c)
			rej := c.expectRejectMessage(tc.reason)
			if !strings.Contains(rej.Message, tc.says) {
				t.Errorf("reject %q does not say %q", rej.Message, tc.says)
			}
			h.waitReleased(t, "edge-c") // the last case's is, before another instance claims
			if row, _ := h.store.GetCluster(nil, "edge-c"); row.State != index.StateDisconnected {
				t.Errorf("state %s after the reject, want DISCONNECTED", row.State)
			}
			if after := conntest.AllRows(t, h.store, "edge-c"); !sameRows(before, after) {
				t.Errorf("the rows changed: %d before, %d after", len(before), len(after))
			}
		})
	}
	t.Run("within the quotas", func(t *testing.T) {
		// 50 rows, an update of all of them, and three kinds are fine.
		c := synced(t, h.url, "edge-c", "fine", testRows("edge-c", 50, "1"))
		c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows("edge-c", 50, "2"))}})
		c.awaitAck(c.seq)
		if got := len(names(t, h.store, "edge-c")); got != 50 {
			t.Fatalf("%d rows, want 50", got)
		}
	})
}

// expectRejectMessage is expectReject returning the Reject; it reads on
// to the close frame, which answers the manager's.
func (c *rawClient) expectRejectMessage(reason Reason) *Reject {
	c.t.Helper()
	for {
		m, err := c.read()
		if err != nil {
			c.t.Fatalf("expected a %s reject, got %v", reason, err)
		}
		if m.Type == TypeReject {
			if m.Reject.Reason != reason {
				c.t.Fatalf("rejected with %s (%s), want %s", m.Reject.Reason, m.Reject.Message, reason)
			}
			if _, err := c.read(); websocket.CloseStatus(err) != websocket.StatusCode(CloseCode(reason)) {
				c.t.Fatalf("after the reject: %v, want a close frame with %d", err, CloseCode(reason))
			}
			return m.Reject
		}
	}
}

// sameRows compares two row lists by key, content and resource version.
func sameRows(a, b []*index.Object) bool {
	return slices.EqualFunc(a, b, func(x, y *index.Object) bool {
		return x.Key() == y.Key() && x.ResourceVersion == y.ResourceVersion && x.Message == y.Message && x.Labels.Len() == y.Labels.Len()
	})
}

// TestSnapshotAllOrNothingAcrossKinds: a snapshot of two kinds whose last
// part has a bad row changes neither kind; a full snapshot that no longer
// lists a kind retires it.
func TestSnapshotAllOrNothingAcrossKinds(t *testing.T) {
	h := newHubHarness(t, HubOptions{Grace: time.Nanosecond})
	two := func(id uint64, cms, svcs []index.Object, full bool) []*Message {
		return []*Message{
			{Type: TypeSnapshot, Snapshot: &Snapshot{ID: id, Part: 0, Full: full, Kinds: []KindState{
				{Kind: testKind, Synced: true}, {Kind: svcKind, Synced: true},
			}, Rows: rawRows(t, cms)}},
			{Type: TypeSnapshot, Snapshot: &Snapshot{ID: id, Part: 1, Full: full, Final: true, Rows: rawRows(t, svcs)}},
		}
	}
	c := dialRaw(t, h.url)
	c.welcome("edge-d", "atomic")
	for _, m := range two(1, testRows("edge-d", 3, "1"), svcRows("edge-d", 2), true) {
		c.send(m)
	}
	c.awaitAck(c.seq)
	before := names(t, h.store, "edge-d")
	if len(before) != 5 {
		t.Fatalf("first snapshot: %v", before)
	}
	bad := svcRows("edge-d", 3)
	bad[2].Name = "" // the index refuses a row without a name
	for _, m := range two(2, testRows("edge-d", 10, "2"), bad, true) {
		c.send(m)
	}
	c.expectReject(ReasonInvalid)
	if got := names(t, h.store, "edge-d"); !slices.Equal(got, before) {
		t.Errorf("a refused snapshot changed the index: %v, want %v", got, before)
	}

	c = dialRaw(t, h.url)
	c.welcome("edge-d", "atomic")
	c.send(snapshotMsg(t, 1, testRows("edge-d", 2, "3"))) // full, ConfigMaps only
	c.awaitAck(c.seq)
	if got := names(t, h.store, "edge-d"); !slices.Equal(got, []string{"ConfigMap/default/cm-00000", "ConfigMap/default/cm-00001"}) {
		t.Errorf("a full snapshot without Services left %v", got)
	}
	for _, k := range h.store.Kinds("edge-d") {
		if k.Kind == "Service" {
			t.Errorf("the retired kind Service is still listed: %v", h.store.Kinds("edge-d"))
		}
	}
}

// TestRemovedTokenEndsSession: rewriting the tokens file to remove an
// edge's token, or to give it to another cluster, ends the live session
// within 5 s with ReasonUnauthorized; its rows stay.
func TestRemovedTokenEndsSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge-tokens.csv")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write("tok-a,edge-a\ntok-b,edge-b\n")
	tokens, err := LoadTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHubHarness(t, HubOptions{Tokens: tokens})
	a := synced(t, h.url, "edge-a", "one", testRows("edge-a", 3, "1"))
	b := synced(t, h.url, "edge-b", "one", testRows("edge-b", 3, "1"))

	for _, step := range []struct {
		c       *rawClient
		cluster string
		file    string
		says    string
	}{
		{a, "edge-a", "tok-b,edge-b\n", "revoked"},
		{b, "edge-b", "tok-b,edge-x\n", "another cluster"},
	} {
		start := time.Now()
		write(step.file)
		rej := step.c.expectRejectMessage(ReasonUnauthorized)
		took := time.Since(start)
		if took > 5*time.Second || !strings.Contains(rej.Message, step.says) {
			t.Errorf("%s: rejected after %v with %q; want within 5 s, saying %q", step.cluster, took, rej.Message, step.says)
		}
		if got := names(t, h.store, step.cluster); len(got) != 3 {
			t.Errorf("%s: %d rows after the token went, want the 3 indexed", step.cluster, len(got))
		}
		c := dialRaw(t, h.url)
		if m := c.hello(step.cluster, "one", tokenFor(step.cluster)); m.Type != TypeReject || m.Reject.Reason != ReasonUnauthorized {
			t.Errorf("%s: a new hello with the old token got %s %+v", step.cluster, m.Type, m.Reject)
		}
	}
}

// TestHelloDeadlineAndHandshakeCap: a peer that trickles its Hello a byte
// at a time is cut off at the Hello deadline, not kept alive by its bytes,
// and no more than MaxHandshakes peers can wait at once before their Hello.
func TestHelloDeadlineAndHandshakeCap(t *testing.T) {
	h := newHubHarness(t, HubOptions{HelloTimeout: time.Second, MaxHandshakes: 2})
	addr := strings.TrimPrefix(strings.TrimSuffix(h.url, "/edge"), "ws://")

	// upgrade opens a raw websocket and returns its connection.
	upgrade := func() (net.Conn, *bufio.Reader, int) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		key := make([]byte, 16)
		_, _ = rand.Read(key)
		_, err = fmt.Fprintf(conn, "GET /edge HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n",
			addr, base64.StdEncoding.EncodeToString(key), Subprotocol)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return conn, br, resp.StatusCode
	}
	// frame writes one masked client frame.
	frame := func(conn net.Conn, opcode byte, fin bool, payload []byte) error {
		b0 := opcode
		if fin {
			b0 |= 0x80
		}
		out := []byte{b0, 0x80 | byte(len(payload)), 1, 2, 3, 4}
		for i, p := range payload {
			out = append(out, p^[]byte{1, 2, 3, 4}[i%4])
		}
		_, err := conn.Write(out)
		return err
	}

	t.Run("trickled hello", func(t *testing.T) {
		conn, br, code := upgrade()
		if code != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %d", code)
		}
		start := time.Now()
		closed := make(chan time.Duration, 1)
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 512)
			for {
				if _, err := br.Read(buf); err != nil {
					closed <- time.Since(start)
					return
				}
			}
		}()
		hello := []byte(`{"type":"hello","seq":1,"hello":{"version":1,"cluster":"edge-a","instance":"i","token":"tok-a"`)
		opcode := byte(1) // text, then continuation frames
		for i := 0; ; i++ {
			select {
			case took := <-closed:
				if took > 3*time.Second {
					t.Errorf("the trickling peer was cut off after %v; the Hello deadline is 1 s", took)
				}
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := frame(conn, opcode, false, hello[i%len(hello):i%len(hello)+1]); err != nil {
				t.Logf("write after %v: %v", time.Since(start), err)
				took := <-closed
				if took > 3*time.Second {
					t.Errorf("the trickling peer was cut off after %v; the Hello deadline is 1 s", took)
				}
				return
			}
			opcode = 0
		}
	})

	t.Run("handshake cap", func(t *testing.T) {
		// The trickler saw its connection close when the Hello deadline
		// fired; the hub frees its slot only once its read has returned,
		// a moment later (under load, after this test's next upgrade).
		conntest.Eventually(t, 5*time.Second, "the trickled hello's handshake ends", func() error {
			h.hub.mu.Lock()
			defer h.hub.mu.Unlock()
			if h.hub.handshakes != 0 {
				return fmt.Errorf("%d handshakes in progress", h.hub.handshakes)
			}
			return nil
		})
		for range 2 {
			if _, _, code := upgrade(); code != http.StatusSwitchingProtocols {
				t.Fatalf("a silent peer within the cap: %d", code)
			}
		}
		if _, _, code := upgrade(); code != http.StatusServiceUnavailable {
			t.Errorf("a third silent peer: %d, want 503", code)
		}
		// Once the silent peers time out, edges get in again.
		var c *rawClient
		conntest.Eventually(t, 5*time.Second, "a slot frees", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cn := newConn()
			ws, _, err := websocket.Dial(ctx, h.url, &websocket.DialOptions{ //nolint:bodyclose // coder closes it
				Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionNoContextTakeover, OnPongReceived: cn.pong,
			})
			if err != nil {
				return err
			}
			cn.ws = ws
			t.Cleanup(cn.closeNow)
			c = &rawClient{t: t, conn: cn}
			return nil
		})
		c.welcome("edge-a", "after")
		c.send(snapshotMsg(t, 1, testRows("edge-a", 1, "1")))
		c.awaitAck(c.seq)
	})
}
