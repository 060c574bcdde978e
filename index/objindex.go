package index

import (
	"slices"
	"sync"
)

// objIndex holds the object rows, their indexes and pre-aggregated
// counts. It lives outside memdb on purpose. Measured on this machine,
// go-memdb's id index alone cost about 440 bytes per row (a radix leaf and
// node, each with its own watch channel, plus path copies) and most of the
// write CPU, which ruled out the 1 KiB/row and 250k rows/s goals before any
// secondary index (docs/design.md has the founding design's figures for
// the naive layout).
// Instead:
//
//   - a map from key to a dense row id, and the rows by id;
//   - posting lists of small row ids per (kind, status), cluster,
//     (cluster, kind, status), (cluster, namespace), label key=value (in
//     labelDict) and label key;
//   - each row's namespace id and kind id by row id (nsOf, kidOf), and
//     the kind ids of a small namespace's rows beside its list
//     (nsAgg.kids), so that a source's rows of other namespaces or kinds
//     are passed over without loading them;
//   - sorted runs of rows in (name, key) order for name-ordered pages
//     (nameOrder), and each row's name prefix by row id, so that sorting a
//     source by name rarely loads a row;
//   - the same runs for each large (kind, status) and label pair posting
//     list (listOrders), so that a name-ordered page of one is a seek;
//   - count cells per (kind, status) at fleet, cluster, namespace and
//     namespace-name level, so totals and facets cost a few thousand
//     additions at 1M objects.
//
// The Store mutates objIndex only with its write lock held and in the same
// critical section as the memdb commit, and readers hold the read lock, so a
// reader always sees objIndex and its memdb snapshot at the same revision.
type objIndex struct {
	clusters   *strDict
	namespaces *strDict // "" has id 0
	kinds      *kindDict
	labels     *labelDict
	msgs       *msgDict

	byKey *keyIndex // key → rid
	rows  []*objRow // by rid; nil for a free id
	pfx   []namePfx // by rid: namePrefix of the row's name
	// nsOf is, by rid, the row's nsid: a restricted viewer's rows of a
	// kind and status are told from the rest of their clusters' lists by
	// namespace without loading a row (see accessCellSource). 4 bytes a
	// row: at 1M rows a viewer's page loaded 731 rows, two cache misses
	// each, to show 100.
	nsOf []uint32
	// kidOf is, by rid, the row's kind id: a page of some kinds in a
	// source that holds other kinds too (one namespace of one cluster)
	// tells the rows of its kinds by it, without loading every row of the
	// source (see plan.scan). 4 bytes a row.
	kidOf []uint32
	gens  []uint32 // by rid: bumped when the id is freed (see nameOrder)
	free  []uint32

	kindStatus map[uint32]*postings // by cellKey(kid, status)
	byCluster  []*clusterAgg        // by cid; nil until the cluster has rows
	global     cells
	byNsName   map[uint32]*cells // by nsid across clusters
	keyPost    []postings        // by label key id
	byName     *nameOrder
	// kindNames is, by kid, a range of name prefixes holding the names of
	// every row of the kind: widened as rows come, never narrowed, so a
	// walk of the name order for some kinds starts and ends there.
	kindNames []pfxRange
	// cellOrders and labelOrders are the name orders of large kindStatus
	// and label pair lists (see listOrders).
	cellOrders, labelOrders listOrders
	// allCluster is the ClusterAccess that sees a whole cluster, used
	// for viewers with Access.All.
	allCluster *ClusterAccess
	// plans pools the plans of pages (see objIndex.getPlan).
	plans sync.Pool
	// shapes numbers the changes of clusters' shapes (see
	// clusterAgg.shape).
	shapes uint64
}

// clusterAgg indexes the rows of one cluster.
type clusterAgg struct {
	rows  postings
	cells cells
	nss   nsTable // by nsid
	// byCell holds the cluster's rows by cellKey(kind, status), so that a
	// viewer's rows of a kind and status in the clusters it may see are a
	// few short lists rather than the fleet-wide list's rows, each checked.
	byCell map[uint32]*postings
	// shape changes (to the next x.shapes, so no two shapes of any
	// cluster are equal) whenever a row comes, goes or changes kind: the
	// rows per namespace and per kind stay as they are between changes,
	// so estimates made from them hold (see accessEstimate).
	shape uint64
}

// nsAgg indexes the rows of one namespace of one cluster.
type nsAgg struct {
	rows  postings
	cells cells
	// kids holds, while the namespace has at most nsKidsMax rows, the
	// kind id of each row, in the order of rows (increasing row id);
	// nil for a larger namespace. A page of one kind in one namespace of
	// one cluster (fleetbench's Q2) tells the rows of its kind from the
	// namespace's others by it: one cache line, where kidOf cost a cache
	// miss for each row of the namespace at 1M rows (see plan.scan).
	kids []uint32
}

// nsKidsMax is the most rows of a namespace whose kind ids its nsAgg
// keeps: a larger scope's page is sized against the kinds' own lists
// too (see smallScope).
const nsKidsMax = smallScope

// add adds row rid, of kind kid, to the namespace; kidOf gives the
// kinds of its other rows, should kids be rebuilt.
func (na *nsAgg) add(rid, kid uint32, maxRows int, kidOf []uint32) {
	na.rows.add(rid, maxRows)
	switch n := na.rows.len(); {
	case n > nsKidsMax:
		na.kids = nil
	case len(na.kids) == n-1:
		if len(na.kids) == cap(na.kids) {
			na.kids = growIDs(na.kids)
		}
		na.kids = slices.Insert(na.kids, na.index(rid), kid)
	default:
		na.rebuildKids(kidOf)
	}
}

// remove removes row rid from the namespace.
func (na *nsAgg) remove(rid uint32, kidOf []uint32) {
	i := na.index(rid)
	na.rows.remove(rid)
	switch n := na.rows.len(); {
	case n > nsKidsMax:
	case len(na.kids) == n+1:
		na.kids = slices.Delete(na.kids, i, i+1)
	default: // the namespace shrank to nsKidsMax rows
		na.rebuildKids(kidOf)
	}
}

// setKind records that row rid of the namespace is now of kind kid.
func (na *nsAgg) setKind(rid, kid uint32) {
	if na.kids != nil {
		na.kids[na.index(rid)] = kid
	}
}

// index returns the position of rid in the rows of a namespace of at
// most nsKidsMax rows (a one-member list or an array, never a bitmap).
func (na *nsAgg) index(rid uint32) int {
	i, _ := slices.BinarySearch(na.rows.ids(), rid)
	return i
}

// rebuildKids sets kids from kidOf.
func (na *nsAgg) rebuildKids(kidOf []uint32) {
	na.kids = na.kids[:0]
	na.rows.each(func(rid uint32) bool {
		na.kids = append(na.kids, kidOf[rid])
		return true
	})
}

func newObjIndex() *objIndex {
	x := &objIndex{
		clusters:    newStrDict(),
		namespaces:  newStrDict(),
		kinds:       newKindDict(),
		labels:      newLabelDict(),
		msgs:        newMsgDict(),
		byKey:       newKeyIndex(),
		kindStatus:  map[uint32]*postings{},
		byNsName:    map[uint32]*cells{},
		allCluster:  &ClusterAccess{All: true},
		cellOrders:  listOrders{min: cellOrderMin, maxRun: listOrderMaxRun},
		labelOrders: listOrders{min: labelOrderMin, maxRun: listOrderMaxRun},
	}
	x.namespaces.ref(x.namespaces.intern("")) // never retired
	x.byName = newNameOrder(x)
	return x
}

// cellKey packs (kid, status) into a count cell key.
func cellKey(kid uint32, status uint8) uint32 { return kid<<3 | uint32(status) }

// cell is one count of rows with one (kind, status).
type cell struct {
	key uint32
	n   int32
}

// cells is a small unsorted set of counts. Namespaces hold a handful of
// (kind, status) combinations, so a slice with a linear scan is smaller and
// faster than a map.
type cells []cell

func (c *cells) add(key uint32, d int32) {
	s := *c
	for i := range s {
		if s[i].key == key {
			s[i].n += d
			if s[i].n == 0 {
				s[i] = s[len(s)-1]
				*c = s[:len(s)-1]
			}
			return
		}
	}
	s = append(s, cell{key: key, n: d})
	*c = s
}

// maxRows is the size of the row id space, used to size bitmaps.
func (x *objIndex) maxRows() int { return len(x.rows) }

// insertRow adds a new row (r.rid unset) to every index but the label
// index (see updateLabels) and interns its message.
func (x *objIndex) insertRow(r *objRow) {
	r.message = x.msgs.intern(r.message)
	pfx := namePrefix(r.name())
	if n := len(x.free); n > 0 {
		r.rid = x.free[n-1]
		x.free = x.free[:n-1]
		x.rows[r.rid] = r
		x.pfx[r.rid] = pfx
		x.nsOf[r.rid] = r.nsid
		x.kidOf[r.rid] = r.kind.kid
	} else {
		r.rid = uint32(len(x.rows))
		x.rows = append(x.rows, r)
		x.pfx = append(x.pfx, pfx)
		x.nsOf = append(x.nsOf, r.nsid)
		x.kidOf = append(x.kidOf, r.kind.kid)
		x.gens = append(x.gens, 0)
	}
	k := x.keyOf(r)
	x.byKey.put(&k, r.rid)
	x.byName.insert(pfx, r)
	x.widenKindNames(r.kind.kid, pfx)
	ca := x.cluster(r.cid)
	x.reshape(ca)
	ca.rows.add(r.rid, x.maxRows())
	x.byCellOf(ca, cellKey(r.kind.kid, r.status)).add(r.rid, x.maxRows())
	x.namespaces.ref(r.nsid)
	x.kinds.ref(r.kind)
	na := ca.nss.get(r.nsid)
	if na == nil {
		na = &nsAgg{}
		ca.nss.put(r.nsid, na)
	}
	na.add(r.rid, r.kind.kid, x.maxRows(), x.kidOf)
	x.addCounts(r, ca, na, 1)
}

// remove deletes r from every index and frees its row id.
func (x *objIndex) remove(r *objRow) {
	k := x.keyOf(r)
	x.byKey.delete(&k, r.rid)
	x.msgs.release(r.message)
	ca := x.byCluster[r.cid]
	x.reshape(ca)
	ca.rows.remove(r.rid)
	x.leaveCell(ca, r)
	na := ca.nss.get(r.nsid)
	na.remove(r.rid, x.kidOf)
	x.addCounts(r, ca, na, -1)
	if na.rows.len() == 0 {
		ca.nss.delete(r.nsid)
	}
	x.namespaces.unref(r.nsid)
	x.kinds.unref(r.kind)
	x.removeLabels(r, x.gens[r.rid])
	x.byName.remove(r)
	x.gens[r.rid]++
	x.rows[r.rid] = nil
	x.free = append(x.free, r.rid)
}

// updateRow swaps old for r, which has the same key, in every index but
// the label index, touching only the indexes whose inputs changed. The
// name order holds row ids, so it does not change. The kind id changes
// when the cluster now reports another resource for the kind.
func (x *objIndex) updateRow(old, r *objRow) {
	r.rid = old.rid
	x.rows[r.rid] = r
	if r.message == old.message {
		r.message = old.message // share the interned copy
	} else {
		r.message = x.msgs.intern(r.message)
		x.msgs.release(old.message)
	}
	if old.kind != r.kind {
		x.kinds.ref(r.kind)
		x.kinds.unref(old.kind)
	}
	ca := x.byCluster[r.cid]
	if old.kind.kid != r.kind.kid {
		x.kidOf[r.rid] = r.kind.kid
		ca.nss.get(r.nsid).setKind(r.rid, r.kind.kid)
		x.reshape(ca)
		x.widenKindNames(r.kind.kid, x.pfx[r.rid])
	}
	if old.status != r.status || old.kind.kid != r.kind.kid {
		x.leaveCell(ca, old)
		x.byCellOf(ca, cellKey(r.kind.kid, r.status)).add(r.rid, x.maxRows())
		na := ca.nss.get(r.nsid)
		x.addCounts(old, ca, na, -1)
		x.addCounts(r, ca, na, 1)
	}
}

// pfxRange is a closed range of name prefixes; the zero value is empty.
type pfxRange struct {
	lo, hi namePfx
	set    bool
}

// widen makes r hold p.
func (r *pfxRange) widen(p namePfx) {
	switch {
	case !r.set:
		r.lo, r.hi, r.set = p, p, true
	case p.compare(r.lo) < 0:
		r.lo = p
	case p.compare(r.hi) > 0:
		r.hi = p
	}
}

func (r *pfxRange) holds(p namePfx) bool {
	return r.set && p.compare(r.lo) >= 0 && p.compare(r.hi) <= 0
}

// widenKindNames records that a row of kind kid is named with prefix p.
func (x *objIndex) widenKindNames(kid uint32, p namePfx) {
	if int(kid) >= len(x.kindNames) {
		x.kindNames = slices.Grow(x.kindNames, int(kid)+1-len(x.kindNames))[:kid+1]
	}
	x.kindNames[kid].widen(p)
}

// kindNamesOf returns the name range of kind kid's rows (empty when it
// never had one).
func (x *objIndex) kindNamesOf(kid uint32) pfxRange {
	if int(kid) < len(x.kindNames) {
		return x.kindNames[kid]
	}
	return pfxRange{}
}

// byCellOf returns the postings of one (kind, status) cell in one
// cluster, made empty when missing.
func (x *objIndex) byCellOf(ca *clusterAgg, key uint32) *postings {
	kp := ca.byCell[key]
	if kp == nil {
		kp = &postings{}
		ca.byCell[key] = kp
	}
	return kp
}

// leaveCell removes r from its (kind, status) cell's postings in ca.
func (x *objIndex) leaveCell(ca *clusterAgg, r *objRow) {
	key := cellKey(r.kind.kid, r.status)
	kp := ca.byCell[key]
	kp.remove(r.rid)
	if kp.len() == 0 {
		delete(ca.byCell, key)
	}
}

// eachOfKind calls fn for every row of kind kid in ca until fn returns
// false; it reports whether it ran to the end.
func (ca *clusterAgg) eachOfKind(kid uint32, fn func(rid uint32) bool) bool {
	for st := range Statuses {
		if !ca.byCell[cellKey(kid, uint8(st))].each(fn) {
			return false
		}
	}
	return true
}

// updateLabels indexes the labels of r, which replaced old (nil for a new
// row); v is x.view(), taken by the write's goroutine. It touches only the
// label dictionary's postings, their orders and keyPost, so it may run
// beside changes to everything else (see upsertBulk), which is why it does
// not read x.rows, x.pfx or x.gens itself.
func (x *objIndex) updateLabels(old, r *objRow, v rowView) {
	switch {
	case old == nil:
		x.addLabels(r, v)
	case old.labelBytes() != r.labelBytes():
		x.removeLabels(old, v.gens[old.rid]) // old.rid is r.rid
		x.addLabels(r, v)
	}
}

func (x *objIndex) cluster(cid uint32) *clusterAgg {
	for int(cid) >= len(x.byCluster) {
		x.byCluster = append(x.byCluster, nil)
	}
	ca := x.byCluster[cid]
	if ca == nil {
		ca = &clusterAgg{byCell: map[uint32]*postings{}}
		x.byCluster[cid] = ca
	}
	return ca
}

// reshape gives ca a new shape: a row comes, goes or changes kind.
func (x *objIndex) reshape(ca *clusterAgg) {
	x.shapes++
	ca.shape = x.shapes
}

func (x *objIndex) addCounts(r *objRow, ca *clusterAgg, na *nsAgg, d int32) {
	k := cellKey(r.kind.kid, r.status)
	x.global.add(k, d)
	ca.cells.add(k, d)
	na.cells.add(k, d)
	nc := x.byNsName[r.nsid]
	if nc == nil {
		nc = &cells{}
		x.byNsName[r.nsid] = nc
	}
	nc.add(k, d)
	if len(*nc) == 0 {
		delete(x.byNsName, r.nsid)
	}
	p := x.kindStatus[k]
	if d > 0 {
		if p == nil {
			p = &postings{}
			x.kindStatus[k] = p
		}
		p.add(r.rid, x.maxRows())
		x.cellOrders.added(x, p, r.rid, x.view())
		return
	}
	p.remove(r.rid)
	x.cellOrders.removed(p, r, x.gens[r.rid])
	if p.len() == 0 {
		delete(x.kindStatus, k)
	}
}

func (x *objIndex) addLabels(r *objRow, v rowView) {
	rid, n := r.rid, v.maxRows
	ls := r.labels()
	for i := range ls.len() {
		pid := ls.at(i)
		rows := x.labels.pairs.rows(pid)
		rows.add(rid, n)
		x.labelOrders.added(x, rows, rid, v)
		kid := x.labels.pairs.kv(pid).kid
		if int(kid) >= len(x.keyPost) {
			x.keyPost = slices.Grow(x.keyPost, int(kid)+1-len(x.keyPost))[:kid+1]
		}
		x.keyPost[kid].add(rid, n)
	}
}

// removeLabels unindexes the labels of r, whose id has generation gen.
func (x *objIndex) removeLabels(r *objRow, gen uint32) {
	rid := r.rid
	ls := r.labels()
	for i := range ls.len() {
		pid := ls.at(i)
		rows := x.labels.pairs.rows(pid)
		rows.remove(rid)
		x.labelOrders.removed(rows, r, gen)
		if rows.len() == 0 {
			x.labels.unused(pid)
		}
		x.keyPost[x.labels.pairs.kv(pid).kid].remove(rid)
	}
}

// recycle ends a commit whose last sequence number is seq: it reclaims the
// dictionary ids nothing can resolve any more (the feed holds no event up
// to their stamp, no paused read began before they were unmapped) and
// retires the ids this commit left unused, stamped seq and epoch. It
// reports whether it retired any (see recycler).
func (x *objIndex) recycle(seq, epoch, feedFirst, oldestRead uint64) bool {
	x.namespaces.reclaim(feedFirst, oldestRead)
	n := x.labels.recycle(seq, epoch, feedFirst, oldestRead)
	n += x.kinds.recycle(epoch, oldestRead, func(kid uint32) {
		if int(kid) < len(x.kindNames) {
			x.kindNames[kid] = pfxRange{}
		}
	})
	return n+x.namespaces.unmapZero(seq, epoch) > 0
}

// lookup returns the row of key k, nil when none.
func (x *objIndex) lookup(k *Key) *objRow {
	return x.lookupHashed(x.byKey.hash(k), k)
}

// lookupHashed is lookup with the key's hash (keyIndex.hash) already
// computed.
func (x *objIndex) lookupHashed(h uint64, k *Key) *objRow {
	rid, ok := x.byKey.get(h, func(rid uint32) bool { return x.hasKey(x.rows[rid], k) })
	if !ok {
		return nil
	}
	return x.rows[rid]
}
