package index

import (
	"math/bits"
	"slices"
	"unsafe"
)

// Posting list representation thresholds. A sorted uint32 array costs 4
// bytes per member; a bitmap costs maxRowID/8 bytes whatever the size. Lists
// switch to a bitmap when it is smaller than the array and back with a
// margin, so a list near the threshold does not flip on every write.
const (
	postingsMinDense = 1 << 12 // never use a bitmap for fewer members
	postingsDenseDiv = 32      // bitmap when members > rows/32
)

// postings is a set of row ids: a sorted array when sparse, a bitmap when
// dense, and the id itself when it has one member. It is the building
// block of the label, kind/status, cluster and namespace indexes. Adding a
// row is usually an append (row ids are allocated mostly in increasing
// order) and a member costs 4 bytes or less. Nearly half of the 1.7M label
// pairs of the 1M-object fleet are on one object; holding that member in
// the struct spares the garbage collector 750k tiny arrays to mark.
//
// The struct is 24 bytes, not the 40 of a slice, a bitmap pointer and the
// one member: one pointer is the array's first element or the bitmap, and
// the counts say which. A label pair holds one (32 bytes a pair, not 48:
// about 27 MB at 1M objects).
//
// It is not safe for concurrent use; the Store's lock guards it.
type postings struct {
	// ptr is nil for no member or one, the first element of the sorted
	// array of n members and capacity c, or the *bitmap when c is dense.
	ptr unsafe.Pointer
	n   uint32 // members, but for a bitmap (bitmap.n)
	c   uint32 // the array's capacity, dense, or the member when n is 1 and ptr nil
	// ord is the list's name order in its listOrders plus one, or 0.
	ord uint32
}

// dense is postings.c for a bitmap; no array has that capacity.
const dense = ^uint32(0)

// bitmap returns the bitmap of a dense list, nil for another.
func (p *postings) bitmap() *bitmap {
	if p.c == dense {
		return (*bitmap)(p.ptr)
	}
	return nil
}

// ids returns the array of a list of two or more members, nil for another.
func (p *postings) ids() []uint32 {
	if p.ptr == nil || p.c == dense {
		return nil
	}
	return unsafe.Slice((*uint32)(p.ptr), p.c)[:p.n]
}

// setIDs makes ids, two or more members, the list's array.
func (p *postings) setIDs(ids []uint32) {
	p.ptr, p.n, p.c = unsafe.Pointer(unsafe.SliceData(ids)), uint32(len(ids)), uint32(cap(ids))
}

// setOne makes id the list's only member.
func (p *postings) setOne(id uint32) { p.ptr, p.n, p.c = nil, 1, id }

// bitmap is the dense form of postings.
type bitmap struct {
	words []uint64
	n     int
}

// len returns the number of members.
func (p *postings) len() int {
	if p == nil {
		return 0
	}
	if bm := p.bitmap(); bm != nil {
		return bm.n
	}
	return int(p.n)
}

// add inserts id; maxRows is the current size of the row id space.
func (p *postings) add(id uint32, maxRows int) {
	if bm := p.bitmap(); bm != nil {
		bm.set(id)
		return
	}
	switch {
	case p.n == 0:
		p.setOne(id)
		return
	case p.ptr == nil && p.c == id:
		return
	case p.ptr == nil:
		p.setIDs([]uint32{min(p.c, id), max(p.c, id)})
		return
	}
	ids := p.ids()
	i, found := len(ids), false
	if ids[i-1] >= id {
		if i, found = slices.BinarySearch(ids, id); found {
			return
		}
	}
	if len(ids) == cap(ids) {
		ids = growIDs(ids)
	}
	ids = slices.Insert(ids, i, id)
	p.setIDs(ids)
	if n := len(ids); n >= postingsMinDense && n > maxRows/postingsDenseDiv {
		p.toBits(maxRows)
	}
}

// growIDs returns a copy of the full array ids with room for an eighth
// more (one more at least), rounded up to its allocation size class (which
// slices.Grow of a nil slice does). append doubles a small slice instead,
// so arrays were on average about three quarters full: at 100k objects the
// posting arrays took 43.9 bytes an object for 33.5 of ids, against 36.4
// for arrays of the smallest size class that holds them. Copying an eighth
// more each time copies each id about 8 times over an array's growth,
// against 2 when doubling: a few tens of milliseconds of memmove at 1M
// objects.
func growIDs(ids []uint32) []uint32 {
	n := len(ids)
	return append(slices.Grow([]uint32(nil), n+max(1, n/8)), ids...)
}

func (b *bitmap) set(id uint32) {
	w := int(id >> 6)
	if w >= len(b.words) {
		b.words = slices.Grow(b.words, w+1-len(b.words))[:w+1]
	}
	m := uint64(1) << (id & 63)
	if b.words[w]&m == 0 {
		b.words[w] |= m
		b.n++
	}
}

// remove deletes id if present.
func (p *postings) remove(id uint32) {
	if b := p.bitmap(); b != nil {
		w := int(id >> 6)
		if w >= len(b.words) {
			return
		}
		m := uint64(1) << (id & 63)
		if b.words[w]&m != 0 {
			b.words[w] &^= m
			b.n--
			if b.n < postingsMinDense/2 {
				p.toIDs()
			}
		}
		return
	}
	if p.ptr == nil {
		if p.n == 1 && p.c == id {
			p.n, p.c = 0, 0
		}
		return
	}
	ids := p.ids()
	i, found := slices.BinarySearch(ids, id)
	if !found {
		return
	}
	ids = slices.Delete(ids, i, i+1)
	switch {
	case len(ids) == 1:
		p.setOne(ids[0])
	case cap(ids) > 64 && len(ids) < cap(ids)/4:
		p.setIDs(slices.Clone(ids)) // Clone rounds up to the size class: keep that room
	default:
		p.setIDs(ids)
	}
}

// has reports whether id is a member.
func (p *postings) has(id uint32) bool {
	if p == nil {
		return false
	}
	if b := p.bitmap(); b != nil {
		w := int(id >> 6)
		return w < len(b.words) && b.words[w]&(1<<(id&63)) != 0
	}
	if p.ptr == nil {
		return p.n == 1 && p.c == id
	}
	_, found := slices.BinarySearch(p.ids(), id)
	return found
}

// each calls fn for every member in increasing order until fn returns
// false; it reports whether it ran to the end.
func (p *postings) each(fn func(uint32) bool) bool {
	if p == nil {
		return true
	}
	if b := p.bitmap(); b != nil {
		for w, word := range b.words {
			for word != 0 {
				i := bits.TrailingZeros64(word)
				if !fn(uint32(w<<6 | i)) {
					return false
				}
				word &= word - 1
			}
		}
		return true
	}
	if p.ptr == nil {
		return p.n == 0 || fn(p.c)
	}
	for _, id := range p.ids() {
		if !fn(id) {
			return false
		}
	}
	return true
}

func (p *postings) toBits(maxRows int) {
	b := &bitmap{words: make([]uint64, 0, maxRows/64+1)}
	for _, id := range p.ids() {
		b.set(id)
	}
	p.ptr, p.n, p.c = unsafe.Pointer(b), 0, dense
}

func (p *postings) toIDs() {
	ids := make([]uint32, 0, p.len())
	p.each(func(id uint32) bool { ids = append(ids, id); return true })
	p.setIDs(ids)
}
