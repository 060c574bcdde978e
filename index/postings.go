package index

import (
	"math/bits"
	"slices"
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
// It is not safe for concurrent use; the Store's lock guards it.
type postings struct {
	ids []uint32 // two or more members, without bm
	bm  *bitmap
	one uint32 // the only member plus one, or 0
	// ord is the list's name order in its listOrders plus one, or 0 (in
	// what was padding: a label pair still costs 48 bytes).
	ord uint32
}

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
	if p.bm != nil {
		return p.bm.n
	}
	if p.one != 0 {
		return 1
	}
	return len(p.ids)
}

// add inserts id; maxRows is the current size of the row id space.
func (p *postings) add(id uint32, maxRows int) {
	if p.bm != nil {
		p.bm.set(id)
		return
	}
	switch {
	case p.ids == nil && p.one == 0:
		p.one = id + 1
		return
	case p.one == id+1:
		return
	case p.one != 0:
		p.ids, p.one = []uint32{min(p.one-1, id), max(p.one-1, id)}, 0
		return
	}
	if n := len(p.ids); n == 0 || p.ids[n-1] < id {
		p.ids = append(p.ids, id)
	} else {
		i, found := slices.BinarySearch(p.ids, id)
		if found {
			return
		}
		p.ids = slices.Insert(p.ids, i, id)
	}
	if n := len(p.ids); n >= postingsMinDense && n > maxRows/postingsDenseDiv {
		p.toBits(maxRows)
	}
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
	if b := p.bm; b != nil {
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
	if p.one != 0 {
		if p.one == id+1 {
			p.one = 0
		}
		return
	}
	i, found := slices.BinarySearch(p.ids, id)
	if !found {
		return
	}
	p.ids = slices.Delete(p.ids, i, i+1)
	if len(p.ids) == 1 {
		p.one, p.ids = p.ids[0]+1, nil
	} else if cap(p.ids) > 64 && len(p.ids) < cap(p.ids)/4 {
		p.ids = slices.Clip(slices.Clone(p.ids))
	}
}

// has reports whether id is a member.
func (p *postings) has(id uint32) bool {
	if p == nil {
		return false
	}
	if b := p.bm; b != nil {
		w := int(id >> 6)
		return w < len(b.words) && b.words[w]&(1<<(id&63)) != 0
	}
	if p.one != 0 {
		return p.one == id+1
	}
	_, found := slices.BinarySearch(p.ids, id)
	return found
}

// each calls fn for every member in increasing order until fn returns
// false; it reports whether it ran to the end.
func (p *postings) each(fn func(uint32) bool) bool {
	if p == nil {
		return true
	}
	if b := p.bm; b != nil {
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
	if p.one != 0 {
		return fn(p.one - 1)
	}
	for _, id := range p.ids {
		if !fn(id) {
			return false
		}
	}
	return true
}

func (p *postings) toBits(maxRows int) {
	b := &bitmap{words: make([]uint64, 0, maxRows/64+1)}
	for _, id := range p.ids {
		b.set(id)
	}
	p.bm, p.ids = b, nil
}

func (p *postings) toIDs() {
	ids := make([]uint32, 0, p.len())
	p.each(func(id uint32) bool { ids = append(ids, id); return true })
	p.ids, p.bm = ids, nil
}
