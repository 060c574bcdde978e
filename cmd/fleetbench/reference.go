package main

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// reference holds the answers the index benchmark's timed queries must
// give, computed by brute force from the generator, never through the
// index: for each named query, every matching key in name order (the first
// page of the answer) and how many there are; and the facets of the whole
// fleet.
type reference struct {
	pages    map[string][]index.Key
	totals   map[string]int
	kinds    map[string]int
	statuses map[index.Status]int
}

// computeReference generates every object of the fleet once and keeps,
// for each predicate, the first `first` matching keys in name order and
// the number of matches.
func computeReference(f indextest.Fleet, first int, preds map[string]func(*index.Object) bool) *reference {
	ref := &reference{pages: map[string][]index.Key{}, totals: map[string]int{}, kinds: map[string]int{}, statuses: map[index.Status]int{}}
	for i := range f.Size() {
		o := f.Object(i)
		ref.kinds[index.Kind{Group: o.Group, Kind: o.Kind}.GroupKind()]++
		ref.statuses[o.Status]++
		for name, pred := range preds {
			if pred(&o) {
				ref.totals[name]++
				ref.pages[name] = append(ref.pages[name], o.Key())
				if len(ref.pages[name]) >= 64*first {
					ref.pages[name] = firstInNameOrder(ref.pages[name], first)
				}
			}
		}
	}
	for name, keys := range ref.pages {
		ref.pages[name] = firstInNameOrder(keys, first)
	}
	return ref
}

// firstInNameOrder sorts keys as the index orders a page by name (name,
// then cluster, group, kind and namespace) and keeps the first n.
func firstInNameOrder(keys []index.Key, n int) []index.Key {
	slices.SortFunc(keys, func(a, b index.Key) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Group, b.Group),
			cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace))
	})
	return keys[:min(n, len(keys))]
}

// checkPage compares a page with the reference answer of query name: the
// same total, and the same keys in the same order.
func (r *reference) checkPage(name string, p *index.Page) error {
	want := r.pages[name]
	if p.TotalCount != r.totals[name] {
		return fmt.Errorf("%s: total %d, the generator says %d", name, p.TotalCount, r.totals[name])
	}
	if len(p.Edges) != len(want) {
		return fmt.Errorf("%s: %d rows, the generator says %d", name, len(p.Edges), len(want))
	}
	for i, e := range p.Edges {
		if k := e.Object.Key(); k != want[i] {
			return fmt.Errorf("%s: row %d is %s, the generator says %s", name, i, k, want[i])
		}
	}
	return nil
}

// checkFacets compares fleet-wide facets with the reference counts.
func (r *reference) checkFacets(f *index.Facets, objects int) error {
	if f.Total != objects {
		return fmt.Errorf("facets count %d objects of %d", f.Total, objects)
	}
	got := map[string]int{}
	for _, c := range f.Kinds {
		got["kind "+c.Value] = c.Count
	}
	for _, c := range f.Statuses {
		got["status "+c.Value] = c.Count
	}
	want := map[string]int{}
	for k, n := range r.kinds {
		want["kind "+k] = n
	}
	for s, n := range r.statuses {
		want["status "+string(s)] = n
	}
	for k, n := range got {
		if n != want[k] {
			return fmt.Errorf("facets count %d of %s, the generator says %d", n, k, want[k])
		}
	}
	for k, n := range want {
		if got[k] != n {
			return fmt.Errorf("facets count %d of %s, the generator says %d", got[k], k, n)
		}
	}
	return nil
}
