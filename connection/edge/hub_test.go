package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// TestClaims: one edge per cluster; after a disconnect only the same
// instance reclaims during the grace period, anyone after it. Where the
// grace period must hold it is a minute, and where it must be over the
// test waits it out from the release it saw (no earlier than the hub's):
// neither depends on how fast a loaded machine gets from one Hello to
// the next.
func TestClaims(t *testing.T) {
	h := newHubHarness(t, HubOptions{Grace: time.Minute})

	first := synced(t, h.url, "edge-a", "one", testRows("edge-a", 3, "1"))
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 1, 5*time.Second)

	dup := dialRaw(t, h.url)
	if m := dup.hello("edge-a", "two", "tok-a"); m.Type != TypeReject || m.Reject.Reason != ReasonAlreadyClaimed {
		t.Fatalf("duplicate edge: %s %+v, want an already_claimed reject", m.Type, m.Reject)
	}

	// The first edge goes away: DISCONNECTED once, rows kept and stale.
	first.conn.closeNow()
	h.rec.WaitFor(t, "edge-a", index.StateDisconnected, 1, 5*time.Second)
	h.waitReleased(t, "edge-a")
	if got := names(t, h.store, "edge-a"); len(got) != 3 {
		t.Fatalf("rows after disconnect: %v", got)
	}
	if row, _ := h.store.GetCluster(nil, "edge-a"); !row.Stale() || row.Mode != index.ModePush {
		t.Fatalf("cluster row after disconnect: %+v", row)
	}

	other := dialRaw(t, h.url)
	m := other.hello("edge-a", "two", "tok-a")
	if m.Type != TypeReject || m.Reject.Reason != ReasonGracePeriod || m.Reject.RetryAfterMillis <= 0 {
		t.Fatalf("other instance in grace: %s %+v, want a grace_period reject with retry-after", m.Type, m.Reject)
	}

	same := synced(t, h.url, "edge-a", "one", testRows("edge-a", 2, "2"))
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 2, 5*time.Second)
	if got := names(t, h.store, "edge-a"); len(got) != 2 {
		t.Fatalf("rows after the reclaim's snapshot: %v, want the 2 it sent (no leftovers)", got)
	}
	same.conn.closeNow()
	h.rec.WaitFor(t, "edge-a", index.StateDisconnected, 2, 5*time.Second)

	if n := h.rec.Count("edge-a", index.StateDisconnected); n != 2 {
		t.Errorf("%d DISCONNECTED transitions for two outages", n)
	}
	for reason, want := range map[Reason]float64{ReasonAlreadyClaimed: 1, ReasonGracePeriod: 1} {
		if got := testutil.ToFloat64(h.hub.metrics.rejects.WithLabelValues(string(reason))); got != want {
			t.Errorf("rejects{%s} = %v, want %v", reason, got, want)
		}
	}
}

// TestClaimAfterTheGracePeriod: once the grace period after a disconnect
// is over, another instance with the token may claim the cluster. (A
// timer never fires early, so this cannot fail on a slow machine.)
func TestClaimAfterTheGracePeriod(t *testing.T) {
	const grace = 300 * time.Millisecond
	h := newHubHarness(t, HubOptions{Grace: grace})
	first := synced(t, h.url, "edge-a", "one", testRows("edge-a", 3, "1"))
	first.conn.closeNow()
	released := h.waitReleased(t, "edge-a")
	time.Sleep(time.Until(released.Add(grace)))
	after := dialRaw(t, h.url)
	after.welcome("edge-a", "two")
}

// TestSupersede: the same instance connecting while its old session is
// still open (a half-open connection the manager has not noticed) takes
// over at once.
func TestSupersede(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	old := dialRaw(t, h.url)
	old.welcome("edge-b", "one")
	fresh := dialRaw(t, h.url)
	fresh.welcome("edge-b", "one")
	old.expectReject(ReasonSuperseded)
}

// TestBadInput: every kind of bad input ends the session with its reason
// and close code; the manager keeps serving and the rows stay.
func TestBadInput(t *testing.T) {
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 64 << 10, Grace: time.Nanosecond}) // no grace period to speak of (0 is the default)
	cases := []struct {
		name   string
		reason Reason
		hello  func(c *rawClient) // instead of a good hello
		bad    func(t *testing.T, c *rawClient)
	}{
		{name: "bad token", reason: ReasonUnauthorized, hello: func(c *rawClient) {
			c.send(&Message{Type: TypeHello, Hello: &Hello{Version: ProtocolVersion, Cluster: "edge-c", Instance: "i", Token: "nope"}})
		}},
		{name: "token of another cluster", reason: ReasonUnauthorized, hello: func(c *rawClient) {
			c.send(&Message{Type: TypeHello, Hello: &Hello{Version: ProtocolVersion, Cluster: "edge-c", Instance: "i", Token: "tok-a"}})
		}},
		{name: "unsupported version", reason: ReasonInvalid, hello: func(c *rawClient) {
			c.send(&Message{Type: TypeHello, Hello: &Hello{Version: 99, Cluster: "edge-c", Instance: "i", Token: "tok-c"}})
		}},
		{name: "no hello first", reason: ReasonInvalid, hello: func(c *rawClient) {
			c.send(&Message{Type: TypeAck, Ack: &Ack{Seq: 1}})
		}},
		{name: "malformed frame", reason: ReasonMalformed, bad: func(t *testing.T, c *rawClient) {
			if err := c.writeRaw(websocket.MessageText, []byte(`{"type":"delta","seq":3,`)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "binary frame", reason: ReasonMalformed, bad: func(t *testing.T, c *rawClient) {
			if err := c.writeRaw(websocket.MessageBinary, []byte{1, 2, 3}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "type without body", reason: ReasonMalformed, bad: func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeDelta})
		}},
		{name: "wrong cluster id in a row", reason: ReasonWrongCluster, bad: func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows("edge-a", 1, "9"))}})
		}},
		{name: "wrong cluster id in a delete", reason: ReasonWrongCluster, bad: func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Deletes: []index.Key{{Cluster: "edge-a", Kind: "ConfigMap", Namespace: "default", Name: "x"}}}})
		}},
		{name: "oversize message", reason: ReasonOversize, bad: func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows("edge-c", 1000, "9"))}})
		}},
		{name: "incompressible oversize", reason: ReasonOversize, bad: func(t *testing.T, c *rawClient) {
			noise := make([]byte, 200<<10)
			for i := range noise {
				noise[i] = byte('a' + (i*7919)%26)
			}
			// The manager stops reading mid-message; the write may
			// or may not finish before it closes.
			_ = c.writeRaw(websocket.MessageText, noise)
		}},
		{name: "sequence gap", reason: ReasonSequenceGap, bad: func(t *testing.T, c *rawClient) {
			c.seq++ // skip one
			c.send(&Message{Type: TypeDelta, Delta: &Delta{}})
		}},
		{name: "delta inside a snapshot", reason: ReasonInvalid, bad: func(t *testing.T, c *rawClient) {
			m := snapshotMsg(t, 2, testRows("edge-c", 1, "9"))
			m.Snapshot.Final = false
			c.send(m)
			c.send(&Message{Type: TypeDelta, Delta: &Delta{}})
		}},
		{name: "manager message from an edge", reason: ReasonInvalid, bad: func(t *testing.T, c *rawClient) {
			c.send(&Message{Type: TypeWelcome, Welcome: &Welcome{}})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.url)
			if tc.hello != nil {
				tc.hello(c)
				c.expectReject(tc.reason)
				return
			}
			c.welcome("edge-c", "bad-input")
			c.send(snapshotMsg(t, 1, testRows("edge-c", 5, "1")))
			c.awaitAck(c.seq)
			tc.bad(t, c)
			c.expectReject(tc.reason)
			if got := names(t, h.store, "edge-c"); len(got) != 5 {
				t.Errorf("rows after the reject: %d, want the 5 indexed before", len(got))
			}
			h.waitReleased(t, "edge-c") // the last case's is, before another instance claims
			row, _ := h.store.GetCluster(nil, "edge-c")
			if row.State != index.StateDisconnected {
				t.Errorf("state %s after the reject, want DISCONNECTED", row.State)
			}
			if !strings.Contains(row.LastError, string(tc.reason)) {
				t.Errorf("lastError %q does not name the reason %s", row.LastError, tc.reason)
			}
		})
	}
	// The manager survived all of it.
	synced(t, h.url, "edge-c", "good", testRows("edge-c", 1, "1"))
}

type errString string

func (e errString) Error() string { return string(e) }

// TestSnapshotChunksAtomic: parts of a snapshot change nothing until the
// final part, which replaces the kind in one go.
func TestSnapshotChunksAtomic(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	c := synced(t, h.url, "edge-d", "one", testRows("edge-d", 10, "1"))
	before := names(t, h.store, "edge-d")

	next := testRows("edge-d", 40, "2")[10:] // rows 10..39: all of the old ones go
	raws := rawRows(t, next)
	for part := range 3 {
		sn := &Snapshot{ID: 2, Part: part, Full: true, Final: part == 2, Rows: raws[part*10 : part*10+10]}
		if part == 0 {
			sn.Kinds = []KindState{{Kind: testKind, Synced: true}}
		}
		c.send(&Message{Type: TypeSnapshot, Snapshot: sn})
		c.awaitAck(c.seq)
		got := names(t, h.store, "edge-d")
		if part < 2 && !slices.Equal(got, before) {
			t.Fatalf("after part %d the index changed: %d rows", part, len(got))
		}
		if part == 2 && (len(got) != 30 || got[0] != "ConfigMap/default/cm-00010") {
			t.Fatalf("after the final part: %d rows from %v", len(got), got[:1])
		}
	}
}

// TestKindErrorsDegrade: a failing kind makes the cluster DEGRADED and a
// kind snapshot without error makes it CONNECTED again; a kind the cluster
// does not serve does not degrade it.
func TestKindErrorsDegrade(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	c := dialRaw(t, h.url)
	c.welcome("edge-a", "one")
	missing := index.Kind{Group: "kustomize.toolkit.fluxcd.io", Kind: "Kustomization"}
	m := snapshotMsg(t, 1, testRows("edge-a", 2, "1"))
	m.Snapshot.Kinds = append(m.Snapshot.Kinds, KindState{Kind: missing, Error: "kind not served"})
	c.send(m)
	c.awaitAck(c.seq)
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 1, 5*time.Second)

	c.send(&Message{Type: TypeDelta, Delta: &Delta{Kinds: []KindState{{Kind: testKind, Error: "forbidden", Failing: true}}}})
	c.awaitAck(c.seq)
	h.rec.WaitFor(t, "edge-a", index.StateDegraded, 1, 5*time.Second)
	if errs := h.store.KindErrors(nil, "edge-a"); len(errs) != 2 {
		t.Errorf("kind errors %+v, want the missing and the failing kind", errs)
	}
	if got := names(t, h.store, "edge-a"); len(got) != 2 {
		t.Errorf("rows of the failing kind: %v, want them kept", got)
	}

	fixed := &Message{Type: TypeSnapshot, Snapshot: &Snapshot{
		ID: 2, Final: true,
		Kinds: []KindState{{Kind: testKind, Synced: true}}, Rows: rawRows(t, testRows("edge-a", 1, "2")),
	}}
	c.send(fixed)
	c.awaitAck(c.seq)
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 2, 5*time.Second)
}

// TestOneOutageHowEverManyAttemptsFail: an edge that loses its session and
// then keeps getting welcomed and rejected (here for rows of another
// cluster) is one outage: one DISCONNECTED, each failed attempt only
// updating lastError, then one CONNECTED once a session syncs again.
func TestOneOutageHowEverManyAttemptsFail(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	c := synced(t, h.url, "edge-a", "one", testRows("edge-a", 3, "1"))
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 1, 5*time.Second)
	c.conn.closeNow()
	h.rec.WaitFor(t, "edge-a", index.StateDisconnected, 1, 5*time.Second)
	outage, _ := h.store.GetCluster(nil, "edge-a")

	for i := range 3 {
		bad := dialRaw(t, h.url)
		bad.welcome("edge-a", "one")
		bad.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows("edge-b", 1, "9"))}})
		bad.expectReject(ReasonWrongCluster)
		conntest.Eventually(t, 5*time.Second, "the rejected attempt's error", func() error {
			if row, _ := h.store.GetCluster(nil, "edge-a"); !strings.Contains(row.LastError, string(ReasonWrongCluster)) || !row.LastSeen.After(outage.LastSeen) {
				return fmt.Errorf("attempt %d: row %+v", i+1, row)
			}
			return nil
		})
	}
	row, _ := h.store.GetCluster(nil, "edge-a")
	if row.State != index.StateDisconnected || !row.Since.Equal(outage.Since) || !row.Stale() {
		t.Errorf("after failed attempts: %+v, want DISCONNECTED since %s", row, outage.Since)
	}

	synced(t, h.url, "edge-a", "one", testRows("edge-a", 2, "2"))
	h.rec.WaitFor(t, "edge-a", index.StateConnected, 2, 5*time.Second)
	var states []index.ConnectionState
	for _, tr := range h.rec.Of("edge-a") {
		states = append(states, tr.State)
	}
	if got, want := fmt.Sprint(states), "[CONNECTING CONNECTED DISCONNECTED CONNECTED]"; got != want {
		t.Errorf("transitions %s, want %s", got, want)
	}
	if n := testutil.ToFloat64(h.hub.metrics.transitions.WithLabelValues("edge-a", string(index.StateDisconnected))); n != 1 {
		t.Errorf("transitions metric counts %v DISCONNECTED, want 1", n)
	}
}

func TestParseTokens(t *testing.T) {
	cases := []struct {
		name, in string
		want     map[string]string
		err      bool
	}{
		{name: "simple", in: "a,one\nb , two\n", want: map[string]string{"a": "one", "b": "two"}},
		{name: "comments and blanks", in: "# tokens\n\n  a,one  \n", want: map[string]string{"a": "one"}},
		{name: "rotation: two tokens of one cluster", in: "a,one\nb,one\n", want: map[string]string{"a": "one", "b": "one"}},
		{name: "missing cluster", in: "a,\n", err: true},
		{name: "no comma", in: "a\n", err: true},
		{name: "extra field", in: "a,one,two\n", err: true},
		{name: "token for two clusters", in: "a,one\na,two\n", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTokens([]byte(tc.in))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if !tc.err && !equalMaps(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	st := NewStaticTokens(map[string]string{"secret": "one"})
	for tok, want := range map[string]bool{"secret": true, "": false, "secre": false, "secret2": false} {
		if _, ok := st.Cluster(tok); ok != want {
			t.Errorf("Cluster(%q) ok=%v, want %v", tok, ok, want)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestResyncNext(t *testing.T) {
	r := ResyncOptions{Interval: 30 * time.Second, Min: 10 * time.Second, Max: time.Minute}
	cases := []struct {
		name          string
		cur           time.Duration
		changes, rows int
		overflowed    bool
		want          time.Duration
	}{
		{"busy halves", 30 * time.Second, 500, 1000, false, 15 * time.Second},
		{"busy stops at min", 12 * time.Second, 500, 1000, false, 10 * time.Second},
		{"overflow halves", 30 * time.Second, 1, 1000, true, 15 * time.Second},
		{"quiet grows", 30 * time.Second, 0, 1000, false, 45 * time.Second},
		{"quiet stops at max", 50 * time.Second, 0, 1000, false, time.Minute},
		{"normal returns up", 10 * time.Second, 5, 1000, false, 20 * time.Second},
		{"normal returns down", time.Minute, 5, 1000, false, 30 * time.Second},
		{"normal stays", 30 * time.Second, 5, 1000, false, 30 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := r.next(tc.cur, tc.changes, tc.rows, tc.overflowed); got != tc.want {
				t.Fatalf("next = %s, want %s", got, tc.want)
			}
		})
	}
	fixed := ResyncOptions{Interval: 30 * time.Second, Min: 30 * time.Second, Max: 30 * time.Second}
	if got := fixed.next(30*time.Second, 1000, 1000, true); got != 30*time.Second {
		t.Errorf("adaptation off: %s", got)
	}
}

// TestBufferCoalesces: many changes of one object are sent once, with the
// latest row; overflow schedules a full snapshot instead of growing.
func TestBufferCoalesces(t *testing.T) {
	ctx := t.Context()
	b := newBuffer("c", 3)
	rows := testRows("c", 5, "1")
	if err := b.Replace(ctx, "c", testKind, rows); err != nil {
		t.Fatal(err)
	}
	b.setConnected(true)
	if full := b.takeFull(); len(full.rows) != 5 || len(full.kinds) != 1 {
		t.Fatalf("full snapshot: %d rows, %d kinds", len(full.rows), len(full.kinds))
	}
	for i := range 10 {
		r := rows[0]
		r.ResourceVersion = string(rune('a' + i))
		if err := b.Upsert(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Delete(ctx, rows[1].Key()); err != nil {
		t.Fatal(err)
	}
	ups, dels := b.takeDelta(100, nil, nil)
	if len(ups) != 1 || ups[0].ResourceVersion != "j" || len(dels) != 1 {
		t.Fatalf("delta: %d upserts (%v), %d deletes; want the latest row and one delete", len(ups), ups, len(dels))
	}
	if got := b.coalesced.Load(); got != 9 {
		t.Errorf("coalesced %d, want 9", got)
	}
	// Unchanged rows are not sent again.
	if err := b.Upsert(ctx, rows[2]); err != nil {
		t.Fatal(err)
	}
	if ups, dels := b.takeDelta(100, nil, nil); len(ups)+len(dels) != 0 {
		t.Fatalf("an unchanged row was queued: %v %v", ups, dels)
	}
	// Overflow: the pending set is dropped and a full snapshot is due.
	for i := range 4 {
		if err := b.Delete(ctx, index.Key{Cluster: "c", Kind: "ConfigMap", Namespace: "x", Name: string(rune('a' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	if !b.fullDue() || b.overflows.Load() != 1 {
		t.Fatalf("overflow: full due %v, overflows %d", b.fullDue(), b.overflows.Load())
	}
	if ups, dels := b.takeDelta(100, nil, nil); len(ups)+len(dels) != 0 {
		t.Fatalf("pending keys kept after an overflow: %d", len(ups)+len(dels))
	}
	// Disconnected: nothing is tracked at all.
	b.setConnected(false)
	b.takeFull()
	if err := b.Upsert(ctx, rows[3]); err != nil {
		t.Fatal(err)
	}
	if b.dirty.n != 0 {
		t.Fatalf("a disconnected buffer tracks %d keys", b.dirty.n)
	}
	if err := b.Upsert(ctx, index.Object{Cluster: "other", Kind: "ConfigMap", Name: "x"}); err == nil {
		t.Error("a row of another cluster was accepted")
	}
}

func TestAPIPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/api/v1/namespaces/a/pods/b": true, "/apis/networking.istio.io/v1/virtualservices": true, "/api": true,
		"/api/../debug/pprof": false, "/logs": false, "/apifoo": false, "/api//v1": false, "": false,
	} {
		if got := apiPath(p); got != want {
			t.Errorf("apiPath(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestCloseText(t *testing.T) {
	long := &Reject{Reason: ReasonInvalid, Message: strings.Repeat("é", 100)}
	if s := closeText(long); len(s) > 123 || !json.Valid([]byte(`"`+s+`"`)) {
		t.Errorf("close text %d bytes or invalid UTF-8", len(s))
	}
}

// slowStore makes every delta take a while, like a manager under load.
type slowStore struct {
	*index.Store
	delay time.Duration
}

func (s slowStore) UpsertBatch(ctx context.Context, rows []index.Object) error {
	time.Sleep(s.delay)
	return s.Store.UpsertBatch(ctx, rows)
}

// TestSlowManagerCoalesces: while the manager is slow, the edge keeps only
// the latest state of each object and the manager ends with exactly that.
func TestSlowManagerCoalesces(t *testing.T) {
	store := index.New(memtables.Open)
	hub, err := NewHub(HubOptions{Store: slowStore{store, 50 * time.Millisecond}, Tokens: NewStaticTokens(testTokens), Window: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	hubDone := make(chan error, 1)
	go func() { hubDone <- hub.Run(ctx) }()
	srv := httptest.NewServer(hub)
	t.Cleanup(func() { cancel(); <-hubDone; srv.Close() })

	a := startAgent(t, AgentOptions{Manager: srv.URL + "/edge", Cluster: "edge-b", MaxPending: 1000})
	rows := testRows("edge-b", 100, "0")
	if err := a.buf.Replace(ctx, "edge-b", testKind, rows); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	conntest.Eventually(t, 10*time.Second, "first snapshot", func() error {
		if row, ok := store.GetCluster(nil, "edge-b"); !ok || row.State != index.StateConnected {
			return errString("not connected")
		}
		return nil
	})
	const rounds = 50
	for round := 1; round <= rounds; round++ {
		for i := range rows {
			r := rows[i]
			// The index ignores the resource version when it compares
			// rows, so change what a user sees too.
			r.ResourceVersion, r.Message = fmt.Sprint(round), fmt.Sprint("round ", round)
			if err := a.buf.Upsert(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	conntest.Eventually(t, 20*time.Second, "the latest state of every object", func() error {
		for _, o := range conntest.AllRows(t, store, "edge-b") {
			if o.Message != fmt.Sprint("round ", rounds) {
				return fmt.Errorf("%s at %q", o.Name, o.Message)
			}
		}
		return nil
	})
	s := a.Stats()
	t.Logf("%d updates: %d coalesced in the edge, %d messages sent", rounds*len(rows), s.Coalesced, s.Messages)
	if s.Coalesced == 0 || s.Messages > rounds {
		t.Errorf("no coalescing under a slow manager: %+v", s)
	}
}

// TestEdgeBeforeRunWaits: an edge whose request reaches the hub before
// Run has started (fleetgraph serve opens its listener beside Run) waits
// and is welcomed once Run starts, rather than getting a 503.
func TestEdgeBeforeRunWaits(t *testing.T) {
	hub, err := NewHub(HubOptions{Store: index.New(memtables.Open), Tokens: NewStaticTokens(testTokens)})
	if err != nil {
		t.Fatal(err)
	}
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		hub.ServeHTTP(w, r)
	}))
	defer srv.Close()
	type dialed struct {
		c   *conn
		err error
	}
	result := make(chan dialed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := newConn()
		ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/edge", &websocket.DialOptions{ //nolint:bodyclose // coder closes it
			Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionNoContextTakeover, OnPongReceived: c.pong,
		})
		c.ws = ws
		result <- dialed{c, err}
	}()
	<-arrived // the request is in the hub, and Run has not been called

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("hub: %v", err)
		}
	}()
	d := <-result
	if d.err != nil {
		t.Fatalf("an edge that came before Run: %v", d.err)
	}
	defer d.c.closeNow()
	(&rawClient{t: t, conn: d.c}).welcome("edge-a", "i")
}

// TestFirstSnapshotKeepsTheResyncInterval: the first full snapshot of a
// session carries the initial rows, which count as changes; the next full
// resync must still come after the configured interval, not after the
// halved one a busy cluster gets. (A timer never fires early, so the lower
// bound cannot fail on a slow machine.)
func TestFirstSnapshotKeepsTheResyncInterval(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	const interval = 2 * time.Second
	a := startAgent(t, AgentOptions{Manager: h.url, Cluster: "edge-b", Resync: ResyncOptions{Interval: interval, Min: 100 * time.Millisecond, Max: time.Hour}})
	// Before the buffer is ready, so before the first snapshot is sent
	// and the resync timer set.
	before := time.Now()
	if err := a.buf.Replace(t.Context(), "edge-b", testKind, testRows("edge-b", 100, "0")); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	conntest.Eventually(t, 10*interval, "the first resync", func() error {
		if a.Stats().Snapshots < 2 {
			return errString("no resync yet")
		}
		return nil
	})
	if gap := time.Since(before); gap < interval {
		t.Errorf("the first resync came %s after the first snapshot, want at least the interval, %s", gap.Round(time.Millisecond), interval)
	}
}
