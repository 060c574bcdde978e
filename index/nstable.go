package index

import (
	"fmt"
	"iter"
)

// nsTable holds a cluster's rows by namespace (clusterAgg.nss): an
// open-addressing table of (namespace id, *nsAgg) slots with linear
// probing. A page of one kind in one namespace of one cluster finds its
// list with one probe, a cache line or two; the Go map it replaces held
// 1,000 namespaces of a 1M-object fleet behind a header, a directory, a
// table and a group, each a cache miss on a page of random keys (1.4 us
// of such a page's 20 us of CPU). Namespace ids are the fleet's, not the
// cluster's, so a slice by id in each cluster would cost 8 bytes per
// namespace of the whole fleet in every cluster (at 1,000 clusters of 100
// namespaces of their own, 800 MB); the table costs 16 bytes a slot, 4/3
// to 8/3 slots per namespace of the cluster, about what the map did.
type nsTable struct {
	slots []nsSlot // a power of two long, or nil when n is 0
	n     int
	shift uint8 // 32 - log2(len(slots)): home keeps the hash's top bits
}

type nsSlot struct {
	na   *nsAgg // nil: the slot is empty
	nsid uint32
}

// nsTableMin is the fewest slots a table has once it holds a namespace.
const nsTableMin = 4

// home is the slot where nsid's probe starts. A cluster's namespace ids
// are often consecutive: Fibonacci hashing spreads them.
func (t *nsTable) home(nsid uint32) int {
	return int((nsid * 0x9E3779B9) >> t.shift)
}

// len returns how many namespaces the table holds.
func (t *nsTable) len() int { return t.n }

// get returns the rows of namespace nsid, nil when it has none.
func (t *nsTable) get(nsid uint32) *nsAgg {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(nsid); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.na == nil {
			return nil
		}
		if s.nsid == nsid {
			return s.na
		}
	}
}

// put adds the rows of namespace nsid, which the table does not hold.
// The table grows to keep at most three slots in four used, so that
// probes stay short.
func (t *nsTable) put(nsid uint32, na *nsAgg) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	i := t.home(nsid)
	for t.slots[i].na != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = nsSlot{na: na, nsid: nsid}
	t.n++
}

// grow doubles the slots (or makes the first ones) and reinserts.
func (t *nsTable) grow() {
	old := t.slots
	size := max(nsTableMin, 2*len(old))
	t.slots = make([]nsSlot, size)
	t.shift = 32
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	t.n = 0
	for _, s := range old {
		if s.na != nil {
			t.put(s.nsid, s.na)
		}
	}
}

// delete removes namespace nsid, which the table must hold (it panics
// rather than loop at the first empty slot otherwise). The slots after
// it in its probe run move back (no tombstones), so a get stops at the
// first empty slot.
func (t *nsTable) delete(nsid uint32) {
	mask := len(t.slots) - 1
	i := t.home(nsid)
	for t.slots[i].nsid != nsid || t.slots[i].na == nil {
		if t.slots[i].na == nil {
			panic(fmt.Sprintf("index: nsTable.delete of namespace id %d, which it does not hold", nsid))
		}
		i = (i + 1) & mask
	}
	t.slots[i] = nsSlot{}
	for j := (i + 1) & mask; t.slots[j].na != nil; j = (j + 1) & mask {
		// The entry at j stays unless the hole at i is on its way from
		// its home k to j (k cyclically outside (i, j]).
		k := t.home(t.slots[j].nsid)
		if (i < j && i < k && k <= j) || (j < i && (i < k || k <= j)) {
			continue
		}
		t.slots[i], t.slots[j] = t.slots[j], nsSlot{}
		i = j
	}
	if t.n--; t.n == 0 {
		t.slots = nil
	}
}

// all yields each namespace id and its rows, in no particular order.
func (t *nsTable) all() iter.Seq2[uint32, *nsAgg] {
	return func(yield func(uint32, *nsAgg) bool) {
		for _, s := range t.slots {
			if s.na != nil && !yield(s.nsid, s.na) {
				return
			}
		}
	}
}
