package edge

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
				wrote: map[index.Key]deltaWrite{},
			}
			for _, w := range tc.writes {
				var row *index.Object
				if w.version != "" {
					o := cmRow("c", w.name, w.version)
					row = &o
				}
				p.noteWrite(key(w.name), row, 100, 1<<20)
			}
			// A kind the snapshot does not sync is the deltas' alone.
			p.noteWrite(index.Key{Cluster: "c", Kind: "Secret", Namespace: "default", Name: "s"}, nil, 0, 1<<20)
			p.noteWrite(index.Key{Cluster: "c", Kind: "Pod", Namespace: "default", Name: "p"}, nil, 0, 1<<20)
			var got []string
			for _, o := range p.withWrites(cms) {
				got = append(got, o.Name+"@"+strings.TrimPrefix(o.Message, "version "))
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("rows %v, want %v", got, tc.want)
			}
			if n := len(p.wrote); n > len(tc.writes) {
				t.Errorf("%d keys kept, more than the %d the synced kind's deltas wrote", n, len(tc.writes))
			}
		})
	}

	t.Run("memory is bounded and counted once per key", func(t *testing.T) {
		p := &pendingSnapshot{kinds: map[kindID]KindState{cms: {Kind: testKind, Synced: true}}, wrote: map[index.Key]deltaWrite{}}
		row := cmRow("c", "a", "1")
		for range 1000 {
			if p.noteWrite(row.Key(), &row, 500, 1000) {
				t.Fatalf("one key written again and again went over the limit: %d bytes", p.bytes)
			}
		}
		if p.bytes != 500 {
			t.Errorf("%d bytes held for one key of cost 500", p.bytes)
		}
		if !p.noteWrite(key("b"), &row, 501, 1000) {
			t.Errorf("%d bytes held, over the limit of 1000, not reported", p.bytes)
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
		{"a flood of deltas", []string{FeatureDeltasInSnapshot}, ReasonOversize, func(_ *testing.T, c *rawClient) *Delta {
			// Ten deltas of 300 distinct deletes, which the manager must
			// keep for the commit: bounded only by the snapshot limit
			// (256 KiB here), which about six of them pass. Ten are
			// inside the window, so all are read before the reject.
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
			conntest.Eventually(t, 5*time.Second, "claim released", func() error {
				if row, _ := h.store.GetCluster(nil, "edge-b"); row.State != index.StateDisconnected {
					return errString("state " + string(row.State))
				}
				return nil
			})
		})
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
	for round := 1; a.Stats().Snapshots < 10; round++ {
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
