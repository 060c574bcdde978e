package index

import (
	"cmp"
	"encoding/binary"
	"slices"
	"sort"
	"strings"
)

// nameOrder keeps every row in (name, key) order for name-ordered pages
// that walk the order instead of sorting a source (see plan.run).
//
// It is a log-structured set of sorted runs rather than a search tree.
// The rows a write inserts are sorted among themselves (they are in cache)
// and added as one run when the write ends; runs of similar size are then
// merged, like a binary counter, up to maxMergedRun items, so each row is
// copied about log2(maxMergedRun/batch) times by sequential merges. Measured
// on the 1M-object fleet, inserting into a B-tree cost 2–4 µs per row,
// nearly all of it cache misses while descending the tree, and was the
// largest part of ingest; a run costs a few hundred nanoseconds per row.
// The price is paid by readers: at 1M rows there are about 45 runs, a walk
// merges their heads (a comparison per run for each row it yields), and
// seeking costs a binary search per run.
//
// Removing a row leaves its item in place. An item is live while its row
// id's generation (objIndex.gens, bumped when an id is freed) is the one it
// was added with; walks skip dead items, the removed row's key is kept
// aside for comparisons, and once dead items are a quarter of all items the
// runs are compacted into one. Items are pointer-free, so the garbage
// collector does not scan the runs (a million pointers less to mark).
//
// Merges happen under the Store's write lock, which is why runs stop
// growing at maxMergedRun: merging two runs of half a million rows took
// 100–400 ms here, a stall no reader should wait behind.
type nameOrder struct {
	x       *objIndex
	runs    [][]nameItem // each sorted, each more than twice as long as the next
	pending []nameItem   // inserted by the write in progress
	items   int          // items in runs, live or dead
	dead    map[uint64]deadRow
	maxRun  int // maxMergedRun; tests lower it
}

// maxMergedRun bounds the runs that merges build: merging costs about
// 100–300 ns an item here (names sharing their first 16 bytes load rows),
// so one write merges at most about 10 ms worth.
const maxMergedRun = 1 << 15

// nameItem is one entry of the name order.
type nameItem struct {
	pfx namePfx
	rid uint32
	gen uint32
}

// deadRow keeps what comparing a dead item needs, by rowGen.
type deadRow struct {
	key     string
	nameOff uint16
}

func rowGen(rid, gen uint32) uint64 { return uint64(rid)<<32 | uint64(gen) }

// nameSeek is a position to seek: a name prefix, key and name offset.
type nameSeek struct {
	pfx     namePfx
	key     string
	nameOff uint16
}

// keyOf returns the key and name offset of an item's row, live or dead.
func (o *nameOrder) keyOf(it *nameItem) (string, uint16) {
	if o.live(it) {
		r := o.x.rows[it.rid]
		return r.key, r.nameOff
	}
	d := o.dead[rowGen(it.rid, it.gen)]
	return d.key, d.nameOff
}

// compare orders items by name, then key. Most comparisons are decided by
// the prefixes, without loading rows.
func (o *nameOrder) compare(a, b *nameItem) int {
	if c := a.pfx.compare(b.pfx); c != 0 {
		return c
	}
	ak, ao := o.keyOf(a)
	bk, bo := o.keyOf(b)
	return compareKeys(ak, ao, bk, bo)
}

// compareSeek orders an item against a seek position.
func (o *nameOrder) compareSeek(a *nameItem, s *nameSeek) int {
	if c := a.pfx.compare(s.pfx); c != 0 {
		return c
	}
	ak, ao := o.keyOf(a)
	return compareKeys(ak, ao, s.key, s.nameOff)
}

// compareKeys orders two keys by their names, then whole.
func compareKeys(a string, aOff uint16, b string, bOff uint16) int {
	if c := strings.Compare(a[aOff:len(a)-1], b[bOff:len(b)-1]); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// namePfx is the first 16 bytes of a name as two big-endian numbers,
// zero-padded: prefixes order like the names they start (names hold no NUL
// bytes), and only equal prefixes need the names.
type namePfx struct{ hi, lo uint64 }

func namePrefix(name string) namePfx {
	var b [16]byte
	copy(b[:], name)
	return namePfx{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

func (p namePfx) compare(q namePfx) int {
	if p.hi != q.hi {
		return cmp.Compare(p.hi, q.hi)
	}
	return cmp.Compare(p.lo, q.lo)
}

// compareByName orders rows by name, then key.
func compareByName(a, b *objRow) int {
	return compareKeys(a.key, a.nameOff, b.key, b.nameOff)
}

func newNameOrder(x *objIndex) *nameOrder {
	return &nameOrder{x: x, dead: map[uint64]deadRow{}, maxRun: maxMergedRun}
}

// live reports whether it is the item of a stored row.
func (o *nameOrder) live(it *nameItem) bool { return o.x.gens[it.rid] == it.gen }

// insert queues a stored row; flush adds it to the order.
func (o *nameOrder) insert(pfx namePfx, r *objRow) {
	o.pending = append(o.pending, nameItem{pfx: pfx, rid: r.rid, gen: o.x.gens[r.rid]})
}

// remove records that a row is going, before its id's generation is
// bumped: its item dies in place.
func (o *nameOrder) remove(r *objRow) {
	o.dead[rowGen(r.rid, o.x.gens[r.rid])] = deadRow{key: r.key, nameOff: r.nameOff}
}

// len returns the number of live rows.
func (o *nameOrder) len() int { return o.items + len(o.pending) - len(o.dead) }

// flush adds the rows inserted since the last flush, and compacts when
// dead items are many; the Store calls it before a write releases its
// lock.
func (o *nameOrder) flush() {
	o.addPending()
	if len(o.dead) > max(o.items/4, 1024) {
		o.compact()
	}
}

// addPending adds the pending rows as one run and merges runs of similar
// size.
func (o *nameOrder) addPending() {
	if len(o.pending) > 0 {
		run := make([]nameItem, 0, len(o.pending))
		for i := range o.pending {
			if it := &o.pending[i]; o.live(it) {
				run = append(run, *it)
			} else {
				delete(o.dead, rowGen(it.rid, it.gen)) // added and removed in one write
			}
		}
		o.pending = o.pending[:0]
		slices.SortFunc(run, func(a, b nameItem) int { return o.compare(&a, &b) })
		o.runs = append(o.runs, run)
		o.items += len(run)
		for n := len(o.runs); n >= 2 && len(o.runs[n-2]) <= 2*len(o.runs[n-1]) &&
			len(o.runs[n-2])+len(o.runs[n-1]) <= o.maxRun; n-- {
			o.runs[n-2] = o.merge(o.runs[n-2:])
			o.runs[n-1] = nil
			o.runs = o.runs[:n-1]
		}
	}
}

// compact drops the dead items from every run (a sequential pass, without
// comparisons).
func (o *nameOrder) compact() {
	o.addPending()
	o.items = 0
	runs := o.runs[:0]
	for _, run := range o.runs {
		live := run[:0]
		for _, it := range run {
			if o.live(&it) {
				live = append(live, it)
			}
		}
		if len(live) > 0 {
			runs = append(runs, live)
			o.items += len(live)
		}
	}
	clear(o.runs[len(runs):])
	o.runs = runs
	clear(o.dead)
}

// merge returns the sorted union of runs.
func (o *nameOrder) merge(runs [][]nameItem) []nameItem {
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	out := make([]nameItem, 0, n)
	heads := make([]int, len(runs))
	for {
		best := -1
		for i, r := range runs {
			if heads[i] < len(r) && (best < 0 || o.compare(&r[heads[i]], &runs[best][heads[best]]) < 0) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, runs[best][heads[best]])
		heads[best]++
	}
	return out
}

// walk calls visit with the row ids of live items in name order,
// ascending or descending, from the start or from pivot (included when it
// is a row), until visit returns false. The rows of the write in progress
// are not visited.
func (o *nameOrder) walk(pivot *nameSeek, desc bool, visit func(rid uint32) bool) {
	// pos[i] is the next index of run i to yield: counting up from the
	// first item at or after the pivot when ascending, down from the last
	// item at or before it when descending.
	pos := make([]int, len(o.runs))
	for i, r := range o.runs {
		switch {
		case pivot == nil && !desc:
			pos[i] = 0
		case pivot == nil:
			pos[i] = len(r) - 1
		case !desc:
			pos[i] = sort.Search(len(r), func(j int) bool { return o.compareSeek(&r[j], pivot) >= 0 })
		default:
			pos[i] = sort.Search(len(r), func(j int) bool { return o.compareSeek(&r[j], pivot) > 0 }) - 1
		}
	}
	for {
		best := -1
		for i, r := range o.runs {
			if pos[i] < 0 || pos[i] >= len(r) {
				continue
			}
			if best < 0 {
				best = i
				continue
			}
			c := o.compare(&r[pos[i]], &o.runs[best][pos[best]])
			if (!desc && c < 0) || (desc && c > 0) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		it := &o.runs[best][pos[best]]
		if desc {
			pos[best]--
		} else {
			pos[best]++
		}
		if o.live(it) && !visit(it.rid) {
			return
		}
	}
}
