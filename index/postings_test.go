package index

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPostings checks every representation (one member, array, bitmap)
// and the conversions between them against a map.
func TestPostings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		universe int
		ops      int
	}{
		{"tiny", 4, 200},
		{"sparse", 1 << 16, 20000},
		{"dense", 1 << 14, 60000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(7, uint64(tc.universe)))
			var p postings
			want := map[uint32]bool{}
			for i := range tc.ops {
				id := uint32(rnd.IntN(tc.universe))
				// Grow for the first half, then shrink, so the dense
				// case goes to a bitmap and back.
				if rnd.IntN(10) < 7 == (i < tc.ops/2) {
					p.add(id, tc.universe)
					want[id] = true
				} else {
					p.remove(id)
					delete(want, id)
				}
				if p.len() != len(want) || p.has(id) != want[id] {
					t.Fatalf("op %d on %d: len %d has %v, want %d %v", i, id, p.len(), p.has(id), len(want), want[id])
				}
			}
			var got []uint32
			p.each(func(id uint32) bool { got = append(got, id); return true })
			var ids []uint32
			for id := range want {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			if !slices.Equal(got, ids) {
				t.Fatalf("each yields %d ids, want %d", len(got), len(ids))
			}
		})
	}
}

// TestPostingsGrowth holds posting arrays near their size: grown by an
// eighth and rounded up to the allocation size class, not doubled (about
// a quarter of the arrays' bytes was spare room).
func TestPostingsGrowth(t *testing.T) {
	for _, n := range []int{3, 10, 100, 1000, 10_000} {
		var p postings
		for id := range uint32(n) {
			p.add(id*3, 1<<30) // never dense
		}
		ids := p.ids()
		if len(ids) != n || !slices.IsSorted(ids) {
			t.Fatalf("%d members: got %d, sorted %v", n, len(ids), slices.IsSorted(ids))
		}
		// Doubling leaves 16, 128 and 1,344 for 10, 100 and 1,000.
		if c, most := cap(ids), n+n/4+2; c > most {
			t.Fatalf("%d members: capacity %d, want at most %d", n, c, most)
		}
	}
}
