package index_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// benchSink keeps benchmark results alive.
var benchSink any

var benchStore = sync.OnceValue(func() *index.Store {
	return fleetStore(indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1})
})

// fleetStore returns a new Store holding fleet f.
func fleetStore(f indextest.Fleet) *index.Store {
	s := index.New(memtables.Open)
	if err := f.Each(1000, func(rows []index.Object) error { return s.UpsertBatch(context.Background(), rows) }); err != nil {
		panic(err)
	}
	return s
}

// BenchmarkIngest loads a 100k-object fleet in 1,000-row UpsertBatch
// calls into an empty Store. The rows are generated before the clock
// starts, so it measures the index only.
func BenchmarkIngest(b *testing.B) {
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	var batches [][]index.Object
	if err := f.Each(1000, func(rows []index.Object) error {
		batches = append(batches, slices.Clone(rows))
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s := index.New(memtables.Open)
		for _, rows := range batches {
			if err := s.UpsertBatch(context.Background(), rows); err != nil {
				b.Fatal(err)
			}
		}
		benchSink = s
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(f.Size()*b.N), "ns/row")
}

// BenchmarkUpsertChange applies single-row Upserts that change status,
// message and sometimes a label of stored rows, as watch events do. Two
// versions of each of 4,096 rows alternate, each a change of the other (and
// the first of version 0), so every Upsert is a change; the benchmark fails
// if the index published fewer changes than it applied Upserts. It writes
// to a store of its own: the query benchmarks share benchStore.
func BenchmarkUpsertChange(b *testing.B) {
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	s := index.New(memtables.Open)
	if err := f.Each(1000, func(rows []index.Object) error { return s.UpsertBatch(context.Background(), rows) }); err != nil {
		b.Fatal(err)
	}
	const rows = 4096
	updates := make([]index.Object, 2*rows)
	for j := range rows {
		i := (j * 7919) % f.Size()
		first, v := f.NextChange(i, 0)
		updates[j] = first
		updates[rows+j], _ = f.NextChange(i, v)
	}
	published := s.FeedStats().Published
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := s.Upsert(context.Background(), updates[i%len(updates)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if n := s.FeedStats().Published - published; n != uint64(i) {
		b.Fatalf("%d Upserts published %d changes: some were no-ops", i, n)
	}
}

// BenchmarkReplaceUnchanged relists one kind of one cluster with no
// change, as a reconnecting collector does.
func BenchmarkReplaceUnchanged(b *testing.B) {
	s := benchStore()
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	var rows []index.Object
	for i := range f.Namespaces * f.PerNamespace {
		if o := f.Object(i); o.Kind == "Service" {
			rows = append(rows, o)
		}
	}
	kind := indextest.Kinds[1]
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Replace(context.Background(), indextest.ClusterName(0), kind, rows); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(len(rows)*b.N), "ns/row")
}

func BenchmarkFacetsFleet(b *testing.B) {
	s := benchStore()
	b.ReportAllocs()
	for b.Loop() {
		f, err := s.Facets(context.Background(), index.Filter{}, &index.Access{All: true})
		if err != nil {
			b.Fatal(err)
		}
		benchSink = f
	}
}

func BenchmarkQueryLabel(b *testing.B) {
	s := benchStore()
	b.ReportAllocs()
	for b.Loop() {
		p, err := s.Query(context.Background(), index.Query{Filter: index.Filter{LabelSelector: "app=v0"}, Access: &index.Access{All: true}})
		if err != nil {
			b.Fatal(err)
		}
		benchSink = p
	}
}

func BenchmarkQueryNamespaceKind(b *testing.B) {
	s := benchStore()
	q := index.Query{Filter: index.Filter{Clusters: []string{"cluster-003"}, Namespaces: []string{"ns-0042"}, Kinds: []string{"Pod"}}, Access: &index.Access{All: true}}
	b.ReportAllocs()
	for b.Loop() {
		p, err := s.Query(context.Background(), q)
		if err != nil {
			b.Fatal(err)
		}
		benchSink = p
	}
}

func BenchmarkQueryKindStatus(b *testing.B) {
	s := benchStore()
	q := index.Query{Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}}, Access: &index.Access{All: true}}
	b.ReportAllocs()
	for b.Loop() {
		p, err := s.Query(context.Background(), q)
		if err != nil {
			b.Fatal(err)
		}
		benchSink = p
	}
}

// BenchmarkQueryKindPage is the dashboard's table after a kind facet
// click: a page of 50 of one big kind in name order. The fleet's names
// start with their kind, so a kind's rows are one stretch of the name
// order; Service's is near its end.
func BenchmarkQueryKindPage(b *testing.B) {
	s := benchStore()
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	viewer := f.NamespaceAccess(10, 200) // a fifth of the fleet, as bench-ui's viewer
	for _, kind := range []string{"Pod", "Service", "EndpointSlice", "viewer/Pod", "viewer/Service"} {
		b.Run(kind, func(b *testing.B) {
			a := &index.Access{All: true}
			if k, ok := strings.CutPrefix(kind, "viewer/"); ok {
				kind, a = k, viewer
			}
			q := index.Query{Filter: index.Filter{Kinds: []string{kind}}, First: 50, Access: a}
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.Query(context.Background(), q)
				if err != nil {
					b.Fatal(err)
				}
				if len(p.Edges) != 50 || p.Edges[0].Object.Kind != kind {
					b.Fatalf("%d edges", len(p.Edges))
				}
				benchSink = p
			}
		})
	}
}

// BenchmarkQueryPage is what fleetbench compare's in-process pages cost:
// the pages of Q3 (kind and status), Q4 (a label), Q2 (one kind in one
// namespace), a restricted viewer's kind page and its unfiltered page by
// update time (every row it may see is collected, cluster by cluster) with
// one resource listed cluster-wide, without the total count (Query.NoTotal) and with the cursors of the first and last edges only
// (Query.NoEdgeCursors), as compare asks for them.
func BenchmarkQueryPage(b *testing.B) {
	s := benchStore()
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	admin := &index.Access{All: true}
	for _, bc := range []struct {
		name string
		q    index.Query
	}{
		{"kind-status", index.Query{Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}}, Access: admin}},
		{"label", index.Query{Filter: index.Filter{LabelSelector: "app=v0"}, Access: admin}},
		{"namespace-kind", index.Query{Filter: index.Filter{Clusters: []string{"cluster-003"}, Namespaces: []string{"ns-0042"}, Kinds: []string{"Pod"}}, Access: admin}},
		{"viewer-kind-status", index.Query{Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}}, Access: f.NamespaceAccess(10, 200)}},
		{"viewer-pod", index.Query{Filter: index.Filter{Kinds: []string{"Pod"}}, Access: f.NamespaceAccess(10, 200)}},
		{"viewer-everywhere", index.Query{Order: index.Order{Field: index.OrderUpdatedAt}, Access: everywhereAccess(f)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			q := bc.q
			q.NoTotal, q.NoEdgeCursors = true, true
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.Query(context.Background(), q)
				if err != nil {
					b.Fatal(err)
				}
				if len(p.Edges) == 0 {
					b.Fatal("no edges")
				}
				benchSink = p
			}
		})
	}
}

// everywhereAccess is NamespaceAccess(10, 200) with Kustomizations also
// listed cluster-wide.
func everywhereAccess(f indextest.Fleet) *index.Access {
	a := f.NamespaceAccess(10, 200)
	k := indextest.Kinds[3]
	every := index.NewResources(index.GroupResource{Group: k.Group, Resource: k.Resource})
	for _, ca := range a.Clusters {
		ca.Everywhere = every
	}
	return a
}

// BenchmarkQueryPageRandomKeys is fleetbench compare's Q2: one kind in
// one namespace of one cluster, first 100 by name, for 4,096 random
// objects' keys in turn, as compare draws them. Unlike BenchmarkQueryPage's
// namespace-kind, which repeats one page, every query compiles other ids
// and reads rows, lists and labels the previous ones did not: it shows the
// fixed cost of a small page (compile, source choice, stale clusters) and
// its cache misses. Its pages hold about 4 rows.
func BenchmarkQueryPageRandomKeys(b *testing.B) {
	s := benchStore()
	f := indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	rnd := rand.New(rand.NewPCG(1, 2))
	queries := make([]index.Query, 4096)
	for i := range queries {
		o := f.Object(rnd.IntN(f.Size()))
		queries[i] = index.Query{
			Filter: index.Filter{Clusters: []string{o.Cluster}, Namespaces: []string{o.Namespace}, Kinds: []string{o.Kind}},
			Access: &index.Access{All: true}, NoTotal: true, NoEdgeCursors: true,
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p, err := s.Query(context.Background(), queries[i%len(queries)])
		if err != nil {
			b.Fatal(err)
		}
		if len(p.Edges) == 0 {
			b.Fatal("no edges")
		}
		benchSink = p
		i++
	}
}

// BenchmarkQueryPageChurn reads a page of 100 pods after every commit of a
// writer that churns a label value, with a replay buffer small enough that
// every commit reclaims the pair ids of an earlier one (as a full feed
// does under steady churn). The churned row is another kind's ("elsewhere")
// or a pod of the page ("in-page"). Only the queries are timed and
// counted: the commit runs with the timer stopped.
func BenchmarkQueryPageChurn(b *testing.B) {
	f := indextest.Fleet{Clusters: 2, Namespaces: 100, PerNamespace: 10, Seed: 1}
	q := index.Query{Filter: index.Filter{Kinds: []string{"Pod"}}, First: 100, NoTotal: true, Access: &index.Access{All: true}}
	for _, bc := range []struct {
		name string
		kind index.Kind
	}{
		{"elsewhere", indextest.Kinds[1]},
		{"in-page", indextest.Kinds[0]},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			s := index.New(memtables.Open, index.WithReplayBuffer(16))
			if err := f.Each(1000, func(rows []index.Object) error { return s.UpsertBatch(ctx, rows) }); err != nil {
				b.Fatal(err)
			}
			churn := f.Object(0)
			churn.Group, churn.Version, churn.Kind, churn.Resource = bc.kind.Group, bc.kind.Version, bc.kind.Kind, bc.kind.Resource
			churn.Name, churn.UID = "a-churn", "churn-uid"
			rev := 0
			write := func() {
				rev++
				churn.Labels = index.LabelsOf(map[string]string{"app": "churn", "rev": strconv.Itoa(rev)})
				if err := s.Upsert(ctx, churn); err != nil {
					b.Fatal(err)
				}
			}
			for range 64 { // fill the feed
				write()
			}
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				write()
				b.StartTimer()
				p, err := s.Query(ctx, q)
				if err != nil {
					b.Fatal(err)
				}
				if len(p.Edges) != 100 {
					b.Fatalf("%d edges, want 100", len(p.Edges))
				}
				benchSink = p
			}
		})
	}
}
