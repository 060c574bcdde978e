package index

import (
	"cmp"
	"encoding/binary"
	"strings"

	"github.com/google/btree"
)

// nameOrder keeps every row in (name, key) order for name-ordered pages
// that walk the order instead of sorting a source (see plan.run).
//
// Its items are small pointer-free values, not row pointers: the first 16
// bytes of the name as two numbers, and the row id. Inserting into or
// seeking a B-tree of a million rows takes about twenty comparisons. When
// each one loaded two rows and then their keys (cache misses all) an insert
// cost about 4 µs, the largest part of ingest; now most comparisons read
// only the node's own array (about 2 µs, of which half is the tree itself),
// and rows are loaded only for names that share their first 16 bytes.
// Pointer-free items also spare the garbage collector from scanning the
// tree and moving items from write barriers.
//
// Items name rows by id, so replacing a row (same key, same id) leaves the
// tree alone; a row's item is removed before its id is freed.
type nameOrder struct {
	t *btree.BTreeG[nameItem]
}

// nameItem is one entry of the name order.
type nameItem struct {
	pfx namePfx
	rid uint32
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
	switch {
	case p.hi != q.hi:
		return cmp.Compare(p.hi, q.hi)
	case p.lo != q.lo:
		return cmp.Compare(p.lo, q.lo)
	}
	return 0
}

// Seek row ids: items that sort before (seekLow) or after (seekHigh)
// every row whose name has the same prefix. They position a walk whose
// cursor row no longer exists.
const (
	seekLow  = ^uint32(0)
	seekHigh = ^uint32(0) - 1
)

// nameOrderDegree is the B-tree degree. Measured at 500k rows, 32 was the
// fastest to insert into (16: same, 64: 15% slower, 8: 40% slower); nodes
// of 31–63 items keep it at 4–5 levels for ~30 bytes per row.
const nameOrderDegree = 32

func newNameOrder(x *objIndex) *nameOrder {
	return &nameOrder{t: btree.NewG(nameOrderDegree, func(a, b nameItem) bool {
		if c := a.pfx.compare(b.pfx); c != 0 {
			return c < 0
		}
		if a.rid == b.rid {
			return false
		}
		switch {
		case a.rid == seekLow || b.rid == seekHigh:
			return true
		case a.rid == seekHigh || b.rid == seekLow:
			return false
		}
		return compareByName(x.rows[a.rid], x.rows[b.rid]) < 0
	})}
}

// compareByName orders rows by name, then key.
func compareByName(a, b *objRow) int {
	if c := strings.Compare(a.name(), b.name()); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}

// insert adds a row that is already in x.rows.
func (o *nameOrder) insert(pfx namePfx, rid uint32) {
	o.t.ReplaceOrInsert(nameItem{pfx: pfx, rid: rid})
}

// remove deletes a row while it is still in x.rows.
func (o *nameOrder) remove(pfx namePfx, rid uint32) {
	o.t.Delete(nameItem{pfx: pfx, rid: rid})
}

// len returns the number of rows.
func (o *nameOrder) len() int { return o.t.Len() }

// walk calls visit with row ids in name order, ascending or descending,
// from the start or from pivot (included when it is a row), until visit
// returns false.
func (o *nameOrder) walk(pivot *nameItem, desc bool, visit func(rid uint32) bool) {
	it := func(i nameItem) bool { return visit(i.rid) }
	switch {
	case pivot == nil && !desc:
		o.t.Ascend(it)
	case pivot == nil:
		o.t.Descend(it)
	case !desc:
		o.t.AscendGreaterOrEqual(*pivot, it)
	default:
		o.t.DescendLessOrEqual(*pivot, it)
	}
}
