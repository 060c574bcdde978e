package index_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// TestQueryNoTotal pages through queries of each planner path (an exact
// kind and status source, a name-order walk, a label source, a numeric
// order, a restricted viewer) twice, with and without NoTotal: the pages
// must be the same, edge by edge and cursor by cursor, and only the
// counted walk may carry TotalCount and StaleClusters.
func TestQueryNoTotal(t *testing.T) {
	s, queries := plannerQueries(t)
	for i, q := range queries {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			counted, alone, total := pagesTwice(t, s, q, func(q *index.Query) { q.NoTotal = true })
			if total == 0 {
				t.Fatalf("the query matches nothing")
			}
			for n := range counted {
				want, got := counted[n], alone[n]
				if want.TotalCount != total {
					t.Fatalf("page %d: total %d, want %d", n, want.TotalCount, total)
				}
				if got.TotalCount != 0 || got.StaleClusters != nil {
					t.Fatalf("page %d with NoTotal: total %d, stale clusters %v", n, got.TotalCount, got.StaleClusters)
				}
				if want.StaleClusters == nil {
					t.Fatalf("page %d: nil StaleClusters without NoTotal", n)
				}
				if got.HasNextPage != want.HasNextPage || len(got.Edges) != len(want.Edges) {
					t.Fatalf("page %d with NoTotal: %d edges, hasNextPage %v; want %d, %v", n, len(got.Edges), got.HasNextPage, len(want.Edges), want.HasNextPage)
				}
				for e := range want.Edges {
					g, w := got.Edges[e], want.Edges[e]
					if g.Object.Key() != w.Object.Key() || g.Cursor != w.Cursor || g.Stale != w.Stale {
						t.Fatalf("page %d edge %d with NoTotal: %s %q stale %v; want %s %q stale %v", n, e, g.Object.Key(), g.Cursor, g.Stale, w.Object.Key(), w.Cursor, w.Stale)
					}
				}
			}
		})
	}
}

// plannerQueries returns a store of a small fleet with a stale cluster,
// and queries of each planner path over it.
func plannerQueries(t *testing.T) (*index.Store, []index.Query) {
	f := indextest.Fleet{Clusters: 3, Namespaces: 40, PerNamespace: 10, Seed: 1}
	s := fleetStore(f)
	stale := indextest.ClusterName(1)
	if err := s.UpsertCluster(context.Background(), index.Cluster{Name: stale, State: index.StateDisconnected}); err != nil {
		t.Fatal(err)
	}
	admin := &index.Access{All: true}
	viewer := f.NamespaceAccess(2, 10)
	return s, []index.Query{
		{Filter: index.Filter{Kinds: []string{"Pod"}}, Access: admin},
		{Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}}, Access: admin},
		{Filter: index.Filter{LabelSelector: "app=v0"}, Access: admin},
		{Filter: index.Filter{Clusters: []string{stale}}, Order: index.Order{Field: index.OrderCreatedAt, Desc: true}, Access: admin},
		{Filter: index.Filter{Kinds: []string{"Pod"}}, Access: viewer},
		{Access: viewer},
	}
}

// TestQueryNoEdgeCursors pages through the queries of TestQueryNoTotal with
// and without NoEdgeCursors, following the last edge's cursor: the pages
// must be the same, edge by edge, but for the cursors of the edges between
// the first and the last, which NoEdgeCursors leaves empty.
func TestQueryNoEdgeCursors(t *testing.T) {
	s, queries := plannerQueries(t)
	blanked := 0
	for i, q := range queries {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			all, ends, _ := pagesTwice(t, s, q, func(q *index.Query) { q.NoEdgeCursors = true })
			for n := range all {
				want, got := all[n], ends[n]
				if got.HasNextPage != want.HasNextPage || got.TotalCount != want.TotalCount || len(got.Edges) != len(want.Edges) {
					t.Fatalf("page %d with NoEdgeCursors: %d edges, hasNextPage %v, total %d; want %d, %v, %d",
						n, len(got.Edges), got.HasNextPage, got.TotalCount, len(want.Edges), want.HasNextPage, want.TotalCount)
				}
				for e := range want.Edges {
					g, w := got.Edges[e], want.Edges[e]
					wantCursor := w.Cursor
					if e != 0 && e != len(want.Edges)-1 {
						wantCursor = ""
						blanked++
					}
					if g.Object.Key() != w.Object.Key() || g.Cursor != wantCursor || g.Stale != w.Stale || w.Cursor == "" {
						t.Fatalf("page %d edge %d with NoEdgeCursors: %s %q stale %v; want %s %q stale %v",
							n, e, g.Object.Key(), g.Cursor, g.Stale, w.Object.Key(), wantCursor, w.Stale)
					}
				}
			}
		})
	}
	if blanked == 0 {
		t.Fatal("no page had an edge between its first and last")
	}
}

// pagesTwice pages through q in pages of 7, as it is and then as set
// changes it, and returns both walks' pages (as many in each) and the
// number of rows.
func pagesTwice(t *testing.T, s *index.Store, q index.Query, set func(*index.Query)) (before, after []*index.Page, rows int) {
	t.Helper()
	q.First = 7
	before, rows = walkPages(t, s, q)
	set(&q)
	after, _ = walkPages(t, s, q)
	if len(after) != len(before) {
		t.Fatalf("%d pages, want %d", len(after), len(before))
	}
	return before, after, rows
}

// walkPages returns every page of q from the start, and the number of
// rows they hold.
func walkPages(t *testing.T, s *index.Store, q index.Query) ([]*index.Page, int) {
	t.Helper()
	var pages []*index.Page
	rows := 0
	for {
		p, err := s.Query(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, p)
		rows += len(p.Edges)
		if !p.HasNextPage {
			return pages, rows
		}
		q.After = p.Edges[len(p.Edges)-1].Cursor
	}
}
