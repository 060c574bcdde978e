package indextest_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// TestChangesAreChanges applies a churn sequence, with repeated objects, to
// a store holding the fleet: every update must be published as a change
// (a resource version alone would be skipped as unchanged).
func TestChangesAreChanges(t *testing.T) {
	ctx := context.Background()
	f := indextest.Fleet{Clusters: 2, Namespaces: 10, PerNamespace: 10, Seed: 1}
	s := index.New(memtables.Open)
	if err := f.Each(100, func(rows []index.Object) error { return s.UpsertBatch(ctx, rows) }); err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	updates := f.Changes(2000, func() int { return rnd.IntN(f.Size()) }) // ten per object on average
	before := s.FeedStats().Published
	for _, u := range updates {
		if err := s.Upsert(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.FeedStats().Published - before; n != uint64(len(updates)) {
		t.Fatalf("%d updates published %d changes", len(updates), n)
	}
}

// TestKey: Key(i) is Object(i)'s key, for objects of every cluster,
// namespace and kind.
func TestKey(t *testing.T) {
	f := indextest.Fleet{Clusters: 3, Namespaces: 7, PerNamespace: 11, Seed: 5}
	for i := range f.Size() {
		o := f.Object(i)
		if got, want := f.Key(i), o.Key(); got != want {
			t.Fatalf("Key(%d) = %v, want %v", i, got, want)
		}
	}
}
