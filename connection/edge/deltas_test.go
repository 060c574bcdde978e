package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// Deltas between the parts of a snapshot (FeatureDeltasInSnapshot).

// cmRow is a ConfigMap row of cluster c whose version shows in its
// message, which the index compares (it ignores the resource version).
func cmRow(c, name, version string) index.Object {
	o := testRows(c, 1, version)[0]
	o.Name, o.UID, o.Message = name, "uid-"+name, "version "+version
	return o
}

// TestSnapshotWithWrites: what a synced kind ends with at the commit when
// deltas wrote some of its keys while the snapshot was pending.
func TestSnapshotWithWrites(t *testing.T) {
	secrets := index.Kind{Version: "v1", Kind: "Secret", Resource: "secrets", Namespaced: true}
	cms := idOf(testKind.Group, testKind.Kind)
	key := func(name string) index.Key {
		o := cmRow("c", name, "")
		return o.Key()
	}
	type write struct {
		name    string
		version string // "" deletes
	}
	cases := []struct {
		name   string
		writes []write
		want   []string // name@version of the kind's rows after the commit
	}{
		{"no deltas: the snapshot", nil, []string{"a@1", "b@1", "c@1"}},
		{"an update wins over the snapshot's row", []write{{"a", "2"}}, []string{"a@2", "b@1", "c@1"}},
		{"a delete wins over the snapshot's row", []write{{"b", ""}}, []string{"a@1", "c@1"}},
		{"a create the snapshot omits stays", []write{{"d", "2"}}, []string{"a@1", "b@1", "c@1", "d@2"}},
		{"a delete of a key the snapshot omits", []write{{"e", ""}}, []string{"a@1", "b@1", "c@1"}},
		{"the last write of a key wins", []write{{"a", "2"}, {"a", ""}, {"d", ""}, {"d", "3"}}, []string{"b@1", "c@1", "d@3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &pendingSnapshot{
				kinds: map[kindID]KindState{cms: {Kind: testKind, Synced: true}, idOf("", "Secret"): {Kind: secrets, Error: "forbidden"}},
				rows:  map[kindID][]index.Object{cms: {cmRow("c", "a", "1"), cmRow("c", "b", "1"), cmRow("c", "c", "1")}},
				wrote: map[kindID]map[index.Key]deltaWrite{},
			}
			for _, w := range tc.writes {
				var row *index.Object
				if w.version != "" {
					o := cmRow("c", w.name, w.version)
					row = &o
				}
				if err := p.noteWrite(key(w.name), row, 100, 1<<20); err != nil {
					t.Fatal(err)
				}
			}
			// A kind the snapshot lists with an error, or does not list,
			// is refused: the snapshot would undo its writes.
			for _, k := range []index.Key{
				{Cluster: "c", Kind: "Secret", Namespace: "default", Name: "s"},
				{Cluster: "c", Kind: "Pod", Namespace: "default", Name: "p"},
			} {
				if rej := asReject(p.noteWrite(k, nil, 0, 1<<20)); rej == nil || rej.Reason != ReasonInvalid {
					t.Errorf("a write of %s, a kind the snapshot does not sync: %v, want invalid", k, rej)
				}
			}
			var got []string
			for _, o := range p.withWrites(cms) {
				got = append(got, o.Name+"@"+strings.TrimPrefix(o.Message, "version "))
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("rows %v, want %v", got, tc.want)
			}
			if n := len(p.wrote[cms]); n > len(tc.writes) || len(p.wrote) > 1 {
				t.Errorf("%d keys kept, more than the %d the synced kind's deltas wrote", n, len(tc.writes))
			}
		})
	}

	t.Run("memory is bounded and counted once per key", func(t *testing.T) {
		p := &pendingSnapshot{kinds: map[kindID]KindState{cms: {Kind: testKind, Synced: true}}, wrote: map[kindID]map[index.Key]deltaWrite{}}
		row := cmRow("c", "a", "1")
		for range 1000 {
			if err := p.noteWrite(row.Key(), &row, 500, 1000); err != nil {
				t.Fatalf("one key written again and again went over the limit: %d bytes: %v", p.wroteBytes, err)
			}
		}
		if p.wroteBytes != 500+entryCost {
			t.Errorf("%d bytes held for one key of cost 500 (and its map entry, %d)", p.wroteBytes, entryCost)
		}
		if rej := asReject(p.noteWrite(key("b"), &row, 501, 1000)); rej == nil || rej.Reason != ReasonOversize {
			t.Errorf("%d bytes held, over the limit of 1000: %v, want oversize", p.wroteBytes, rej)
		}
	})

	// The commit merges each kind with its own writes (review-edgedelta
	// L1: every kind used to walk every kind's writes), and a kind no
	// delta wrote keeps its rows as they are.
	t.Run("each kind merges its own writes", func(t *testing.T) {
		sec := idOf("", "Secret")
		secRow := func(name, version string) index.Object {
			o := cmRow("c", name, version)
			o.Kind, o.Resource = "Secret", "secrets"
			return o
		}
		p := &pendingSnapshot{
			kinds: map[kindID]KindState{cms: {Kind: testKind, Synced: true}, sec: {Kind: secrets, Synced: true}, idOf("", "Pod"): {Kind: testKind, Synced: true}},
			rows: map[kindID][]index.Object{
				cms: {cmRow("c", "a", "1"), cmRow("c", "b", "1")},
				sec: {secRow("a", "1"), secRow("s", "1")},
			},
			wrote: map[kindID]map[index.Key]deltaWrite{},
		}
		for _, o := range []index.Object{cmRow("c", "a", "2"), secRow("s", "2"), secRow("t", "2")} {
			if err := p.noteWrite(o.Key(), &o, 100, 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.noteWrite(key("b"), nil, 0, 1<<20); err != nil {
			t.Fatal(err)
		}
		for id, want := range map[kindID]string{cms: "ConfigMap/a@2", sec: "Secret/a@1 Secret/s@2 Secret/t@2", idOf("", "Pod"): ""} {
			var got []string
			for _, o := range p.withWrites(id) {
				got = append(got, o.Kind+"/"+o.Name+"@"+strings.TrimPrefix(o.Message, "version "))
			}
			slices.Sort(got)
			if g := strings.Join(got, " "); g != want {
				t.Errorf("%v: rows %q, want %q", id, g, want)
			}
		}
	})

	// What the manager keeps of a delta is what it counts: a copy of the
	// one row, not a pointer into the delta's decoded rows (which would
	// keep every row of the delta, counted or not), and the key's map
	// entry, for an upsert as for a delete.
	t.Run("a kept row is a copy, and its key counts", func(t *testing.T) {
		p := &pendingSnapshot{kinds: map[kindID]KindState{cms: {Kind: testKind, Synced: true}}, wrote: map[kindID]map[index.Key]deltaWrite{}}
		rows := []index.Object{cmRow("c", "a", "1"), cmRow("c", "b", "1")}
		if err := p.noteWrite(rows[0].Key(), &rows[0], 500, 1<<20); err != nil {
			t.Fatal(err)
		}
		rows[0].Message = "the delta's rows, reused"
		kept := p.wrote[cms][key("a")].row
		if kept == &rows[0] || kept.Message != "version 1" {
			t.Errorf("the kept row points into the delta's rows (message %q)", kept.Message)
		}
		if p.wroteBytes <= 500 {
			t.Errorf("an upsert of a row of cost 500 counts %d bytes: its key's map entry is not counted", p.wroteBytes)
		}
	})
}

// TestDeltasBetweenSnapshotParts: a manager applies a delta sent between a
// snapshot's parts at once, and at the commit the delta wins over the
// snapshot's older rows; every key neither the snapshot nor a delta has
// is removed.
func TestDeltasBetweenSnapshotParts(t *testing.T) {
	h := newHubHarness(t, HubOptions{MaxSnapshotBytes: 256 << 10})
	versions := func(cluster string) string {
		var out []string
		for _, o := range conntest.AllRows(t, h.store, cluster) {
			out = append(out, o.Name+"@"+strings.TrimPrefix(o.Message, "version "))
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	// start claims cluster with features and indexes a, b, c and x at
	// version 1, then sends part 0 of a second full snapshot.
	start := func(t *testing.T, cluster string, features ...string) *rawClient {
		c := dialRaw(t, h.url)
		if got := c.welcome(cluster, "i", features...); !slices.Equal(got, features) {
			t.Fatalf("welcome lists features %v, want %v", got, features)
		}
		first := []index.Object{cmRow(cluster, "a", "1"), cmRow(cluster, "b", "1"), cmRow(cluster, "c", "1"), cmRow(cluster, "x", "1")}
		c.send(snapshotMsg(t, 1, first))
		c.awaitAck(c.seq)
		part0 := snapshotMsg(t, 2, []index.Object{cmRow(cluster, "a", "1"), cmRow(cluster, "b", "1")})
		part0.Snapshot.Final = false
		c.send(part0)
		return c
	}
	del := func(cluster, name string) index.Key {
		o := cmRow(cluster, name, "")
		return o.Key()
	}

	t.Run("the delta wins", func(t *testing.T) {
		c := start(t, "edge-a", FeatureDeltasInSnapshot)
		c.send(&Message{Type: TypeDelta, Delta: &Delta{
			Upserts: rawRows(t, []index.Object{cmRow("edge-a", "a", "2"), cmRow("edge-a", "d", "2")}),
			Deletes: []index.Key{del("edge-a", "b"), del("edge-a", "c")},
		}})
		c.awaitAck(c.seq)
		if got, want := versions("edge-a"), "a@2 d@2 x@1"; got != want {
			t.Errorf("before the snapshot's end: %s, want the delta applied at once: %s", got, want)
		}
		// The final part still has c at version 1, and omits d and x.
		c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Part: 1, Final: true, Full: true, Rows: rawRows(t, []index.Object{cmRow("edge-a", "c", "1")})}})
		c.awaitAck(c.seq)
		if got, want := versions("edge-a"), "a@2 d@2"; got != want {
			t.Errorf("after the snapshot: %s, want %s", got, want)
		}
	})

	// review-edgedelta L2: a key both in the snapshot and in a delta was
	// counted twice against one limit, so a cluster whose snapshot fits
	// went over it when it changed during the resync, and reconnected
	// into the same failure. A row of a later part that a delta wrote is
	// older than the write: it is dropped on arrival, not counted.
	t.Run("a cluster near the limit changes during a resync", func(t *testing.T) {
		const cluster = "edge-c"
		big := func(name, version string) index.Object {
			o := cmRow(cluster, name, version)
			o.Message = "version " + version + " " + strings.Repeat("m", 8<<10)
			return o
		}
		quotas := h.hub.opts.Quotas
		one := big("big-0", "1")
		cost, over := quotas.checkRow(&one)
		if over != nil {
			t.Fatal(over.reject)
		}
		n := (256 << 10) / cost // the most rows of this cost the snapshot fits
		var rows []index.Object
		for i := range n {
			rows = append(rows, big(fmt.Sprintf("big-%d", i), "1"))
		}
		c := dialRaw(t, h.url)
		c.welcome(cluster, "i", FeatureDeltasInSnapshot)
		part0 := snapshotMsg(t, 1, rows[:n-1])
		part0.Snapshot.Final = false
		c.send(part0)
		c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, []index.Object{big("big-0", "2"), big(rows[n-1].Name, "2")})}})
		c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 1, Part: 1, Final: true, Full: true, Rows: rawRows(t, rows[n-1:])}})
		c.awaitAck(c.seq)
		got := versions(cluster)
		for _, name := range []string{"big-0", rows[n-1].Name} {
			if !strings.Contains(" "+got+" ", " "+name+"@2 ") {
				t.Errorf("%s is not at the delta's version 2 after the commit", name)
			}
		}
		if k := strings.Count(got, "@"); k != n {
			t.Errorf("%d rows after the commit, want %d", k, n)
		}
	})

	// Each of these ends the session; the rows indexed before stay.
	bad := []struct {
		name     string
		features []string
		reason   Reason
		delta    func(t *testing.T, c *rawClient) *Delta
	}{
		{"an edge without the feature", nil, ReasonInvalid, func(*testing.T, *rawClient) *Delta { return &Delta{} }},
		{"kinds inside a snapshot", []string{FeatureDeltasInSnapshot}, ReasonInvalid, func(*testing.T, *rawClient) *Delta {
			return &Delta{Kinds: []KindState{{Kind: testKind, Error: "forbidden"}}}
		}},
		{"a row of another cluster", []string{FeatureDeltasInSnapshot}, ReasonWrongCluster, func(t *testing.T, _ *rawClient) *Delta {
			return &Delta{Upserts: rawRows(t, []index.Object{cmRow("edge-a", "a", "3")})}
		}},
		{"a delete of another cluster's key", []string{FeatureDeltasInSnapshot}, ReasonWrongCluster, func(*testing.T, *rawClient) *Delta {
			return &Delta{Deletes: []index.Key{del("edge-a", "a")}}
		}},
		// An edge that never ends its snapshot, sending deltas of one
		// row the snapshot syncs (kept, counted) and many of a kind it
		// does not list: such rows were applied and not kept, but the
		// kept row pointed into the delta's rows, so every delta stayed
		// in memory with one row of it counted.
		{"rows of a kind the snapshot does not sync", []string{FeatureDeltasInSnapshot}, ReasonInvalid, func(t *testing.T, _ *rawClient) *Delta {
			rows := []index.Object{cmRow("edge-b", "kept", "2")}
			for i := range 200 {
				o := cmRow("edge-b", fmt.Sprintf("foo-%d", i), "2")
				o.Group, o.Kind, o.Resource = "x.example.com", "Foo", "foos"
				o.Message = strings.Repeat("m", 4<<10)
				rows = append(rows, o)
			}
			return &Delta{Upserts: rawRows(t, rows)}
		}},
		{"a delete of a kind the snapshot does not sync", []string{FeatureDeltasInSnapshot}, ReasonInvalid, func(*testing.T, *rawClient) *Delta {
			k := del("edge-b", "a")
			k.Kind = "Secret"
			return &Delta{Deletes: []index.Key{k}}
		}},
		{"a flood of deltas", []string{FeatureDeltasInSnapshot}, ReasonOversize, func(_ *testing.T, c *rawClient) *Delta {
			// Ten deltas of 300 distinct deletes, which the manager must
			// keep for the commit: bounded by the deltas' share of the
			// snapshot limit (32 KiB of 256 KiB here), which the first
			// passes. Ten are inside the window, so all are read before
			// the reject.
			flood := func(i int) *Delta {
				d := &Delta{}
				for j := range 300 {
					d.Deletes = append(d.Deletes, del("edge-b", fmt.Sprintf("gone-%d-%d", i, j)))
				}
				return d
			}
			for i := range 9 {
				c.send(&Message{Type: TypeDelta, Delta: flood(i)})
			}
			return flood(9)
		}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			c := start(t, "edge-b", tc.features...)
			if d := tc.delta(t, c); d != nil {
				c.send(&Message{Type: TypeDelta, Delta: d})
			}
			rej := c.expectRejectMessage(tc.reason)
			t.Logf("%s: %s", rej.Reason, rej.Message)
			if got, want := versions("edge-b"), "a@1 b@1 c@1 x@1"; got != want {
				t.Errorf("rows after the reject: %s, want the first snapshot's, %s", got, want)
			}
			// The hub writes DISCONNECTED before it releases the claim:
			// wait for the release, which the next subtest's claim needs.
			h.waitReleased(t, "edge-b")
			if row, _ := h.store.GetCluster(nil, "edge-b"); row.State != index.StateDisconnected {
				t.Errorf("state %s after the reject, want %s", row.State, index.StateDisconnected)
			}
		})
	}
}

// TestSnapshotPendingTooLong: an edge that sends part 0 of a resync and
// then only deltas, which are applied at once so that its cluster looks
// live, is cut off once the snapshot has been pending for
// MaxSnapshotPending, rather than keeping the snapshot's rows held
// forever (review-s7-edge L2). What it applied stays. An edge that goes
// silent after part 0 is cut off at the deadline too.
func TestSnapshotPendingTooLong(t *testing.T) {
	const limit = 300 * time.Millisecond
	h := newHubHarness(t, HubOptions{MaxSnapshotPending: limit})
	c := dialRaw(t, h.url)
	c.welcome("edge-a", "i", FeatureDeltasInSnapshot)
	c.send(snapshotMsg(t, 1, []index.Object{cmRow("edge-a", "a", "1")}))
	c.awaitAck(c.seq)
	part0 := snapshotMsg(t, 2, []index.Object{cmRow("edge-a", "a", "1")})
	part0.Snapshot.Final = false
	start := time.Now()
	c.send(part0)
	c.awaitAck(c.seq)
	// One delta per round trip until the manager answers with a reject.
	// The messages are written by hand: the manager may close the
	// connection while one is on its way, and the reject is read anyway.
	for v := 2; ; v++ {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("still welcome %s after part 0 of a snapshot that never ends (limit %s)", time.Since(start).Round(time.Millisecond), limit)
		}
		c.seq++
		_, werr := c.conn.write(&Message{Type: TypeDelta, Seq: c.seq, Time: time.Now(), Delta: &Delta{
			Upserts: rawRows(t, []index.Object{cmRow("edge-a", "b", fmt.Sprint(v))}),
		}})
		m, err := c.read()
		if err != nil {
			t.Fatalf("no reject: write %v, read %v", werr, err)
		}
		if m.Type == TypeAck {
			continue
		}
		if m.Type != TypeReject || m.Reject.Reason != ReasonInvalid || !strings.Contains(m.Reject.Message, "snapshot 2 pending for over 300ms") {
			t.Fatalf("got %s %+v, want an invalid reject saying snapshot 2 is pending", m.Type, m.Reject)
		}
		if took := time.Since(start); took < limit {
			t.Errorf("rejected %s after part 0, before the limit, %s", took, limit)
		}
		_, _ = c.read() // the close frame, which answers the manager's
		break
	}
	h.waitReleased(t, "edge-a")
	got := names(t, h.store, "edge-a")
	if want := []string{"ConfigMap/default/a", "ConfigMap/default/b"}; !slices.Equal(got, want) {
		t.Errorf("rows after the reject: %v, want %v (the first snapshot's and the deltas')", got, want)
	}

	// An edge that sends part 0 and then nothing at all: the deadline's
	// timer ends the session, no message needs to come after it. Without
	// the timer the read below gives up after 10 s of silence.
	c = dialRaw(t, h.url)
	c.welcome("edge-b", "i", FeatureDeltasInSnapshot)
	part0 = snapshotMsg(t, 1, []index.Object{cmRow("edge-b", "a", "1")})
	part0.Snapshot.Final = false
	c.send(part0)
	if rej := c.expectRejectMessage(ReasonInvalid); !strings.Contains(rej.Message, "snapshot 1 pending for over 300ms") {
		t.Errorf("silent edge: rejected with %q, want snapshot 1 pending", rej.Message)
	}
}

// TestDeltasDuringResyncs: a real edge collecting a real API server, which
// resyncs every half second in parts of at most 16 KiB, sends the creates,
// updates and deletes it sees between the parts; the manager never shows a
// pod older than one it showed (an update undone by a commit, a deleted
// pod back, a created one removed and back), and ends equal to the API
// server.
func TestDeltasDuringResyncs(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "edge-deltas"})
	ctx := t.Context()
	const pods = 40
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 1, Pods: pods, Services: 4}); err != nil {
		t.Fatal(err)
	}
	const name = "edge-a"
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 16 << 10, Window: 2, PingInterval: testPing, PongWait: testPongWait})
	regressions := watchRegressions(t, h.store, name)
	const every = 500 * time.Millisecond
	a := startAgent(t, AgentOptions{
		Manager: h.url, Cluster: name, Local: rest.CopyConfig(c.DirectConfig),
		Resync: ResyncOptions{Interval: every, Min: every, Max: every},
	})
	h.rec.WaitFor(t, name, index.StateConnected, 1, 90*time.Second)

	api := kubernetes.NewForConfigOrDie(c.DirectConfig).CoreV1().Pods("ns-0")
	const lag = 3 // a created pod lives this many rounds
	for i := 0; a.Stats().DeltasInSnapshot < 20; i++ {
		if i == 3000 {
			t.Fatalf("%d rounds of changes, and only %d deltas went between a snapshot's parts", i, a.Stats().DeltasInSnapshot)
		}
		if _, err := api.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("new-%d", i)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"round":"%d"}}}`, i)
		if _, err := api.Patch(ctx, fmt.Sprintf("pod-%d", i%pods), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if i >= lag {
			if err := api.Delete(ctx, fmt.Sprintf("new-%d", i-lag), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := conntest.Truth(t, c, h.store.Kinds(name))
	conntest.Eventually(t, 10*time.Second, "rows equal the API server's objects", func() error {
		return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, name))
	})
	s := a.Stats()
	t.Logf("agent: %d snapshots in %d parts, %d deltas between parts, %d messages", s.Snapshots, s.Parts, s.DeltasInSnapshot, s.Messages)
	if s.Rejects != 0 || s.Sessions != 1 {
		t.Errorf("the session did not last: %+v", s)
	}
	if bad := regressions(); len(bad) > 0 {
		t.Errorf("%d pod rows went back, e.g. %s", len(bad), conntest.Head(bad))
	}
}

// watchRegressions follows the index's change feed and returns a function
// listing every pod row of cluster that went back: older than a row shown
// before, or shown again after its object's delete. Resource versions of
// one API server only grow.
func watchRegressions(t *testing.T, store *index.Store, cluster string) func() []string {
	type seen struct {
		rv      uint64
		deleted bool
	}
	var mu sync.Mutex
	last := map[index.Key]seen{}
	var bad []string
	conntest.Follow(t, store, func(e *index.Event) {
		if e.Cluster != cluster || (e.Type != index.EventAdded && e.Type != index.EventModified && e.Type != index.EventDeleted) {
			return
		}
		o := e.Object()
		if o.Kind != "Pod" {
			return
		}
		rv, err := strconv.ParseUint(o.ResourceVersion, 10, 64)
		k := o.Key()
		mu.Lock()
		defer mu.Unlock()
		prev, ok := last[k]
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s: resource version %q", k, o.ResourceVersion))
		case e.Type == index.EventDeleted:
			last[k] = seen{rv: rv, deleted: true}
		case ok && (rv < prev.rv || prev.deleted && rv <= prev.rv):
			bad = append(bad, fmt.Sprintf("%s %s at rv %d after rv %d (deleted: %v)", k, e.Type, rv, prev.rv, prev.deleted))
		default:
			last[k] = seen{rv: rv}
		}
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bad)
	}
}

// TestOldManagerGetsNoDeltasInSnapshots: against a manager that lists no
// features in its Welcome (one from before them), an edge sends nothing
// between a snapshot's parts, however much changes during them.
func TestOldManagerGetsNoDeltasInSnapshots(t *testing.T) {
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 16 << 10, Window: 2, features: []string{}})
	const every = 50 * time.Millisecond
	a := startAgent(t, AgentOptions{Manager: h.url, Cluster: "edge-b", Resync: ResyncOptions{Interval: every, Min: every, Max: every}})
	rows := testRows("edge-b", 300, "0")
	if err := a.buf.Replace(t.Context(), "edge-b", testKind, rows); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	// Ten resyncs take about half a second; past the deadline the session
	// ended some other way (review-edgedelta L5). A failure bound only.
	const within = 90 * time.Second
	deadline := time.Now().Add(within)
	for round := 1; a.Stats().Snapshots < 10; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d rounds of changes in %s and only %d snapshots: %+v", round, within, a.Stats().Snapshots, a.Stats())
		}
		r := rows[round%len(rows)]
		r.ResourceVersion, r.Message = fmt.Sprint(round), fmt.Sprint("round ", round)
		if err := a.buf.Upsert(t.Context(), r); err != nil {
			t.Fatal(err)
		}
		if s := a.Stats(); s.Rejects > 0 {
			t.Fatalf("the manager rejected the edge: %+v", s.LastReject)
		}
		time.Sleep(time.Millisecond) // pace the changes; not a synchronisation
	}
	s := a.Stats()
	t.Logf("agent: %d snapshots in %d parts, %d messages", s.Snapshots, s.Parts, s.Messages)
	if s.Rejects != 0 || s.DeltasInSnapshot != 0 || s.Parts < 2*s.Snapshots {
		t.Errorf("want multi-part snapshots, no deltas between their parts and no rejects: %+v", s)
	}
}

// TestTakeDeltaOfListedKinds: between a snapshot's parts the edge takes
// only changes of the kinds the snapshot syncs; the others stay changed,
// for after the snapshot.
func TestTakeDeltaOfListedKinds(t *testing.T) {
	b := newBuffer("c", 100)
	b.setConnected(true)
	b.takeFull()
	cm, svc := cmRow("c", "a", "1"), svcRows("c", 1)[0]
	for _, o := range []index.Object{cm, svc} {
		if err := b.Upsert(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	only := syncedKinds([]KindState{{Kind: testKind, Synced: true}, {Kind: svcKind, Error: "forbidden"}})
	ups, dels := b.takeDelta(100, only, nil)
	if len(ups) != 1 || ups[0].Key() != cm.Key() || len(dels) != 0 {
		t.Errorf("during a snapshot syncing only ConfigMaps: took %v and deletes %v, want only %s", ups, dels, cm.Key())
	}
	if b.dirty.n != 1 {
		t.Errorf("%d keys changed after the take, want the Service's", b.dirty.n)
	}
	ups, _ = b.takeDelta(100, nil, nil)
	if len(ups) != 1 || ups[0].Key() != svc.Key() {
		t.Errorf("after the snapshot: took %v, want the Service held back, %s", ups, svc.Key())
	}
	if err := b.Delete(t.Context(), cm.Key()); err != nil {
		t.Fatal(err)
	}
	if ups, dels := b.takeDelta(100, syncedKinds([]KindState{{Kind: svcKind, Error: "forbidden"}}), nil); len(ups)+len(dels) != 0 {
		t.Errorf("a snapshot syncing no kind took %v %v", ups, dels)
	}
	if _, dels := b.takeDelta(100, nil, nil); len(dels) != 1 || dels[0] != cm.Key() {
		t.Errorf("after it: took deletes %v, want %s", dels, cm.Key())
	}
	if b.dirty.n != 0 {
		t.Errorf("%d keys changed after taking every one", b.dirty.n)
	}
}

// relayHub is a manager played by the test in front of a real hub. It
// welcomes an edge with a window of window messages (one: the edge sends
// its next message only once the test acks the last), and the test relays each
// message to the hub (over its own session) before it acks it to the
// edge. Between two messages the test can change the edge's rows at a
// known point of a snapshot.
//
// Concurrency: serve (the HTTP handler of the edge's one connection) and
// its reader goroutine hand messages to the test goroutine over msgs and
// take acks from it over acks; the test's cleanup closes done and waits
// for serve.
type relayHub struct {
	t      *testing.T
	h      *hubHarness
	hub    *rawClient // the relay's session with the real hub
	msgs   chan *Message
	acks   chan uint64
	finals int // snapshots whose final part the hub applied
	parts  int // the most parts of one snapshot the hub applied
	// allowance is the hub's Welcome.MaxSnapshotDeltaBytes, which the
	// relay's own Welcome passes on.
	allowance int
}

// relayWait bounds how long the relay waits for the edge's next message.
const relayWait = 30 * time.Second

// newRelayHub starts a relay claiming cluster on a new hub and returns it
// and the URL an agent dials.
func newRelayHub(t *testing.T, cluster string, window int) (*relayHub, string) {
	return newRelayHubWith(t, cluster, window, HubOptions{})
}

// newRelayHubWith is newRelayHub with a hub of the given options.
func newRelayHubWith(t *testing.T, cluster string, window int, opts HubOptions) (*relayHub, string) {
	// The relay reads from the hub only while it relays: the hub waits
	// longer than the relay waits for the edge before it drops the relay.
	opts.PongWait = 2 * relayWait
	h := newHubHarness(t, opts)
	r := &relayHub{t: t, h: h, msgs: make(chan *Message, 64), acks: make(chan uint64)}
	r.hub = dialRaw(t, r.h.url)
	w := r.hub.hello(cluster, "relay", tokenFor(cluster), FeatureDeltasInSnapshot)
	if w.Type != TypeWelcome || !slices.Equal(w.Welcome.Features, []string{FeatureDeltasInSnapshot}) {
		t.Fatalf("the hub's answer to the relay: %s %+v %+v", w.Type, w.Welcome, w.Reject)
	}
	r.allowance = w.Welcome.MaxSnapshotDeltaBytes
	done := make(chan struct{})
	var served sync.WaitGroup
	var conns atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if conns.Add(1) > 1 {
			t.Errorf("the edge connected again: its session ended")
			http.Error(w, "one session only", http.StatusServiceUnavailable)
			return
		}
		served.Add(1)
		defer served.Done()
		r.serve(w, req, window, done)
	}))
	t.Cleanup(func() {
		close(done)
		served.Wait()
		srv.Close()
	})
	return r, "ws" + strings.TrimPrefix(srv.URL, "http")
}

func (r *relayHub) serve(w http.ResponseWriter, req *http.Request, window int, done <-chan struct{}) {
	c := newConn()
	ws, err := websocket.Accept(w, req, &websocket.AcceptOptions{
		Subprotocols: []string{Subprotocol}, CompressionMode: websocket.CompressionNoContextTakeover, OnPongReceived: c.pong,
	})
	if err != nil {
		r.t.Errorf("accept: %v", err)
		return
	}
	c.ws = ws
	defer c.closeNow()
	if m, _, err := c.read(DefaultMaxMessageBytes, time.Minute); err != nil || m.Type != TypeHello {
		r.t.Errorf("the edge's hello: %v", err)
		return
	}
	if _, err := c.write(&Message{Type: TypeWelcome, Seq: 1, Time: time.Now(), Welcome: &Welcome{
		Version: ProtocolVersion, Session: "relay", MaxMessageBytes: DefaultMaxMessageBytes, Window: window,
		Features: []string{FeatureDeltasInSnapshot}, MaxSnapshotDeltaBytes: r.allowance,
	}}); err != nil {
		r.t.Errorf("welcome: %v", err)
		return
	}
	readDone := make(chan struct{})
	defer func() {
		c.closeNow()
		<-readDone
	}()
	go func() {
		defer close(readDone)
		for {
			m, _, err := c.read(DefaultMaxMessageBytes, time.Minute)
			if err != nil {
				return
			}
			select {
			case r.msgs <- m:
			case <-done:
				return
			}
		}
	}()
	for seq := uint64(2); ; seq++ {
		select {
		case n := <-r.acks:
			if _, err := c.write(&Message{Type: TypeAck, Seq: seq, Time: time.Now(), Ack: &Ack{Seq: n}}); err != nil {
				return
			}
		case <-readDone:
			return
		case <-done:
			return
		}
	}
}

// next returns the edge's next message; why says what the test waits for.
func (r *relayHub) next(why func() string) *Message {
	r.t.Helper()
	select {
	case m := <-r.msgs:
		return m
	case <-time.After(relayWait):
		r.t.Fatalf("no message from the edge within %s, waiting for %s", relayWait, why())
		return nil
	}
}

// pass relays m to the hub, waits until the hub applied it (failing on a
// reject) and acks it to the edge.
func (r *relayHub) pass(m *Message) {
	r.t.Helper()
	seq := m.Seq
	m.Seq = 0 // the relay's own session numbers it
	r.hub.send(m)
	r.hub.awaitAck(r.hub.seq)
	if m.Type == TypeSnapshot {
		r.parts = max(r.parts, m.Snapshot.Part+1)
		if m.Snapshot.Final {
			r.finals++
		}
	}
	select {
	case r.acks <- seq:
	case <-time.After(30 * time.Second):
		r.t.Fatal("the edge's session with the relay is gone")
	}
}

// relayUntil relays the edge's messages until one that stop matches, and
// returns that one unrelayed: the edge waits for its ack.
func (r *relayHub) relayUntil(what string, stop func(*Message) bool) *Message {
	r.t.Helper()
	for {
		m := r.next(func() string { return what })
		if stop(m) {
			return m
		}
		r.pass(m)
	}
}

// settle relays the edge's messages until the hub applied at least finals
// snapshots and holds the rows the edge holds, each at the edge's version.
func (r *relayHub) settle(cluster string, want map[string]string, finals int) {
	r.t.Helper()
	diff := func() error { return conntest.DiffKeys(want, conntest.RowVersions(r.t, r.h.store, cluster)) }
	for r.finals < finals || diff() != nil {
		r.pass(r.next(func() string {
			return fmt.Sprintf("the hub to hold the edge's rows (%d of %d snapshots applied): %v", r.finals, finals, diff())
		}))
	}
}

// edgeVersions returns the rows the edge's buffer holds, keyed as
// conntest.RowVersions keys the index's.
func edgeVersions(b *buffer) map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]string{}
	for _, kr := range b.kinds {
		for _, o := range kr.rows {
			out[fmt.Sprintf("%s.%s/%s/%s", o.Kind, o.Group, o.Namespace, o.Name)] = o.ResourceVersion
		}
	}
	return out
}

// versioned returns rows at version v, which shows in the message too
// (the index ignores a row that differs only in its resource version).
func versioned(rows []index.Object, v string) []index.Object {
	out := slices.Clone(rows)
	for i := range out {
		out[i].ResourceVersion, out[i].Message = v, "version "+v
	}
	return out
}

// TestChangesOfOtherKindsWaitForTheSnapshot: between a snapshot's parts
// the edge sends only changes of the kinds the snapshot syncs; a change of
// another kind waits for the snapshot's end, because the snapshot, or the
// one after it, would undo it on the manager (review-edgedelta H1, M1). A
// relay with a window of one message changes the edge's rows while a
// snapshot of several parts is going out, and a real hub applies what the
// edge sends: the hub accepts every message, ends with the edge's rows,
// and never deletes a row the edge still has.
func TestChangesOfOtherKindsWaitForTheSnapshot(t *testing.T) {
	const cluster = "edge-a"
	ctx := t.Context()
	configMaps := versioned(testRows(cluster, 3000, ""), "1") // about 1 MiB: several parts of 256 KiB
	services := versioned(svcRows(cluster, 3), "1")
	part0 := func(full bool) func(*Message) bool {
		return func(m *Message) bool {
			return m.Type == TypeSnapshot && m.Snapshot.Part == 0 && m.Snapshot.Full == full
		}
	}
	cases := []struct {
		name string
		// kinds the edge has before the session and expects from discovery
		kinds []index.Kind
		// run makes the changes as the relay goes and returns how many
		// snapshots the hub applies in all.
		run func(t *testing.T, r *relayHub, b *buffer) int
	}{
		{
			// H1: ConfigMaps and Services relist at once, so they follow
			// as two kind snapshots of rows taken together. A Service
			// changes while the ConfigMaps' parts go out; the Services'
			// snapshot must not undo it.
			name:  "a later kind snapshot of the same relist",
			kinds: []index.Kind{testKind, svcKind},
			run: func(t *testing.T, r *relayHub, b *buffer) int {
				m := r.relayUntil("the full snapshot", part0(true))
				for _, k := range []index.Kind{testKind, svcKind} {
					if err := b.ReportKindError(ctx, cluster, k, errString("relist failed")); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Replace(ctx, cluster, testKind, versioned(configMaps, "2")); err != nil {
					t.Fatal(err)
				}
				if err := b.Replace(ctx, cluster, svcKind, versioned(services, "2")); err != nil {
					t.Fatal(err)
				}
				r.pass(m)
				m = r.relayUntil("the ConfigMaps' kind snapshot", part0(false))
				if ks := m.Snapshot.Kinds; len(ks) != 1 || ks[0].Kind.Kind != "ConfigMap" {
					t.Fatalf("the first kind snapshot lists %+v, want ConfigMaps", ks)
				}
				updated := versioned(services[:1], "3")[0]
				created := versioned(svcRows(cluster, 4)[3:], "3")[0]
				for _, o := range []index.Object{updated, created} {
					if err := b.Upsert(ctx, o); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Delete(ctx, services[1].Key()); err != nil {
					t.Fatal(err)
				}
				r.pass(m)
				return 3 // the full snapshot, then the ConfigMaps' and the Services'
			},
		},
		{
			// M1: Services finish their first list while a full snapshot
			// that does not list them goes out; its commit retires every
			// kind it does not list.
			name:  "a kind that finishes its first list during a full snapshot",
			kinds: []index.Kind{testKind},
			run: func(t *testing.T, r *relayHub, b *buffer) int {
				m := r.relayUntil("the full snapshot", part0(true))
				if err := b.Replace(ctx, cluster, svcKind, services); err != nil {
					t.Fatal(err)
				}
				r.pass(m)
				return 2 // the full snapshot, then the Services'
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, url := newRelayHub(t, cluster, 1)
			var mu sync.Mutex
			var deleted []string
			var seen uint64 // the last event's sequence number
			conntest.Follow(t, r.h.store, func(e *index.Event) {
				mu.Lock()
				defer mu.Unlock()
				seen = e.Seq
				if e.Cluster == cluster && e.Type == index.EventDeleted {
					o := e.Object()
					deleted = append(deleted, fmt.Sprintf("%s.%s/%s/%s", o.Kind, o.Group, o.Namespace, o.Name))
				}
			})
			a := startAgent(t, AgentOptions{
				Manager: url, Cluster: cluster, PingInterval: 5 * time.Second, PongWait: time.Minute,
				Resync: ResyncOptions{Interval: time.Hour}, // no periodic resync: the test counts snapshots
			})
			if err := a.buf.Replace(ctx, cluster, testKind, configMaps); err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.kinds[1:] {
				if err := a.buf.Replace(ctx, cluster, k, services); err != nil {
					t.Fatal(err)
				}
			}
			a.buf.expect(tc.kinds)
			finals := tc.run(t, r, a.buf)
			want := edgeVersions(a.buf)
			r.settle(cluster, want, finals)
			s := a.Stats()
			t.Logf("agent: %d snapshots in %d parts, %d deltas between parts, %d messages", s.Snapshots, s.Parts, s.DeltasInSnapshot, s.Messages)
			if r.parts < 3 {
				t.Errorf("the longest snapshot had %d parts: the test needs deltas after a part that is not the first", r.parts)
			}
			// Every commit the hub acked is published; the watcher reads
			// the feed on its own goroutine.
			last := r.h.store.LastSeq()
			conntest.Eventually(t, 10*time.Second, "the change feed read", func() error {
				mu.Lock()
				defer mu.Unlock()
				if seen < last {
					return fmt.Errorf("event %d of %d", seen, last)
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			var back []string
			for _, k := range deleted {
				if _, ok := want[k]; ok {
					back = append(back, k)
				}
			}
			if len(back) > 0 {
				t.Errorf("%d rows the edge has were deleted on the way (and came back), e.g. %s", len(back), conntest.Head(back))
			}
		})
	}
}

// TestResyncKeepsTwoPartsInFlight: once a session's first full snapshot is
// sent, a resync with its window held at two parts (MaxResyncParts) keeps
// at most two parts unacknowledged, and a change made
// while it waits for an ack goes out at once, not after the next part: a
// delta queues on the manager behind two parts, not behind a window of
// them. The first snapshot uses the whole window. A relay with a window of
// 16 holds its acks back to see what the edge sends unprompted, and a real
// hub applies every message.
func TestResyncKeepsTwoPartsInFlight(t *testing.T) {
	const cluster = "edge-a"
	ctx := t.Context()
	configMaps := versioned(testRows(cluster, 6000, ""), "1") // about 2 MiB: 8 parts or more
	r, url := newRelayHub(t, cluster, DefaultWindow)
	every := 500 * time.Millisecond
	a := startAgent(t, AgentOptions{
		Manager: url, Cluster: cluster, PingInterval: 5 * time.Second, PongWait: time.Minute,
		Resync: ResyncOptions{Interval: every, Min: every, Max: every},
		// The relay's held acks would read as a long round trip, and the
		// window would grow (TestResyncOverALongLink); this test is about
		// the two parts it starts from.
		MaxResyncParts: resyncPartsInFlight,
	})
	if err := a.buf.Replace(ctx, cluster, testKind, configMaps); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})

	// held are the edge's messages not yet relayed nor acked, in order;
	// release relays and acks them up to and including the first part.
	var held []*Message
	unacked := func() int {
		n := 0
		for _, m := range held {
			if m.Type == TypeSnapshot {
				n++
			}
		}
		return n
	}
	release := func() {
		for len(held) > 0 {
			m := held[0]
			held = held[1:]
			r.pass(m)
			if m.Type == TypeSnapshot {
				return
			}
		}
	}
	isPart := func(id uint64) func() string {
		return func() string { return fmt.Sprintf("a part of snapshot %d (%d messages held)", id, len(held)) }
	}

	// The first snapshot: three parts unacknowledged (a paced edge would
	// stop at two, and this would time out).
	for unacked() < 3 {
		m := r.next(isPart(1))
		if m.Type != TypeSnapshot || m.Snapshot.ID != 1 || m.Snapshot.Final {
			t.Fatalf("got %s while waiting for 3 parts of the first snapshot", m.Type)
		}
		held = append(held, m)
	}
	for len(held) > 0 {
		release()
	}
	held = append(held, r.relayUntil("the first resync", func(m *Message) bool { return m.Type == TypeSnapshot && m.Snapshot.ID == 2 }))

	// The first resync: with two parts unacknowledged the edge waits, and
	// a change made then goes out at once; an ack lets the next part go.
	changes := 0
	for final := false; !final; {
		m := r.next(isPart(2))
		switch {
		case m.Type == TypeSnapshot && m.Snapshot.ID == 2:
			if n := unacked(); n >= 2 {
				t.Fatalf("part %d of the resync came with %d parts unacknowledged", m.Snapshot.Part, n)
			}
			held = append(held, m)
			if final = m.Snapshot.Final; final || unacked() < 2 {
				continue
			}
			changes++
			o := versioned(configMaps[changes:changes+1], fmt.Sprint(changes+1))[0]
			if err := a.buf.Upsert(ctx, o); err != nil {
				t.Fatal(err)
			}
			d := r.next(func() string { return "the delta of a change made with two parts unacknowledged" })
			if d.Type != TypeDelta {
				what := string(d.Type)
				if d.Snapshot != nil {
					what = fmt.Sprintf("part %d of snapshot %d", d.Snapshot.Part, d.Snapshot.ID)
				}
				t.Fatalf("after a change made with two parts unacknowledged the edge sent %s, want the change's delta", what)
			}
			held = append(held, d)
			release()
		case m.Type == TypeDelta:
			held = append(held, m)
		default:
			t.Fatalf("got %s while waiting for the resync's parts", m.Type)
		}
	}
	for len(held) > 0 {
		release()
	}
	r.settle(cluster, edgeVersions(a.buf), 2)
	s := a.Stats()
	t.Logf("agent: %d snapshots in %d parts, %d deltas between parts, %d changes made with two parts unacknowledged", s.Snapshots, s.Parts, s.DeltasInSnapshot, changes)
	if changes < 3 {
		t.Errorf("%d changes made with two parts unacknowledged: the resync had too few parts", changes)
	}
}

// TestKindSnapshotIsNotPaced: a kind snapshot (a kind's first listing, or
// a kind recovering) uses the whole window, as the session's first
// snapshot does: changes of every other kind wait for its end, so pacing
// it would make them wait longer (review-s7-edge M2). Only periodic full
// resyncs are paced. After the first snapshot is applied, a second kind
// finishes its first list; the relay holds its acks back and waits for
// three parts of the kind snapshot unacknowledged (a paced edge stops at
// two, and this times out).
func TestKindSnapshotIsNotPaced(t *testing.T) {
	const cluster = "edge-a"
	ctx := t.Context()
	secrets := index.Kind{Version: "v1", Kind: "Secret", Resource: "secrets", Namespaced: true}
	secretRows := versioned(testRows(cluster, 6000, ""), "1") // about 2 MiB: 8 parts or more
	for i := range secretRows {
		secretRows[i].Kind, secretRows[i].Resource = secrets.Kind, secrets.Resource
	}
	r, url := newRelayHub(t, cluster, DefaultWindow)
	never := time.Hour // no periodic resync during the test
	a := startAgent(t, AgentOptions{
		Manager: url, Cluster: cluster, PingInterval: 5 * time.Second, PongWait: time.Minute,
		Resync: ResyncOptions{Interval: never, Min: never, Max: never},
	})
	if err := a.buf.Replace(ctx, cluster, testKind, testRows(cluster, 10, "1")); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	r.settle(cluster, edgeVersions(a.buf), 1)

	if err := a.buf.Replace(ctx, cluster, secrets, secretRows); err != nil {
		t.Fatal(err)
	}
	var held []*Message
	for len(held) < 3 {
		m := r.next(func() string {
			return fmt.Sprintf("3 parts of the Secrets' kind snapshot unacknowledged (%d so far)", len(held))
		})
		if m.Type != TypeSnapshot || m.Snapshot.Full || m.Snapshot.Final {
			t.Fatalf("got %s while waiting for 3 parts of the kind snapshot", m.Type)
		}
		held = append(held, m)
	}
	for _, m := range held {
		r.pass(m)
	}
	r.settle(cluster, edgeVersions(a.buf), 2)
}

// honestEdgeWithinTheAllowance runs TestDeltasKeepWithinTheAllowance's
// honest edge: a relay with a window of two in front of a hub whose
// allowance is 1 MiB, a first snapshot of 6,000 ConfigMaps, and, while
// its part 1 is held, new ConfigMaps (those change returns of 3,000) that
// would make the hub keep over 1.5 times its allowance. It checks that
// the hub accepted everything and that the edge spent its budget once,
// and returns the relay, the agent and the first snapshot's rows.
func honestEdgeWithinTheAllowance(t *testing.T, change func([]index.Object) []index.Object) (*relayHub, *Agent, []index.Object) {
	t.Helper()
	const cluster = "edge-a"
	ctx := t.Context()
	// An allowance of 1 MiB (an eighth of the snapshot limit); the
	// snapshot, about 2 MiB of JSON, goes out in 8 parts or more.
	r, url := newRelayHubWith(t, cluster, 2, HubOptions{MaxSnapshotBytes: 8 << 20})
	if want := (8 << 20) / wroteShare; r.allowance != want {
		t.Fatalf("the hub's welcome announces an allowance of %d, want %d", r.allowance, want)
	}
	configMaps := versioned(testRows(cluster, 6000, ""), "1")
	// New ConfigMaps made during the snapshot: the hub would keep half as
	// much again as its allowance of them if the edge sent them all
	// between the parts.
	created := change(versioned(testRows(cluster, 9000, ""), "2")[6000:])
	cost := 0
	for i := range created {
		// What the hub holds: the row as it decodes it from the edge's JSON.
		o := roundTrip(t, &created[i])
		c, over := r.h.hub.opts.Quotas.checkRow(o)
		if over != nil {
			t.Fatal(over.reject)
		}
		cost += writeCost(o.Key(), o, c)
	}
	if cost < r.allowance*3/2 {
		t.Fatalf("the changes would make the hub keep %d bytes, under 1.5 times its allowance of %d", cost, r.allowance)
	}
	logs := countPhrases(budgetSpentLog)
	a := startAgent(t, AgentOptions{
		Manager: url, Cluster: cluster, PingInterval: 5 * time.Second, PongWait: time.Minute,
		Resync: ResyncOptions{Interval: time.Hour}, // no periodic resync: the test counts snapshots
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err := a.buf.Replace(ctx, cluster, testKind, configMaps); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	// With part 1 held (a window of two), the edge waits before part 2 or
	// 3; every change made now goes between later parts, or waits.
	m := r.relayUntil("part 1 of the first snapshot", func(m *Message) bool {
		return m.Type == TypeSnapshot && m.Snapshot.Part == 1
	})
	for _, o := range created {
		if err := a.buf.Upsert(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r.pass(m) // fails on a reject
	r.settle(cluster, edgeVersions(a.buf), 1)
	s := a.Stats()
	t.Logf("agent: %d snapshots in %d parts, %d deltas between parts, budget spent in %d", s.Snapshots, s.Parts, s.DeltasInSnapshot, s.DeltaBudgetSpent)
	if s.DeltasInSnapshot == 0 || s.DeltaBudgetSpent != 1 || r.parts < 8 {
		t.Errorf("want deltas between the parts until the budget was spent, in one snapshot of 8 parts or more (%d): %+v", r.parts, s)
	}
	// An operator sees it (review-s9-a L7): one line, when it starts.
	if n := logs[budgetSpentLog].Load(); n != 1 {
		t.Errorf("the edge logged a spent budget %d times, want once", n)
	}
	return r, a, configMaps
}

// roundTrip returns o as the hub decodes it from the edge's JSON.
func roundTrip(t *testing.T, o *index.Object) *index.Object {
	t.Helper()
	data, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var out index.Object
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestInvalidUTF8KeepsWithinTheAllowance: rows whose strings are invalid
// UTF-8 grow threefold through JSON (each byte becomes U+FFFD), so an
// edge that measured its own bytes sent about 2.4 times what it meant to
// and the hub ended the session with oversize; the edge counts strings as
// the hub decodes them (review-s9-a L2). An object's message is free
// text, and the collector reads core kinds over protobuf, which does not
// check UTF-8: anyone who can set one can fill it with such bytes.
func TestInvalidUTF8KeepsWithinTheAllowance(t *testing.T) {
	// 600 rows of 1,000 such bytes: the hub would keep about 2 MiB of
	// them, and an edge counting 1,000 bytes each sends about 340 between
	// the parts, 1.2 MiB on the hub, past its 1 MiB allowance. Fewer rows
	// than the valid case: each is 6 KB of JSON, slow to encode and decode
	// under -race.
	honestEdgeWithinTheAllowance(t, func(rows []index.Object) []index.Object {
		rows = rows[:600]
		for i := range rows {
			rows[i].Message = strings.Repeat("\xff", 1000)
		}
		return rows
	})
}

// TestDeletesMeasuredAsEncoded: a delta's deletes are measured as JSON
// encodes them. A name may hold control characters, each 6 bytes in JSON
// (\u0001); measured by its raw bytes, a delta deleting 40 such 1 KiB
// names was thought to be 44 KB and was 240 KB, over the manager's 64 KiB
// limit, and the manager ended the session with oversize (review-s11 E3).
// Deleted at once (one Replace), they go in one takeDelta, and the delta
// is split over as many messages as they need.
func TestDeletesMeasuredAsEncoded(t *testing.T) {
	const cluster = "edge-a"
	ctx := t.Context()
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 64 << 10})
	a, _ := runAgent(t, AgentOptions{Manager: h.url, Cluster: cluster, Instance: "edge-a-1"})
	rows := testRows(cluster, 40, "1")
	for i := range rows {
		rows[i].Name = fmt.Sprintf("cm-%02d-%s", i, strings.Repeat("\x01", 1000))
	}
	if err := a.buf.Replace(ctx, cluster, testKind, rows); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	synced := func(want int) func() error {
		return func() error {
			if s := a.Stats(); s.Rejects > 0 {
				t.Fatalf("the manager refused %d sessions, the last: %v", s.Rejects, s.LastReject)
			}
			if got := len(names(t, h.store, cluster)); got != want {
				return fmt.Errorf("the manager has %d rows, want %d", got, want)
			}
			return nil
		}
	}
	conntest.Eventually(t, 30*time.Second, "the rows synced", synced(len(rows)))
	if err := a.buf.Replace(ctx, cluster, testKind, nil); err != nil {
		t.Fatal(err)
	}
	conntest.Eventually(t, 30*time.Second, "the rows deleted", synced(0))
	if s := a.Stats(); s.Sessions != 1 || s.Rejects != 0 {
		t.Errorf("%d sessions, %d rejects, the last: %v; want 1, 0", s.Sessions, s.Rejects, s.LastReject)
	}
}

// TestDeltaRowHasARoomWithoutKinds: only a delta's first message carries
// its kind errors, so a row that fits a message without them but not the
// first goes in a later message. With the first message's room, it was
// left out as too large for any message and deleted at the manager, to
// come back with the next resync (review-s11 E2).
func TestDeltaRowHasARoomWithoutKinds(t *testing.T) {
	const maxMsg = 64 << 10
	got := make(chan *Message, 8)
	manager, ws, url := wsPair(t)
	go func() {
		for {
			m, _, err := manager.read(maxMsg, 10*time.Second)
			if err != nil {
				close(got)
				return
			}
			got <- m
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c := newConn()
	c.ws = ws
	a, err := NewAgent(AgentOptions{Manager: url, Cluster: "c", Token: func() (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	s := newAgentSession(a, c, &Welcome{MaxMessageBytes: maxMsg, Window: 8})
	var kinds []KindState
	for i := range 4 {
		kinds = append(kinds, KindState{Kind: index.Kind{Kind: fmt.Sprintf("Broken%d", i)}, Error: strings.Repeat("e", 1000)})
	}
	empty, err := overhead(&Message{Type: TypeDelta, Seq: 1, Delta: &Delta{}})
	if err != nil {
		t.Fatal(err)
	}
	// A row 500 bytes under a message without the kinds, 3.5 KB over one
	// with them.
	row := testRows("c", 1, "1")[0]
	fill := func(n int) {
		l := map[string]string{"f": strings.Repeat("f", n)}
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			l[k] = strings.Repeat(k, 12<<10)
		}
		row.Labels = index.LabelsOf(l)
	}
	fill(0)
	raw, err := json.Marshal(&row)
	if err != nil {
		t.Fatal(err)
	}
	fill(maxMsg - empty - 500 - len(raw))
	if err := s.sendDelta(ctx, []index.Object{row}, nil, kinds); err != nil {
		t.Fatal(err)
	}
	c.closeNow()
	var upserts, deletes, kindErrs int
	for m := range got {
		upserts += len(m.Delta.Upserts)
		deletes += len(m.Delta.Deletes)
		kindErrs += len(m.Delta.Kinds)
	}
	if upserts != 1 || deletes != 0 || kindErrs != len(kinds) || a.Stats().TooBig != 0 {
		t.Errorf("the delta sent %d rows, %d deletes, %d kind errors, %d rows too big; want 1, 0, %d, 0", upserts, deletes, kindErrs, a.Stats().TooBig, len(kinds))
	}
}

// TestDeltasKeepWithinTheAllowance: the manager announces what it keeps
// of the deltas between a snapshot's parts (Welcome.MaxSnapshotDeltaBytes),
// and an honest edge stays within half of it however much changes during a
// snapshot: the changes that do not fit wait for the snapshot's end, and
// the session lasts (review-s7-edge M3: a large cluster changing fast
// during a long resync reached the limit and reconnected into the same
// failure). An edge that ignores the allowance still gets a clear
// oversize, its cluster's rows stay as they were, and the hub goes on
// serving the honest edge.
func TestDeltasKeepWithinTheAllowance(t *testing.T) {
	const cluster = "edge-a"
	ctx := t.Context()
	r, a, configMaps := honestEdgeWithinTheAllowance(t, func(rows []index.Object) []index.Object { return rows })

	// The attacker: part 0 of a resync, then one delta deleting more
	// distinct keys than the allowance holds.
	c := dialRaw(t, r.h.url)
	w := c.hello("edge-b", "i", tokenFor("edge-b"), FeatureDeltasInSnapshot)
	if w.Type != TypeWelcome || w.Welcome.MaxSnapshotDeltaBytes != r.allowance {
		t.Fatalf("the attacker's welcome: %s %+v", w.Type, w.Welcome)
	}
	c.send(snapshotMsg(t, 1, []index.Object{cmRow("edge-b", "a", "1")}))
	c.awaitAck(c.seq)
	part0 := snapshotMsg(t, 2, []index.Object{cmRow("edge-b", "a", "1")})
	part0.Snapshot.Final = false
	c.send(part0)
	flood := &Delta{}
	for spent := 0; spent <= r.allowance; {
		o := cmRow("edge-b", fmt.Sprintf("gone-%d", len(flood.Deletes)), "")
		k := o.Key()
		flood.Deletes = append(flood.Deletes, k)
		spent += writeCost(k, nil, 0)
	}
	c.send(&Message{Type: TypeDelta, Delta: flood})
	rej := c.expectRejectMessage(ReasonOversize)
	if !strings.Contains(rej.Message, fmt.Sprint(r.allowance)) {
		t.Errorf("oversize reject %q does not name the allowance, %d", rej.Message, r.allowance)
	}
	if got, want := names(t, r.h.store, "edge-b"), []string{"ConfigMap/default/a"}; !slices.Equal(got, want) {
		t.Errorf("the attacker's rows after the reject: %v, want %v", got, want)
	}
	// The hub still serves the honest edge.
	changed := versioned(configMaps[:1], "3")[0]
	if err := a.buf.Upsert(ctx, changed); err != nil {
		t.Fatal(err)
	}
	r.settle(cluster, edgeVersions(a.buf), 1)
	if s := a.Stats(); s.Sessions != 1 || s.Rejects != 0 {
		t.Errorf("the honest edge's session did not last: %+v", s)
	}
}

// TestPendingSnapshotGauge: fleetgraph_edge_pending_snapshot_bytes shows
// what the hub holds for snapshots whose final part has not come (their
// decoded rows, and what deltas wrote meanwhile), as the limits count it;
// it goes back to zero at the commit and when the session ends with a
// snapshot pending (review-s7-edge L2's gauge). A part's row of a key a
// delta wrote meanwhile is not counted: it is dropped on arrival.
func TestPendingSnapshotGauge(t *testing.T) {
	h := newHubHarness(t, HubOptions{})
	check := func(when string, want int) {
		t.Helper()
		if got := testutil.ToFloat64(h.hub.metrics.pendingBytes); got != float64(want) {
			t.Errorf("%s: the gauge shows %v bytes, want %d", when, got, want)
		}
	}
	cost := func(rows ...index.Object) int {
		n := 0
		for i := range rows {
			c, over := h.hub.opts.Quotas.checkRow(&rows[i])
			if over != nil {
				t.Fatal(over.reject)
			}
			n += c
		}
		return n
	}
	c := dialRaw(t, h.url)
	c.welcome("edge-a", "i", FeatureDeltasInSnapshot)
	c.send(snapshotMsg(t, 1, []index.Object{cmRow("edge-a", "a", "1")}))
	c.awaitAck(c.seq)
	check("after a one-part snapshot", 0)

	rows := []index.Object{cmRow("edge-a", "a", "1"), cmRow("edge-a", "b", "1"), cmRow("edge-a", "c", "1")}
	part0 := snapshotMsg(t, 2, rows)
	part0.Snapshot.Final = false
	c.send(part0)
	c.awaitAck(c.seq)
	want := cost(rows...)
	check("after part 0", want)
	d := cmRow("edge-a", "d", "2")
	c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, []index.Object{d})}})
	c.awaitAck(c.seq)
	want += writeCost(d.Key(), &d, cost(d))
	check("after a delta inside the snapshot", want)
	// A later part's row of a key the delta wrote is older than the write:
	// it is dropped on arrival, not held and counted until the commit
	// (review-s7-edge L3); the part's other row counts.
	older, e := cmRow("edge-a", "d", "1"), cmRow("edge-a", "e", "1")
	c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Part: 1, Full: true, Rows: rawRows(t, []index.Object{older, e})}})
	c.awaitAck(c.seq)
	want += cost(e)
	check("after a part with a row of the key the delta wrote", want)
	c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Part: 2, Final: true, Full: true, Rows: rawRows(t, rows[:1])}})
	c.awaitAck(c.seq)
	check("after the final part", 0)
	if got := conntest.RowVersions(t, h.store, "edge-a"); got["ConfigMap./default/d"] != "2" {
		t.Errorf("after the commit: rows %v, want d at the delta's version 2", got)
	}

	part0 = snapshotMsg(t, 3, rows)
	part0.Snapshot.Final = false
	c.send(part0)
	c.awaitAck(c.seq)
	check("after part 0 of the next snapshot", cost(rows...))
	c.conn.closeNow()
	h.waitReleased(t, "edge-a")
	check("after the session ended with a snapshot pending", 0)
}

// TestWelcomeAnnouncesTheAllowance: the Welcome announces the deltas'
// allowance to a session that uses FeatureDeltasInSnapshot and zero to
// one that does not, though the limit does not depend on the feature
// (review-s9-a L3).
func TestWelcomeAnnouncesTheAllowance(t *testing.T) {
	h := newHubHarness(t, HubOptions{MaxSnapshotBytes: 8 << 20})
	for _, tc := range []struct {
		name     string
		features []string
		want     int
	}{
		{name: "with the feature", features: []string{FeatureDeltasInSnapshot}, want: (8 << 20) / wroteShare},
		{name: "without it", want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, h.url)
			cluster := "edge-a"
			if tc.features == nil {
				cluster = "edge-b"
			}
			w := c.hello(cluster, "i", tokenFor(cluster), tc.features...)
			if w.Type != TypeWelcome || w.Welcome.MaxSnapshotDeltaBytes != tc.want {
				t.Errorf("welcome %s %+v, want MaxSnapshotDeltaBytes %d", w.Type, w.Welcome, tc.want)
			}
		})
	}
}

// budgetSpentLog is in the line the agent logs when a snapshot's delta
// budget is spent.
const budgetSpentLog = "the manager's allowance for deltas between its parts is spent"

// phraseCounter counts the log records that contain each of its phrases
// (slog's handlers write a record in one Write).
type phraseCounter map[string]*atomic.Int32

func countPhrases(phrases ...string) phraseCounter {
	c := phraseCounter{}
	for _, p := range phrases {
		c[p] = &atomic.Int32{}
	}
	return c
}

func (c phraseCounter) Write(p []byte) (int, error) {
	for phrase, n := range c {
		if bytes.Contains(p, []byte(phrase)) {
			n.Add(1)
		}
	}
	return len(p), nil
}

// TestDeltaBudgetLoggedOncePerOutage: a run of snapshots that spend their
// delta budget logs one line at its start and one at its end.
func TestDeltaBudgetLoggedOncePerOutage(t *testing.T) {
	const back = "between the snapshot's parts again"
	logs := countPhrases(budgetSpentLog, back)
	a := &Agent{log: slog.New(slog.NewTextHandler(logs, nil))}
	for i, spent := range []bool{false, true, true, true, false, false, true} {
		a.noteDeltaBudget(spent, uint64(i+1), 1<<20)
	}
	if n := logs[budgetSpentLog].Load(); n != 2 {
		t.Errorf("%d lines about a spent budget, want 2 (snapshots 2 and 7)", n)
	}
	if n := logs[back].Load(); n != 1 {
		t.Errorf("%d lines about the budget back, want 1 (snapshot 5)", n)
	}
}

// TestDeltaBudgetFits: the edge's budget counts what the manager keeps of
// the deltas between a snapshot's parts (review-s9-a L6): half the
// allowance; a rewritten key replaces its cost rather than adding to it; a
// delete costs its key's strings and an entry; and once a key does not
// fit, none does, however small.
func TestDeltaBudgetFits(t *testing.T) {
	a, b, c := cmRow("edge-a", "a", "1"), cmRow("edge-a", "b", "1"), cmRow("edge-a", "c", "1")
	rowCostOf := func(o index.Object) int {
		n, _, _ := rowCost(&o, math.MaxInt)
		return writeCost(o.Key(), &o, n)
	}
	del := writeCost(c.Key(), nil, 0)
	if del != keyBytes(c.Key())+entryCost {
		t.Fatalf("a delete costs %d, want its key's %d bytes and an entry, %d", del, keyBytes(c.Key()), entryCost)
	}
	type write struct {
		row  index.Object
		del  bool
		fits bool
	}
	for _, tc := range []struct {
		name   string
		limit  int // the budget: half the allowance
		writes []write
		used   int
	}{
		{name: "rows up to the limit", limit: rowCostOf(a) + rowCostOf(b), writes: []write{{row: a, fits: true}, {row: b, fits: true}}, used: rowCostOf(a) + rowCostOf(b)},
		{name: "a rewrite replaces its cost", limit: rowCostOf(a) + rowCostOf(b), writes: []write{{row: a, fits: true}, {row: a, fits: true}, {row: a, fits: true}, {row: b, fits: true}}, used: rowCostOf(a) + rowCostOf(b)},
		{name: "a delete after the row's write costs the key", limit: rowCostOf(a) + rowCostOf(b), writes: []write{{row: a, fits: true}, {row: a, del: true, fits: true}, {row: b, fits: true}}, used: writeCost(a.Key(), nil, 0) + rowCostOf(b)},
		// c's delete would fit after a, b's row does not.
		{name: "one over closes the budget", limit: rowCostOf(a) + del, writes: []write{{row: a, fits: true}, {row: b, fits: false}, {row: c, del: true, fits: false}}, used: rowCostOf(a)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			budget := newDeltaBudget(2 * tc.limit)
			if budget.limit != tc.limit {
				t.Fatalf("a budget of %d for an allowance of %d, want %d", budget.limit, 2*tc.limit, tc.limit)
			}
			for i, w := range tc.writes {
				row := &w.row
				if w.del {
					row = nil
				}
				if got := budget.fits(w.row.Key(), row); got != w.fits {
					t.Errorf("write %d (%s, delete %v) fits = %v, want %v", i, w.row.Name, w.del, got, w.fits)
				}
			}
			if budget.used != tc.used {
				t.Errorf("the budget counts %d bytes, want %d", budget.used, tc.used)
			}
		})
	}
}

// TestDeltaAllowanceOfAnOldManager: a Welcome without
// MaxSnapshotDeltaBytes (a manager from before the field), or with a
// value below one, gives LegacyMaxSnapshotDeltaBytes (review-s9-a L6).
func TestDeltaAllowanceOfAnOldManager(t *testing.T) {
	a := &Agent{}
	for _, announced := range []int{0, -1, 1 << 20} {
		want := announced
		if announced <= 0 {
			want = LegacyMaxSnapshotDeltaBytes
		}
		s := newAgentSession(a, nil, &Welcome{Window: 1, MaxSnapshotDeltaBytes: announced})
		if s.deltaAllowance != want {
			t.Errorf("announced %d: allowance %d, want %d", announced, s.deltaAllowance, want)
		}
	}
}
