package index

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
)

// TestAccessCellSource checks a restricted viewer's cell source (the
// clusters' (kind, status) lists less the rows the viewer's namespaces
// hide) against brute force, for access sets of one namespace, of many
// namespaces sharing one set of resources, of namespaces granting
// different resources, with resources listed everywhere, whole clusters,
// named grants (in one namespace and in any), and a namespace grant of a
// cluster-scoped resource: the source yields every visible match and est
// rows, and when it says it is exact, exactly the visible matches. Pages
// of the same queries are checked too. The checks run again after a
// namespace's rows are all deleted and its id is reused by another
// namespace, after it comes back, and after a cluster an access set names
// gets rows, with the access sets' resolved ids kept from the first
// queries.
func TestAccessCellSource(t *testing.T) {
	s, _ := newTestStore(t, WithReplayBuffer(8))
	hr := Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	hrGR := GroupResource{Group: hr.Group, Resource: hr.Resource}
	kinds := []Kind{podKind, flux, hr, nodeKind}
	model := map[Key]Object{}
	put := func(cluster, ns string, k Kind, i int) {
		if !k.Namespaced {
			ns = ""
		}
		o := Object{
			Cluster: cluster, Namespace: ns, Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource,
			Name: fmt.Sprintf("o%d", i), Status: Statuses[i%3],
		}
		mustNoErr(t, s.Upsert(ctxb, o))
		model[o.Key()] = o
	}
	fill := func(namespaces ...string) {
		for c := range 3 {
			for _, ns := range namespaces {
				for i, k := range kinds {
					for j := range 3 {
						put(fmt.Sprintf("c%d", c), ns, k, i*3+j)
					}
				}
			}
		}
	}
	fill("ns0", "ns1", "ns2", "ns3")

	shared := NewResources(podsGR, fluxGR, hrGR)
	podsOnly, podsFlux := NewResources(podsGR), NewResources(podsGR, fluxGR)
	nsAccess := func(grs *Resources, namespaces ...string) map[string]*Resources {
		out := map[string]*Resources{}
		for _, ns := range namespaces {
			out[ns] = grs
		}
		return out
	}
	cases := []struct {
		name string
		a    *Access
		// exact is whether the source is exact for a Kustomization filter
		// (no name, label or namespace filter).
		exact bool
	}{
		{"one namespace", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: nsAccess(podsFlux, "ns1")},
		}}, true},
		{"shared set in every cluster", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: nsAccess(shared, "ns0", "ns1", "ns3")},
			"c1": {Namespaces: nsAccess(shared, "ns1", "ns2")},
			"c2": {Namespaces: nsAccess(shared, "ns1")},
		}}, true},
		{"sets that differ by namespace", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: map[string]*Resources{"ns0": podsOnly, "ns1": podsFlux, "ns2": podsFlux}},
			"c1": {Namespaces: map[string]*Resources{"ns1": podsOnly, "ns3": NewResources(hrGR)}},
		}}, false},
		{"everywhere and whole clusters", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Everywhere: NewResources(fluxGR, nodesGR), Namespaces: nsAccess(podsOnly, "ns0")},
			"c1": {All: true},
			"c2": {Namespaces: nsAccess(shared, "ns2")},
		}}, true},
		{"named grants", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: nsAccess(podsOnly, "ns0"), Named: map[NamedObject]struct{}{
				{GroupResource: fluxGR, Name: "o4"}:                    {},
				{GroupResource: fluxGR, Namespace: "ns2", Name: "o5"}:  {},
				{GroupResource: nodesGR, Name: "o9"}:                   {},
				{GroupResource: hrGR, Namespace: "ns3", Name: "o7"}:    {},
				{GroupResource: podsGR, Namespace: "ns9", Name: "o0"}:  {},
				{GroupResource: fluxGR, Namespace: "ns1", Name: "o99"}: {},
			}},
			"c1": {Namespaces: nsAccess(podsFlux, "ns1", "ns3")},
		}}, false},
		{"a cluster-scoped resource granted in namespaces", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: nsAccess(NewResources(nodesGR, podsGR, fluxGR), "ns0", "ns2")},
			"c2": {Namespaces: nsAccess(NewResources(nodesGR), "ns1")},
		}}, true},
		{"namespaces and a cluster not in the index yet", &Access{Clusters: map[string]*ClusterAccess{
			"c0": {Namespaces: nsAccess(shared, "ns1", "nsnew", "ns9")},
			"c1": {Namespaces: nsAccess(shared, "nsnew")},
			"c3": {Namespaces: nsAccess(shared, "ns0", "ns1")},
		}}, true},
	}
	filters := []Filter{
		{Kinds: []string{"Kustomization"}},
		{Kinds: []string{"Pod"}, Statuses: []Status{StatusUnhealthy}},
		{Kinds: []string{"Node"}},
		{Statuses: []Status{StatusHealthy}},
		{Kinds: []string{"HelmRelease", "Kustomization"}, Statuses: []Status{StatusProgressing, StatusUnhealthy}},
		{Kinds: []string{"Kustomization"}, NameContains: "o4"},
		{Kinds: []string{"Kustomization"}, Namespaces: []string{"ns1"}},
		{Kinds: []string{"Pod", "Node"}, Clusters: []string{"c0"}},
	}
	check := func(phase string) {
		t.Helper()
		for _, c := range cases {
			for fi, f := range filters {
				what := fmt.Sprintf("%s: %s: filter %d %+v", phase, c.name, fi, f)
				want := map[uint32]bool{}
				var wantObjs []Object
				for _, o := range model {
					if refMatch(t, f, c.a, &o, s) {
						k := o.Key()
						want[s.x.lookup(&k).rid] = true
						wantObjs = append(wantObjs, o)
					}
				}
				s.mu.RLock()
				p, err := s.x.compile(s.db, &f, c.a)
				mustNoErr(t, err)
				src, ok := p.accessCellSource(math.MaxInt)
				var got []uint32
				if ok {
					src.each(func(rid uint32) bool { got = append(got, rid); return true })
				}
				s.mu.RUnlock()
				if !ok {
					t.Fatalf("%s: no access cell source", what)
				}
				if len(got) != src.est {
					t.Fatalf("%s: yielded %d rows, est %d", what, len(got), src.est)
				}
				yielded := map[uint32]bool{}
				for _, rid := range got {
					if yielded[rid] {
						t.Fatalf("%s: row %d yielded twice", what, rid)
					}
					yielded[rid] = true
				}
				for rid := range want {
					if !yielded[rid] {
						t.Fatalf("%s: visible match %s not yielded", what, s.x.keyOf(s.x.rows[rid]))
					}
				}
				if src.exact && len(got) != len(want) {
					t.Fatalf("%s: exact source yields %d rows, want the %d visible matches", what, len(got), len(want))
				}
				if fi == 0 && src.exact != c.exact {
					t.Fatalf("%s: exact %v, want %v", what, src.exact, c.exact)
				}
				slices.SortFunc(wantObjs, func(x, y Object) int { return refCompare(Order{}, &x, &y) })
				checkPaged(t, s, Query{Filter: f, Access: c.a, First: 4}, wantObjs, what)
			}
		}
	}
	check("four namespaces")

	// ns1 goes away: its id is unmapped, then reclaimed (the replay buffer
	// holds 8 events) and given to the next new namespace.
	s.mu.RLock()
	ns1, _ := s.x.namespaces.lookup("ns1")
	s.mu.RUnlock()
	for _, k := range slices.Collect(maps.Keys(model)) {
		if k.Namespace == "ns1" {
			mustNoErr(t, s.Delete(ctxb, k))
			delete(model, k)
		}
	}
	for i := range 20 {
		put("c0", "ns0", podKind, 100+i)
	}
	check("ns1 deleted")
	fill("nsnew")
	s.mu.RLock()
	reused, _ := s.x.namespaces.lookup("nsnew")
	s.mu.RUnlock()
	if reused != ns1 {
		t.Fatalf("nsnew has id %d, ns1 had %d: the test needs the id reused", reused, ns1)
	}
	check("nsnew in ns1's id")
	fill("ns1")
	check("ns1 back")
	for i, k := range kinds {
		put("c3", "ns0", k, i)
		put("c3", "ns2", k, i)
	}
	check("a new cluster")
}
