package index

import "sync/atomic"

// accessIDs is a ClusterAccess resolved against one index's dictionaries:
// namespaces by id and resources by kind, so that checking a row is a probe
// of a small uint32-keyed map and a bit test. ClusterAccess.Allows takes
// two or three string-keyed lookups instead, each a cache miss or two on
// the viewer's maps and strings; for a viewer of 20,000 namespaces at 1M
// objects they were a third of a restricted query's time in the index.
//
// It is built on a query's first use of the ClusterAccess and kept on it,
// and authz caches ClusterAccess values per identity and RBAC revision, so
// later queries reuse it. It stays right as rows come and go, except in
// the cases that valid checks: a kind interned or unmapped since (its bit
// would be missing, or its seq may be reused), a namespace unmapped since
// (its last row went: the namespace would get another id when it comes
// back, and the id may be reused, see recycler), and a namespace of the
// access set that had no id yet (a later row may intern it).
type accessIDs struct {
	x          *objIndex
	kinds      uint64 // kinds version when built
	assigned   uint64 // namespace ids assigned when built; matters only if unresolved
	unmapped   uint64 // namespace ids unmapped when built
	unresolved bool   // a namespace of the access set had no id
	all        bool
	named      bool              // the access set has Named grants: check them by string
	byNS       map[uint32]idBits // by namespace id, the kinds (by seq) granted there
	// nsBits has the bit of each namespace of byNS, when that bitmap is
	// small (see nsBitsMax); nil otherwise, and then byNS is probed.
	nsBits idBits
	// kidRows says, by kid, which rows of the kind it shows (a cellRows),
	// so that a cluster's (kind, status) list is filtered by namespace id
	// alone (see accessCellSource); rowsAll marks the kinds whose resource
	// is listed everywhere.
	kidRows kindRows
	// est is the last accessEstimate made from it, for one cluster.
	est atomic.Pointer[accessEst]
}

// accessEst is how many rows a ClusterAccess lets a source yield in the
// cluster cid while the cluster has the given shape (clusterAgg.shape): n
// exactly when full, else at least n (the estimate stopped at a limit).
type accessEst struct {
	cid   uint32
	shape uint64
	n     int
	full  bool
}

// idBits is a set of small ids, a bit each: kindInfo seqs, namespace ids,
// row ids.
type idBits []uint64

func (b idBits) has(id uint32) bool {
	i := int(id / 64)
	return i < len(b) && b[i]&(1<<(id%64)) != 0
}

// set adds id, which b must have room for.
func (b idBits) set(id uint32) { b[id/64] |= 1 << (id % 64) }

// kindRows is, by kid, what an access set shows of a cluster's rows of
// the kind.
type kindRows []cellRows

// all reports whether the access set shows every row of kid (its
// resource is listed everywhere).
func (k kindRows) all(kid uint32) bool { return int(kid) < len(k) && k[kid] == rowsAll }

// cellRows is what an access set shows of a cluster's rows of one kid,
// from the kind's resource alone.
type cellRows uint8

const (
	// rowsNone: no row (the resource is granted nowhere in the cluster).
	rowsNone cellRows = iota
	// rowsAll: every row (All, or the resource is listed Everywhere).
	rowsAll
	// rowsInNS: exactly the rows in a namespace of byNS (every namespace
	// with a grant lists the resource).
	rowsInNS
	// rowsSomeInNS: only rows in a namespace of byNS, but not all of them
	// (some namespaces' grants do not list the resource).
	rowsSomeInNS
	// rowsCheck: any row may be visible (a Named grant of the resource):
	// each must be checked.
	rowsCheck
)

// nsBitsMax bounds nsBits, in words: a bitmap of the namespace ids up to
// the largest one of byNS costs at most 2 bytes per namespace of byNS
// plus 512 bytes (a byNS entry costs about 40), else byNS is probed.
func nsBitsMax(namespaces int) int { return namespaces/4 + 64 }

// inNS reports whether the access set grants anything in namespace nsid.
func (ids *accessIDs) inNS(nsid uint32) bool {
	if ids.nsBits != nil {
		return ids.nsBits.has(nsid)
	}
	_, ok := ids.byNS[nsid]
	return ok
}

// rowsOf returns what the access set shows of the rows of kid.
func (ids *accessIDs) rowsOf(kid uint32) cellRows {
	if ids.all {
		return rowsAll
	}
	if int(kid) >= len(ids.kidRows) {
		return rowsCheck // a kid interned since: valid would have failed
	}
	return ids.kidRows[kid]
}

// valid reports whether ids still describes its ClusterAccess on x.
func (ids *accessIDs) valid(x *objIndex) bool {
	return ids.x == x && ids.kinds == x.kinds.version && ids.unmapped == x.namespaces.unmapped &&
		(!ids.unresolved || ids.assigned == x.namespaces.assigned)
}

// allows reports whether the row is visible; it agrees with
// ClusterAccess.Allows given the ClusterAccess it was built from.
func (ids *accessIDs) allows(c *ClusterAccess, r *objRow) bool {
	if ids.all || ids.kidRows.all(r.kind.kid) {
		return true
	}
	if bits, ok := ids.byNS[r.nsid]; ok && bits.has(r.kind.seq) {
		return true
	}
	return ids.named && c.allowsNamed(r.kind.gr, ids.x.namespaces.str(r.nsid), r.name())
}

// resolveAccess returns c resolved against x, building it when c has none
// for x or it is out of date. It must be called with the read lock held.
// Concurrent queries may both build it; either result is right.
func (x *objIndex) resolveAccess(c *ClusterAccess) *accessIDs {
	if ids := c.ids.Load(); ids != nil && ids.valid(x) {
		return ids
	}
	ids := &accessIDs{
		x: x, kinds: x.kinds.version, assigned: x.namespaces.assigned, unmapped: x.namespaces.unmapped,
		all: c.All, named: len(c.Named) > 0,
	}
	if !c.All {
		// Namespaces share Resources values (see Resources), so resolve
		// each set once.
		shared := map[*Resources]idBits{}
		ids.byNS = make(map[uint32]idBits, len(c.Namespaces))
		for ns, grs := range c.Namespaces {
			if ns == "" || grs.Len() == 0 { // Allows never reads them
				continue
			}
			nsid, ok := x.namespaces.lookup(ns)
			if !ok {
				ids.unresolved = true
				continue
			}
			bits, ok := shared[grs]
			if !ok {
				bits = x.kindBitsOf(grs)
				shared[grs] = bits
			}
			if bits != nil {
				ids.byNS[nsid] = bits
			}
		}
		ids.nsBits = nsBitmap(ids.byNS)
		ids.kidRows = x.kidRowsOf(c, shared)
	}
	c.ids.Store(ids)
	return ids
}

// nsBitmap returns the bitmap of the namespace ids of byNS, or nil when it
// would be larger than nsBitsMax words.
func nsBitmap(byNS map[uint32]idBits) idBits {
	top := uint32(0)
	for nsid := range byNS {
		top = max(top, nsid)
	}
	if len(byNS) == 0 || int(top/64)+1 > nsBitsMax(len(byNS)) {
		return nil
	}
	bits := make(idBits, top/64+1)
	for nsid := range byNS {
		bits.set(nsid)
	}
	return bits
}

// kidRowsOf returns, by kid, what c shows of a cluster's rows of the kid;
// sets are the Resources of c's namespaces that grant a kind of the index.
func (x *objIndex) kidRowsOf(c *ClusterAccess, sets map[*Resources]idBits) kindRows {
	named := map[GroupResource]bool{}
	for no := range c.Named {
		named[no.GroupResource] = true
	}
	out := make(kindRows, len(x.kinds.grOf))
	for kid, gr := range x.kinds.grOf {
		some, every := false, true
		for grs, bits := range sets {
			if bits == nil {
				continue // no namespace of byNS holds it
			}
			if grs.Has(gr) {
				some = true
			} else {
				every = false
			}
		}
		switch {
		case c.Everywhere.Has(gr):
			out[kid] = rowsAll
		case named[gr]:
			out[kid] = rowsCheck
		case !some:
			out[kid] = rowsNone
		case every:
			out[kid] = rowsInNS
		default:
			out[kid] = rowsSomeInNS
		}
	}
	return out
}

// kindBitsOf returns the seqs of the kindInfos whose resource is in grs.
func (x *objIndex) kindBitsOf(grs *Resources) idBits {
	if grs.Len() == 0 {
		return nil
	}
	var bits idBits
	for _, ki := range x.kinds.infos {
		if grs.Has(ki.gr) {
			for int(ki.seq/64) >= len(bits) {
				bits = append(bits, 0)
			}
			bits.set(ki.seq)
		}
	}
	return bits
}

// everywhere returns what ca shows of a cluster's rows by kid, its
// resolved kidRows (kept on ca), whose rowsAll marks the kinds whose
// resource ca lists everywhere; nil when it lists none. ca must not have
// All. It must be called with the read lock held.
func (x *objIndex) everywhere(ca *ClusterAccess) kindRows {
	if ca.Everywhere.Len() == 0 {
		return nil
	}
	return x.resolveAccess(ca).kidRows
}

// viewerClusters is an Access's clusters resolved against one index: the
// ids of those the index has, with their ClusterAccess. A restricted
// viewer's sources range over its clusters on every query, and looking
// each name up cost a cache miss or two: about a tenth of the CPU of a
// page for a viewer of 100 clusters. Cluster ids are never unmapped, so
// the list stays right until the index interns another cluster (which may
// be one of the access set's) or is replaced.
type viewerClusters struct {
	x        *objIndex
	interned int // x.clusters.len() when built
	list     []viewerCluster
}

type viewerCluster struct {
	cid uint32
	ca  *ClusterAccess
}

// viewerClusters returns the clusters of a that x has ids for, with their
// (non-nil) access, building the list when a has none for x or it is out
// of date. It must be called with the read lock held; concurrent queries
// may both build it, and either result is right.
func (x *objIndex) viewerClusters(a *Access) []viewerCluster {
	if vc := a.byCID.Load(); vc != nil && vc.x == x && vc.interned == x.clusters.len() {
		return vc.list
	}
	vc := &viewerClusters{x: x, interned: x.clusters.len()}
	for name, ca := range a.Clusters {
		if cid, ok := x.clusters.lookup(name); ok && ca != nil {
			vc.list = append(vc.list, viewerCluster{cid, ca})
		}
	}
	a.byCID.Store(vc)
	return vc.list
}
