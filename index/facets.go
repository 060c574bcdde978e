package index

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// FacetCount is the number of visible matching objects with one value.
type FacetCount struct {
	Value string
	Count int
}

// Facets counts the visible objects matching a filter by status, kind
// ("Kind" or "Kind.group"), cluster and namespace. Each list is ordered by
// count, descending, then value; Statuses lists every status, zeros
// included, in the order of Statuses. Cluster-scoped objects are not
// counted under any namespace.
type Facets struct {
	Total         int
	Statuses      []FacetCount
	Kinds         []FacetCount
	Clusters      []FacetCount
	Namespaces    []FacetCount
	StaleClusters []string
	// Seq is the change feed position the counts reflect.
	Seq uint64
}

// Facets computes the facets of f for a viewer. The unfiltered facets of a
// fleet-wide viewer are read from counts the index keeps (one per value
// shown, see tallyFleet); filters on cluster, namespace, kind and status
// are answered from the pre-aggregated count cells;
// name and label filters, or a restricted viewer whose access is larger
// than the matching rows, are answered by scanning the cheapest candidate
// source.
//
// A scan works in chunks and stops when ctx ends (see pacer).
func (s *Store) Facets(ctx context.Context, f Filter, a *Access) (*Facets, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("index: facets: %w", err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	seq, stale := s.seq, s.stale
	p, err := s.x.compile(s.db, &f, a)
	if err != nil {
		return nil, err
	}
	p.paced(s, ctx)
	defer p.end()
	t := p.newTally(true, 0)
	if !p.empty {
		src := p.bestSource()
		done := false
		if p.aggregatable() {
			if at, ok := p.tally(true, 4*src.est+1024); ok {
				t, done = at, true
			}
		}
		if !done {
			err := p.scan(src, visitFunc(func(rid uint32, exact bool) bool {
				if r := p.x.rows[rid]; exact || p.match(r) {
					t.addRow(r)
				}
				return true
			}))
			if err != nil {
				return nil, err
			}
		}
	}
	return t.result(seq, p.staleInScope(stale)), nil
}

// tally accumulates counts and, when facets is set, per-dimension counts
// by id. Slices indexed by id are cheaper than maps here: the fleet-wide
// facets of a kind or status add about 60,000 cells at 1M objects, and map
// updates were half their cost.
type tally struct {
	p       *plan
	facets  bool
	budget  int
	total   int
	status  [5]int
	kind    []int // by kid
	cluster []int // by cid
	ns      []int // by nsid
}

func (p *plan) newTally(facets bool, budget int) *tally {
	t := &tally{p: p, facets: facets, budget: budget}
	if facets {
		t.kind = make([]int, len(p.x.kinds.byKid))
		t.cluster = make([]int, p.x.clusters.len())
		t.ns = make([]int, p.x.namespaces.len())
	}
	return t
}

// grow extends the counts by id to the dictionaries' current sizes.
func (t *tally) grow() {
	x := t.p.x
	t.kind = growTo(t.kind, len(x.kinds.byKid))
	t.cluster = growTo(t.cluster, x.clusters.len())
	t.ns = growTo(t.ns, x.namespaces.len())
}

func growTo(counts []int, n int) []int {
	if len(counts) < n {
		counts = append(counts, make([]int, n-len(counts))...)
	}
	return counts
}

// noNS marks cluster-level cells, which carry no namespace breakdown.
const noNS = ^uint32(0)

func (t *tally) addRow(r *objRow) {
	t.total++
	if t.facets {
		if int(r.kind.kid) >= len(t.kind) || int(r.cid) >= len(t.cluster) || int(r.nsid) >= len(t.ns) {
			t.grow() // interned during a pause of the scan
		}
		t.status[r.status]++
		t.kind[r.kind.kid]++
		t.cluster[r.cid]++
		if r.nsid != 0 {
			t.ns[r.nsid]++
		}
	}
}

// addCells adds the cells passing the filter and allow (nil: every kind).
func (t *tally) addCells(cid, nsid uint32, cs cells, allow func(kid uint32) bool) {
	t.budget -= len(cs) + 1
	for _, c := range cs {
		if !t.p.cellMatches(c.key) || (allow != nil && !allow(c.key>>3)) {
			continue
		}
		n := int(c.n)
		t.total += n
		if t.facets {
			t.status[c.key&7] += n
			t.kind[c.key>>3] += n
			t.cluster[cid] += n
			if nsid != noNS && nsid != 0 {
				t.ns[nsid] += n
			}
		}
	}
}

// tally counts from the cells. It gives up (ok false) once it has spent
// budget cell visits, so callers can fall back to a scan.
func (p *plan) tally(facets bool, budget int) (t *tally, ok bool) {
	x := p.x
	t = p.newTally(facets, budget)
	// The namespace facet of a viewer who sees whole clusters, with no
	// namespace filter, needs per-namespace cells; fleet-wide it comes
	// from the per-name cells instead.
	fleetWide := p.accessAll && p.clusters.any() && p.nss.any()
	if facets && fleetWide && p.kids == nil && p.statuses == 0 {
		p.tallyFleet(t)
		return t, true
	}
	perNS := facets && !fleetWide
	for cid, agg := range x.byCluster {
		if agg == nil || !p.clusters.has(uint32(cid)) {
			continue
		}
		ca := p.clusterAccess(uint32(cid))
		if ca == nil {
			continue
		}
		if ca.All {
			t.addScope(uint32(cid), agg, perNS, nil)
		} else {
			p.tallyRestricted(t, uint32(cid), agg, ca)
		}
		if t.budget < 0 {
			return nil, false
		}
	}
	if facets && fleetWide {
		for nsid, cs := range x.byNsName {
			if nsid == 0 {
				continue
			}
			for _, c := range *cs {
				if p.cellMatches(c.key) {
					t.ns[nsid] += int(c.n)
				}
			}
		}
	}
	return t, t.budget >= 0
}

// tallyFleet counts every row by status, kind, cluster and namespace from
// what the index keeps up to date as rows come and go: the fleet-wide
// (kind, status) cells, each cluster's row list and each namespace name's
// use count (its rows across clusters). It reads one number per value it
// shows, where the cells of every cluster and namespace name took one
// addition per (kind, status) of each: about 110,000 at 10M objects, and
// most of the unfiltered facets' time.
func (p *plan) tallyFleet(t *tally) {
	x := p.x
	for _, c := range x.global {
		n := int(c.n)
		t.total += n
		t.status[c.key&7] += n
		t.kind[c.key>>3] += n
	}
	for cid, agg := range x.byCluster {
		if agg != nil {
			t.cluster[cid] = agg.rows.len()
		}
	}
	for nsid := 1; nsid < len(t.ns); nsid++ { // 0: cluster-scoped rows
		t.ns[nsid] = x.namespaces.uses(uint32(nsid))
	}
}

// addScope adds a cluster's cells for the kinds allow admits: the
// filtered namespaces, every namespace when perNS, else the cluster-level
// cells.
func (t *tally) addScope(cid uint32, agg *clusterAgg, perNS bool, allow func(uint32) bool) {
	switch {
	case t.p.nss.on:
		for _, nsid := range t.p.nss.ids {
			if na := agg.nss.get(nsid); na != nil {
				t.addCells(cid, nsid, na.cells, allow)
			}
		}
	case perNS:
		for nsid, na := range agg.nss.all() {
			t.addCells(cid, nsid, na.cells, allow)
			if t.budget < 0 {
				return
			}
		}
	default:
		t.addCells(cid, noNS, agg.cells, allow)
	}
}

// tallyRestricted adds what a ClusterAccess without All shows in a
// cluster, counting each object once as Access.Allows does.
func (p *plan) tallyRestricted(t *tally, cid uint32, agg *clusterAgg, ca *ClusterAccess) {
	x := p.x
	everywhere := x.everywhere(ca)
	if slices.Contains(everywhere, rowsAll) {
		t.addScope(cid, agg, t.facets, everywhere.all)
	}
	for ns, grs := range ca.Namespaces {
		if t.budget--; t.budget < 0 {
			return
		}
		nsid, ok := x.namespaces.lookup(ns)
		if !ok || nsid == 0 || !p.nss.has(nsid) {
			continue
		}
		na := agg.nss.get(nsid)
		if na == nil {
			continue
		}
		t.addCells(cid, nsid, na.cells, func(kid uint32) bool {
			if everywhere.all(kid) {
				return false
			}
			return grs.Has(x.kinds.grOf[kid])
		})
	}
	if len(ca.Named) > 0 {
		named := &ClusterAccess{Named: ca.Named}
		p.eachInCluster(cid, named, func(r *objRow) bool {
			t.budget--
			if !p.matchFilter(r) || everywhere.all(r.kind.kid) {
				return true
			}
			if r.nsid != 0 {
				if ca.Namespaces[x.namespaces.str(r.nsid)].Has(r.kind.gr) {
					return true
				}
			}
			t.addRow(r)
			return true
		})
	}
}

// result turns the tally into sorted facet lists.
func (t *tally) result(seq uint64, stale []string) *Facets {
	x := t.p.x
	f := &Facets{Total: t.total, StaleClusters: stale, Seq: seq}
	if t.facets {
		t.grow()
	}
	for i, st := range Statuses {
		f.Statuses = append(f.Statuses, FacetCount{Value: string(st), Count: t.status[i]})
	}
	f.Kinds = kindFacets(t.kind, x.kinds.byKid)
	f.Clusters = facetList(t.cluster, x.clusters.inOrder(), x.clusters.str)
	f.Namespaces = facetList(t.ns, x.namespaces.inOrder(), x.namespaces.str)
	return f
}

// kindFacets is facetList for kinds: the kids of one (group, kind), which
// clusters that name its resource differently have, count as one value.
func kindFacets(counts []int, byKid []groupKindName) []FacetCount {
	first := make(map[groupKindName]uint32, len(byKid))
	merged := make([]int, len(counts))
	for kid, n := range counts {
		if n == 0 {
			continue
		}
		gk := byKid[kid]
		to, ok := first[gk]
		if !ok {
			to = uint32(kid)
			first[gk] = to
		}
		merged[to] += n
	}
	return facetList(merged, nil, func(id uint32) string { return byKid[id].String() })
}

// facetList returns the non-zero counts by count, descending, then value.
// inOrder lists the ids in value order when known, so that only counts
// are compared (namespaces often have equal counts, and comparing their
// names was a fifth of the fleet-wide facets).
func facetList(counts []int, inOrder []uint32, name func(uint32) string) []FacetCount {
	out := make([]FacetCount, 0, len(counts))
	if inOrder == nil {
		for id, n := range counts {
			if n > 0 {
				out = append(out, FacetCount{Value: name(uint32(id)), Count: n})
			}
		}
		slices.SortFunc(out, func(a, b FacetCount) int { return cmp.Compare(a.Value, b.Value) })
	} else {
		for _, id := range inOrder {
			if n := counts[id]; n > 0 {
				out = append(out, FacetCount{Value: name(id), Count: n})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b FacetCount) int { return cmp.Compare(b.Count, a.Count) })
	return out
}
