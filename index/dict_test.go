package index

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestDictionariesReclaimChurnedStrings churns many distinct label keys,
// label values and namespaces through rows that are created and deleted,
// as an edge sending fresh values would: the dictionaries, their id
// spaces included, stay bounded by the live rows plus what the change
// feed still holds, and the live rows read back as written.
func TestDictionariesReclaimChurnedStrings(t *testing.T) {
	const (
		live   = 10   // rows alive at any time
		churn  = 3000 // rows created, and all but the last live deleted
		replay = 32   // change events the feed keeps
	)
	s, _ := newTestStore(t, WithReplayBuffer(replay))
	row := func(i int) Object {
		return pod("c0", fmt.Sprintf("ns-%d", i), fmt.Sprintf("p-%d", i), StatusHealthy,
			map[string]string{"app": fmt.Sprintf("v-%d", i), fmt.Sprintf("k-%d", i): "x", "tier": "web"})
	}
	for i := range churn {
		mustNoErr(t, s.Upsert(ctxb, row(i)))
		if i >= live {
			old := row(i - live)
			mustNoErr(t, s.Delete(ctxb, old.Key()))
		}
	}
	// Every row holds 3 pairs, 2 keys and values of its own, 1 namespace;
	// the feed holds the events of replay/2 rows, whose strings wait.
	bound := func(perRow int) int { return perRow*(live+replay) + 2 }
	x := s.x
	for _, d := range []struct {
		name      string
		held, ids int
		perRow    int
	}{
		{"namespaces", x.namespaces.held(), x.namespaces.len(), 1},
		{"label keys", x.labels.keys.held(), x.labels.keys.len(), 1},
		{"label values", x.labels.values.held(), x.labels.values.len(), 1},
		{"label pairs", x.labels.held(), x.labels.pairs.len(), 2},
	} {
		if d.held > bound(d.perRow) || d.ids > bound(d.perRow) {
			t.Errorf("%s: %d held, id space %d, after %d rows churned with %d live; want at most %d",
				d.name, d.held, d.ids, churn, live, bound(d.perRow))
		}
	}
	st := s.DictionaryStats()
	if st.LabelValues != x.labels.values.held() || st.Namespaces != x.namespaces.held() {
		t.Errorf("DictionaryStats %+v disagrees with the dictionaries", st)
	}
	// The live rows read back and are found by their labels and
	// namespaces; nothing else is.
	for i := churn - live; i < churn; i++ {
		want := row(i)
		got, ok := s.Get(want.Key())
		if !ok || got.Namespace != want.Namespace || got.Labels.Len() != 3 ||
			got.Labels.Get("app") != want.Labels.Get("app") || got.Labels.Get(fmt.Sprintf("k-%d", i)) != "x" {
			t.Fatalf("row %d reads %+v, want the labels %v", i, got, want.Labels)
		}
		for _, f := range []Filter{
			{LabelSelector: "app=" + want.Labels.Get("app")},
			{LabelSelector: fmt.Sprintf("k-%d", i)},
			{Namespaces: []string{want.Namespace}},
		} {
			page, err := s.Query(ctxb, Query{Filter: f, Access: &Access{All: true}, First: 10})
			mustNoErr(t, err)
			if len(page.Edges) != 1 || page.Edges[0].Object.Name != want.Name {
				t.Fatalf("%+v found %d rows, want %s", f, len(page.Edges), want.Name)
			}
		}
	}
	page, err := s.Query(ctxb, Query{Filter: Filter{LabelSelector: "tier=web"}, Access: &Access{All: true}, First: 100})
	mustNoErr(t, err)
	if page.TotalCount != live {
		t.Errorf("tier=web matches %d rows, want %d", page.TotalCount, live)
	}
	f, err := s.Facets(ctxb, Filter{}, &Access{All: true})
	mustNoErr(t, err)
	if len(f.Namespaces) != live {
		t.Errorf("namespace facet %+v, want the %d live namespaces", f.Namespaces, live)
	}
}

// TestReclaimedIDsKeepDeliveredEvents checks that events a subscription
// delivered read as written after the feed dropped them and their ids
// were reused for other strings.
func TestReclaimedIDsKeepDeliveredEvents(t *testing.T) {
	const replay = 8
	s, _ := newTestStore(t, WithReplayBuffer(replay))
	sub, err := s.Subscribe(s.LastSeq())
	mustNoErr(t, err)
	defer sub.Close()
	write := func(gen int) {
		for i := range 4 {
			mustNoErr(t, s.Upsert(ctxb, pod("c0", fmt.Sprintf("ns-%d-%d", gen, i), "p", StatusHealthy,
				map[string]string{"app": fmt.Sprintf("v-%d-%d", gen, i)})))
		}
		for i := range 4 {
			mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c0", Kind: "Pod", Namespace: fmt.Sprintf("ns-%d-%d", gen, i), Name: "p"}))
		}
	}
	write(0)
	evs, err := sub.Next(ctxb, make([]*Event, 0, 64))
	mustNoErr(t, err)
	if len(evs) != 8 {
		t.Fatalf("got %d events, want 8", len(evs))
	}
	// Enough churn for the feed to drop the events above, and their ids
	// to be reclaimed and reused.
	for gen := 1; gen < 6; gen++ {
		write(gen)
	}
	if n := s.x.labels.values.len(); n > 2*replay {
		t.Fatalf("label values id space %d: the test needs ids reused", n)
	}
	for i, ev := range evs {
		o := ev.Object()
		if want := fmt.Sprintf("ns-0-%d", i%4); o.Namespace != want || o.Labels.Get("app") != fmt.Sprintf("v-0-%d", i%4) {
			t.Errorf("event %d (%s) reads %s %v, want %s app=v-0-%d", i, ev.Type, o.Namespace, o.Labels, want, i%4)
		}
	}
}

// TestPausedReadKeepsItsIDs checks that a long read that paused keeps the
// dictionary ids it looked up: a label pair whose rows were deleted during
// the pause is not reused for another pair until the read ends, so the
// read's selector still means what it said.
func TestPausedReadKeepsItsIDs(t *testing.T) {
	s, _ := newTestStore(t, WithReplayBuffer(4))
	var rows []Object
	for i := range 3 * scanChunk {
		rows = append(rows, pod("c0", "ns0", fmt.Sprintf("p-%05d", i), StatusHealthy, map[string]string{"app": "a"}))
	}
	for i := range 5 {
		rows = append(rows, pod("c0", "ns0", fmt.Sprintf("gone-%d", i), StatusHealthy, map[string]string{"app": "a", "tag": "gone"}))
	}
	mustNoErr(t, s.Replace(ctxb, "c0", podKind, rows))
	writerWaits(t, s)
	pauses := 0
	s.pauseHook = func() {
		if pauses++; pauses != 1 {
			return
		}
		// tag=gone loses its rows, the feed moves far past that, and
		// the rows of the last chunk get a new pair.
		for i := range 5 {
			mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c0", Kind: "Pod", Namespace: "ns0", Name: fmt.Sprintf("gone-%d", i)}))
		}
		for i := range 10 {
			mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns1", fmt.Sprintf("filler-%d", i), StatusHealthy, nil)))
		}
		for i := 2 * scanChunk; i < 3*scanChunk; i++ {
			mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", fmt.Sprintf("p-%05d", i), StatusHealthy, map[string]string{"app": "a", "tag": "new"})))
		}
	}
	page, err := s.Query(ctxb, Query{Filter: Filter{LabelSelector: "app=a,tag!=gone"}, Access: &Access{All: true}, First: 1})
	mustNoErr(t, err)
	if pauses < 2 {
		t.Fatalf("the read paused %d times; want several", pauses)
	}
	if want := 3 * scanChunk; page.TotalCount != want {
		t.Errorf("app=a,tag!=gone counted %d rows, want %d: tag=new rows were taken for tag=gone", page.TotalCount, want)
	}
	// Once the read is over the ids are reused.
	for i := range 10 {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns1", fmt.Sprintf("filler-%d", i), StatusUnhealthy, nil)))
	}
	if len(s.x.labels.rc.free) == 0 {
		t.Errorf("no pair id was reclaimed after the read ended")
	}
}

// TestKindsReclaimed churns kinds as an edge listing new kinds in every
// full snapshot would: each round replaces a cluster's kinds with fresh
// ones. The kind dictionary and its id spaces (kid, seq) stay bounded by
// the live kinds, and a viewer who may list only one resource sees
// exactly its rows, however its kind's seq and kid came to be reused, in
// queries and facets alike.
func TestKindsReclaimed(t *testing.T) {
	const rounds, perRound = 200, 4
	s, _ := newTestStore(t)
	kept := Kind{Group: "example.com", Version: "v1", Kind: "Kept", Resource: "kepts", Namespaced: true}
	keptGR := GroupResource{Group: kept.Group, Resource: kept.Resource}
	row := func(k Kind, name string) Object {
		return Object{Cluster: "c0", Namespace: "ns", Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource, Name: name, Status: StatusHealthy}
	}
	// Namespace grants are checked by kind seq (accessIDs).
	viewer := &Access{Clusters: map[string]*ClusterAccess{"c0": {Namespaces: map[string]*Resources{"ns": NewResources(keptGR)}}}}
	check := func(when string) {
		t.Helper()
		page, err := s.Query(ctxb, Query{Access: viewer, First: 10})
		mustNoErr(t, err)
		if page.TotalCount != 1 || page.Edges[0].Object.Kind != "Kept" {
			t.Fatalf("%s: the viewer of kepts sees %d rows (%+v)", when, page.TotalCount, page.Edges)
		}
		f, err := s.Facets(ctxb, Filter{}, viewer)
		mustNoErr(t, err)
		if f.Total != 1 || len(f.Kinds) != 1 || f.Kinds[0].Value != "Kept.example.com" {
			t.Fatalf("%s: the viewer's facets %+v", when, f)
		}
	}
	var prev []Kind
	for r := range rounds {
		if r == rounds/2 {
			mustNoErr(t, s.Replace(ctxb, "c0", kept, []Object{row(kept, "k")}))
			check("after the kept kind came")
		}
		var cur []Kind
		for i := range perRound {
			k := Kind{Group: "example.com", Version: "v1", Kind: fmt.Sprintf("K%dx%d", r, i), Resource: fmt.Sprintf("k%dx%ds", r, i), Namespaced: true}
			cur = append(cur, k)
			mustNoErr(t, s.Replace(ctxb, "c0", k, []Object{row(k, "a"), row(k, "b")}))
		}
		for _, k := range prev {
			mustNoErr(t, s.Replace(ctxb, "c0", k, nil))
		}
		prev = cur
		if r > rounds/2 {
			check(fmt.Sprintf("round %d", r))
		}
	}
	x := s.x
	// The live kinds, the last round's being replaced, and slack.
	const bound = 3*perRound + 2
	if n := x.kinds.held(); n > bound {
		t.Errorf("%d kinds held after %d rounds of %d fresh kinds; want at most %d", n, rounds, perRound, bound)
	}
	if n, m := len(x.kinds.byKid), int(x.kinds.nextSeq); n > bound || m > bound {
		t.Errorf("kid space %d, seq space %d; want at most %d", n, m, bound)
	}
	if st := s.DictionaryStats(); st.Kinds != x.kinds.held() {
		t.Errorf("DictionaryStats %+v", st)
	}
	// The viewer's kind goes and its seq and kid are reused by new kinds:
	// the access set she resolved before must not let her see them.
	mustNoErr(t, s.Replace(ctxb, "c0", kept, nil))
	for i := range perRound {
		k := Kind{Group: "example.com", Version: "v1", Kind: fmt.Sprintf("Late%d", i), Resource: fmt.Sprintf("late%ds", i), Namespaced: true}
		mustNoErr(t, s.Replace(ctxb, "c0", k, []Object{row(k, "a")}))
	}
	page, err := s.Query(ctxb, Query{Access: viewer, First: 10})
	mustNoErr(t, err)
	f, err := s.Facets(ctxb, Filter{}, viewer)
	mustNoErr(t, err)
	if page.TotalCount != 0 || f.Total != 0 {
		t.Errorf("with no kepts left the viewer of kepts sees %d rows (%+v), facets %+v", page.TotalCount, page.Edges, f)
	}
	// The last round's kinds are listed, each with its rows.
	for _, k := range prev {
		page, err := s.Query(ctxb, Query{Filter: Filter{Kinds: []string{k.Kind}}, Access: &Access{All: true}, First: 10})
		mustNoErr(t, err)
		if page.TotalCount != 2 {
			t.Errorf("kind %s has %d rows, want 2", k.Kind, page.TotalCount)
		}
	}
}

// TestLabelPairsAcrossPages writes rows with more distinct label pairs than
// a page of the pair table holds, and reads every row's labels back and
// every pair's list of rows: a pair id must name its own ids and its own
// list (pairTable keeps them in two tables) on every page.
func TestLabelPairsAcrossPages(t *testing.T) {
	s, _ := newTestStore(t)
	const rows = 1<<pairPageBits + 500 // two labels of their own each: over 2 pages of pairs
	want := make([]Object, rows)
	for i := range want {
		want[i] = pod("c0", "ns", fmt.Sprintf("p-%d", i), StatusHealthy,
			map[string]string{"app": fmt.Sprintf("a-%d", i), fmt.Sprintf("k-%d", i): fmt.Sprintf("v-%d", i), "tier": "web"})
	}
	mustNoErr(t, s.UpsertBatch(ctxb, want))
	if n := s.x.labels.pairs.len(); n < 2*rows {
		t.Fatalf("%d pairs, want at least %d", n, 2*rows)
	}
	for _, w := range want {
		got, ok := s.Get(w.Key())
		if !ok {
			t.Fatalf("%s: not found", w.Key())
		}
		if fmt.Sprint(got.Labels) != fmt.Sprint(w.Labels) {
			t.Fatalf("%s: labels %v, want %v", w.Key(), got.Labels, w.Labels)
		}
	}
	for i, w := range want {
		pid, ok := s.x.labels.lookup(fmt.Sprintf("k-%d", i), fmt.Sprintf("v-%d", i))
		if !ok {
			t.Fatalf("row %d: its own pair is not interned", i)
		}
		k := w.Key()
		if l := s.x.labels.pairs.rows(pid); l.len() != 1 || !l.has(s.x.lookup(&k).rid) {
			t.Fatalf("row %d: the list of its own pair %d has %d rows, not just it", i, pid, l.len())
		}
	}
}

// TestMarkKinds checks the kinds filter's lookup by name (kindDict.byName
// and unfolded) against comparing every kind, as the filter is defined:
// the kind or its resource, case-insensitively (Unicode folding, so the
// Kelvin sign is a K), optionally qualified by the group; before and after
// kinds are unmapped.
func TestMarkKinds(t *testing.T) {
	d := newKindDict()
	kinds := []Kind{
		{Version: "v1", Kind: "Pod", Resource: "pods"},
		{Version: "v1beta1", Kind: "Pod", Resource: "pods"},
		{Group: "example.io", Version: "v1", Kind: "Pod", Resource: "pods"},
		{Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments"},
		{Group: "x.io", Version: "v1", Kind: "Thing", Resource: "thing"},
		{Group: "x.io", Version: "v1", Kind: "\u212Aube", Resource: "kubes"}, // Kelvin sign
		{Group: "y.io", Version: "v1", Kind: "Kube", Resource: "kubes"},
		{Group: "z.io", Version: "v1", Kind: "Straße", Resource: "strassen"},
	}
	infos := make([]*kindInfo, len(kinds))
	for i, k := range kinds {
		infos[i] = d.intern(k)
		d.ref(infos[i])
	}
	terms := []string{
		"Pod", "pod", "PODS", "pods.example.io", "Pod.", "Pod.apps", "deployment", "Deployments.apps",
		"thing", "THING.x.io", "kube", "KUBES", "\u212Aube", "kube.x.io", "straße", "STRASSE", "strassen",
		"\u017Ftrassen", "", "nothing",
	}
	check := func(when string) {
		t.Helper()
		for _, term := range terms {
			got := make([]bool, len(d.byKid))
			gotAny := d.markKinds(term, got)
			want := make([]bool, len(d.byKid))
			wantAny := false
			name, group, qualified := strings.Cut(term, ".")
			for _, ki := range d.infos {
				if (!qualified || ki.Group == group) && (strings.EqualFold(ki.Kind.Kind, name) || strings.EqualFold(ki.Resource, name)) {
					want[ki.kid], wantAny = true, true
				}
			}
			if !slices.Equal(got, want) || gotAny != wantAny {
				t.Errorf("%s: markKinds(%q) = %v %v, want %v %v", when, term, got, gotAny, want, wantAny)
			}
		}
	}
	check("interned")
	for _, i := range []int{0, 4, 5} { // a version of Pod, Thing and the Kelvin Kube go
		d.unref(infos[i])
	}
	d.recycle(1, 0, func(uint32) {})
	if len(d.infos) != len(kinds)-3 {
		t.Fatalf("%d kinds after recycle, want %d", len(d.infos), len(kinds)-3)
	}
	check("after recycle")
}
