package index

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/fleetgraph/fleetgraph/index/tables"
)

// ErrInvalidQuery is returned (wrapped) for a filter, order or cursor the
// index cannot evaluate: an unknown status or order, a malformed label
// selector, or a cursor of another order.
var ErrInvalidQuery = errors.New("index: invalid query")

// Filter selects objects. Every non-empty field must match (AND); the
// values inside one field are alternatives (OR).
type Filter struct {
	Clusters   []string
	Namespaces []string
	// Kinds holds "Kind" (any group) or "Kind.group"; the kind name also
	// matches case-insensitively and as the plural resource ("pods").
	Kinds    []string
	Statuses []Status
	// NameContains matches a case-insensitive substring of the name.
	NameContains string
	// LabelSelector uses the Kubernetes syntax: =, ==, !=, in, notin,
	// exists, !key, and the numeric gt/lt.
	LabelSelector string
	// ClusterSelector selects objects by their cluster's labels, in the
	// same syntax: "env=prod,region in (eu-west-1)". Queries evaluate it
	// against the cluster rows when they run; a Matcher (subscriptions)
	// against each event's cluster as it is then.
	ClusterSelector string
}

// plan is a compiled filter and access check, valid while the read lock
// that built it is held.
type plan struct {
	x *objIndex

	empty     bool     // the filter can match nothing
	clusters  idFilter // cluster ids
	nss       idFilter // namespace ids
	kids      []bool   // by kid; nil: any
	statuses  uint8    // bit per status index; 0: any
	name      string   // lower-case NameContains
	labelReqs []labelReq

	access    *Access
	accessAll bool
	caByCID   []*ClusterAccess // resolved lazily
	idsByCID  []*accessIDs     // caByCID[cid] resolved against x, on the first row check
	caDone    []bool

	// pace, when set, lets long scans release the read lock (see pacer).
	// It points at pacing, so that a page allocates no pacer of its own.
	pace   *pacer
	pacing pacer

	// kidsBuf holds kids when the kinds are few (no allocation).
	kidsBuf [kidsInPlan]bool
	// coll is the state of the plan's collect.
	coll collector
	// slots and rows are collect's buffers (its heap's slots and the rows
	// it returns), kept when a page returns its plan to the pool.
	slots []topSlot
	rows  []*objRow
}

// getPlan returns a zero plan but for the buffers of a pooled one: a
// page's plan (about 600 bytes) and its heap (80 bytes a row) were two of
// its eight allocations and about 40% of its bytes at 1M objects, and at
// 1M objects fresh memory costs a cache miss or a page fault on its
// first write.
func (x *objIndex) getPlan() *plan {
	if p, ok := x.plans.Get().(*plan); ok {
		return p
	}
	return new(plan)
}

// end ends a paced read (see plan.paced): the pacer is done, and p goes
// back to the pool. The caller must be done with p and with the rows
// collect returned. Everything but the buffers is dropped, and the
// buffers hold no row (see topK.sorted), so a pooled plan keeps nothing
// alive but its own memory (at most MaxPageSize+1 slots, 80 KB).
func (p *plan) end() {
	p.pace.done()
	x := p.x
	clear(p.coll.h.slots) // a heap left unsorted (the scan failed)
	clear(p.rows)
	*p = plan{slots: p.slots[:0], rows: p.rows[:0]}
	x.plans.Put(p)
}

// kidsInPlan is how many kinds a plan's kinds filter holds without an
// allocation: the kinds a fleet collects by default and some more.
const kidsInPlan = 128

// paced makes p pause its long scans for writers and stop when ctx ends
// (see pacer); the read calls p.end when it ends.
func (p *plan) paced(s *Store, ctx context.Context) {
	p.pacing = s.newPacer(ctx)
	p.pace = &p.pacing
}

// idFilter is the ids of a filter's clusters or namespaces. The zero
// value allows any id. A filter names one value or a few, so the ids are
// a short list, held in the plan itself up to four (a map cost two
// allocations per dimension and query, and a cache miss per lookup),
// scanned when short and binary-searched when long. A plan is never
// copied, so ids may point at buf.
type idFilter struct {
	on  bool // the filter names values: only ids pass
	ids []uint32
	buf [4]uint32
}

// linearIDs is the longest idFilter scanned rather than binary-searched.
const linearIDs = 8

// add allows id; seal must follow the last add.
func (f *idFilter) add(id uint32) {
	if f.ids == nil {
		f.ids = f.buf[:0]
	}
	f.ids = append(f.ids, id)
}

// seal sorts the ids and drops duplicates, so that each is visited once.
func (f *idFilter) seal() {
	f.on = true
	if len(f.ids) > 1 {
		slices.Sort(f.ids)
		f.ids = slices.Compact(f.ids)
	}
}

// any reports whether the filter allows every id.
func (f *idFilter) any() bool { return !f.on }

// has reports whether id passes the filter (any id when the filter is off).
func (f *idFilter) has(id uint32) bool {
	if !f.on {
		return true
	}
	if len(f.ids) > linearIDs {
		_, ok := slices.BinarySearch(f.ids, id)
		return ok
	}
	for _, v := range f.ids {
		if v == id {
			return true
		}
	}
	return false
}

// labelReq is one compiled selector requirement.
type labelReq struct {
	op     selection.Operator
	key    uint32
	known  bool            // the key was ever interned
	pids   map[uint32]bool // pair ids of the values, for =, in, !=, notin
	values []string        // for gt, lt
}

// compile builds the plan for f and a. It must run under the read lock.
// It reads the cluster rows of db (a read transaction, two allocations)
// only for a cluster selector.
func (x *objIndex) compile(db tables.DB, f *Filter, a *Access) (*plan, error) {
	p := x.getPlan()
	p.x, p.access, p.accessAll = x, a, a != nil && a.All
	p.clusters.set(x.clusters, f.Clusters, &p.empty)
	if f.ClusterSelector != "" {
		sel, err := parseSelector("cluster selector", f.ClusterSelector)
		if err != nil {
			return nil, err
		}
		x.matchClusters(db.Txn(false), sel, &p.clusters)
		p.empty = p.empty || len(p.clusters.ids) == 0
	}
	p.nss.set(x.namespaces, f.Namespaces, &p.empty)
	if len(f.Kinds) > 0 {
		if n := len(x.kinds.byKid); n <= len(p.kidsBuf) {
			p.kids = p.kidsBuf[:n:n]
		} else {
			p.kids = make([]bool, n)
		}
		any := false
		for _, term := range f.Kinds {
			any = x.kinds.markKinds(term, p.kids) || any
		}
		p.empty = p.empty || !any
	}
	for _, st := range f.Statuses {
		i := statusIndex(st)
		if Statuses[i] != st {
			return nil, fmt.Errorf("%w: unknown status %q", ErrInvalidQuery, st)
		}
		p.statuses |= 1 << i
	}
	p.name = strings.ToLower(f.NameContains)
	if f.LabelSelector != "" {
		sel, err := parseSelector("label selector", f.LabelSelector)
		if err != nil {
			return nil, err
		}
		reqs, _ := sel.Requirements()
		for _, r := range reqs {
			lr := labelReq{op: r.Operator()}
			lr.key, lr.known = x.labels.keys.lookup(r.Key())
			switch lr.op {
			case selection.GreaterThan, selection.LessThan:
				lr.values = r.Values().List()
			default:
				lr.pids = map[uint32]bool{}
				for v := range r.Values() {
					if pid, ok := x.labels.lookup(r.Key(), v); ok {
						lr.pids[pid] = true
					}
				}
			}
			switch lr.op {
			case selection.Equals, selection.DoubleEquals, selection.In:
				p.empty = p.empty || len(lr.pids) == 0
			case selection.Exists, selection.GreaterThan, selection.LessThan:
				p.empty = p.empty || !lr.known
			}
			p.labelReqs = append(p.labelReqs, lr)
		}
	}
	if a == nil || (!a.All && len(a.Clusters) == 0) {
		p.empty = true
	}
	return p, nil
}

// parseSelector parses a label selector of a filter; what names it in the
// error.
func parseSelector(what, s string) (labels.Selector, error) {
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q: %w", ErrInvalidQuery, what, s, err)
	}
	return sel, nil
}

// matchClusters narrows f to the clusters whose labels sel matches (from
// every cluster when f is off). Every cluster that ever had rows has an
// id; one whose row is gone has no labels, as in Store.NewMatcher.
func (x *objIndex) matchClusters(txn tables.Txn, sel labels.Selector, f *idFilter) {
	matches := func(cid uint32) bool {
		var set labels.Set
		raw, err := txn.First(tableClusters, indexID, memKey(compoundKey(x.clusters.str(cid))))
		must(err)
		if c, ok := raw.(*Cluster); ok {
			set = c.Labels
		}
		return sel.Matches(set)
	}
	if f.on {
		kept := f.ids[:0]
		for _, cid := range f.ids {
			if matches(cid) {
				kept = append(kept, cid)
			}
		}
		f.ids = kept
		return
	}
	for cid := range uint32(x.clusters.len()) {
		if matches(cid) {
			f.add(cid)
		}
	}
	f.seal()
}

// set makes f allow the ids of the interned values; it stays off when
// values is empty (no filter). It sets *empty when no value was ever
// interned: the filter matches nothing.
func (f *idFilter) set(d *strDict, values []string, empty *bool) {
	if len(values) == 0 {
		return
	}
	for _, v := range values {
		if id, ok := d.lookup(v); ok {
			f.add(id)
		}
	}
	f.seal()
	*empty = *empty || len(f.ids) == 0
}

// markKinds sets kids[kid] for each kid matching one kinds filter term,
// and reports whether one did. A query compiles its kinds filter with it
// (no set or iterator to allocate: kids is the plan's). An ASCII name
// looks at the kinds byName lists under its lower case, and at the
// unfolded ones; those are a superset of the matches, each checked as
// before, so a fleet of many kinds costs a query no comparison per kind.
func (d *kindDict) markKinds(term string, kids []bool) bool {
	name, group, qualified := strings.Cut(term, ".")
	found := false
	mark := func(ki *kindInfo) {
		if qualified && ki.Group != group {
			return
		}
		if strings.EqualFold(ki.Kind.Kind, name) || strings.EqualFold(ki.Resource, name) {
			kids[ki.kid], found = true, true
		}
	}
	if !isASCII(name) {
		for _, ki := range d.infos {
			mark(ki)
		}
		return found
	}
	var buf [64]byte
	lower := append(buf[:0], name...)
	for i, c := range lower {
		if 'A' <= c && c <= 'Z' {
			lower[i] = c + 'a' - 'A'
		}
	}
	for _, ki := range d.byName[string(lower)] {
		mark(ki)
	}
	for _, ki := range d.unfolded {
		mark(ki)
	}
	return found
}

// aggregatable reports whether the filter uses only the dimensions of the
// count cells (cluster, namespace, kind, status).
func (p *plan) aggregatable() bool {
	return p.name == "" && len(p.labelReqs) == 0
}

// cellMatches reports whether a count cell passes the kind and status
// filters.
func (p *plan) cellMatches(key uint32) bool {
	kid, st := key>>3, uint8(key&7)
	if p.kids != nil && !p.wantsKind(kid) {
		return false
	}
	return p.statuses == 0 || p.statuses&(1<<st) != 0
}

// match reports whether r passes the filter and the access check.
func (p *plan) match(r *objRow) bool {
	return p.matchFilter(r) && p.visible(r)
}

// matchFilter evaluates the filter only.
func (p *plan) matchFilter(r *objRow) bool {
	if !p.clusters.has(r.cid) || !p.nss.has(r.nsid) {
		return false
	}
	if p.kids != nil && !p.wantsKind(r.kind.kid) {
		return false
	}
	if p.statuses != 0 && p.statuses&(1<<r.status) == 0 {
		return false
	}
	if p.name != "" && !containsFold(r.name(), p.name) {
		return false
	}
	for i := range p.labelReqs {
		if !p.matchLabel(&p.labelReqs[i], r) {
			return false
		}
	}
	return true
}

// matchLabel evaluates one requirement on a row.
func (p *plan) matchLabel(lr *labelReq, r *objRow) bool {
	pid, has := uint32(0), false
	if lr.known {
		ls := r.labels()
		for i := range ls.len() {
			id := ls.at(i)
			if p.x.labels.pairs.kv(id).kid == lr.key {
				pid, has = id, true
				break
			}
		}
	}
	switch lr.op {
	case selection.Equals, selection.DoubleEquals, selection.In:
		return has && lr.pids[pid]
	case selection.NotEquals, selection.NotIn:
		return !has || !lr.pids[pid]
	case selection.Exists:
		return has
	case selection.DoesNotExist:
		return !has
	case selection.GreaterThan, selection.LessThan:
		if !has || len(lr.values) != 1 {
			return false
		}
		v, err1 := strconv.ParseInt(p.x.labels.value(pid), 10, 64)
		w, err2 := strconv.ParseInt(lr.values[0], 10, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		if lr.op == selection.GreaterThan {
			return v > w
		}
		return v < w
	}
	return false
}

// containsFold reports whether s contains the lower-case sub, ignoring
// ASCII case in s, without allocating.
func containsFold(s, sub string) bool {
	if len(sub) > len(s) {
		return false
	}
outer:
	for i := 0; i+len(sub) <= len(s); i++ {
		for j := 0; j < len(sub); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				continue outer
			}
		}
		return true
	}
	return false
}

// clusterAccess returns the viewer's access for a cluster id, nil when the
// viewer sees nothing there. With access All it returns allClusters.
func (p *plan) clusterAccess(cid uint32) *ClusterAccess {
	if p.accessAll {
		return p.x.allCluster
	}
	if p.access == nil {
		return nil
	}
	p.resolveCluster(cid)
	return p.caByCID[cid]
}

// resolveCluster fills caByCID[cid] on first use.
func (p *plan) resolveCluster(cid uint32) {
	for int(cid) >= len(p.caByCID) {
		p.caByCID = append(p.caByCID, nil)
		p.idsByCID = append(p.idsByCID, nil)
		p.caDone = append(p.caDone, false)
	}
	if !p.caDone[cid] {
		p.caByCID[cid] = p.access.Clusters[p.x.clusters.str(cid)]
		p.caDone[cid] = true
	}
}

// visible applies the access check; it agrees with Access.Allows.
func (p *plan) visible(r *objRow) bool {
	if p.accessAll {
		return true
	}
	if p.access == nil {
		return false
	}
	p.resolveCluster(r.cid)
	ca, ids := p.caByCID[r.cid], p.idsByCID[r.cid]
	if ca == nil {
		return false
	}
	if ids == nil { // resolved only for row checks: facets read ca itself
		ids = p.x.resolveAccess(ca)
		p.idsByCID[r.cid] = ids
	}
	return ids.allows(ca, r)
}
