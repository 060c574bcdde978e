package index

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestNSTable runs random puts and deletes on a cluster's namespace table
// against a map, over dense and sparse ids (dense ids collide in their
// home slots more), checking after every step that each id in the range
// is found exactly when the map holds it, and that all yields the map.
func TestNSTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		ids  uint32 // ids are drawn from [0, ids) * stride
		step uint32
	}{
		{"dense", 40, 1},
		{"sparse", 300, 7919},
		{"few", 6, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(5, uint64(tc.ids)))
			var tab nsTable
			model := map[uint32]*nsAgg{}
			for step := range 4000 {
				id := rnd.Uint32N(tc.ids) * tc.step
				if na := model[id]; na != nil && rnd.IntN(2) == 0 {
					tab.delete(id)
					delete(model, id)
				} else if na == nil {
					na = &nsAgg{}
					tab.put(id, na)
					model[id] = na
				}
				if tab.len() != len(model) {
					t.Fatalf("step %d: len %d, want %d", step, tab.len(), len(model))
				}
				for i := range tc.ids {
					id := i * tc.step
					if got := tab.get(id); got != model[id] {
						t.Fatalf("step %d: get(%d) = %p, want %p", step, id, got, model[id])
					}
				}
				n := 0
				for id, na := range tab.all() {
					if model[id] != na {
						t.Fatalf("step %d: all yields %d -> %p, want %p", step, id, na, model[id])
					}
					n++
				}
				if n != len(model) {
					t.Fatalf("step %d: all yields %d namespaces, want %d", step, n, len(model))
				}
			}
			if len(tab.slots) > 0 && 4*tab.n > 3*len(tab.slots) {
				t.Errorf("%d of %d slots used", tab.n, len(tab.slots))
			}
		})
	}
}

// TestNSTableDeleteAbsent: deleting an id the table does not hold panics
// at the first empty slot of its probe run rather than loop (under the
// store's write lock) over a table that always has one.
func TestNSTableDeleteAbsent(t *testing.T) {
	var tb nsTable
	for id := uint32(1); id <= 5; id++ {
		tb.put(id, &nsAgg{})
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		tb.delete(99)
	}()
	select {
	case r := <-done:
		if r == nil {
			t.Fatal("delete of an absent id returned without a panic")
		}
	case <-time.After(time.Minute):
		t.Fatal("delete of an absent id did not return in a minute: it loops")
	}
}
