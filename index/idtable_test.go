package index

import (
	"math/rand/v2"
	"testing"
)

// TestIDTable checks an idTable against a map through adds and removes,
// with hashes drawn from a few values (so that tags collide, probe runs
// are long and wrap around their shard) and from the whole range. Spread
// over 3,000 ids, about 1,500 live ids leave every shard small (a broken
// growth past 36 slots passes); over 100,000, about 50,000 grow every
// shard many times.
func TestIDTable(t *testing.T) {
	spread := func(id uint32) uint64 { return mix64(uint64(id)) }
	for _, tc := range []struct {
		name string
		hash func(id uint32) uint64
		ids  int
	}{
		{"spread", spread, 3000},
		{"spread, grown", spread, 100_000},
		{"one shard, 7 tags", func(id uint32) uint64 { return uint64(id%7) << 33 }, 3000},
		{"one shard, high tags", func(id uint32) uint64 { return uint64(^uint32(0)-id%5) << 32 }, 3000},
		{"4 shards, 3 tags", func(id uint32) uint64 { return uint64(id%3)<<40 | uint64(id%4) }, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tab idTable
			want := map[uint32]bool{}
			rnd := rand.New(rand.NewPCG(1, 2))
			check := func(when string) {
				t.Helper()
				if tab.len() != len(want) {
					t.Fatalf("%s: len %d, want %d", when, tab.len(), len(want))
				}
				for id := range uint32(tc.ids) {
					got, ok := tab.find(tc.hash(id), func(c uint32) bool { return c == id })
					if ok != want[id] || (ok && got != id) {
						t.Fatalf("%s: find %d: %d %v, want %v", when, id, got, ok, want[id])
					}
				}
			}
			for round := range 4 {
				for range tc.ids * 2 / 3 {
					id := uint32(rnd.IntN(tc.ids))
					if want[id] {
						if !tab.remove(tc.hash(id), id) {
							t.Fatalf("remove %d: not found", id)
						}
						delete(want, id)
					} else {
						tab.add(tc.hash(id), id)
						want[id] = true
					}
				}
				check("round " + string(rune('0'+round)))
			}
			if tab.remove(tc.hash(uint32(tc.ids)), uint32(tc.ids)) {
				t.Fatal("removed an id never added")
			}
			if tc.ids > 3000 {
				for i := range tab.shards {
					if n := len(tab.shards[i].slots); n <= 16 {
						t.Fatalf("shard %d has %d slots: the case needs every shard grown", i, n)
					}
				}
			}
		})
	}
}
