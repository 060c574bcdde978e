package index_test

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// millionEnv enables the benchmarks of the 1M-object fleet, which take
// about a minute and a gigabyte to load.
const millionEnv = "FLEETGRAPH_BENCH_1M"

// millionFleet is fleetbench compare's 1M-object fleet, loaded as compare
// loads it (one Replace per cluster and kind), and compare's Q1/Q2 keys:
// 4,096 random objects, the same sequence.
var millionFleet = sync.OnceValues(func() (*index.Store, []index.Key) {
	f := indextest.DefaultFleet()
	heap := measure.LiveHeap()
	s := index.New(memtables.Open)
	byKind := make([][]index.Object, len(indextest.Kinds))
	err := f.Each(f.Namespaces*f.PerNamespace, func(rows []index.Object) error {
		for k := range byKind {
			byKind[k] = byKind[k][:0]
		}
		for i := range rows {
			k := slices.IndexFunc(indextest.Kinds, func(k index.Kind) bool { return k.Kind == rows[i].Kind })
			byKind[k] = append(byKind[k], rows[i])
		}
		for k, kr := range byKind {
			if err := s.Replace(context.Background(), rows[0].Cluster, indextest.Kinds[k], kr); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	millionHeap = float64(measure.LiveHeap()-heap) / float64(f.Size())
	rnd := rand.New(rand.NewPCG(1, 2))
	keys := make([]index.Key, 4096)
	for i := range keys {
		o := f.Object(rnd.IntN(f.Size()))
		keys[i] = o.Key()
	}
	return s, keys
})

// millionHeap is the live heap the store of millionFleet holds, in bytes
// per object (fleetbench's heap_bytes_per_object).
var millionHeap float64

// BenchmarkObjectsMillion times the calls that build Objects at 1M
// objects, as fleetbench compare makes them: get is Q1 (Store.Get of
// 4,096 random keys in turn), page is Q2 (one kind in one namespace of
// one cluster, first 100 by name, for the same keys; most of its rows
// are not in the page cache); objects is the page's Objects alone
// (pageObjects, for the rows of the same pages). Each reads every label of what it got, as
// a caller that serves them would. Set FLEETGRAPH_BENCH_1M=1 to run it.
func BenchmarkObjectsMillion(b *testing.B) {
	if os.Getenv(millionEnv) == "" {
		b.Skip("set " + millionEnv + "=1 to load the 1M-object fleet")
	}
	s, keys := millionFleet()
	b.Run("get", func(b *testing.B) {
		i, n := 0, 0
		defer cpuPerOp(b, stopGC)()
		for b.Loop() {
			o, ok := s.Get(keys[i%len(keys)])
			if !ok {
				b.Fatal("no object", keys[i%len(keys)])
			}
			n += countLabels(o)
			i++
		}
		b.ReportMetric(float64(n)/float64(i), "labels/op")
	})
	b.Run("page", func(b *testing.B) {
		queries := q2Queries(keys)
		i, rows, n := 0, 0, 0
		defer cpuPerOp(b, stopGC)()
		for b.Loop() {
			pg, err := s.Query(context.Background(), queries[i%len(queries)])
			if err != nil || len(pg.Edges) == 0 {
				b.Fatal(err, len(pg.Edges))
			}
			for j := range pg.Edges {
				n += countLabels(pg.Edges[j].Object)
			}
			rows += len(pg.Edges)
			i++
		}
		b.ReportMetric(float64(rows)/float64(i), "rows/op")
		b.ReportMetric(float64(n)/float64(i), "labels/op")
	})
	b.Run("objects", func(b *testing.B) {
		pages := make([][]uint32, len(keys))
		for i, q := range q2Queries(keys) {
			pages[i] = index.PageRowIDs(s, q)
		}
		edges := make([]index.Edge, 100)
		i, n := 0, 0
		defer cpuPerOp(b, stopGC)()
		for b.Loop() {
			p := pages[i%len(pages)]
			index.PageObjects(s, p, edges)
			for j := range p {
				n += countLabels(edges[j].Object)
			}
			i++
		}
		b.ReportMetric(float64(n)/float64(i), "labels/op")
	})
}

// countLabels reads every label of o, key and value, as a caller that
// serves them does.
func countLabels(o *index.Object) int {
	n := 0
	for k, v := range o.Labels.All() {
		n += min(len(k), 1) + min(len(v), 1)
	}
	return n
}

// BenchmarkQ2Million is fleetbench compare's Q2 at 1M objects (one kind
// in one namespace of one cluster, first 100 by name, 4,096 random keys
// in turn), with the garbage collector on as a server runs it: page is
// Store.Query as compare calls it; plan is the query's plan alone
// (compile, source choice and collect, without the page's objects);
// compile is its compile alone; heap reports the store's live heap per
// object (heap-B/object). Set FLEETGRAPH_BENCH_1M=1 to run it.
func BenchmarkQ2Million(b *testing.B) {
	if os.Getenv(millionEnv) == "" {
		b.Skip("set " + millionEnv + "=1 to load the 1M-object fleet")
	}
	s, keys := millionFleet()
	queries := q2Queries(keys)
	b.Run("heap", func(b *testing.B) {
		for b.Loop() {
		}
		b.ReportMetric(millionHeap, "heap-B/object")
	})
	b.Run("page", func(b *testing.B) {
		defer cpuPerOp(b, keepGC)()
		i := 0
		for b.Loop() {
			pg, err := s.Query(context.Background(), queries[i%len(queries)])
			if err != nil || len(pg.Edges) == 0 {
				b.Fatal(err, len(pg.Edges))
			}
			i++
		}
	})
	b.Run("plan", func(b *testing.B) {
		defer cpuPerOp(b, keepGC)()
		i := 0
		for b.Loop() {
			if n, err := index.PlanOnly(s, &queries[i%len(queries)]); err != nil || n == 0 {
				b.Fatal(err, n)
			}
			i++
		}
	})
	b.Run("compile", func(b *testing.B) {
		defer cpuPerOp(b, keepGC)()
		i := 0
		for b.Loop() {
			if err := index.CompileOnly(s, &queries[i%len(queries)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// q2Queries are compare's Q2 requests for keys: one kind in one
// namespace of one cluster, first 100 by name, with no total or cursors.
func q2Queries(keys []index.Key) []index.Query {
	queries := make([]index.Query, len(keys))
	for i, k := range keys {
		queries[i] = index.Query{
			Filter:  index.Filter{Clusters: []string{k.Cluster}, Namespaces: []string{k.Namespace}, Kinds: []string{k.Kind}},
			First:   100,
			Access:  &index.Access{All: true},
			Order:   index.Order{Field: index.OrderName},
			NoTotal: true, NoEdgeCursors: true,
		}
	}
	return queries
}

// stopGC and keepGC tell cpuPerOp what to do with the garbage collector.
const (
	stopGC = true
	keepGC = false
)

// cpuPerOp reports allocations and, where threadCPU can tell it, the CPU
// time of this thread per op (cpu-ns/op) when the returned function runs:
// on a loaded machine, wall time per op counts the time other processes
// had the core. Call it at the start of a benchmark and defer what it
// returns.
//
// With stopGC it collects and then stops the garbage collector until
// then: at 1M objects a collection marks about a gigabyte, and one in the
// timed loop (the loop allocates a few GB in a few seconds) costs its
// reads the collector's CPU and caches: stopGC measures the query alone.
// compare's queries do run across collections (each workload runs for at
// least a second), as a server's do. With the collector on (keepGC), cpu-ns/op
// leaves out the marking it does on other threads (see threadCPU): read
// it beside B/op, as a change that allocates more looks cheaper than it
// is.
func cpuPerOp(b *testing.B, gc bool) func() {
	b.ReportAllocs()
	percent := 0
	if gc == stopGC {
		runtime.GC()
		percent = debug.SetGCPercent(-1)
	}
	runtime.LockOSThread()
	start, ok := threadCPU()
	return func() {
		if end, _ := threadCPU(); ok {
			b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
		}
		runtime.UnlockOSThread()
		if gc == stopGC {
			debug.SetGCPercent(percent)
		}
	}
}
