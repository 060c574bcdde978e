package index_test

import (
	"context"
	"os"
	"runtime"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

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
	if os.Getenv(millionEnv) == "" {
		b.Skip("set " + millionEnv + "=1 to load the 1M-object fleet")
	}
	s, keys := millionFleet()
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
