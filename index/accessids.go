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
	named      bool // the access set has Named grants: check them by string
	everywhere kindBits
	byNS       map[uint32]kindBits
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

// kindBits is a set of kindInfo seqs.
type kindBits []uint64

func (b kindBits) has(seq uint32) bool {
	i := int(seq / 64)
	return i < len(b) && b[i]&(1<<(seq%64)) != 0
}

// valid reports whether ids still describes its ClusterAccess on x.
func (ids *accessIDs) valid(x *objIndex) bool {
	return ids.x == x && ids.kinds == x.kinds.version && ids.unmapped == x.namespaces.unmapped &&
		(!ids.unresolved || ids.assigned == x.namespaces.assigned)
}

// allows reports whether the row is visible; it agrees with
// ClusterAccess.Allows given the ClusterAccess it was built from.
func (ids *accessIDs) allows(c *ClusterAccess, r *objRow) bool {
	if ids.all || ids.everywhere.has(r.kind.seq) {
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
		ids.everywhere = x.kindBitsOf(c.Everywhere)
		// Namespaces share Resources values (see Resources), so resolve
		// each set once.
		shared := map[*Resources]kindBits{}
		ids.byNS = make(map[uint32]kindBits, len(c.Namespaces))
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
	}
	c.ids.Store(ids)
	return ids
}

// kindBitsOf returns the kindInfos whose resource is in grs.
func (x *objIndex) kindBitsOf(grs *Resources) kindBits {
	if grs.Len() == 0 {
		return nil
	}
	var bits kindBits
	for _, ki := range x.kinds.infos {
		if grs.Has(ki.gr) {
			for int(ki.seq/64) >= len(bits) {
				bits = append(bits, 0)
			}
			bits[ki.seq/64] |= 1 << (ki.seq % 64)
		}
	}
	return bits
}
