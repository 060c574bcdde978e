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
	f := indextest.Fleet{Clusters: 3, Namespaces: 40, PerNamespace: 10, Seed: 1}
	s := fleetStore(f)
	stale := indextest.ClusterName(1)
	if err := s.UpsertCluster(context.Background(), index.Cluster{Name: stale, State: index.StateDisconnected}); err != nil {
		t.Fatal(err)
	}
	admin := &index.Access{All: true}
	viewer := f.NamespaceAccess(2, 10)
	queries := []index.Query{
		{Filter: index.Filter{Kinds: []string{"Pod"}}, Access: admin},
		{Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}}, Access: admin},
		{Filter: index.Filter{LabelSelector: "app=v0"}, Access: admin},
		{Filter: index.Filter{Clusters: []string{stale}}, Order: index.Order{Field: index.OrderCreatedAt, Desc: true}, Access: admin},
		{Filter: index.Filter{Kinds: []string{"Pod"}}, Access: viewer},
		{Access: viewer},
	}
	for i, q := range queries {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			q.First = 7
			counted, total := walkPages(t, s, q)
			q.NoTotal = true
			alone, _ := walkPages(t, s, q)
			if total == 0 {
				t.Fatalf("the query matches nothing")
			}
			if len(alone) != len(counted) {
				t.Fatalf("NoTotal: %d pages, want %d", len(alone), len(counted))
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
