package index

import (
	"errors"
	"slices"
	"testing"
)

// TestApplySnapshot: several kinds in one commit; an invalid row anywhere
// changes nothing; retire removes the kinds a full snapshot does not list,
// and keeps those it lists with an error.
func TestApplySnapshot(t *testing.T) {
	s, _ := newTestStore(t)
	svcKind := Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
	cmKind := Kind{Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}
	svc := func(name string) Object {
		return Object{Cluster: "c1", Namespace: "ns", Version: "v1", Kind: "Service", Resource: "services", Name: name, Status: StatusHealthy}
	}
	cm := func(name string) Object {
		return Object{Cluster: "c1", Namespace: "ns", Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Name: name, Status: StatusHealthy}
	}
	names := func() []string {
		p, err := s.Query(ctxb, Query{Access: &Access{All: true}, First: MaxPageSize})
		mustNoErr(t, err)
		var out []string
		for _, e := range p.Edges {
			out = append(out, e.Object.Kind+"/"+e.Object.Name)
		}
		slices.Sort(out)
		return out
	}
	kindNames := func() []string {
		var out []string
		for _, k := range s.Kinds("c1") {
			out = append(out, k.Kind)
		}
		return out
	}

	mustNoErr(t, s.ApplySnapshot(ctxb, "c1", []KindSnapshot{
		{Kind: podKind, Synced: true, Rows: []Object{pod("c1", "ns", "a", StatusHealthy, nil)}},
		{Kind: svcKind, Synced: true, Rows: []Object{svc("s")}},
		{Kind: cmKind, Synced: true, Rows: []Object{cm("m")}},
	}, true))
	seq := s.LastSeq()
	if got := names(); !slices.Equal(got, []string{"ConfigMap/m", "Pod/a", "Service/s"}) {
		t.Fatalf("after the first snapshot: %v", got)
	}

	// One bad row in the last kind: nothing of the snapshot is applied.
	bad := svc("t")
	bad.Cluster = "c2"
	err := s.ApplySnapshot(ctxb, "c1", []KindSnapshot{
		{Kind: podKind, Synced: true, Rows: []Object{pod("c1", "ns", "b", StatusHealthy, nil)}},
		{Kind: svcKind, Synced: true, Rows: []Object{bad}},
	}, true)
	if !errors.Is(err, ErrInvalidRow) {
		t.Fatalf("a row of another cluster: %v", err)
	}
	if s.LastSeq() != seq || !slices.Equal(names(), []string{"ConfigMap/m", "Pod/a", "Service/s"}) {
		t.Fatalf("a refused snapshot changed the index: %v (seq %d -> %d)", names(), seq, s.LastSeq())
	}

	// A full snapshot that lists Pods (new rows) and Services (failing)
	// but not ConfigMaps: ConfigMaps retire, Services keep their rows.
	mustNoErr(t, s.ApplySnapshot(ctxb, "c1", []KindSnapshot{
		{Kind: podKind, Synced: true, Rows: []Object{pod("c1", "ns", "b", StatusHealthy, nil)}},
		{Kind: svcKind, Err: "services is forbidden"},
	}, true))
	if got := names(); !slices.Equal(got, []string{"Pod/b", "Service/s"}) {
		t.Errorf("after the retiring snapshot: %v", got)
	}
	if got := kindNames(); !slices.Equal(got, []string{"Pod", "Service"}) {
		t.Errorf("kinds after the retiring snapshot: %v", got)
	}
	if ke := s.KindErrors(nil, "c1"); len(ke) != 1 || ke[0].Kind.Kind != "Service" {
		t.Errorf("kind errors: %+v", ke)
	}
	evs := drain(t, s, seq)
	commits := map[uint64]bool{}
	for _, e := range evs {
		commits[e.Seq-uint64(e.pos)] = true // the first Seq of the event's commit
	}
	if len(commits) != 1 {
		t.Errorf("the snapshot took %d commits; want 1 (events %v)", len(commits), types(evs))
	}
}
