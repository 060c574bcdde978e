package replication

import (
	"context"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// warmClusters is how many clusters of the benchmark fleet (10,000
// objects each, as in make bench-replication) the warm-start benchmarks
// load.
const warmClusters = 4

// snapshotMessages returns each cluster's snapshot as the messages an
// owner publishes, under the embedded server's message budget.
func snapshotMessages(tb testing.TB, f indextest.Fleet) [][][]byte {
	tb.Helper()
	ctx := context.Background()
	src := index.New(memtables.Open)
	enc := newEncoder()
	var out [][][]byte
	for c := range f.Clusters {
		if err := f.ReplaceCluster(ctx, src, c); err != nil {
			tb.Fatal(err)
		}
		snap := src.SnapshotCluster(indextest.ClusterName(c))
		ch := newChunker(DefaultMaxPayload - payloadHeadroom)
		ch.addSnapshot(&op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows}, false)
		var msgs [][]byte
		for _, p := range ch.messages() {
			msgs = append(msgs, enc.message(envelope{cluster: snap.Name, epoch: 1, owner: "owner"}, &p))
		}
		out = append(out, msgs)
	}
	return out
}

// BenchmarkWarmStart measures what a new replica spends on each snapshot
// it loads: decoding its messages, and restoring it into an empty index.
func BenchmarkWarmStart(b *testing.B) {
	f := indextest.Fleet{Clusters: warmClusters, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	msgs := snapshotMessages(b, f)
	decodeAll := func(dec *decoder) []index.ClusterSnapshot {
		var snaps []index.ClusterSnapshot
		for c, cm := range msgs {
			snap := index.ClusterSnapshot{Name: indextest.ClusterName(c)}
			for _, m := range cm {
				env, err := dec.decode(m)
				if err != nil {
					b.Fatal(err)
				}
				for _, o := range env.ops {
					if o.cluster != nil {
						snap.Cluster = o.cluster
					}
					snap.Kinds = append(snap.Kinds, o.kinds...)
					appendSnapshotRows(&snap, &o)
				}
			}
			snaps = append(snaps, snap)
		}
		return snaps
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		dec := newDecoder()
		cpu := measure.CPUTime()
		for b.Loop() {
			decodeAll(dec)
		}
		reportPerObject(b, f.Size(), measure.CPUTime()-cpu)
	})
	b.Run("restore", func(b *testing.B) {
		b.ReportAllocs()
		snaps := decodeAll(newDecoder())
		cpu := measure.CPUTime()
		for b.Loop() {
			s := index.New(memtables.Open)
			for _, snap := range snaps {
				if err := s.RestoreCluster(context.Background(), snap); err != nil {
					b.Fatal(err)
				}
			}
		}
		reportPerObject(b, f.Size(), measure.CPUTime()-cpu)
	})
}

// reportPerObject reports the wall and CPU time (every goroutine's, GC
// included) per object: on a shared machine CPU time is the steadier.
func reportPerObject(b *testing.B, objects int, cpu time.Duration) {
	n := float64(b.N * objects)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/object")
	b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/object")
}
