package index_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// TestUpsertBulkMatchesSerial loads the same rows into two Stores, one
// with large UpsertBatch calls (which take the two-goroutine bulk path)
// and one with single Upserts, and checks that they publish the same
// events and answer the same queries. The batches mix new rows, unchanged
// rows, rows whose status or labels change, and a batch with a repeated
// key (which the bulk path hands to the serial one).
func TestUpsertBulkMatchesSerial(t *testing.T) {
	ctx := context.Background()
	f := indextest.Fleet{Clusters: 2, Namespaces: 60, PerNamespace: 10, Seed: 3}
	clock := func() time.Time { return time.Unix(1_800_000_000, 0) }
	bulk, serial := index.New(memtables.Open, index.WithClock(clock)), index.New(memtables.Open, index.WithClock(clock))
	var batches [][]index.Object
	var first []index.Object
	for i := range f.Size() / 2 {
		first = append(first, f.Object(i))
	}
	batches = append(batches, first)
	var mixed []index.Object
	for i := range f.Size() {
		switch i % 4 {
		case 0:
			mixed = append(mixed, f.Object(i)) // unchanged, or new in the second half
		case 1:
			mixed = append(mixed, f.Version(i, 8)) // version 8 also changes a label
		case 2:
			mixed = append(mixed, f.Version(i, 3))
		}
	}
	batches = append(batches, mixed)
	dup := []index.Object{}
	for i := range 300 {
		dup = append(dup, f.Version(i, 5))
	}
	dup = append(dup, f.Version(7, 6))
	batches = append(batches, dup)

	subB, err := bulk.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer subB.Close()
	subS, err := serial.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer subS.Close()
	for _, b := range batches {
		if err := bulk.UpsertBatch(ctx, b); err != nil {
			t.Fatal(err)
		}
		for _, o := range b {
			if err := serial.Upsert(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if bulk.LastSeq() != serial.LastSeq() {
		t.Fatalf("bulk published %d events, serial %d", bulk.LastSeq(), serial.LastSeq())
	}
	evB, _ := subB.Next(ctx, make([]*index.Event, 0, bulk.LastSeq()))
	evS, _ := subS.Next(ctx, make([]*index.Event, 0, serial.LastSeq()))
	for i := range evB {
		if evB[i].Type != evS[i].Type || evB[i].Key() != evS[i].Key() || !reflect.DeepEqual(evB[i].Object(), evS[i].Object()) {
			t.Fatalf("event %d: bulk %v %s, serial %v %s", i+1, evB[i].Type, evB[i].Key(), evS[i].Type, evS[i].Key())
		}
	}
	all := &index.Access{All: true}
	for _, sel := range []string{"", "app=v0", "app in (v1,v2)", "rev", "!rev", "k0", "app!=v0"} {
		q := index.Query{Filter: index.Filter{LabelSelector: sel}, Access: all, First: index.MaxPageSize}
		for {
			pb, err := bulk.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			ps, err := serial.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if pb.TotalCount != ps.TotalCount || len(pb.Edges) != len(ps.Edges) {
				t.Fatalf("%q: bulk %d/%d rows, serial %d/%d", sel, len(pb.Edges), pb.TotalCount, len(ps.Edges), ps.TotalCount)
			}
			for i := range pb.Edges {
				if !reflect.DeepEqual(pb.Edges[i].Object, ps.Edges[i].Object) {
					t.Fatalf("%q: row %d differs: %s", sel, i, fmt.Sprint(pb.Edges[i].Object.Key()))
				}
			}
			if !pb.HasNextPage {
				break
			}
			q.After = pb.Edges[len(pb.Edges)-1].Cursor
		}
	}
}

// TestRestoreLabelTableMatchesLabels restores clusters large enough for
// the bulk path (three goroutines) from snapshots whose labels are in a
// LabelTable, as the stream carries them, and from the same snapshots
// with each row's labels in its own map: both indexes hold the same rows
// and answer label selectors alike. The second round restores a newer
// state over the first (rows whose labels change, rows that go), and a
// snapshot with RBAC rows among the objects.
func TestRestoreLabelTableMatchesLabels(t *testing.T) {
	ctx := context.Background()
	f := indextest.Fleet{Clusters: 2, Namespaces: 60, PerNamespace: 10, Seed: 5}
	src := index.New(memtables.Open)
	for c := range f.Clusters {
		if err := f.ReplaceCluster(ctx, src, c); err != nil {
			t.Fatal(err)
		}
	}
	maps, table := index.New(memtables.Open), index.New(memtables.Open)
	restore := func() {
		t.Helper()
		for c := range f.Clusters {
			snap := src.SnapshotCluster(indextest.ClusterName(c))
			if err := maps.RestoreCluster(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if err := table.RestoreCluster(ctx, index.WithLabelTable(snap)); err != nil {
				t.Fatal(err)
			}
		}
	}
	restore()
	var next []index.Object
	for i := range f.Size() {
		switch i % 3 {
		case 0:
			next = append(next, f.Version(i, 8)) // version 8 also changes a label
		case 1:
			next = append(next, f.Object(i))
		}
	}
	role := index.Object{
		Cluster: indextest.ClusterName(0), Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles",
		Namespace: "ns-1", Name: "r", Policy: &index.Policy{Rules: []index.PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}},
	}
	for c := range f.Clusters {
		if err := src.RestoreCluster(ctx, index.ClusterSnapshot{Name: indextest.ClusterName(c)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.UpsertBatch(ctx, append(next, role)); err != nil {
		t.Fatal(err)
	}
	restore()
	for c := range f.Clusters {
		name := indextest.ClusterName(c)
		want, got := maps.SnapshotCluster(name), table.SnapshotCluster(name)
		if len(want.Rows) != len(src.SnapshotCluster(name).Rows) {
			t.Fatalf("%s: %d rows restored, the source has %d", name, len(want.Rows), len(src.SnapshotCluster(name).Rows))
		}
		if !reflect.DeepEqual(got, want) {
			for i := range min(len(got.Rows), len(want.Rows)) {
				if !reflect.DeepEqual(got.Rows[i], want.Rows[i]) {
					t.Fatalf("%s: row %d from the table: %+v\nfrom the maps: %+v", name, i, got.Rows[i], want.Rows[i])
				}
			}
			t.Fatalf("%s: %d rows from the table, %d from the maps", name, len(got.Rows), len(want.Rows))
		}
	}
	all := &index.Access{All: true}
	for _, sel := range []string{"app=v0", "app in (v1,v2)", "rev", "!rev", "k0", "app!=v0,k1"} {
		q := index.Query{Filter: index.Filter{LabelSelector: sel}, Access: all, First: index.MaxPageSize}
		pm, err := maps.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := table.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if pm.TotalCount != pt.TotalCount || pm.TotalCount == 0 {
			t.Fatalf("%q: %d rows from the table, %d from the maps", sel, pt.TotalCount, pm.TotalCount)
		}
	}
	if got, want := table.DictionaryStats(), maps.DictionaryStats(); got != want {
		t.Fatalf("dictionaries from the table %+v, from the maps %+v", got, want)
	}
}
