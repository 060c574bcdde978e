package index

// A large posting list of a (kind, status) cell or of a label pair also
// keeps its members in name order, in a nameOrder of its own (a list's
// order), so that a name-ordered page of such a list alone (the kind and
// status page of an admin, a label-selector page) seeks the cursor in the
// list's runs and visits the page's rows, and its total is the list's
// length. Without it the page either scans the whole list, comparing each
// member's name prefix (a cache miss a member: a label page of 14,430
// matches at 1M objects spent half its time there, 141,685 at 10M), or
// walks the whole index's name order, visiting about live/matches rows
// for each row of the page.
//
// A list gets its order when it reaches its family's threshold
// (cellOrderMin, labelOrderMin) and loses it below half that, so a list
// near the threshold does not build and drop its order on every write.
// Lists of label keys (selectors "k", "k>1"), clusters and namespaces keep
// none: the first are dense enough for the whole name order's walk, and
// the others are narrow enough to scan.
//
// An item costs 24 bytes (nameItem). Every row is in one cell, whose list
// has an order unless it is small. On the synthetic fleets (indextest)
// 0.02 of a row's label pairs are in lists of labelOrderMin rows or more
// at 100k objects, 0.21 at 1M and about 1.2 at 10M (at 2,048 they were 0,
// 0.05 and 0.5), so the label orders cost about 0.5, 5 and 29 bytes an
// object by that count, beside the cells' 24; fleetbench index measured
// both at 29 bytes an object at 1M when labels had 2,048 (heap 590 to 619
// bytes an object).
//
// Lists of label pairs are written on upsertBulk's label goroutine, beside
// the rest of the write, so their orders read the row id space through a
// rowView taken by the write's goroutine, and queue their new items; the
// write's end (flushLists) sorts and merges them, single-threaded.

// The sizes from which a list keeps a name order. Below them a
// name-ordered page scans the list's name prefixes and offers each member
// to a heap: 30-40 ns a member, at most about 20 µs, where a page from an
// order costs a few. The benchmark's kind-and-status page (Kustomizations
// UNHEALTHY: 731 rows at 1M objects) took half the time with its cell's
// order (loaded machine, p50 210 µs before, 105 µs after). Label pairs had
// 2,048, to keep their orders few, and compare's label page (app=v0) then
// cost 55 µs at 100k objects, where its 1,451 members had no order, and
// 7 µs at 1M, where its 14,430 had one.
const (
	cellOrderMin  = 512
	labelOrderMin = 512
)

// listOrderMaxRun bounds the runs of a list's order. A list's writes are
// a few items each, so merges up to maxMergedRun copied each item about
// 11 times, as much as the whole name order costs on ingest; a list of
// 141,685 rows (app=v0 at 10M objects) then has about 35 runs, and a seek
// a binary search in each.
const listOrderMaxRun = 1 << 12

// rowView is what indexing a row id reads of the row id space: its size,
// and each id's name prefix and generation. It is a copy of objIndex's
// slices, so that upsertBulk's label goroutine may read the ids of the
// rows handed to it while the write's goroutine appends new ones.
type rowView struct {
	maxRows int
	pfx     []namePfx
	gens    []uint32
}

// view returns the rowView of the index as it is now.
func (x *objIndex) view() rowView { return rowView{maxRows: len(x.rows), pfx: x.pfx, gens: x.gens} }

// listOrders holds the orders of one family of lists (cells or label
// pairs: each written by one goroutine at a time), by postings.ord.
type listOrders struct {
	min    int          // members from which a list has an order; tests lower it
	maxRun int          // listOrderMaxRun; tests lower it
	orders []*nameOrder // by ord-1; nil for a free slot
	free   []uint32     // free slots
	dirty  []*nameOrder // orders with queued items or dead items, to flush
}

// of returns the order of list p, or nil.
func (t *listOrders) of(p *postings) *nameOrder {
	if p == nil || p.ord == 0 {
		return nil
	}
	return t.orders[p.ord-1]
}

// added keeps p's order after rid joined p, and gives p an order when it
// has grown to t.min members.
func (t *listOrders) added(x *objIndex, p *postings, rid uint32, v rowView) {
	if o := t.of(p); o != nil {
		o.insertID(v.pfx[rid], rid, v.gens[rid])
		t.touch(o)
		return
	}
	if p.len() < t.min {
		return
	}
	o := newNameOrder(x)
	o.idMask, o.minCompact, o.maxRun = 1<<12-1, 16, t.maxRun
	p.each(func(id uint32) bool {
		o.insertID(v.pfx[id], id, v.gens[id])
		return true
	})
	if n := len(t.free); n > 0 {
		p.ord = t.free[n-1] + 1
		t.free = t.free[:n-1]
		t.orders[p.ord-1] = o
	} else {
		t.orders = append(t.orders, o)
		p.ord = uint32(len(t.orders))
	}
	t.touch(o)
}

// removed keeps p's order after row r, of generation gen, left p, and
// drops the order when p has shrunk below half of t.min.
func (t *listOrders) removed(p *postings, r *objRow, gen uint32) {
	o := t.of(p)
	if o == nil {
		return
	}
	if p.len() < max(t.min/2, 1) {
		// The order may be queued for a flush: empty, it flushes to
		// nothing, and no reader finds it.
		*o = nameOrder{x: o.x, dead: map[uint64]deadRow{}}
		t.orders[p.ord-1] = nil
		t.free = append(t.free, p.ord-1)
		p.ord = 0
		return
	}
	o.removeID(r, gen)
	t.touch(o)
}

// touch queues o for the write's flush.
func (t *listOrders) touch(o *nameOrder) {
	if !o.queued {
		o.queued = true
		t.dirty = append(t.dirty, o)
	}
}

// flush adds the queued items of every touched order to its runs.
func (t *listOrders) flush() {
	for _, o := range t.dirty {
		o.queued = false
		o.flush()
	}
	clear(t.dirty)
	t.dirty = t.dirty[:0]
}

// flushLists ends a write for the lists' orders; the write's label
// goroutine, if any, is done.
func (x *objIndex) flushLists() {
	x.cellOrders.flush()
	x.labelOrders.flush()
}

// orderOf returns the name orders of lists, or nil when one of them has
// none.
func orderOf(t *listOrders, lists []*postings) []*nameOrder {
	orders := make([]*nameOrder, 0, len(lists))
	for _, l := range lists {
		o := t.of(l)
		if o == nil {
			return nil
		}
		orders = append(orders, o)
	}
	return orders
}
