package index

import (
	"fmt"
	"maps"
	"reflect"
	"testing"
)

// TestPageLabelsShared checks that pages hand out one Labels map per label
// set: a row read by two pages, and two rows with equal labels, share it;
// a single Get builds its own.
func TestPageLabelsShared(t *testing.T) {
	s, _ := newTestStore(t)
	labels := map[string]string{"app": "web", "tier": "front"}
	for _, name := range []string{"a", "b"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", name, StatusHealthy, labels)))
	}
	q := Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}}
	p1, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	p2, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	if len(p1.Edges) != 2 || len(p2.Edges) != 2 {
		t.Fatalf("pages of %d and %d edges, want 2", len(p1.Edges), len(p2.Edges))
	}
	mapID := func(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }
	first := mapID(p1.Edges[0].Object.Labels)
	for _, e := range append(p1.Edges, p2.Edges...) {
		if !maps.Equal(e.Object.Labels, labels) {
			t.Errorf("%s: labels %v, want %v", e.Object.Name, e.Object.Labels, labels)
		}
		if mapID(e.Object.Labels) != first {
			t.Errorf("%s: a Labels map of its own, want the page's shared one", e.Object.Name)
		}
	}
	o, ok := s.Get(p1.Edges[0].Object.Key())
	if !ok || !maps.Equal(o.Labels, labels) || mapID(o.Labels) == first {
		t.Errorf("Get: labels %v (shared %v), want %v in a map of its own", o.Labels, mapID(o.Labels) == first, labels)
	}
}

// TestPageLabelsAfterPairReuse churns rows whose labels are their own, so
// that label pair ids are reclaimed and reused for other pairs, reading a
// page after every write: each page shows every row's labels as written,
// never a map kept for the pair ids' earlier meaning.
func TestPageLabelsAfterPairReuse(t *testing.T) {
	const (
		live  = 4
		churn = 400
	)
	s, _ := newTestStore(t, WithReplayBuffer(8))
	row := func(i int) Object {
		return pod("c0", "ns0", fmt.Sprintf("p-%04d", i), StatusHealthy,
			map[string]string{"app": fmt.Sprintf("v-%d", i), fmt.Sprintf("k-%d", i): "x", "tier": "web"})
	}
	q := Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}}
	for i := range churn {
		mustNoErr(t, s.Upsert(ctxb, row(i)))
		if i >= live {
			old := row(i - live)
			mustNoErr(t, s.Delete(ctxb, old.Key()))
		}
		page, err := s.Query(ctxb, q)
		mustNoErr(t, err)
		for _, e := range page.Edges {
			var n int
			if _, err := fmt.Sscanf(e.Object.Name, "p-%d", &n); err != nil {
				t.Fatal(err)
			}
			if want := row(n).Labels; !maps.Equal(e.Object.Labels, want) {
				t.Fatalf("after write %d: %s has labels %v, want %v", i, e.Object.Name, e.Object.Labels, want)
			}
		}
	}
	if n := s.x.labels.pairs.len(); n > churn {
		t.Fatalf("label pair id space %d after %d rows of 2 own pairs: the test needs ids reused", n, churn)
	}
}

// TestPageLabelsKeptAcrossReclaim churns the labels of a row no page
// read, so that commits reclaim pair ids nobody paged: the maps pages
// share survive them.
func TestPageLabelsKeptAcrossReclaim(t *testing.T) {
	const churn = 64
	s, _ := newTestStore(t, WithReplayBuffer(8))
	mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", "a", StatusHealthy, map[string]string{"app": "web"})))
	q := Query{Filter: Filter{Namespaces: []string{"ns0"}}, Access: &Access{All: true}}
	p1, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	for i := range churn {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns1", "b", StatusHealthy, map[string]string{"rev": fmt.Sprint(i)})))
	}
	if n := s.x.labels.pairs.len(); n >= churn {
		t.Fatalf("label pair id space %d after %d values: the test needs ids reclaimed", n, churn)
	}
	p2, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	mapID := func(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }
	if len(p1.Edges) != 1 || len(p2.Edges) != 1 || mapID(p1.Edges[0].Object.Labels) != mapID(p2.Edges[0].Object.Labels) {
		t.Fatalf("the page's Labels map was built again after commits that reclaimed only pairs no page read")
	}
}
