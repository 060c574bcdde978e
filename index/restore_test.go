package index

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"
)

var (
	roleKind = Kind{Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespaced: true}
	crbKind  = Kind{Group: RBACGroup, Version: "v1", Kind: KindClusterRoleBinding, Resource: "clusterrolebindings"}
	hrKind   = Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	svcKind  = Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
)

// buildCluster writes a cluster with every kind of state the index keeps:
// a cluster row, object rows written at different times, RBAC rows, a
// present kind, a present kind that then failed, and a kind that only
// failed.
func buildCluster(t *testing.T, s Sink, clk *fakeClock, name string) {
	t.Helper()
	mustNoErr(t, s.UpsertCluster(ctxb, Cluster{
		Name: name, Mode: ModePull, State: StateConnected, Since: clk.Now(), LastSeen: clk.Now(), Synced: true,
		Labels: map[string]string{"env": "prod"}, Metadata: map[string]string{"kubernetes.version": "v1.35.4"},
	}))
	mustNoErr(t, s.Replace(ctxb, name, podKind, []Object{
		pod(name, "a", "p1", StatusHealthy, map[string]string{"app": "web"}),
		pod(name, "b", "p2", StatusUnhealthy, nil),
	}))
	clk.Advance(time.Second)
	p3 := pod(name, "a", "p3", StatusProgressing, map[string]string{"app": "db", "tier": "x"})
	p3.Summary, p3.OwnerRefs, p3.Message = []byte(`{"phase":"Pending"}`), []OwnerRef{{Kind: "ReplicaSet", Name: "rs"}}, "waiting"
	mustNoErr(t, s.Upsert(ctxb, p3))
	mustNoErr(t, s.Replace(ctxb, name, roleKind, []Object{{
		Cluster: name, Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespace: "a", Name: "r",
		Policy: &Policy{Rules: []PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}},
	}}))
	mustNoErr(t, s.Replace(ctxb, name, crbKind, []Object{{
		Cluster: name, Group: RBACGroup, Version: "v1", Kind: KindClusterRoleBinding, Resource: "clusterrolebindings", Name: "b",
		Policy: &Policy{RoleRef: RoleRef{Kind: "ClusterRole", Name: "view"}, Subjects: []Subject{{Kind: "User", Name: "alice"}}},
	}}))
	mustNoErr(t, s.Replace(ctxb, name, svcKind, []Object{{
		Cluster: name, Namespace: "a", Version: "v1", Kind: "Service", Resource: "services", Name: "s", UID: "u-s", Status: StatusHealthy,
	}}))
	clk.Advance(time.Second)
	mustNoErr(t, s.ReportKindError(ctxb, name, svcKind, errors.New("watch failed")))
	mustNoErr(t, s.ReportKindError(ctxb, name, hrKind, errors.New("no matches for kind")))
}

// WithLabelTable returns snap with its rows' labels in a LabelTable, as
// the stream carries a snapshot (replication): each distinct label once,
// in the order rows first use it.
func WithLabelTable(snap ClusterSnapshot) ClusterSnapshot {
	t := &LabelTable{}
	strs, refs := map[string]uint32{}, map[LabelPair]uint32{}
	str := func(s string) uint32 {
		i, ok := strs[s]
		if !ok {
			i = uint32(len(t.Strings))
			strs[s] = i
			t.Strings = append(t.Strings, s)
		}
		return i
	}
	rows := slices.Clone(snap.Rows)
	for i := range rows {
		for k, v := range rows[i].Labels.All() {
			l := LabelPair{Key: str(k), Value: str(v)}
			ref, ok := refs[l]
			if !ok {
				ref = uint32(len(t.Pairs))
				refs[l] = ref
				t.Pairs = append(t.Pairs, l)
			}
			t.Refs = append(t.Refs, ref)
		}
		t.Ends = append(t.Ends, uint32(len(t.Refs)))
		rows[i].Labels = Labels{}
	}
	snap.Rows, snap.Labels = rows, t
	return snap
}

// snapshotForms are the two ways a snapshot can carry its rows' labels;
// a restore from either must give the same index.
var snapshotForms = map[string]func(ClusterSnapshot) ClusterSnapshot{
	"labels of each row": func(s ClusterSnapshot) ClusterSnapshot { return s },
	"label table":        WithLabelTable,
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	for form, conv := range snapshotForms {
		t.Run(form, func(t *testing.T) { testSnapshotRestoreRoundTrip(t, conv) })
	}
}

func testSnapshotRestoreRoundTrip(t *testing.T, conv func(ClusterSnapshot) ClusterSnapshot) {
	src, clk := newTestStore(t)
	buildCluster(t, src, clk, "c1")
	buildCluster(t, src, clk, "c2")
	snap := src.SnapshotCluster("c1")
	if snap.Cluster == nil || len(snap.Kinds) != 5 || len(snap.Rows) != 6 {
		t.Fatalf("snapshot: row %v, %d kinds, %d rows", snap.Cluster, len(snap.Kinds), len(snap.Rows))
	}
	for _, o := range snap.Rows {
		if o.Cluster != "c1" {
			t.Fatalf("snapshot of c1 holds a row of %s", o.Cluster)
		}
		if !IsPolicyKind(o.Group, o.Kind) && o.UpdatedAt.IsZero() {
			t.Fatalf("%s has no UpdatedAt", o.Key())
		}
	}

	// A fresh index restored from the snapshot has the same state, at
	// another time.
	dst, dclk := newTestStore(t)
	dclk.Advance(time.Hour)
	mustNoErr(t, dst.RestoreCluster(ctxb, conv(snap)))
	if got := dst.SnapshotCluster("c1"); !reflect.DeepEqual(got, snap) {
		t.Fatalf("restored snapshot differs:\n got %+v\nwant %+v", got, snap)
	}
	if p, _ := dst.Query(ctxb, Query{Access: &Access{All: true}, Filter: Filter{LabelSelector: "app=db,tier=x"}}); p.TotalCount != 1 {
		t.Fatalf("restored index answers %d objects labelled app=db,tier=x, want 1", p.TotalCount)
	}
	if p, _ := dst.Query(ctxb, Query{Access: &Access{All: true}}); p.TotalCount != 4 {
		t.Fatalf("restored index answers %d objects, want 4", p.TotalCount)
	}
	if r, ok := dst.GetRole("c1", "a", "r"); !ok || len(r.Rules) != 1 {
		t.Fatalf("restored Role: %+v %v", r, ok)
	}
	if errs := dst.KindErrors(nil, "c1"); len(errs) != 2 || errs[1].Kind.Kind != "HelmRelease" {
		t.Fatalf("restored kind errors: %+v", errs)
	}
	if got := dst.Kinds("c1"); len(got) != 4 { // Pod, Service, Role, ClusterRoleBinding
		t.Fatalf("restored kinds: %+v", got)
	}

	// Restoring the state an index has already publishes nothing.
	seq, rev := dst.LastSeq(), dst.PolicyRevision("c1")
	mustNoErr(t, dst.RestoreCluster(ctxb, conv(snap)))
	mustNoErr(t, src.RestoreCluster(ctxb, conv(snap)))
	if dst.LastSeq() != seq || dst.PolicyRevision("c1") != rev {
		t.Fatalf("restoring the same state published events: seq %d -> %d", seq, dst.LastSeq())
	}
	if got := src.SnapshotCluster("c1"); !reflect.DeepEqual(got, snap) {
		t.Fatal("restoring a store's own snapshot changed it")
	}
}

func TestRestoreOverOtherState(t *testing.T) {
	for form, conv := range snapshotForms {
		t.Run(form, func(t *testing.T) { testRestoreOverOtherState(t, conv) })
	}
}

func testRestoreOverOtherState(t *testing.T, conv func(ClusterSnapshot) ClusterSnapshot) {
	src, clk := newTestStore(t)
	buildCluster(t, src, clk, "c1")
	snap := src.SnapshotCluster("c1")

	// dst diverged: an extra row and kind, a changed row, a missing row,
	// another cluster row, no errors.
	dst, dclk := newTestStore(t)
	dclk.Advance(time.Hour)
	mustNoErr(t, dst.UpsertCluster(ctxb, Cluster{Name: "c1", State: StateDisconnected, LastError: "old"}))
	mustNoErr(t, dst.Replace(ctxb, "c1", podKind, []Object{
		pod("c1", "a", "p1", StatusUnhealthy, nil),
		pod("c1", "z", "extra", StatusHealthy, nil),
	}))
	cm := Kind{Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}
	mustNoErr(t, dst.Replace(ctxb, "c1", cm, []Object{{Cluster: "c1", Namespace: "a", Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Name: "cm", UID: "u"}}))
	mustNoErr(t, dst.Upsert(ctxb, pod("other", "a", "keep", StatusHealthy, nil)))
	seq := dst.LastSeq()
	wantStale(t, dst, "c1")

	mustNoErr(t, dst.RestoreCluster(ctxb, conv(snap)))
	wantStale(t, dst) // the snapshot's row is connected
	if got := dst.SnapshotCluster("c1"); !reflect.DeepEqual(got, snap) {
		t.Fatalf("restored snapshot differs:\n got %+v\nwant %+v", got, snap)
	}
	got := types(drain(t, dst, seq))
	want := map[string]bool{
		"MODIFIED p1": true, "DELETED extra": true, "DELETED cm": true, "ADDED p2": true, "ADDED p3": true, "ADDED s": true,
		"CLUSTER": true, "POLICY": true,
	}
	if len(got) != len(want) {
		t.Fatalf("events %v, want the %d of %v", got, len(want), want)
	}
	for _, e := range got {
		if !want[e] {
			t.Fatalf("unexpected event %q in %v", e, got)
		}
	}
	if _, ok := dst.Get(Key{Cluster: "other", Kind: "Pod", Namespace: "a", Name: "keep"}); !ok {
		t.Fatal("restoring c1 touched another cluster")
	}

	// An empty snapshot empties the cluster, and removes its stale row.
	mustNoErr(t, dst.UpsertCluster(ctxb, Cluster{Name: "c1", State: StateDisconnected}))
	wantStale(t, dst, "c1")
	mustNoErr(t, dst.RestoreCluster(ctxb, ClusterSnapshot{Name: "c1"}))
	wantStale(t, dst)
	if got := dst.SnapshotCluster("c1"); got.Cluster != nil || len(got.Kinds) != 0 || len(got.Rows) != 0 {
		t.Fatalf("after an empty restore: %+v", got)
	}
}

// wantStale fails t unless a fleet-wide viewer's page and facets name the
// stale clusters want.
func wantStale(t *testing.T, s *Store, want ...string) {
	t.Helper()
	all := &Access{All: true}
	p, err := s.Query(ctxb, Query{Access: all})
	mustNoErr(t, err)
	fc, err := s.Facets(ctxb, Filter{}, all)
	mustNoErr(t, err)
	if !slices.Equal(p.StaleClusters, want) || !slices.Equal(fc.StaleClusters, want) {
		t.Fatalf("stale clusters: page %v, facets %v, want %v", p.StaleClusters, fc.StaleClusters, want)
	}
}

func TestRestoreRejectsBadSnapshots(t *testing.T) {
	s, clk := newTestStore(t)
	buildCluster(t, s, clk, "c1")
	before := s.SnapshotCluster("c1")
	seq := s.LastSeq()
	good := before
	table := WithLabelTable(before)
	withTable := func(fn func(l *LabelTable)) ClusterSnapshot {
		s := table
		l := *table.Labels
		l.Refs, l.Ends = slices.Clone(l.Refs), slices.Clone(l.Ends)
		fn(&l)
		s.Labels = &l
		return s
	}
	cases := map[string]ClusterSnapshot{
		"table of fewer rows": withTable(func(l *LabelTable) { l.Ends = l.Ends[1:] }),
		"label not in table":  withTable(func(l *LabelTable) { l.Refs[0] = uint32(len(l.Pairs)) }),
		"table ends back":     withTable(func(l *LabelTable) { l.Ends[0] = l.Ends[len(l.Ends)-1] }),
		"table key twice": withTable(func(l *LabelTable) {
			l.Pairs = append(l.Pairs, LabelPair{Key: l.Pairs[0].Key})
			l.Refs[2] = uint32(len(l.Pairs) - 1)
		}),
		"string not in table": withTable(func(l *LabelTable) {
			l.Pairs = append(slices.Clone(l.Pairs[1:]), LabelPair{Value: uint32(len(l.Strings))})
		}),
		"labels and table":  {Name: "c1", Rows: good.Rows, Labels: table.Labels},
		"no name":           {},
		"row of another":    {Name: "c1", Rows: []Object{pod("c2", "a", "x", StatusHealthy, nil)}},
		"cluster row other": {Name: "c1", Cluster: &Cluster{Name: "c2"}},
		"kind twice":        {Name: "c1", Kinds: []KindState{{Kind: podKind}, {Kind: podKind}}},
		"kind without name": {Name: "c1", Kinds: []KindState{{Kind: Kind{Group: "x"}}}},
		"row without name":  {Name: "c1", Rows: []Object{{Cluster: "c1", Kind: "Pod"}}},
		"bad policy row": {Name: "c1", Rows: append(append([]Object{}, good.Rows...), Object{
			Cluster: "c1", Group: RBACGroup, Kind: KindRole, Name: "cluster-scoped-role",
		})},
	}
	for name, snap := range cases {
		t.Run(name, func(t *testing.T) {
			if err := s.RestoreCluster(ctxb, snap); !errors.Is(err, ErrInvalidRow) {
				t.Fatalf("err = %v, want ErrInvalidRow", err)
			}
		})
	}
	if s.LastSeq() != seq || !reflect.DeepEqual(s.SnapshotCluster("c1"), before) {
		t.Fatal("a rejected restore changed the index")
	}
}

// TestAtReplaysAnotherIndex replays the writes of one index into another
// at the first one's times: both end with equal rows, UpdatedAt and error
// times included, whatever the second one's clock says.
func TestAtReplaysAnotherIndex(t *testing.T) {
	src, clk := newTestStore(t)
	dst, dclk := newTestStore(t)
	dclk.Advance(24 * time.Hour)
	both := func(fn func(s Sink)) {
		fn(src)
		fn(dst.At(clk.Now()))
	}
	both(func(s Sink) {
		mustNoErr(t, s.Replace(ctxb, "c1", podKind, []Object{pod("c1", "a", "p1", StatusHealthy, nil)}))
	})
	clk.Advance(time.Minute)
	both(func(s Sink) {
		mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", "p2", StatusHealthy, nil)))
		mustNoErr(t, s.UpsertBatch(ctxb, []Object{pod("c1", "a", "p1", StatusUnhealthy, nil)}))
	})
	clk.Advance(time.Minute)
	both(func(s Sink) {
		mustNoErr(t, s.ReportKindError(ctxb, "c1", hrKind, errors.New("forbidden")))
		mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c1", Kind: "Pod", Namespace: "a", Name: "p2"}))
	})
	clk.Advance(time.Minute)
	both(func(s Sink) { // unchanged: keeps the earlier UpdatedAt
		mustNoErr(t, s.Replace(ctxb, "c1", podKind, []Object{pod("c1", "a", "p1", StatusUnhealthy, nil)}))
	})
	want, got := src.SnapshotCluster("c1"), dst.SnapshotCluster("c1")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("replayed index differs:\n got %+v\nwant %+v", got, want)
	}
	if u := got.Rows[0].UpdatedAt; !u.Equal(clk.Now().Add(-2 * time.Minute)) {
		t.Fatalf("p1 UpdatedAt = %v, want the source's time of its last change", u)
	}
	// A zero time is the Store's own clock.
	mustNoErr(t, dst.At(time.Time{}).Upsert(ctxb, pod("c1", "a", "p9", StatusHealthy, nil)))
	if o, _ := dst.Get(Key{Cluster: "c1", Kind: "Pod", Namespace: "a", Name: "p9"}); !o.UpdatedAt.Equal(dclk.Now()) {
		t.Fatalf("At(zero) stamped %v, want the clock's %v", o.UpdatedAt, dclk.Now())
	}
}
