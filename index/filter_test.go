package index

import (
	"context"
	"fmt"
	"testing"
)

// TestIDFilter checks the id lists a plan keeps for its clusters and
// namespaces: off allows any id; on, exactly the ids added, whether the
// list is scanned (short) or binary-searched (long), duplicates and order
// of adding aside.
func TestIDFilter(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []uint32
		in   []uint32
		out  []uint32
	}{
		{"one", []uint32{7}, []uint32{7}, []uint32{0, 6, 8}},
		{"duplicates", []uint32{3, 1, 3, 1}, []uint32{1, 3}, []uint32{0, 2, 4}},
		{"beyond the plan's room", []uint32{9, 2, 5, 7, 1}, []uint32{1, 2, 5, 7, 9}, []uint32{0, 3, 8, 10}},
		{"searched", []uint32{40, 2, 33, 17, 8, 90, 61, 5, 12, 77, 2}, []uint32{2, 5, 8, 12, 17, 33, 40, 61, 77, 90}, []uint32{0, 1, 3, 41, 91}},
		{"none interned", nil, nil, []uint32{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f idFilter
			if !f.any() || !f.has(123) {
				t.Fatal("the zero idFilter does not allow every id")
			}
			for _, id := range tc.add {
				f.add(id)
			}
			f.seal()
			if f.any() {
				t.Fatal("a sealed idFilter allows any id")
			}
			if len(f.ids) != len(tc.in) {
				t.Errorf("ids %v, want each of %v once", f.ids, tc.in)
			}
			for _, id := range tc.in {
				if !f.has(id) {
					t.Errorf("id %d was added but does not pass", id)
				}
			}
			for _, id := range tc.out {
				if f.has(id) {
					t.Errorf("id %d was not added but passes", id)
				}
			}
		})
	}
}

// TestFilterManyValues queries with more clusters and namespaces than a
// plan holds without allocating, and more than it scans, named in no
// order and twice: the page and the total are those of the values' rows,
// each once.
func TestFilterManyValues(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	var rows []Object
	for c := range 12 {
		for n := range 12 {
			rows = append(rows, pod(fmt.Sprintf("c%02d", c), fmt.Sprintf("ns%02d", n), "p", StatusHealthy, nil))
		}
	}
	for i := range 200 { // so that the clusters' and namespaces' lists are the source
		rows = append(rows, pod("other", "ns00", fmt.Sprintf("p%03d", i), StatusHealthy, nil))
	}
	if err := s.UpsertBatch(ctx, rows); err != nil {
		t.Fatal(err)
	}
	var clusters, nss []string
	for _, i := range []int{11, 3, 9, 0, 5, 7, 1, 10, 2, 6, 3, 11} { // 10 distinct, 2 twice
		clusters = append(clusters, fmt.Sprintf("c%02d", i))
		nss = append(nss, fmt.Sprintf("ns%02d", i))
	}
	clusters = append(clusters, "nope")
	p, err := s.Query(ctx, Query{Filter: Filter{Clusters: clusters, Namespaces: nss}, First: 1000, Access: &Access{All: true}})
	if err != nil {
		t.Fatal(err)
	}
	if p.TotalCount != 100 || len(p.Edges) != 100 {
		t.Fatalf("total %d, %d edges; want 100 (10 clusters x 10 namespaces)", p.TotalCount, len(p.Edges))
	}
	seen := map[Key]bool{}
	for _, e := range p.Edges {
		k := e.Object.Key()
		if seen[k] {
			t.Errorf("%v twice", k)
		}
		seen[k] = true
	}
}
