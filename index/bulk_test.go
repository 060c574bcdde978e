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
