package edge

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// benchSink keeps benchmark results alive.
var benchSink AgentStats

// countingConn counts bytes written to the wire, after compression.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(int64(n))
	return n, err
}

var podKind = index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}

// podRows makes n pod rows shaped like real ones: a few labels, an owner,
// a status summary, and UIDs that do not compress.
func podRows(cluster string, n int) []index.Object {
	rows := make([]index.Object, n)
	for i := range rows {
		sum := sha256.Sum256([]byte(fmt.Sprint(i)))
		uid := hex.EncodeToString(sum[:16])
		app := fmt.Sprintf("app-%d", i%200)
		rows[i] = index.Object{
			Cluster: cluster, Namespace: fmt.Sprintf("team-%d", i%50), Version: "v1", Kind: "Pod", Resource: "pods",
			Name: fmt.Sprintf("%s-7d9f8c6b5-%05d", app, i), UID: uid[:8] + "-" + uid[8:12] + "-" + uid[12:16] + "-" + uid[16:20] + "-" + uid[20:],
			Labels:    index.LabelsOf(map[string]string{"app": app, "pod-template-hash": "7d9f8c6b5", "tier": "backend", "version": "v2"}),
			OwnerRefs: []index.OwnerRef{{Kind: "ReplicaSet", Name: app + "-7d9f8c6b5"}},
			CreatedAt: time.Unix(1700000000+int64(i), 0).UTC(), ResourceVersion: fmt.Sprint(100000 + i),
			Status:  index.StatusHealthy,
			Summary: []byte(fmt.Sprintf(`{"phase":"Running","restarts":%d,"node":"node-%d","ready":"1/1"}`, i%3, i%40)),
		}
	}
	return rows
}

// BenchmarkSnapshot measures a full snapshot of 20,000 pod rows from an
// edge's buffer to the manager's index over a real websocket with
// compression: from dial to the cluster being CONNECTED, which is when the
// last part has been replaced into the index. Each run checks that the
// index then holds every row; the line gives the median run, with that
// run's own wire bytes and parts (run it with -benchtime 3x or more).
//
//	go test -run '^$' -bench Snapshot -benchtime 3x ./connection/edge/
func BenchmarkSnapshot(b *testing.B) {
	const objects = 20_000
	rows := podRows("edge-a", objects)
	type run struct {
		took  time.Duration
		wire  int64
		stats AgentStats
	}
	var runs []run
	for b.Loop() {
		b.StopTimer()
		h := newHubHarness(b, HubOptions{})
		var n atomic.Int64
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, &n}, nil
		}
		a, err := NewAgent(AgentOptions{
			Manager: h.url, Cluster: "edge-a", Token: func() (string, error) { return "tok-a", nil }, Dial: dial,
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.buf.Replace(context.Background(), "edge-a", podKind, rows); err != nil {
			b.Fatal(err)
		}
		a.buf.expect([]index.Kind{podKind})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		b.StartTimer()
		start := time.Now()
		go func() {
			defer close(done)
			_ = a.Run(ctx) // returns nil when cancelled
		}()
		for {
			if row, ok := h.store.GetCluster(nil, "edge-a"); ok && row.State == index.StateConnected {
				break
			}
			time.Sleep(time.Millisecond)
		}
		took := time.Since(start)
		b.StopTimer()
		page, err := h.store.Query(context.Background(), index.Query{Filter: index.Filter{Clusters: []string{"edge-a"}}, First: 1, Access: &index.Access{All: true}})
		if err != nil || page.TotalCount != objects {
			b.Fatalf("after the snapshot the index holds %d rows of %d (%v)", page.TotalCount, objects, err)
		}
		runs = append(runs, run{took, n.Load(), a.Stats()})
		benchSink = a.Stats()
		cancel()
		<-done
		b.StartTimer()
	}
	slices.SortFunc(runs, func(x, y run) int { return cmp.Compare(x.took, y.took) })
	m := runs[len(runs)/2]
	b.ReportMetric(float64(objects)/m.took.Seconds(), "objects/s")
	b.ReportMetric(float64(m.wire)/objects, "wire_bytes/object")
	b.ReportMetric(float64(m.stats.Bytes)/objects, "json_bytes/object")
	fmt.Printf("edge_snapshot: objects=%d runs=%d snapshot_s=%.3f bytes_per_object=%.1f json_bytes_per_object=%.1f parts=%d\n",
		objects, len(runs), m.took.Seconds(), float64(m.wire)/objects, float64(m.stats.Bytes)/objects, m.stats.Parts)
}

// BenchmarkTakeFull measures what a resync holds the edge's buffer lock
// for (the collector's events wait on it): copying the rows of 50,000
// pods.
func BenchmarkTakeFull(b *testing.B) {
	buf := newBuffer("c", 1000)
	if err := buf.Replace(context.Background(), "c", podKind, podRows("c", 50000)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		full := buf.takeFull()
		if len(full.rows) != 50000 {
			b.Fatalf("took %d rows", len(full.rows))
		}
	}
}

// BenchmarkTakeDeltaOfOneKind measures a take between a snapshot's parts
// (one kind listed) while another kind has 50,000 changed keys, as after
// that kind relisted during the snapshot (review-s7-edge L1): one changed
// ConfigMap is taken per run, and the pods' keys are never looked at.
func BenchmarkTakeDeltaOfOneKind(b *testing.B) {
	const pods = 50_000
	buf := newBuffer("c", 2*pods)
	buf.setConnected(true)
	buf.takeFull()
	if err := buf.Replace(context.Background(), "c", podKind, podRows("c", pods)); err != nil {
		b.Fatal(err)
	}
	only := syncedKinds([]KindState{{Kind: testKind, Synced: true}})
	row := testRows("c", 1, "1")[0]
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		row.ResourceVersion = fmt.Sprint(i)
		if err := buf.Upsert(context.Background(), row); err != nil {
			b.Fatal(err)
		}
		if ups, _ := buf.takeDelta(maxDeltaKeys, only, nil); len(ups) != 1 {
			b.Fatalf("took %d rows, want the one ConfigMap", len(ups))
		}
	}
	if buf.dirty.n != pods {
		b.Fatalf("%d keys changed after the takes, want the %d pods", buf.dirty.n, pods)
	}
}
