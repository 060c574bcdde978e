package index

import (
	"sync"
	"unsafe"
)

// pageCache keeps the Object of each row that pages returned lately, so
// that a page of rows seen recently builds nothing. Rows are immutable (an
// update builds a new objRow), and an Object holds only the row's fields
// and the strings its dictionary ids resolved to, so a kept Object stays
// the row's for as long as anything can reach the row. Filling 100
// Objects of about 300 bytes (a 32 KB allocation, zeroed, then written
// with a write barrier per pointer while the collector runs) was about
// half the CPU of a 100-row page at 1M objects once the labels were
// shared, and most of its bytes.
//
// Kept Objects are shared by every page that got them, so callers must
// not mutate them (see Object). They are a table of pageObjectSets sets of
// two entries, the set picked by the row id, most recently used first: a
// lookup is one array load and a pointer compare, where a map of rows
// cost a page of new rows about 0.5 µs a row at 1M objects to look up and
// keep. A page allocates its new Objects in one slab, and their Labels in
// one array beside it, which stay alive while any of them is kept, so the
// table also counts the bytes of the slabs it keeps alive and drops every
// entry when they pass pageObjectsBytes (when evictions left many slabs
// nearly unused). So the cache's own memory is about 5 MB (the table and
// up to 4.9 MB of Objects) plus the label arrays of the pages whose
// Objects it keeps, which it does not count (see objSlab.bytes): on the
// synthetic fleet about as many bytes again, but one kept Object keeps its
// whole page's array, so rows of many labels (128 labels are 4 KB of
// array a row) can make that tens of MB. Beyond that it bounds rows, not
// bytes: a kept Object keeps its row's data, owner references and
// message alive until dropped, updated or deleted rows' too (about 16,000
// rows, 10-15 MB on the synthetic fleet, more with large rows).
// RemoveCluster drops every kept Object (dropObjects), so that an
// offboarded cluster's rows do not stay.
//
// Labels are built from the dictionary's strings into the page's one
// array (see pageObjects); rows that share a label set share strings, not
// arrays.
//
// Reads hold the Store's read lock and may run at once, so pageCache has
// its own mutex: a page whose rows are all kept takes it once; a page
// with new rows takes it again to keep what it built outside it.
type pageCache struct {
	mu sync.Mutex
	// objs is the table of Objects: set i is objs[2i:2i+2], allocated
	// by the first page.
	objs []pageObject
	// slabBytes counts the bytes of the slabs objs keeps alive.
	slabBytes int
}

// pageObject is a kept Object, its row and the slab it lives in.
type pageObject struct {
	r    *objRow
	o    *Object
	slab *objSlab
}

// objSlab is the Objects a page built, allocated at once.
type objSlab struct {
	objs []Object
	// kept counts the entries of pageCache.objs that hold one of objs.
	kept int
}

// bytes returns the size of the slab's Objects. Their page's label array
// (about as many bytes again on the synthetic fleet, 32 bytes a label) is
// not counted: it follows the Objects, as the Labels maps they held did,
// and stays alive while any of them is kept (review-s10-index L6).
func (s *objSlab) bytes() int { return len(s.objs) * int(unsafe.Sizeof(Object{})) }

// pageObjectSets is the number of sets of the Objects' table (8,192
// Objects, 196 KB of entries): two entries a set make it unlikely that
// rows of one page evict each other (three of a 100-row page in one set).
const pageObjectSets = 4096

// pageObjectsBytes bounds the bytes of the slabs the table keeps alive:
// as many Objects as it holds, in slabs at least half kept (about 4.9 MB).
const pageObjectsBytes = 2 * 2 * pageObjectSets * int(unsafe.Sizeof(Object{}))

// pageObjects sets the Object of edges[i] to the one of rows[i], kept or
// built (and kept), under the read lock.
//
// The Labels of the rows it builds share one array, in the page's order,
// each row's sorted by key: one allocation for the page, where a map per
// row cost two and a hashed insert per label, and a table of maps by
// label set, kept so that rows with equal labels shared one, cost as much
// again to look up and fill, since on a page of random rows every set is
// new. On compare's Q2 page (about 4 new rows at 1M objects) that took
// pageObjects from 11.8 to 6.8 µs of CPU and the page from 34 to 27
// allocations (profiles, loaded machine).
func (x *objIndex) pageObjects(edges []Edge, rows []*objRow) {
	c := &x.labels.cache
	var missBuf [128]int32
	miss := missBuf[:0]
	c.mu.Lock()
	for i, r := range rows {
		if o := c.object(r); o != nil {
			edges[i].Object = o
			continue
		}
		miss = append(miss, int32(i))
	}
	c.mu.Unlock()
	if len(miss) == 0 {
		return
	}
	// The label pairs of every row to build are read first, in one pass
	// whose cache misses overlap (see appendPairs).
	var kvBuf [512]pairKV
	kvs := kvBuf[:0]
	for _, i := range miss {
		kvs = x.labels.appendPairs(kvs, rows[i])
	}
	slab := &objSlab{objs: make([]Object, len(miss))}
	labels := make([]labelKV, len(kvs))
	for j, i := range miss {
		o := &slab.objs[j]
		x.fillFields(o, rows[i])
		n := rows[i].numLabels()
		o.Labels = x.labels.labelsOf(labels[:n:n], kvs[:n])
		labels, kvs = labels[n:], kvs[n:]
	}
	c.mu.Lock()
	for j, i := range miss {
		o := &slab.objs[j]
		c.putObject(pageObject{r: rows[i], o: o, slab: slab})
		edges[i].Object = o
	}
	c.mu.Unlock()
}

// objectSet returns the set of the table that may hold row r.
func (c *pageCache) objectSet(r *objRow) []pageObject {
	i := 2 * int(r.rid%pageObjectSets)
	return c.objs[i : i+2 : i+2]
}

// object returns the kept Object of row r, nil when it has none.
func (c *pageCache) object(r *objRow) *Object {
	if c.objs == nil {
		return nil
	}
	set := c.objectSet(r)
	if set[0].r == r {
		return set[0].o
	}
	if set[1].r == r {
		set[0], set[1] = set[1], set[0]
		return set[0].o
	}
	return nil
}

// putObject keeps po, in place of the least recently used entry of its
// set or of an entry of the same row (kept by another page meanwhile).
func (c *pageCache) putObject(po pageObject) {
	if c.objs == nil {
		c.objs = make([]pageObject, 2*pageObjectSets)
	}
	set := c.objectSet(po.r)
	if set[0].r == po.r {
		set[0], set[1] = set[1], set[0]
	}
	c.release(&set[1])
	set[1], set[0] = set[0], po
	if po.slab.kept == 0 {
		c.slabBytes += po.slab.bytes()
	}
	po.slab.kept++
	if c.slabBytes > pageObjectsBytes {
		c.releaseObjects()
	}
}

// releaseObjects empties the table.
func (c *pageCache) releaseObjects() {
	for i := range c.objs {
		c.release(&c.objs[i])
	}
}

// dropObjects drops every kept Object, under the write lock: RemoveCluster
// calls it, so that a removed cluster's rows, with their data, owner
// references, messages and labels, are not kept alive until other pages
// evict them (on a quiet hub, never). It costs a pass over the table
// (8,192 entries), which a cluster's removal can afford, and the next
// pages build their Objects again.
func (c *pageCache) dropObjects() {
	c.mu.Lock()
	c.releaseObjects()
	c.mu.Unlock()
}

// release empties an entry of the table.
func (c *pageCache) release(po *pageObject) {
	if po.slab == nil {
		return
	}
	if po.slab.kept--; po.slab.kept == 0 {
		c.slabBytes -= po.slab.bytes()
	}
	*po = pageObject{}
}
