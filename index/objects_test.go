package index

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// drain reads every event currently published after seq.
func drain(t *testing.T, s *Store, after uint64) []*Event {
	t.Helper()
	sub, err := s.Subscribe(after)
	mustNoErr(t, err)
	defer sub.Close()
	var out []*Event
	for sub.Position() < s.LastSeq() {
		ctx, cancel := context.WithTimeout(ctxb, time.Second)
		out, err = sub.Next(ctx, out)
		cancel()
		mustNoErr(t, err)
	}
	return out
}

func types(evs []*Event) []string {
	var out []string
	for _, e := range evs {
		s := e.Type.String()
		if o := e.Object(); o != nil {
			s += " " + o.Name
		}
		out = append(out, s)
	}
	return out
}

func TestReplaceChangeDetection(t *testing.T) {
	s, clk := newTestStore(t)
	rows := []Object{
		pod("c1", "ns", "a", StatusHealthy, map[string]string{"app": "x"}),
		pod("c1", "ns", "b", StatusHealthy, nil),
		pod("c1", "ns", "c", StatusHealthy, nil),
	}
	mustNoErr(t, s.Replace(ctxb, "c1", podKind, rows))
	if got := types(drain(t, s, 0)); len(got) != 4 { // 3 ADDED + POLICY (kinds set changed)
		t.Fatalf("first Replace events = %v", got)
	}
	t0 := clk.Now()
	seq := s.LastSeq()
	clk.Advance(time.Minute)

	// Same content, new resource versions: nothing happens.
	same := append([]Object(nil), rows...)
	for i := range same {
		same[i].ResourceVersion = "99"
		same[i].UpdatedAt = clk.Now()
	}
	mustNoErr(t, s.Replace(ctxb, "c1", podKind, same))
	if s.LastSeq() != seq {
		t.Fatalf("unchanged Replace published events: %v", types(drain(t, s, seq)))
	}
	o, _ := s.Get(rows[0].Key())
	if !o.UpdatedAt.Equal(t0) {
		t.Errorf("unchanged row UpdatedAt = %v, want %v", o.UpdatedAt, t0)
	}

	// a changes (label), b is gone, c is unchanged, d is new.
	next := []Object{
		pod("c1", "ns", "a", StatusHealthy, map[string]string{"app": "y"}),
		rows[2],
		pod("c1", "ns", "d", StatusUnhealthy, nil),
	}
	mustNoErr(t, s.Replace(ctxb, "c1", podKind, next))
	got := types(drain(t, s, seq))
	want := []string{"MODIFIED a", "ADDED d", "DELETED b"}
	if len(got) != len(want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %s, want %s", i, got[i], want[i])
		}
	}
	a, _ := s.Get(rows[0].Key())
	if !a.UpdatedAt.Equal(clk.Now()) || a.Labels.Get("app") != "y" {
		t.Errorf("changed row = %+v", a)
	}
	c, _ := s.Get(rows[2].Key())
	if !c.UpdatedAt.Equal(t0) {
		t.Errorf("unchanged row c UpdatedAt changed")
	}
	if _, ok := s.Get(rows[1].Key()); ok {
		t.Error("b still stored")
	}
}

func TestReplaceRejectsForeignRows(t *testing.T) {
	s, _ := newTestStore(t)
	tests := []struct {
		name string
		row  Object
	}{
		{"other cluster", pod("c2", "ns", "a", StatusHealthy, nil)},
		{"no name", pod("c1", "ns", "", StatusHealthy, nil)},
		{"nul", pod("c1", "n\x00s", "a", StatusHealthy, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Replace(ctxb, "c1", podKind, []Object{tt.row})
			if !errors.Is(err, ErrInvalidRow) {
				t.Fatalf("err = %v, want ErrInvalidRow", err)
			}
		})
	}
	if s.LastSeq() != 0 {
		t.Error("a failed Replace published events")
	}
}

func TestUpsertDelete(t *testing.T) {
	s, _ := newTestStore(t)
	p := pod("c1", "ns", "a", StatusHealthy, nil)
	mustNoErr(t, s.Upsert(ctxb, p))
	mustNoErr(t, s.Upsert(ctxb, p)) // unchanged: no event
	p.Status = StatusUnhealthy
	mustNoErr(t, s.Upsert(ctxb, p))
	mustNoErr(t, s.Delete(ctxb, p.Key()))
	mustNoErr(t, s.Delete(ctxb, p.Key())) // missing: fine
	got := types(drain(t, s, 0))
	want := []string{"ADDED a", "MODIFIED a", "DELETED a"}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("events = %v, want %v", got, want)
	}
	evs := drain(t, s, 0)
	if prev := evs[1].Previous(); prev == nil || prev.Status != StatusHealthy {
		t.Errorf("Previous = %+v", prev)
	}
	if evs[2].Object().Status != StatusUnhealthy {
		t.Error("DELETED event does not carry the last state")
	}
}

func TestGetWatchFires(t *testing.T) {
	s, _ := newTestStore(t)
	p := pod("c1", "ns", "a", StatusHealthy, nil)
	mustNoErr(t, s.Upsert(ctxb, p))
	ws := NewWatch()
	if _, ok := s.GetWatch(ws, p.Key()); !ok {
		t.Fatal("not found")
	}
	if fired := watchFired(t, ws); fired {
		t.Fatal("watch fired without a change")
	}
	mustNoErr(t, s.Upsert(ctxb, p)) // unchanged
	if watchFired(t, ws) {
		t.Fatal("watch fired on an unchanged upsert")
	}
	p.Status = StatusUnhealthy
	mustNoErr(t, s.Upsert(ctxb, p))
	if !watchFired(t, ws) {
		t.Fatal("watch did not fire")
	}
}

// TestKindRemappedBetweenSyncs is a cluster whose discovery names a kind's
// resource differently from one sync to the next: each Replace moves the
// kind's rows to the new resource, and the next one still finds and drops
// the rows it no longer lists (it used to panic on a row left under the old
// resource's kind id, and counts kept the old resource).
func TestKindRemappedBetweenSyncs(t *testing.T) {
	s, _ := newTestStore(t)
	v2 := flux
	v2.Resource = "kustomizations-v2"
	rows := func(kind Kind, n int) []Object {
		var out []Object
		for i := range n {
			out = append(out, Object{
				Cluster: "c", Namespace: "ns", Group: kind.Group, Version: kind.Version, Kind: kind.Kind,
				Resource: kind.Resource, Name: fmt.Sprint("k", i), UID: fmt.Sprint("u", i), Status: StatusHealthy,
			})
		}
		return out
	}
	mustNoErr(t, s.Replace(ctxb, "c", flux, rows(flux, 5)))
	mustNoErr(t, s.Replace(ctxb, "c", v2, rows(v2, 5)))
	mustNoErr(t, s.Replace(ctxb, "c", flux, rows(flux, 3)))
	// Counts and facets follow the resource the rows now have.
	listAll := func(gr GroupResource) *Access {
		return &Access{Clusters: map[string]*ClusterAccess{"c": {Everywhere: NewResources(gr)}}}
	}
	checkFacets(t, s, Filter{}, listAll(fluxGR), rows(flux, 3))
	checkFacets(t, s, Filter{}, listAll(GroupResource{Group: flux.Group, Resource: v2.Resource}), nil)
	if _, ok := s.Get(rows(flux, 5)[4].Key()); ok {
		t.Fatalf("a row the last Replace did not list is still stored")
	}
}
