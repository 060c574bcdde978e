package index

import (
	"hash/maphash"
	"strings"
	"sync"
	"unsafe"
)

// pageCache keeps what pages returned lately, so that a page of rows seen
// recently builds nothing:
//
//   - the Object of each row, by row. Rows are immutable (an update builds
//     a new objRow), and an Object holds only the row's fields and the
//     strings its dictionary ids resolved to, so a kept Object stays the
//     row's for as long as anything can reach the row. Filling 100 Objects
//     of 288 bytes (a 32 KB allocation, zeroed, then written with a write
//     barrier per pointer while the collector runs) was about half the CPU
//     of a 100-row page at 1M objects once the labels were shared, and
//     most of its bytes.
//   - the Labels map of each label set, by objRow.labelBytes (equal strings
//     mean equal labels), for the Objects it builds: building one cost
//     about half the CPU of a page before it was kept (a map and its group
//     allocated per row, and a pair, key and value lookup per label, each a
//     likely cache miss), and rows with equal labels (the pods of one
//     ReplicaSet) share one.
//
// Both are shared by every page that got them, so callers must not mutate
// them (see Object). The Objects are a table of pageObjectSets sets of two
// entries, the set picked by the row id, most recently used first: a
// lookup is one array load and a pointer compare, where a map of rows
// cost a page of new rows about 0.5 µs a row at 1M objects to look up and
// keep. A page allocates its new Objects in one slab, which stays alive
// while any of them is kept, so the table also counts the bytes of the
// slabs it keeps alive and drops every entry when they pass
// pageObjectsBytes (when evictions left many slabs nearly unused). The
// label maps are a table of the same shape, pageSetSets sets of two
// entries picked by a hash of the label bytes: two Go maps of label sets
// (generations of 4,000) cost a page of random rows, whose sets are
// mostly new, about 3 µs of its 20 at 1M objects, in hashing, probing and
// growing maps whose entries were out of cache. So the cache's own memory
// is about 5 MB at most (the tables, up to 4.7 MB of Objects, 8,192 maps),
// but it bounds rows, not bytes: a kept Object keeps its row's data, owner references
// and message alive until dropped, updated or deleted rows' too (about
// 16,000 rows, 10-15 MB on the synthetic fleet, more with large rows).
// RemoveCluster drops every kept Object (dropObjects), so that an
// offboarded cluster's rows do not stay. A label set's key is a copy, so
// it keeps no row alive.
//
// Pair ids are recycled, so a set's bytes can come to mean other labels:
// pids marks the pair ids of the sets kept since the last reset, and a
// commit that reclaims a marked pair drops every label map
// (labelDict.recycle, under the write lock, when no read can hold a row
// with the pair) by moving to a new epoch: maps kept in an earlier one are
// never found again, and go as new ones take their entries. Pairs of
// labels nobody paged lately are reclaimed on nearly every commit under
// label churn, and drop nothing. Kept Objects
// need no reset: a row that can be read still has the labels its Object
// shows.
//
// Reads hold the Store's read lock and may run at once, so pageCache has
// its own mutex: a page whose rows are all kept takes it once; a page
// with new rows takes it again to keep what it built outside it (or take
// the label maps another page kept meanwhile).
type pageCache struct {
	mu sync.Mutex
	// objs is the table of Objects: set i is objs[2i:2i+2], allocated
	// by the first page.
	objs []pageObject
	// slabBytes counts the bytes of the slabs objs keeps alive.
	slabBytes int
	// sets is the table of Labels maps: set i is sets[2i:2i+2], allocated
	// by the first page that keeps one, with seed.
	sets []pageSet
	seed maphash.Seed
	// epoch is the epoch of the maps that can be found (see resetSets).
	epoch uint32
	// pids has a bit per pair id, set for the ids of the kept sets (and
	// of sets dropped since the last reset).
	pids []uint64
}

// pageObject is a kept Object, its row and the slab it lives in.
type pageObject struct {
	r    *objRow
	o    *Object
	slab *objSlab
}

// pageSet is a kept Labels map, the label bytes it shows (a copy of
// objRow.labelBytes, so that it keeps no row alive), their hash and the
// epoch it was kept in.
type pageSet struct {
	hash  uint32
	epoch uint32
	set   string
	m     map[string]string
}

// objSlab is the Objects a page built, allocated at once.
type objSlab struct {
	objs []Object
	// kept counts the entries of pageCache.objs that hold one of objs.
	kept int
}

// bytes returns the size of the slab's Objects.
func (s *objSlab) bytes() int { return len(s.objs) * int(unsafe.Sizeof(Object{})) }

// pageSetSets is the number of sets of the label maps' table (8,192
// maps, 256 KB of entries), as many as the Objects' table holds.
const pageSetSets = 4096

// pageObjectSets is the number of sets of the Objects' table (8,192
// Objects, 196 KB of entries): two entries a set make it unlikely that
// rows of one page evict each other (three of a 100-row page in one set).
const pageObjectSets = 4096

// pageObjectsBytes bounds the bytes of the slabs the table keeps alive:
// as many Objects as it holds, in slabs at least half kept (about 4.7 MB).
const pageObjectsBytes = 2 * 2 * pageObjectSets * int(unsafe.Sizeof(Object{}))

// pageObjects sets the Object of edges[i] to the one of rows[i], kept or
// built (and kept), under the read lock.
func (x *objIndex) pageObjects(edges []Edge, rows []*objRow) {
	c := &x.labels.cache
	var missBuf [128]int32
	var setBuf [128]map[string]string
	miss, sets := missBuf[:0], setBuf[:0]
	c.mu.Lock()
	for i, r := range rows {
		if o := c.object(r); o != nil {
			edges[i].Object = o
			continue
		}
		miss = append(miss, int32(i))
		sets = append(sets, c.set(r.labelBytes()))
	}
	c.mu.Unlock()
	if len(miss) == 0 {
		return
	}
	// The label pairs of every row to build are read first, in one pass
	// whose cache misses overlap (see appendPairs).
	var kvBuf [512]pairKV
	kvs := kvBuf[:0]
	for j, i := range miss {
		if sets[j] == nil {
			kvs = x.labels.appendPairs(kvs, rows[i])
		}
	}
	slab := &objSlab{objs: make([]Object, len(miss))}
	for j, i := range miss {
		o := &slab.objs[j]
		x.fillFields(o, rows[i])
		if o.Labels = sets[j]; o.Labels == nil {
			n := rows[i].numLabels()
			o.Labels, kvs = x.labels.labelMapOf(kvs[:n]), kvs[n:]
		}
	}
	c.mu.Lock()
	for j, i := range miss {
		r, o := rows[i], &slab.objs[j]
		if sets[j] == nil && o.Labels != nil {
			// An earlier row of the page, or another page meanwhile, may
			// have kept a map of the same set: share that one.
			o.Labels = c.keepSet(r, o.Labels)
		}
		c.putObject(pageObject{r: r, o: o, slab: slab})
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

// labelSet returns the entries of the label maps' table that may hold
// the map of label bytes set, and the hash they are kept under; nil
// entries when the table has none yet.
func (c *pageCache) labelSet(set string) ([]pageSet, uint32) {
	if c.sets == nil {
		return nil, 0
	}
	h := maphash.String(c.seed, set)
	i := 2 * int(h%pageSetSets)
	return c.sets[i : i+2 : i+2], uint32(h >> 32)
}

// set returns the kept map of the label bytes set, nil when it has none
// (or set is empty).
func (c *pageCache) set(set string) map[string]string {
	if set == "" {
		return nil
	}
	es, h := c.labelSet(set)
	for i := range es {
		if e := &es[i]; e.m != nil && e.epoch == c.epoch && e.hash == h && e.set == set {
			if i == 1 {
				es[0], es[1] = es[1], es[0]
			}
			return es[0].m
		}
	}
	return nil
}

// keepSet returns the kept map of r's labels if there is one, else keeps
// m, a new map of them, and returns it.
func (c *pageCache) keepSet(r *objRow, m map[string]string) map[string]string {
	if kept := c.set(r.labelBytes()); kept != nil {
		return kept
	}
	if c.sets == nil {
		c.sets, c.seed = make([]pageSet, 2*pageSetSets), maphash.MakeSeed()
	}
	c.mark(r)
	es, h := c.labelSet(r.labelBytes())
	kept := pageSet{hash: h, epoch: c.epoch, set: strings.Clone(r.labelBytes()), m: m}
	if e := es[0]; e.m == nil || e.epoch != c.epoch {
		es[0] = kept // an entry of an earlier epoch goes before a current one
	} else {
		es[1], es[0] = es[0], kept
	}
	return m
}

// mark sets the bits of the pair ids of r's labels.
func (c *pageCache) mark(r *objRow) {
	ls := r.labels()
	for i := range ls.len() {
		pid := ls.at(i)
		w := int(pid >> 6)
		if w >= len(c.pids) {
			c.pids = append(c.pids, make([]uint64, w+1-len(c.pids))...)
		}
		c.pids[w] |= 1 << (pid & 63)
	}
}

// holds reports whether a kept set may have pair pid, under the write
// lock.
func (c *pageCache) holds(pid uint32) bool {
	w := int(pid >> 6)
	return w < len(c.pids) && c.pids[w]&(1<<(pid&63)) != 0
}

// resetSets drops every label map, by moving to a new epoch rather than
// clearing the table: a commit may do it under the write lock, and
// entries of earlier epochs are never found again. (After 2^32 epochs the
// table is cleared, so that no entry comes back to the current one.)
func (c *pageCache) resetSets() {
	c.mu.Lock()
	if c.epoch++; c.epoch == 0 {
		clear(c.sets)
	}
	clear(c.pids)
	c.mu.Unlock()
}
