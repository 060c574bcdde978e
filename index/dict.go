package index

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Reclaiming dictionary ids.
//
// The index keeps numeric ids in rows, posting lists and change events
// instead of strings, so a dictionary entry may only go once nothing can
// read its id any more. Without that, an edge (or a churning cluster) that
// sends fresh label values, label keys or namespaces grows the
// dictionaries forever, a few dozen bytes per string, however few rows it
// keeps. So the namespace and label dictionaries count the uses of each id
// and recycle an id in three steps:
//
//  1. Zero. A write that drops an id's count to zero (the last row of a
//     namespace or the last row carrying a label pair goes) lists it as a
//     candidate. At the end of the write's commit, a candidate still at
//     zero is unmapped: its string no longer finds it, so a later intern
//     of the same string gets another id, while the id still resolves to
//     its string for whoever holds it.
//  2. Retired. An unmapped id waits, stamped with the last sequence number
//     of that commit and the Store's dictionary epoch (bumped by every
//     commit that unmaps). Two kinds of holders can still resolve it: a
//     change event of that commit or an earlier one (events hold rows,
//     rows hold ids), and a long read that released the read lock in a
//     pause (see pacer) after it looked ids up. The id is reclaimed once
//     the change feed has dropped every event up to its stamp, and every
//     paused read in flight began after it was unmapped. Subscriptions
//     resolve the events they deliver under the read lock (see
//     Subscription.Next), so an event copied out of the feed never
//     resolves an id later.
//  3. Free. Reclaimed ids are reused by the next new strings.
//
// A label pair counts as used while a row carries it (its posting list is
// the count); a label key or value while a pair that is not yet free
// refers to it, so that a retired pair still resolves. Kinds are recycled
// the same way (see kindDict), by the paused-read rule only: rows point at
// their kindInfo, so no event resolves a kind through an id. Clusters are
// not reclaimed: they are the operator's (an edge speaks for one).
//
// Every id a write interns is used by a row of that write (rows are
// validated before anything is interned), so new ids need no candidate
// check.
type recycler struct {
	zero    []uint32    // ids whose count reached zero in this write
	retired []retiredID // unmapped ids, in stamp order
	free    []uint32    // reclaimed ids, reused by the next new strings
}

// retiredID is an unmapped id waiting until nothing can resolve it.
type retiredID struct {
	id uint32
	// seq is the last sequence number of the commit that unmapped it (0
	// for ids no event refers to directly), epoch the Store's dictionary
	// epoch after that commit.
	seq, epoch uint64
}

// reclaimable reports whether an id retired as r may be reused, given the
// oldest sequence number the change feed still holds and the epoch the
// oldest paused read began in.
func (r retiredID) reclaimable(feedFirst, oldestRead uint64) bool {
	return r.seq < feedFirst && r.epoch <= oldestRead
}

// reclaim moves the retired ids that nothing can resolve any more to the
// free list, calling fn for each first.
func (rc *recycler) reclaim(feedFirst, oldestRead uint64, fn func(id uint32)) {
	n := 0
	for n < len(rc.retired) && rc.retired[n].reclaimable(feedFirst, oldestRead) {
		id := rc.retired[n].id
		if fn != nil {
			fn(id)
		}
		rc.free = append(rc.free, id)
		n++
	}
	if n > 0 {
		rc.retired = slices.Delete(rc.retired, 0, n)
	}
}

// unmapZero retires the candidates still unused: unused reports whether an
// id's count is zero and unmap removes it from its map, returning false
// when it was not mapped (a candidate listed twice). It returns how many
// it retired.
func (rc *recycler) unmapZero(seq, epoch uint64, unused func(uint32) bool, unmap func(uint32) bool) int {
	n := 0
	for _, id := range rc.zero {
		if unused(id) && unmap(id) {
			rc.retired = append(rc.retired, retiredID{id: id, seq: seq, epoch: epoch})
			n++
		}
	}
	rc.zero = rc.zero[:0]
	return n
}

// pop returns a free id, if any.
func (rc *recycler) pop() (uint32, bool) {
	n := len(rc.free)
	if n == 0 {
		return 0, false
	}
	id := rc.free[n-1]
	rc.free = rc.free[:n-1]
	return id, true
}

// strDict interns strings as dense ids. The index keeps numeric ids in rows
// and posting lists instead of strings: a cluster, namespace or label is
// stored once however many rows use it.
//
// A dictionary that counts its uses (ref, unref) recycles ids whose count
// fell to zero (see recycler); one that does not (clusters) keeps every
// string for the life of the Store.
type strDict struct {
	ids  map[string]uint32
	strs []string // by id; an unmapped id keeps its string until reused
	refs []uint32 // uses by id, for dictionaries that count them
	rc   recycler
	// assigned counts the ids given a string (new or reused) and unmapped
	// the ids unmapped: caches of ids (sorted, accessIDs) are valid while
	// both are unchanged.
	assigned, unmapped uint64
	// sorted caches the ids in string order for facets; inOrder rebuilds
	// it when strings were added. Readers share it under the Store's read
	// lock, so sortMu serializes the rebuild.
	sortMu sync.Mutex
	sorted atomic.Pointer[sortedIDs]
	// last and lastID cache the last interned string: rows arrive grouped
	// by cluster and namespace, so most interns are a string comparison
	// instead of a hashed lookup. Only intern (under the write lock) uses
	// them.
	last    string
	lastID  uint32
	hasLast bool
}

// sortedIDs is the ids in string order as of assigned.
type sortedIDs struct {
	ids      []uint32
	assigned uint64
}

func newStrDict() *strDict {
	return &strDict{ids: map[string]uint32{}}
}

// intern returns the id of s, adding it when new: a free id if there is
// one.
func (d *strDict) intern(s string) uint32 {
	if d.hasLast && s == d.last {
		return d.lastID
	}
	id, ok := d.ids[s]
	if !ok {
		s = cloneString(s)
		if id, ok = d.rc.pop(); ok {
			d.strs[id], d.refs[id] = s, 0
		} else {
			id = uint32(len(d.strs))
			d.strs = append(d.strs, s)
			d.refs = append(d.refs, 0)
		}
		d.ids[s] = id
		d.assigned++
	}
	d.last, d.lastID, d.hasLast = d.strs[id], id, true
	return id
}

// ref counts one more use of id.
func (d *strDict) ref(id uint32) { d.refs[id]++ }

// uses returns how many uses of id are counted.
func (d *strDict) uses(id uint32) int { return int(d.refs[id]) }

// unref counts one use of id less, listing it as a candidate for
// retirement when that was the last.
func (d *strDict) unref(id uint32) {
	if d.refs[id]--; d.refs[id] == 0 {
		d.rc.zero = append(d.rc.zero, id)
	}
}

// unmapZero retires the ids whose count is still zero (see recycler),
// stamped seq and epoch; it returns how many.
func (d *strDict) unmapZero(seq, epoch uint64) int {
	if len(d.rc.zero) == 0 {
		return 0
	}
	return d.rc.unmapZero(seq, epoch, func(id uint32) bool { return d.refs[id] == 0 }, func(id uint32) bool {
		s := d.strs[id]
		if cur, ok := d.ids[s]; !ok || cur != id {
			return false
		}
		delete(d.ids, s)
		d.unmapped++
		d.hasLast = false
		return true
	})
}

// reclaim frees the retired ids nothing can resolve any more (see
// recycler), dropping their strings.
func (d *strDict) reclaim(feedFirst, oldestRead uint64) {
	if len(d.rc.retired) > 0 {
		d.rc.reclaim(feedFirst, oldestRead, func(id uint32) { d.strs[id] = "" })
	}
}

// lookup returns the id of s if it is interned.
func (d *strDict) lookup(s string) (uint32, bool) {
	id, ok := d.ids[s]
	return id, ok
}

// str returns the string of id.
func (d *strDict) str(id uint32) string { return d.strs[id] }

// len returns the size of the id space: ids are below it.
func (d *strDict) len() int { return len(d.strs) }

// held returns how many strings the dictionary holds: interned, or
// retired and waiting to be reclaimed. It is what DictionaryStats reports.
func (d *strDict) held() int { return len(d.strs) - len(d.rc.free) }

// inOrder returns every id in string order. It must be called with the
// Store's lock held (read or write), so that no string is being added.
func (d *strDict) inOrder() []uint32 {
	if p := d.sorted.Load(); p != nil && p.assigned == d.assigned {
		return p.ids
	}
	d.sortMu.Lock()
	defer d.sortMu.Unlock()
	if p := d.sorted.Load(); p != nil && p.assigned == d.assigned {
		return p.ids
	}
	ids := make([]uint32, len(d.strs))
	for i := range ids {
		ids[i] = uint32(i)
	}
	slices.SortFunc(ids, func(a, b uint32) int { return strings.Compare(d.strs[a], d.strs[b]) })
	d.sorted.Store(&sortedIDs{ids: ids, assigned: d.assigned})
	return ids
}

// cloneString copies s so that an interned string does not pin the larger
// buffer (a decoded JSON document, a protobuf message) it was sliced from.
func cloneString(s string) string {
	if s == "" {
		return ""
	}
	return string([]byte(s))
}

// kindInfo is the interned description of one (group, version, kind,
// resource, scope) as rows carry it. Rows point at it, so version, resource
// and the group/resource pair used by access checks cost 8 bytes per row.
type kindInfo struct {
	Kind
	// kid identifies (group, kind, resource) regardless of version: it is
	// the unit of the kind filter, the count cells and the access checks
	// that work on cells (see kindDict).
	kid uint32
	gr  GroupResource
	// seq numbers the kindInfos interned (densely, reusing the seqs of
	// reclaimed ones); it indexes the kind sets of resolved access sets
	// (accessIDs).
	seq uint32
	// rows counts the rows that point at it (see recycler).
	rows int32
}

// kindDict interns kindInfo values and kind ids.
//
// A kid stands for a kind as one resource names it: (group, kind,
// resource). Each row's resource is the one its own cluster reported, and
// RBAC grants resources, so the count cells of a kid hold only rows that
// one access check decides alike. Normally a kind has one resource across
// the fleet and so one kid; a cluster that names it differently (its own
// CRD plural, or an edge that lies) gets a kid of its own, and can never
// change which resource another cluster's rows are checked against. The
// kind facet adds up the kids of one (group, kind).
//
// A kindInfo no row points at any more is unmapped at the end of the
// commit, and a kid once no kindInfo has it; their seq and kid are reused
// once no paused read that began before is in flight (see recycler).
// Rows and events point at their kindInfo, so its strings never go
// through an id and no event rule is needed.
type kindDict struct {
	infos map[Kind]*kindInfo
	// byName indexes the kindInfos by the ASCII lower case of their kind
	// and of their resource, so that a kinds filter finds its kinds
	// without comparing every kind name in the fleet; a kindInfo with a
	// non-ASCII kind or resource (whose case folding is Unicode's) is in
	// unfolded instead, checked by every filter (see markKinds).
	byName   map[string][]*kindInfo
	unfolded []*kindInfo

	last *kindInfo // the last interned kind: batches are mostly one kind
	kids map[kindKey]uint32
	// byKid, grOf and namespaced are indexed by kid; namespaced is set
	// once a row of the kind had a namespace.
	byKid      []groupKindName
	grOf       []GroupResource
	namespaced []bool
	// kidsOfGR inverts grOf, so that access checks by resource (named
	// grants) find their kinds without scanning every kind, and kidsOfGK
	// lists the kids of one (group, kind), for Replace.
	kidsOfGR map[GroupResource][]uint32
	kidsOfGK map[groupKindName][]uint32

	// infosOf counts, by kid, the kindInfos mapped with that kid.
	infosOf []uint32
	// zero lists the kindInfos whose rows reached zero in this write;
	// seqs and kidRC recycle seqs and kids, nextSeq is the next new seq.
	zero    []*kindInfo
	seqs    recycler
	kidRC   recycler
	nextSeq uint32
	// version changes whenever the set of kindInfos does: accessIDs built
	// against another version are stale.
	version uint64
}

// groupKindName is the (group, kind) pair that a kid is a kind of.
type groupKindName struct {
	Group string
	Kind  string
}

// kindKey is what a kid stands for.
type kindKey struct {
	groupKindName
	Resource string
}

// String returns "Kind" or "Kind.group", the filter and facet form.
func (g groupKindName) String() string {
	return Kind{Group: g.Group, Kind: g.Kind}.GroupKind()
}

func newKindDict() *kindDict {
	return &kindDict{
		infos: map[Kind]*kindInfo{}, byName: map[string][]*kindInfo{}, kids: map[kindKey]uint32{},
		kidsOfGR: map[GroupResource][]uint32{}, kidsOfGK: map[groupKindName][]uint32{},
	}
}

// intern returns the shared kindInfo for k.
func (d *kindDict) intern(k Kind) *kindInfo {
	if d.last != nil && d.last.Kind == k {
		return d.last
	}
	if ki, ok := d.infos[k]; ok {
		d.last = ki
		return ki
	}
	k = Kind{
		Group: cloneString(k.Group), Version: cloneString(k.Version), Kind: cloneString(k.Kind),
		Resource: cloneString(k.Resource), Namespaced: k.Namespaced,
	}
	gk := groupKindName{Group: k.Group, Kind: k.Kind}
	gr := GroupResource{Group: k.Group, Resource: k.Resource}
	kk := kindKey{groupKindName: gk, Resource: k.Resource}
	kid, ok := d.kids[kk]
	if !ok {
		kid = d.newKid(kk, gr)
	}
	d.namespaced[kid] = d.namespaced[kid] || k.Namespaced
	d.infosOf[kid]++
	seq, ok := d.seqs.pop()
	if !ok {
		seq = d.nextSeq
		d.nextSeq++
	}
	ki := &kindInfo{Kind: k, kid: kid, gr: gr, seq: seq}
	d.infos[k] = ki
	d.indexName(ki, true)
	d.last = ki
	d.version++
	return ki
}

// indexName adds ki to byName or unfolded, or removes it.
func (d *kindDict) indexName(ki *kindInfo, add bool) {
	if !isASCII(ki.Kind.Kind) || !isASCII(ki.Resource) {
		if add {
			d.unfolded = append(d.unfolded, ki)
		} else {
			d.unfolded = slices.DeleteFunc(d.unfolded, func(o *kindInfo) bool { return o == ki })
		}
		return
	}
	names := [2]string{strings.ToLower(ki.Kind.Kind), strings.ToLower(ki.Resource)}
	for i, name := range names {
		if i == 1 && name == names[0] {
			break
		}
		if add {
			d.byName[name] = append(d.byName[name], ki)
			continue
		}
		if l := slices.DeleteFunc(d.byName[name], func(o *kindInfo) bool { return o == ki }); len(l) > 0 {
			d.byName[name] = l
		} else {
			delete(d.byName, name)
		}
	}
}

// isASCII reports whether s has only ASCII characters.
func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// newKid gives kk a kid: a free one if there is one.
func (d *kindDict) newKid(kk kindKey, gr GroupResource) uint32 {
	gk := kk.groupKindName
	kid, ok := d.kidRC.pop()
	if ok {
		d.byKid[kid], d.grOf[kid], d.namespaced[kid], d.infosOf[kid] = gk, gr, false, 0
	} else {
		kid = uint32(len(d.byKid))
		d.byKid = append(d.byKid, gk)
		d.grOf = append(d.grOf, gr)
		d.namespaced = append(d.namespaced, false)
		d.infosOf = append(d.infosOf, 0)
	}
	d.kids[kk] = kid
	d.kidsOfGR[gr] = append(d.kidsOfGR[gr], kid)
	d.kidsOfGK[gk] = append(d.kidsOfGK[gk], kid)
	return kid
}

// ref and unref count the rows of ki.
func (d *kindDict) ref(ki *kindInfo) { ki.rows++ }

func (d *kindDict) unref(ki *kindInfo) {
	if ki.rows--; ki.rows == 0 {
		d.zero = append(d.zero, ki)
	}
}

// recycle reclaims the seqs and kids nothing can hold any more (resetKid
// clears what others keep by kid), then unmaps the kindInfos this write
// left without rows and the kids left without kindInfos, stamped epoch.
// It returns how many it retired.
func (d *kindDict) recycle(epoch, oldestRead uint64, resetKid func(kid uint32)) int {
	// No event refers to a seq or kid (rows point at the kindInfo), so
	// the feed is no condition: seq 0 is always reclaimable by it.
	const anyFeed = ^uint64(0)
	if len(d.seqs.retired) > 0 {
		d.seqs.reclaim(anyFeed, oldestRead, nil)
	}
	if len(d.kidRC.retired) > 0 {
		d.kidRC.reclaim(anyFeed, oldestRead, resetKid)
	}
	n := 0
	for _, ki := range d.zero {
		if ki.rows != 0 || d.infos[ki.Kind] != ki {
			continue
		}
		delete(d.infos, ki.Kind)
		d.indexName(ki, false)
		d.last = nil
		d.version++
		d.seqs.retired = append(d.seqs.retired, retiredID{id: ki.seq, epoch: epoch})
		n++
		if d.infosOf[ki.kid]--; d.infosOf[ki.kid] == 0 {
			kk := kindKey{groupKindName: d.byKid[ki.kid], Resource: ki.gr.Resource}
			delete(d.kids, kk)
			d.kidsOfGR[ki.gr] = dropID(d.kidsOfGR[ki.gr], ki.kid)
			if len(d.kidsOfGR[ki.gr]) == 0 {
				delete(d.kidsOfGR, ki.gr)
			}
			gk := d.byKid[ki.kid]
			d.kidsOfGK[gk] = dropID(d.kidsOfGK[gk], ki.kid)
			if len(d.kidsOfGK[gk]) == 0 {
				delete(d.kidsOfGK, gk)
			}
			d.kidRC.retired = append(d.kidRC.retired, retiredID{id: ki.kid, epoch: epoch})
		}
	}
	d.zero = d.zero[:0]
	return n
}

// dropID returns ids without id, in place.
func dropID(ids []uint32, id uint32) []uint32 {
	return slices.DeleteFunc(ids, func(x uint32) bool { return x == id })
}

// held returns how many kindInfos the dictionary maps, for metrics.
func (d *kindDict) held() int { return len(d.infos) }

// labelDict interns label keys, values and key=value pairs. Rows hold
// sorted pair ids (4 bytes per label) and the label index keeps one posting
// list per pair and per key. Pairs are keyed by (key id, value id) so that
// a pair costs 32 bytes in pairs (8 of ids, 24 of posting list:
// TestLabelPairSize) plus its id table slot, whatever its strings.
//
// Interning a label takes three hashed lookups, and that is faster than
// one: the key and value dictionaries are small and stay in cache, so the
// cost is the one lookup in the large pair map. Measured on the 1M-object
// fleet (5.5M labels, 1.7M distinct pairs), one lookup of the "key\x00value"
// text took 700–760 ns per label against 360–450 ns, because comparing
// the text loads a string that is never in cache. (Measured with the
// exact-key map the pair id table replaced; a hit in the table also reads
// the pair to confirm its ids, one more cache miss.)
type labelDict struct {
	keys    *strDict // counted by the pairs not yet free that use them
	values  *strDict
	pairIDs idTable // by pairHash, checked against the pair's key and value ids
	pairs   pairTable
	// rc recycles pair ids; a pair's count is its posting list (see
	// recycler).
	rc recycler
	// cache keeps the Objects of recent pages' rows. It is the only state
	// of the dictionaries that reads write (under its own mutex).
	cache pageCache
}

func newLabelDict() *labelDict {
	return &labelDict{keys: newStrDict(), values: newStrDict()}
}

// pairHash returns the hash the pair of key id kid and value id vid is
// kept under in pairIDs.
func pairHash(kid, vid uint32) uint64 { return mix64(uint64(kid)<<32 | uint64(vid)) }

// findPair returns the pair id of key id kid and value id vid, if interned.
func (d *labelDict) findPair(kid, vid uint32) (uint32, bool) {
	return d.pairIDs.find(pairHash(kid, vid), func(pid uint32) bool {
		return d.pairs.kv(pid) == pairKV{kid: kid, vid: vid}
	})
}

// intern returns the pair id of key=value.
func (d *labelDict) intern(key, value string) uint32 {
	return d.internIDs(d.keys.intern(key), d.values.intern(value))
}

// internIDs returns the pair id of the key and value ids kid and vid,
// which intern returned or will return for their strings.
func (d *labelDict) internIDs(kid, vid uint32) uint32 {
	if id, ok := d.findPair(kid, vid); ok {
		return id
	}
	d.keys.ref(kid)
	d.values.ref(vid)
	id, ok := d.rc.pop()
	if ok {
		d.pairs.set(id, pairKV{kid: kid, vid: vid})
	} else {
		id = d.pairs.add(pairKV{kid: kid, vid: vid})
	}
	d.pairIDs.add(pairHash(kid, vid), id)
	return id
}

// unused lists pair pid as a candidate for retirement once a removal left
// no row carrying it.
func (d *labelDict) unused(pid uint32) {
	d.rc.zero = append(d.rc.zero, pid)
}

// recycle runs the recycler steps of the label dictionaries at the end of
// a commit (see recycler): it reclaims the pairs, then the keys and values
// nothing can resolve any more, and retires the pairs, keys and values
// left unused. It returns how many ids it retired.
func (d *labelDict) recycle(seq, epoch, feedFirst, oldestRead uint64) int {
	if len(d.rc.retired) > 0 {
		d.rc.reclaim(feedFirst, oldestRead, d.reclaimPair)
	}
	// No event refers to a key or value but through a pair, which is
	// free by now: only paused reads may hold them.
	d.keys.reclaim(feedFirst, oldestRead)
	d.values.reclaim(feedFirst, oldestRead)
	n := 0
	if len(d.rc.zero) > 0 {
		n += d.rc.unmapZero(seq, epoch, func(pid uint32) bool { return d.pairs.rows(pid).len() == 0 }, func(pid uint32) bool {
			p := d.pairs.kv(pid)
			return d.pairIDs.remove(pairHash(p.kid, p.vid), pid)
		})
	}
	return n + d.keys.unmapZero(0, epoch) + d.values.unmapZero(0, epoch)
}

// lookup returns the pair id of key=value if it is interned.
func (d *labelDict) lookup(key, value string) (uint32, bool) {
	kid, ok := d.keys.lookup(key)
	if !ok {
		return 0, false
	}
	vid, ok := d.values.lookup(value)
	if !ok {
		return 0, false
	}
	return d.findPair(kid, vid)
}

// reclaimPair frees pair pid, which counted as a use of its key and value.
func (d *labelDict) reclaimPair(pid uint32) {
	p := d.pairs.kv(pid)
	d.keys.unref(p.kid)
	d.values.unref(p.vid)
	d.pairs.set(pid, pairKV{})
}

// held returns how many pairs the dictionary holds, as strDict.held.
func (d *labelDict) held() int { return d.pairs.len() - len(d.rc.free) }

// labelsOfRow returns the Labels of r, in an allocation of their own
// (pages share one: pageObjects).
func (d *labelDict) labelsOfRow(r *objRow) Labels {
	var buf [128]pairKV // the labels of a row within the edge quota (128) stay on the stack
	kvs := d.appendPairs(buf[:0], r)
	return d.labelsOf(make([]labelKV, len(kvs)), kvs)
}

// pairKV is the key and value ids of a label pair.
type pairKV struct{ kid, vid uint32 }

// appendPairs appends the key and value ids of r's labels to dst.
//
// Building Labels reads each label's ids, a random load in a table of
// about 14 MB at 1M objects (see pairTable), often a cache miss; work
// between two of them keeps the processor from starting the next before
// the last has arrived. This loop does nothing else, so its loads overlap: a page
// gathers the pairs of all its new rows first, then builds their Labels
// from dst (labelsOf).
func (d *labelDict) appendPairs(dst []pairKV, r *objRow) []pairKV {
	ls := r.labels()
	for i := range ls.len() {
		dst = append(dst, d.pairs.kv(ls.at(i)))
	}
	return dst
}

// labelsOf fills dst, of len(kvs), with the strings of the labels whose
// ids appendPairs returned, sorts it by key and returns it as Labels.
// Rows keep their pair ids in id order, which is the order pairs were
// first interned, not key order.
func (d *labelDict) labelsOf(dst []labelKV, kvs []pairKV) Labels {
	if len(kvs) == 0 {
		return Labels{}
	}
	for i, kv := range kvs {
		dst[i] = labelKV{key: d.keys.str(kv.kid), value: d.values.str(kv.vid)}
	}
	sortLabels(dst)
	return Labels{kv: dst}
}

// key and value return the strings of a pair.
func (d *labelDict) key(pid uint32) string   { return d.keys.str(d.pairs.kv(pid).kid) }
func (d *labelDict) value(pid uint32) string { return d.values.str(d.pairs.kv(pid).vid) }

// pairTable holds the label pairs by id: each pair's key and value ids,
// and the posting list of the rows that carry it, in two tables of pages
// of a fixed size. A slice that grows by append copies every pair it holds
// each time it grows: at 1M objects (1.7M pairs) that was about 400 MB
// allocated and most of it copied while a new replica restored the fleet,
// on the goroutine that interns labels (upsertBulk), which bounds a bulk
// write. Pages are never copied, so a list's address is also stable.
//
// The ids are apart from the lists so that what reads use is small: an
// Object's labels, a label selector's check of a row and the check of an
// interned pair read the ids only, 8 bytes a pair (about 14 MB at 1M
// objects, with no pointers), where ids and list together were 32 bytes a
// pair in one table of about 54 MB, four times the pages and the cache
// lines for the same loads. Indexing a row's labels reads both (the key id
// for the key's list), two loads a label where one table had one; the
// memory is the same 32 bytes a pair.
type pairTable struct {
	kvs   [][]pairKV
	lists [][]postings
	n     int
}

// pairPageBits sets the page size: 4,096 pairs, 32 KiB of ids and 96 KiB
// of lists.
const pairPageBits = 12

// kv returns the key and value ids of pair id, which must be below len.
func (t *pairTable) kv(id uint32) pairKV {
	return t.kvs[id>>pairPageBits][id&(1<<pairPageBits-1)]
}

// rows returns the posting list of pair id, which must be below len.
func (t *pairTable) rows(id uint32) *postings {
	return &t.lists[id>>pairPageBits][id&(1<<pairPageBits-1)]
}

// set gives pair id, which must be below len, the ids kv and an empty
// list.
func (t *pairTable) set(id uint32, kv pairKV) {
	t.kvs[id>>pairPageBits][id&(1<<pairPageBits-1)] = kv
	*t.rows(id) = postings{}
}

// add appends a pair of ids kv and an empty list, and returns its id.
func (t *pairTable) add(kv pairKV) uint32 {
	if t.n>>pairPageBits == len(t.kvs) {
		t.kvs = append(t.kvs, make([]pairKV, 1<<pairPageBits))
		t.lists = append(t.lists, make([]postings, 1<<pairPageBits))
	}
	id := uint32(t.n)
	t.set(id, kv)
	t.n++
	return id
}

// len returns how many ids the table has given out.
func (t *pairTable) len() int { return t.n }

// msgDict interns status messages with reference counts. Messages repeat a
// lot across objects ("Back-off restarting failed container", "Applied
// revision: main@sha1:..."), so rows share one copy of each, and a message
// is dropped when its last row goes. Rows hold the string itself, not an
// id, so a row that outlives its count (in a change event) still reads
// correctly. Unlike unique.Make this costs one map lookup and no weak
// pointers, which the garbage collector has to process.
type msgDict struct {
	m map[string]*msgRef
}

type msgRef struct {
	s string
	n int
}

func newMsgDict() *msgDict { return &msgDict{m: map[string]*msgRef{}} }

// intern returns the shared copy of s and counts one more user.
func (d *msgDict) intern(s string) string {
	if s == "" {
		return ""
	}
	if e, ok := d.m[s]; ok {
		e.n++
		return e.s
	}
	e := &msgRef{s: cloneString(s), n: 1}
	d.m[e.s] = e
	return e.s
}

// release drops one user of s, a string intern returned.
func (d *msgDict) release(s string) {
	if s == "" {
		return
	}
	if e, ok := d.m[s]; ok {
		if e.n--; e.n == 0 {
			delete(d.m, s)
		}
	}
}

// len returns the number of distinct messages in use.
func (d *msgDict) len() int { return len(d.m) }

// DictionaryStats are the sizes of the index's string dictionaries, for
// metrics: how many strings each holds for the rows (interned, or no
// longer used and waiting to be reclaimed; Kinds counts the (group,
// version, kind, resource, scope) descriptions in use). Kinds, namespaces
// and labels are reclaimed when no row uses them any more (see recycler), so under
// churn these follow the live rows rather than everything ever indexed.
type DictionaryStats struct {
	Clusters, Kinds, Namespaces, LabelKeys, LabelValues, LabelPairs int
}

// DictionaryStats returns the dictionary sizes.
func (s *Store) DictionaryStats() DictionaryStats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	x := s.x
	return DictionaryStats{
		Clusters: x.clusters.held(), Kinds: x.kinds.held(), Namespaces: x.namespaces.held(),
		LabelKeys: x.labels.keys.held(), LabelValues: x.labels.values.held(), LabelPairs: x.labels.held(),
	}
}
