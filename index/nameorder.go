package index

import (
	"cmp"
	"encoding/binary"
	"slices"
	"sort"
	"strings"
)

// nameOrder keeps every row in (name, key) order for name-ordered pages
// that walk the order instead of sorting a source (see plan.run). A large
// posting list keeps its own members the same way (see listOrders).
//
// It is a log-structured set of sorted runs rather than a search tree.
// The rows a write inserts are sorted among themselves (they are in cache)
// and added as one run when the write ends; runs of similar size are then
// merged, like a binary counter, up to maxMergedRun items, so each row is
// copied about log2(maxMergedRun/batch) times by sequential merges. Measured
// on the 1M-object fleet, inserting into a B-tree cost 2–4 µs per row,
// nearly all of it cache misses while descending the tree, and was the
// largest part of ingest; a run costs a few hundred nanoseconds per row.
// The price is paid by readers: at 1M rows there are about 45 runs (over
// 300 at 10M), a walk merges their heads through a heap (about log2(runs)
// comparisons for each row it yields), and seeking costs a binary search
// per run.
//
// Removing a row leaves its item in place. An item names its row by id and
// the id's generation (objIndex.gens, bumped when an id is freed), and is
// dead while the dead map holds that pair, with the removed row's key for
// comparisons; walks skip dead items, and once dead items are a quarter of
// all items they are dropped from the runs. Items are pointer-free, so the
// garbage collector does not scan the runs (a million pointers less to
// mark).
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
	deadIDs []uint64 // bit per row id (masked by idMask) that has or had a dead item since the last compaction
	idMask  uint32   // ^0 for the whole order; a list's order folds ids into a small filter
	// minCompact is the fewest dead items that compact (with a quarter
	// of all items).
	minCompact int
	maxRun     int  // maxMergedRun; tests lower it
	queued     bool // a list's order is in its listOrders.dirty
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

// deadRow keeps what comparing a dead item needs, by rowGen: the removed
// row and its namespace, whose id the dictionary may give another
// namespace before the item goes (cluster ids are never reused, and a
// kindInfo never changes). It keeps the row alive until the next
// compaction, as the feed's events do for a while anyway.
type deadRow struct {
	r  *objRow
	ns string
}

func rowGen(rid, gen uint32) uint64 { return uint64(rid)<<32 | uint64(gen) }

// nameSeek is a position to seek: a name prefix and a key.
type nameSeek struct {
	pfx namePfx
	key Key
}

// rowOf returns the row of an item, live or dead, and for a dead one its
// namespace (see deadRow).
func (o *nameOrder) rowOf(it *nameItem) (r *objRow, ns string, live bool) {
	if o.live(it) {
		return o.x.rows[it.rid], "", true
	}
	d := o.dead[rowGen(it.rid, it.gen)]
	return d.r, d.ns, false
}

// itemKey returns the key of an item's row from what rowOf returned.
func (o *nameOrder) itemKey(r *objRow, ns string, live bool) Key {
	k := o.x.keyOf(r)
	if !live {
		k.Namespace = ns
	}
	return k
}

// compare orders items by name, then key. Most comparisons are decided by
// the prefixes, without loading rows.
func (o *nameOrder) compare(a, b *nameItem) int { return compareItems(o, a, o, b) }

// compareItems orders item a of order ao and item b of order bo, orders
// of one index.
func compareItems(ao *nameOrder, a *nameItem, bo *nameOrder, b *nameItem) int {
	if c := a.pfx.compare(b.pfx); c != 0 {
		return c
	}
	ar, ans, alive := ao.rowOf(a)
	br, bns, blive := bo.rowOf(b)
	if c := strings.Compare(ar.name(), br.name()); c != 0 {
		return c
	}
	if alive && blive {
		return ao.x.compareRows(ar, br)
	}
	ak, bk := ao.itemKey(ar, ans, alive), bo.itemKey(br, bns, blive)
	return compareKeys(&ak, &bk)
}

// compareSeek orders an item against a seek position.
func (o *nameOrder) compareSeek(a *nameItem, s *nameSeek) int {
	if c := a.pfx.compare(s.pfx); c != 0 {
		return c
	}
	r, ns, live := o.rowOf(a)
	if c := strings.Compare(r.name(), s.key.Name); c != 0 {
		return c
	}
	if live {
		return o.x.compareRowKey(r, &s.key)
	}
	k := o.itemKey(r, ns, false)
	return compareKeys(&k, &s.key)
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

func newNameOrder(x *objIndex) *nameOrder {
	return &nameOrder{x: x, dead: map[uint64]deadRow{}, idMask: ^uint32(0), minCompact: 1024, maxRun: maxMergedRun}
}

// live reports whether it is the item of a stored row (of the list, for
// a list's order). Only the ids in deadIDs can have a dead item, so most
// items need no look at the dead map, which was a cache miss for every
// item a walk visited (deadIDs is a bit per id, 32 times smaller; a
// list's order folds the ids into 4,096 bits, so that thousands of lists
// do not each hold a bit per row of the index).
func (o *nameOrder) live(it *nameItem) bool {
	if len(o.dead) == 0 {
		return true
	}
	id := it.rid & o.idMask
	w := int(id >> 6)
	if w >= len(o.deadIDs) || o.deadIDs[w]&(1<<(id&63)) == 0 {
		return true
	}
	_, dead := o.dead[rowGen(it.rid, it.gen)]
	return !dead
}

// insert queues a stored row; flush adds it to the order.
func (o *nameOrder) insert(pfx namePfx, r *objRow) {
	o.insertID(pfx, r.rid, o.x.gens[r.rid])
}

// insertID queues row id rid of generation gen, named with prefix pfx. A
// row that left a list's order and comes back before a compaction has
// its dead item still in place, at its position: the item lives again,
// so that no row has two items. (The whole order's rows never come back:
// a removed row's id gets a new generation.)
func (o *nameOrder) insertID(pfx namePfx, rid, gen uint32) {
	if len(o.dead) > 0 {
		if _, dead := o.dead[rowGen(rid, gen)]; dead {
			delete(o.dead, rowGen(rid, gen))
			return
		}
	}
	o.pending = append(o.pending, nameItem{pfx: pfx, rid: rid, gen: gen})
}

// remove records that a row is going, before its id's generation is
// bumped: its item dies in place.
func (o *nameOrder) remove(r *objRow) {
	o.removeID(r, o.x.gens[r.rid])
}

// removeID records that row r, of generation gen, leaves the order.
func (o *nameOrder) removeID(r *objRow, gen uint32) {
	o.dead[rowGen(r.rid, gen)] = deadRow{r: r, ns: o.x.namespaces.str(r.nsid)}
	id := r.rid & o.idMask
	w := int(id >> 6)
	if w >= len(o.deadIDs) {
		o.deadIDs = slices.Grow(o.deadIDs, w+1-len(o.deadIDs))[:w+1]
	}
	o.deadIDs[w] |= 1 << (id & 63)
}

// len returns the number of live rows.
func (o *nameOrder) len() int { return o.items + len(o.pending) - len(o.dead) }

// flush adds the rows inserted since the last flush, and compacts when
// dead items are many; the Store calls it before a write releases its
// lock.
func (o *nameOrder) flush() {
	o.addPending()
	if len(o.dead) > max(o.items/4, o.minCompact) {
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
		if n := len(o.runs); n > 0 && len(o.runs[n-1])+len(run) <= min(smallRun, o.maxRun) {
			o.runs[n-1] = o.mergeInto(o.runs[n-1], run)
		} else {
			o.runs = append(o.runs, run)
		}
		o.items += len(run)
		for n := len(o.runs); n >= 2 && len(o.runs[n-2]) <= 2*len(o.runs[n-1]) &&
			len(o.runs[n-2])+len(o.runs[n-1]) <= o.maxRun; n-- {
			o.runs[n-2] = o.merge(o.runs[n-2:])
			o.runs[n-1] = nil
			o.runs = o.runs[:n-1]
		}
	}
}

// smallRun is the size up to which the last run takes a write's items in
// place. A write of a few rows (an Upsert, a status change that moves a
// row between two cells' orders) otherwise added a run of its own and
// merged it up through every smaller run, allocating each: about 12
// copies of each item in a list's order.
const smallRun = 256

// mergeInto merges the sorted items of src into the sorted run dst, in
// place from the end, and returns the grown run. Readers never see a run
// while a write changes it: they hold the Store's read lock, and a walk
// that pauses seeks again.
func (o *nameOrder) mergeInto(dst, src []nameItem) []nameItem {
	i, j := len(dst)-1, len(src)-1
	dst = slices.Grow(dst, len(src))[:len(dst)+len(src)]
	for k := len(dst) - 1; j >= 0; k-- {
		if i >= 0 && o.compare(&dst[i], &src[j]) > 0 {
			dst[k] = dst[i]
			i--
		} else {
			dst[k] = src[j]
			j--
		}
	}
	return dst
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
	clear(o.deadIDs)
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
// is a row), until visit returns false. With within set, only items whose
// name prefix it holds are visited: the walk starts at its edge when that
// is past the pivot, and ends at its other edge. The rows of the write in
// progress are not visited.
//
// The runs' heads are merged through a binary heap, so a visited item
// costs about log2(runs) comparisons. A linear scan of the heads cost one
// comparison per run: at 10M rows (over 300 runs) a label-selector page
// that visits a few thousand items took 39 times its 1M time.
func (o *nameOrder) walk(pivot *nameSeek, within *pfxRange, desc bool, visit func(rid uint32) bool) {
	walkOrders([]*nameOrder{o}, pivot, within, desc, visit)
}

// walkOrders is walk over the union of orders, which hold no row twice
// (the orders of disjoint lists).
func walkOrders(orders []*nameOrder, pivot *nameSeek, within *pfxRange, desc bool, visit func(rid uint32) bool) {
	// Each cursor is the next index of its run to yield: counting up from
	// the first item at or after the pivot when ascending, down from the
	// last item at or before it when descending.
	m := runMerge{desc: desc}
	for _, o := range orders {
		for _, r := range o.runs {
			pos := 0
			switch {
			case pivot == nil && !desc:
			case pivot == nil:
				pos = len(r) - 1
			case !desc:
				pos = sort.Search(len(r), func(j int) bool { return o.compareSeek(&r[j], pivot) >= 0 })
			default:
				pos = sort.Search(len(r), func(j int) bool { return o.compareSeek(&r[j], pivot) > 0 }) - 1
			}
			switch {
			case within == nil:
			case !desc:
				pos = max(pos, sort.Search(len(r), func(j int) bool { return r[j].pfx.compare(within.lo) >= 0 }))
			default:
				pos = min(pos, sort.Search(len(r), func(j int) bool { return r[j].pfx.compare(within.hi) > 0 })-1)
			}
			if pos >= 0 && pos < len(r) {
				m.heads = append(m.heads, runHead{o: o, run: r, pos: pos})
			}
		}
	}
	m.init()
	for len(m.heads) > 0 {
		h := &m.heads[0]
		o, it := h.o, &h.run[h.pos]
		if within != nil && !within.holds(it.pfx) {
			return // the heads come in order: every later item is outside too
		}
		if desc {
			h.pos--
		} else {
			h.pos++
		}
		if h.pos < 0 || h.pos >= len(h.run) {
			last := len(m.heads) - 1
			m.heads[0] = m.heads[last]
			m.heads = m.heads[:last]
		}
		m.down(0)
		if o.live(it) && !visit(it.rid) {
			return
		}
	}
}

// runHead is a run of an order and the index of its next item in a
// merge.
type runHead struct {
	o   *nameOrder
	run []nameItem
	pos int
}

// runMerge is a binary heap of run heads, the next item of the order
// first.
type runMerge struct {
	desc  bool
	heads []runHead
}

// before reports whether head i's item comes before head j's in the walk.
func (m *runMerge) before(i, j int) bool {
	a, b := &m.heads[i], &m.heads[j]
	c := compareItems(a.o, &a.run[a.pos], b.o, &b.run[b.pos])
	return (!m.desc && c < 0) || (m.desc && c > 0)
}

func (m *runMerge) init() {
	for i := len(m.heads)/2 - 1; i >= 0; i-- {
		m.down(i)
	}
}

func (m *runMerge) down(i int) {
	for n := len(m.heads); ; {
		j := 2*i + 1
		if j >= n {
			return
		}
		if k := j + 1; k < n && m.before(k, j) {
			j = k
		}
		if !m.before(j, i) {
			return
		}
		m.heads[i], m.heads[j] = m.heads[j], m.heads[i]
		i = j
	}
}
