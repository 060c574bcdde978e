package index_test

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// bench1MEnv enables the benchmarks of the 1M-object fleet, which take
// about a minute and a gigabyte to load.
const bench1MEnv = "FLEETGRAPH_BENCH_1M"

// q2Fleet is fleetbench compare's 1M-object fleet, loaded the way compare
// loads it (one Replace per cluster and kind, so that a cluster's row ids
// are grouped by kind, as after a collector's first sync), and compare's
// Q2 keys: 4,096 random objects, the same sequence.
var q2Fleet = sync.OnceValues(func() (*index.Store, []index.Key) {
	f := indextest.Fleet{Clusters: 100, Namespaces: 1000, PerNamespace: 10, Seed: 1}
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
	rnd := rand.New(rand.NewPCG(1, 2))
	keys := make([]index.Key, 4096)
	for i := range keys {
		o := f.Object(rnd.IntN(f.Size()))
		keys[i] = o.Key()
	}
	return s, keys
})

// q2Query is compare's Q2 request for key k.
func q2Query(k index.Key) index.Query {
	return index.Query{
		Filter:  index.Filter{Clusters: []string{k.Cluster}, Namespaces: []string{k.Namespace}, Kinds: []string{k.Kind}},
		First:   100,
		Access:  &index.Access{All: true},
		Order:   index.Order{Field: index.OrderName},
		NoTotal: true, NoEdgeCursors: true,
	}
}

// BenchmarkQ2Million is fleetbench compare's Q2 at 1M objects (one kind
// in one namespace of one cluster, first 100 by name, 4,096 random keys
// in turn): page is Store.Query as compare calls it; plan is the query's
// plan alone (compile, source choice and collect, without the page's
// objects). Set FLEETGRAPH_BENCH_1M=1 to run it.
func BenchmarkQ2Million(b *testing.B) {
	if os.Getenv(bench1MEnv) == "" {
		b.Skip("set " + bench1MEnv + "=1 to load the 1M-object fleet")
	}
	s, keys := q2Fleet()
	queries := make([]index.Query, len(keys))
	for i, k := range keys {
		queries[i] = q2Query(k)
	}
	b.Run("page", func(b *testing.B) {
		defer cpuPerOp(b)()
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
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			if n, err := index.PlanOnly(s, &queries[i%len(queries)]); err != nil || n == 0 {
				b.Fatal(err, n)
			}
			i++
		}
	})
	b.Run("compile", func(b *testing.B) {
		defer cpuPerOp(b)()
		i := 0
		for b.Loop() {
			if err := index.CompileOnly(s, &queries[i%len(queries)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// cpuPerOp reports allocations and the benchmark thread's CPU time per
// operation (cpu-ns/op), which a loaded machine disturbs less than the
// wall time, with the garbage collector on as a server runs it (cpuTimer
// turns it off): call it at the start of a benchmark and defer what it
// returns.
func cpuPerOp(b *testing.B) func() {
	b.ReportAllocs()
	runtime.LockOSThread()
	start := threadCPU()
	return func() {
		b.ReportMetric(float64(threadCPU()-start)/float64(b.N), "cpu-ns/op")
		runtime.UnlockOSThread()
	}
}
