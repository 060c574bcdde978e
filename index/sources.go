package index

import (
	"slices"

	"k8s.io/apimachinery/pkg/selection"
)

// source enumerates candidate rows for a query, by row id, so that
// callers can look at compact per-id data (the name prefix) before loading
// a row. est is its exact size (rows it will yield); exact means every row
// it yields matches the filter and is visible, so the count needs no scan.
type source struct {
	est   int
	exact bool
	// butKinds means every row it yields matches the filter and is
	// visible but for the kinds filter, which the scan tells by the
	// row's kind id (kids, or objIndex.kidOf) without loading the row:
	// one kind in one namespace of one cluster is a few rows of the
	// namespace's list, which holds every kind.
	butKinds bool
	// list, when set, is the whole source: one small posting list (a
	// namespace's rows), read and probed with no closure or copy of its
	// own (see eachID and contains); each and has are then nil.
	list *postings
	// ns, when set, is the namespace whose rows list is: the scan reads
	// its kind ids (nsAgg.kids) when it reads the list, in the same lock
	// hold, since a write between choosing the source and scanning it
	// changes both.
	ns   *nsAgg
	each func(fn func(rid uint32) bool)
	// has reports whether the source yields rid; nil when testing
	// membership is not cheap. A walk tests it before loading a row.
	has func(rid uint32) bool
	// orders are the name orders of the source's lists when each of them
	// has one (see listOrders): walking them yields the source in name
	// order.
	orders []*nameOrder
}

// eachID calls fn for each row id of s until fn returns false.
func (s source) eachID(fn func(rid uint32) bool) {
	if s.list != nil {
		s.list.each(fn)
		return
	}
	s.each(fn)
}

// nsKids returns the kind id of each row of s.list, in its order, when
// s is a namespace's rows that keeps them (nsAgg.kids), else nil. The
// caller reads them and the list in one lock hold; the length check only
// keeps a broken invariant from indexing past them.
func (s source) nsKids() []uint32 {
	if s.ns == nil || len(s.ns.kids) != s.list.len() {
		return nil
	}
	return s.ns.kids
}

// canTest reports whether testing membership (contains) is cheap.
func (s source) canTest() bool { return s.list != nil || s.has != nil }

// contains reports whether s yields rid; canTest must hold.
func (s source) contains(rid uint32) bool {
	if s.list != nil {
		return s.list.has(rid)
	}
	return s.has(rid)
}

// bestSource returns the smallest candidate source for the plan. The
// posting-list candidates are sized before they are built and built only
// when they beat the best so far, the scope first: one kind in one
// namespace of one cluster is ten rows of the (cluster, namespace) list,
// and building the union of the kind's fleet-wide cells only to drop it
// cost about as much as the rest of the page.
func (p *plan) bestSource() source {
	x := p.x
	best := source{est: len(x.rows) - len(x.free)} // every row; each is set if it stays best
	consider := func(s source, ok bool) {
		if ok && beats(s.est, s.exact, best) {
			best = s
		}
	}
	consider(p.scopeSource(best))
	if best.est > smallScope {
		consider(p.kindStatusSource(best))
	}
	consider(p.labelSource())
	if !p.accessAll {
		consider(p.accessSource(best.est))
		consider(p.accessCellSource(best.est))
	}
	if best.list == nil && best.each == nil {
		best.each = x.eachRow
	}
	return best
}

// smallScope is the most rows of a cluster and namespace scope that
// bestSource takes without sizing the kind and status lists: sizing them
// costs a map lookup and a list header for each cell of the filter's
// kinds, cache misses that cost about what testing this many rows' kind
// ids does (a page of one kind in one namespace of one cluster: ten rows
// at 1M objects), and a kind's fleet-wide lists are seldom smaller.
const smallScope = 64

// beats reports whether a source of est rows, exact or not, is better than
// best: smaller, or as small and exact (the narrower source on a tie).
func beats(est int, exact bool, best source) bool {
	return est < best.est || (est == best.est && exact)
}

// eachRow yields every live row.
func (x *objIndex) eachRow(fn func(rid uint32) bool) {
	for rid, r := range x.rows {
		if r != nil && !fn(uint32(rid)) {
			return
		}
	}
}

// unionSource yields the members of disjoint posting lists, which hold n
// rows (listsLen: its callers sized them to choose it). It keeps lists,
// unless it is one small list: callers may then pass a buffer of their
// own.
func (x *objIndex) unionSource(lists []*postings, n int) source {
	if l := oneSmallList(lists, n); l != nil {
		return source{est: n, list: l}
	}
	s := source{est: n, each: func(fn func(rid uint32) bool) {
		for _, l := range lists {
			if !l.each(fn) {
				return
			}
		}
	}}
	if len(lists) <= maxHasLists {
		// A walk probes members in name order, that is at random row ids:
		// each probe of a sorted array is a binary search of cache misses
		// (about 300 ns at 10M rows). Once the probes have cost about what
		// setting every member's bit in a bitmap costs, build one.
		var bits idBits
		calls := 0
		s.has = func(rid uint32) bool {
			if bits == nil {
				if calls++; n >= hasBitmapMin && calls > n/64 {
					bits = make(idBits, x.maxRows()/64+1)
					for _, l := range lists {
						l.each(func(id uint32) bool { bits.set(id); return true })
					}
				}
			}
			if bits != nil {
				return bits.has(rid)
			}
			for _, l := range lists {
				if l.has(rid) {
					return true
				}
			}
			return false
		}
	}
	return s
}

// oneSmallList returns the list when lists, which hold n rows, are one
// list of fewer than hasBitmapMin rows (a namespace's rows: probing it is
// cheap, and it is a source of its own), nil otherwise.
func oneSmallList(lists []*postings, n int) *postings {
	if len(lists) == 1 && n < hasBitmapMin {
		return lists[0]
	}
	return nil
}

// listsLen returns the rows of posting lists.
func listsLen(lists []*postings) int {
	n := 0
	for _, l := range lists {
		n += l.len()
	}
	return n
}

// maxHasLists bounds the posting lists a source's membership test probes.
const maxHasLists = 8

// hasBitmapMin is the smallest source whose membership test may switch to
// a bitmap (see unionSource).
const hasBitmapMin = 256

// kindStatusSource is the union of the (kind, status) posting lists the
// kind and status filters allow, if it beats best.
func (p *plan) kindStatusSource(best source) (source, bool) {
	if p.kids == nil && p.statuses == 0 {
		return source{}, false
	}
	var buf [32]*postings // a kind's cells, or a status's cells of a fleet's kinds
	lists := buf[:0]
	p.eachCell(func(_ uint32, l *postings) { lists = append(lists, l) })
	est := listsLen(lists)
	exact := p.accessAll && p.clusters.any() && p.nss.any() && p.aggregatable()
	if !beats(est, exact, best) {
		return source{}, false
	}
	kept := slices.Clone(lists)
	s := p.x.unionSource(kept, est)
	s.exact = exact
	if len(kept) > 0 {
		s.orders = orderOf(&p.x.cellOrders, kept)
	}
	return s, true
}

// eachCell calls fn for each fleet-wide (kind, status) cell that has rows
// and passes the kind and status filters, with its key and posting list.
func (p *plan) eachCell(fn func(key uint32, l *postings)) {
	if p.kids == nil {
		for k, l := range p.x.kindStatus {
			if p.cellMatches(k) {
				fn(k, l)
			}
		}
		return
	}
	// A filter names a few kinds of the many: look up their cells rather
	// than range over every cell.
	for kid, in := range p.kids {
		if !in {
			continue
		}
		for st := range uint8(len(Statuses)) {
			k := cellKey(uint32(kid), st)
			if l := p.x.kindStatus[k]; l != nil && p.cellMatches(k) {
				fn(k, l)
			}
		}
	}
}

// accessCellSource is the union, over the clusters a restricted viewer may
// see (and the filter allows), of each cluster's (kind, status) lists that
// the kind and status filters allow, less the rows the viewer's namespaces
// hide. For a viewer of a few clusters of a large fleet it is a fraction
// of the fleet-wide lists (kindStatusSource): the viewer of 100 of 1,000
// clusters gets a tenth of their rows. Within a cluster, the rows of a
// kind the viewer may list in some namespaces are told apart by their
// namespace id (objIndex.nsOf), without loading a row: a viewer of 200
// namespaces in each of 100 clusters loaded the 731 rows of a 1M-object
// fleet's (kind, status) list to find its 146. The source is exact when
// that namespace test is the whole access check for every list and the
// filter has no other dimension.
//
// Sizing it costs a lookup per cluster of the viewer and cell of the
// filter, and a namespace test per row of the lists it filters, so it
// stops as soon as its lists hold more than limit rows (the best source
// so far).
func (p *plan) accessCellSource(limit int) (source, bool) {
	if (p.kids == nil && p.statuses == 0) || limit <= 0 {
		return source{}, false
	}
	x := p.x
	var keyBuf [8]uint32 // a filter names one cell or a few
	keys := keyBuf[:0]
	p.eachCell(func(k uint32, _ *postings) { keys = append(keys, k) })
	// whole are the lists the viewer sees all of (or must check row by
	// row); some are the lists it sees part of, by namespace: most often
	// a list a cluster, with one kind and status. rows counts the rows of
	// both, someRows those of some.
	vcs := x.viewerClusters(p.access)
	var whole []accessPart
	var someBuf [8]accessPart
	some := someBuf[:0]
	rows, someRows := 0, 0
	exact := p.aggregatable() && p.nss.any()
	for _, vc := range vcs {
		agg := p.viewerAgg(vc.cid)
		if agg == nil {
			continue
		}
		ids := x.resolveAccess(vc.ca)
		ok := p.eachClusterCell(agg, keys, func(k uint32, l *postings) bool {
			switch shows := ids.rowsOf(k >> 3); shows {
			case rowsNone:
				return true
			case rowsAll, rowsCheck:
				whole = append(whole, accessPart{l, ids})
				exact = exact && shows == rowsAll
			default:
				if len(some) == cap(some) && len(some) < len(vcs) {
					some = append(make([]accessPart, 0, len(vcs)), some...) // a list a cluster
				}
				some = append(some, accessPart{l, ids})
				exact = exact && shows == rowsInNS
				someRows += l.len()
			}
			rows += l.len()
			return rows <= limit
		})
		if !ok {
			return source{}, false
		}
	}
	// The rows of the partly seen lists, kept (a fraction of their lists
	// once their namespaces are tested), so that the source is walked
	// without testing them again.
	var kept []uint32
	if len(some) > 0 {
		kept = make([]uint32, 0, min(someRows, maxKeptCap))
	}
	for _, pt := range some {
		kept = pt.keep(kept, x.nsOf)
	}
	est := len(kept)
	for _, pt := range whole {
		est += pt.l.len()
	}
	return source{est: est, exact: exact, each: func(fn func(rid uint32) bool) {
		for _, pt := range whole {
			if !pt.l.each(fn) {
				return
			}
		}
		for _, rid := range kept {
			if !fn(rid) {
				return
			}
		}
	}}, true
}

// viewerAgg returns the rows of a cluster of the viewer, cid, when the
// cluster filter allows it and it has rows; nil otherwise.
func (p *plan) viewerAgg(cid uint32) *clusterAgg {
	if !p.clusters.has(cid) || int(cid) >= len(p.x.byCluster) {
		return nil
	}
	return p.x.byCluster[cid]
}

// maxKeptCap bounds the room accessCellSource makes for the rows it
// keeps before it knows how many there are (it knows at most how many it
// tests).
const maxKeptCap = 4096

// accessPart is one cluster's (kind, status) list in an accessCellSource,
// with the viewer's access in the cluster.
type accessPart struct {
	l   *postings
	ids *accessIDs
}

// keep appends to dst the rows of the list in a namespace the access
// grants something in. For a list held as an array (a cluster's list
// seldom is anything else) it is a plain loop, whose namespace id loads
// (cache misses: the rows are spread over the id space) overlap.
func (pt accessPart) keep(dst, nsOf []uint32) []uint32 {
	ids := pt.ids
	if arr := pt.l.ids(); arr != nil {
		if bits := ids.nsBits; bits != nil {
			for _, rid := range arr {
				if bits.has(nsOf[rid]) {
					dst = append(dst, rid)
				}
			}
			return dst
		}
	}
	pt.l.each(func(rid uint32) bool {
		if ids.inNS(nsOf[rid]) {
			dst = append(dst, rid)
		}
		return true
	})
	return dst
}

// eachClusterCell calls fn, until it returns false, for each of a
// cluster's (kind, status) lists whose key is in keys (the filter's
// cells, see eachCell), ranging over the shorter of keys and the
// cluster's lists; it reports whether fn never returned false. A viewer
// of every cluster with a status filter alone would otherwise look up
// each of the fleet's kinds in each cluster.
func (p *plan) eachClusterCell(agg *clusterAgg, keys []uint32, fn func(k uint32, l *postings) bool) bool {
	if len(agg.byCell) < len(keys) {
		for k, l := range agg.byCell {
			if p.cellMatches(k) && !fn(k, l) {
				return false
			}
		}
		return true
	}
	for _, k := range keys {
		if l := agg.byCell[k]; l != nil && !fn(k, l) {
			return false
		}
	}
	return true
}

// scopeSource is the union of the cluster or (cluster, namespace) posting
// lists the cluster and namespace filters allow, if it beats best.
func (p *plan) scopeSource(best source) (source, bool) {
	x := p.x
	var buf [8]*postings // a page's scope is most often one list
	lists := buf[:0]
	var ns *nsAgg // the last namespace, whose rows may be the source
	switch {
	case p.clusters.on:
		for _, cid := range p.clusters.ids {
			if int(cid) >= len(x.byCluster) || x.byCluster[cid] == nil {
				continue
			}
			ca := x.byCluster[cid]
			if p.nss.any() {
				lists = append(lists, &ca.rows)
				continue
			}
			for _, nsid := range p.nss.ids {
				if na := ca.nss.get(nsid); na != nil {
					lists = append(lists, &na.rows)
					ns = na
				}
			}
		}
	case p.nss.on:
		for _, ca := range x.byCluster {
			if ca == nil {
				continue
			}
			for _, nsid := range p.nss.ids {
				if na := ca.nss.get(nsid); na != nil {
					lists = append(lists, &na.rows)
				}
			}
		}
	default:
		return source{}, false
	}
	est := listsLen(lists)
	// The lists hold the rows of the clusters and namespaces the filter
	// allows, each once: with no other dimension but kinds, and every row
	// visible, they are exact but for the kinds.
	rest := p.accessAll && p.statuses == 0 && p.aggregatable()
	exact, butKinds := rest && p.kids == nil, rest && p.kids != nil
	if !beats(est, exact, best) {
		return source{}, false
	}
	if l := oneSmallList(lists, est); l != nil {
		s := source{est: est, exact: exact, butKinds: butKinds, list: l} // lists stays on the stack
		if ns != nil && l == &ns.rows {
			s.ns = ns
		}
		return s, true
	}
	s := x.unionSource(slices.Clone(lists), est)
	s.exact, s.butKinds = exact, butKinds
	return s, true
}

// labelSource is the smallest source of one positive label requirement:
// the union of its values' posting lists (=, in) or the key's list
// (exists, gt, lt).
func (p *plan) labelSource() (source, bool) {
	x := p.x
	var best source
	found := false
	for i := range p.labelReqs {
		lr := &p.labelReqs[i]
		var lists []*postings
		pairs := false
		switch {
		case !lr.known:
			continue
		case lr.op == selection.Equals || lr.op == selection.DoubleEquals || lr.op == selection.In:
			for pid := range lr.pids {
				lists = append(lists, x.labels.pairs.rows(pid))
			}
			pairs = true
		case lr.op == selection.Exists || lr.op == selection.GreaterThan || lr.op == selection.LessThan:
			if int(lr.key) < len(x.keyPost) {
				lists = append(lists, &x.keyPost[lr.key])
			}
		default:
			continue
		}
		s := x.unionSource(lists, listsLen(lists))
		if pairs && len(lists) > 0 {
			s.orders = orderOf(&x.labelOrders, lists)
		}
		if !found || s.est < best.est {
			best, found = s, true
		}
	}
	if found && len(p.labelReqs) == 1 && p.accessAll && p.clusters.any() && p.nss.any() &&
		p.kids == nil && p.statuses == 0 && p.name == "" && p.labelReqs[0].op != selection.GreaterThan && p.labelReqs[0].op != selection.LessThan {
		best.exact = true
	}
	return best, found
}

// accessSource enumerates what a restricted viewer may see: whole
// clusters, resources listed cluster-wide, the namespaces it may list in,
// and single named objects. Each part skips rows an earlier part yields, so
// no row comes twice. Sizing it costs a lookup per namespace of the access,
// so it stops as soon as it exceeds limit (the best source so far).
func (p *plan) accessSource(limit int) (source, bool) {
	x := p.x
	a := p.access
	type part struct {
		cid uint32
		ca  *ClusterAccess
	}
	var parts []part
	est := 0
	for _, vc := range x.viewerClusters(a) {
		cid, ca := vc.cid, vc.ca
		if p.viewerAgg(cid) == nil {
			continue
		}
		parts = append(parts, part{cid, ca})
		if est += x.accessEstimate(cid, ca, limit-est); est >= limit {
			return source{}, false
		}
	}
	return source{est: est, each: func(fn func(rid uint32) bool) {
		for _, pt := range parts {
			if !p.eachInCluster(pt.cid, pt.ca, func(r *objRow) bool { return fn(r.rid) }) {
				return
			}
		}
	}}, true
}

// accessEstimate returns how many rows accessSource yields in one
// cluster, or a number at least limit once it reaches limit. Summing it
// costs a lookup per namespace of ca, each a cache miss or two (a viewer
// of 200 namespaces in each of 10 clusters spent more on it than on its
// page), so the sum is kept on ca's accessIDs for the cluster's shape: the
// next query of the viewer reuses it until a row of the cluster comes,
// goes or changes kind. A sum stopped at limit is kept too, as a lower
// bound that rejects the access source at once for the same limit or a
// smaller one.
func (x *objIndex) accessEstimate(cid uint32, ca *ClusterAccess, limit int) int {
	agg := x.byCluster[cid]
	if ca.All {
		return agg.rows.len()
	}
	ids := x.resolveAccess(ca)
	if e := ids.est.Load(); e != nil && e.cid == cid && e.shape == agg.shape && (e.full || e.n >= limit) {
		return e.n
	}
	est := 0
	for _, c := range agg.cells {
		if ids.kidRows.all(c.key >> 3) {
			est += int(c.n)
		}
	}
	for ns := range ca.Namespaces {
		if est >= limit {
			break
		}
		if nsid, ok := x.namespaces.lookup(ns); ok {
			if na := agg.nss.get(nsid); na != nil {
				est += na.rows.len()
			}
		}
	}
	if est < limit {
		est += x.namedEstimate(agg, ca, limit-est)
	}
	ids.est.Store(&accessEst{cid: cid, shape: agg.shape, n: est, full: est < limit})
	return est
}

// eachInCluster yields the rows ca lets the viewer see in one cluster.
func (p *plan) eachInCluster(cid uint32, ca *ClusterAccess, fn func(*objRow) bool) bool {
	x := p.x
	agg := x.byCluster[cid]
	if ca.All {
		return agg.rows.each(func(rid uint32) bool { return fn(x.rows[rid]) })
	}
	cluster := x.clusters.str(cid)
	everywhere := x.everywhere(ca)
	for kid, rows := range everywhere {
		if rows == rowsAll && !agg.eachOfKind(uint32(kid), func(rid uint32) bool { return fn(x.rows[rid]) }) {
			return false
		}
	}
	for ns, grs := range ca.Namespaces {
		nsid, ok := x.namespaces.lookup(ns)
		na := agg.nss.get(nsid)
		if !ok || na == nil {
			continue
		}
		ok = na.rows.each(func(rid uint32) bool {
			r := x.rows[rid]
			if everywhere.all(r.kind.kid) {
				return true
			}
			if !grs.Has(r.kind.gr) {
				return true
			}
			return fn(r)
		})
		if !ok {
			return false
		}
	}
	for no := range ca.Named {
		if ca.Everywhere.Has(no.GroupResource) {
			continue
		}
		anyNS := no.Namespace == ""
		if !anyNS {
			if ca.Namespaces[no.Namespace].Has(no.GroupResource) {
				continue
			}
			if _, ok := ca.Named[NamedObject{GroupResource: no.GroupResource, Name: no.Name}]; ok {
				continue // the any-namespace entry yields it
			}
		}
		// The keys of the kinds with this resource; a row found under one
		// is of that kind only if its own cluster names the same resource.
		for _, kid := range x.kinds.kidsOfGR[no.GroupResource] {
			gk := x.kinds.byKid[kid]
			key := Key{Cluster: cluster, Group: gk.Group, Kind: gk.Kind, Namespace: no.Namespace, Name: no.Name}
			if r := x.lookup(&key); r != nil && r.kind.kid == kid && !fn(r) {
				return false
			}
			if !anyNS || !x.kinds.namespaced[kid] {
				continue
			}
			// The name in every namespace of the cluster, but those
			// where the viewer lists the resource (yielded above).
			for nsid := range agg.nss.all() {
				if nsid == 0 {
					continue
				}
				key.Namespace = x.namespaces.str(nsid)
				if ca.Namespaces[key.Namespace].Has(no.GroupResource) {
					continue
				}
				if r := x.lookup(&key); r != nil && r.kind.kid == kid && !fn(r) {
					return false
				}
			}
		}
	}
	return true
}

// namedEstimate bounds the rows the Named entries of ca yield in a
// cluster: one per entry, or one per namespace of the cluster for an
// any-namespace entry of a namespaced resource. It stops counting once it
// reaches limit.
func (x *objIndex) namedEstimate(agg *clusterAgg, ca *ClusterAccess, limit int) int {
	n := 0
	for no := range ca.Named {
		n++
		if no.Namespace != "" {
			continue
		}
		for _, kid := range x.kinds.kidsOfGR[no.GroupResource] {
			if x.kinds.namespaced[kid] {
				n += agg.nss.len()
				break
			}
		}
		if n >= limit {
			break
		}
	}
	return n
}
