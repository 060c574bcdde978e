package index

import (
	"fmt"
	"slices"
	"testing"
)

// TestEachClusterMapsItsOwnResources checks that a cluster's rows are
// checked against the resource that cluster reported for their kind, in
// pages, totals, facets and Matcher alike, when two clusters disagree. It
// is the attack of issue 12: an edge for cluster "a" reports Services with
// the resource "pods" before cluster "b" reports its own, and a viewer of
// "b" who may list only pods must still not see, or count, "b"'s Services.
func TestEachClusterMapsItsOwnResources(t *testing.T) {
	s, _ := newTestStore(t)
	lying := Kind{Version: "v1", Kind: "Service", Resource: "pods", Namespaced: true}
	svc := Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
	obj := func(k Kind, cluster, ns, name string) Object {
		return Object{
			Cluster: cluster, Namespace: ns, Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource,
			Name: name, UID: "uid-" + name, Status: StatusHealthy,
		}
	}
	var first, pods, svcs []Object
	for _, ns := range []string{"web", "db"} {
		first = append(first, obj(lying, "a", ns, "svc-a"))
		for i := range 10 {
			pods = append(pods, obj(podKind, "b", ns, fmt.Sprintf("pod-%d", i)))
			svcs = append(svcs, obj(svc, "b", ns, fmt.Sprintf("svc-%d", i)))
		}
	}
	mustNoErr(t, s.Replace(ctxb, "a", lying, first)) // "a" interns Service first
	mustNoErr(t, s.Replace(ctxb, "b", podKind, pods))
	mustNoErr(t, s.Replace(ctxb, "b", svc, svcs))
	all := slices.Concat(first, pods, svcs)

	svcsGR := GroupResource{Resource: "services"}
	accesses := map[string]*Access{
		"list pods in b": {Clusters: map[string]*ClusterAccess{"b": {Everywhere: NewResources(podsGR)}}},
		"list pods in b/web": {Clusters: map[string]*ClusterAccess{"b": {
			Namespaces: map[string]*Resources{"web": NewResources(podsGR)},
		}}},
		"get pods named svc-1 in b": {Clusters: map[string]*ClusterAccess{"b": {
			Named: map[NamedObject]struct{}{{GroupResource: podsGR, Name: "svc-1"}: {}, {GroupResource: podsGR, Name: "pod-1"}: {}},
		}}},
		"list services in b": {Clusters: map[string]*ClusterAccess{"b": {Everywhere: NewResources(svcsGR)}}},
		"list pods in a and b": {Clusters: map[string]*ClusterAccess{
			"a": {Everywhere: NewResources(podsGR)},
			"b": {Everywhere: NewResources(podsGR)},
		}},
	}
	for name, acc := range accesses {
		t.Run(name, func(t *testing.T) { checkOwnResources(t, s, name, acc, all) })
	}
}

// checkOwnResources compares pages, totals, facets and Matcher with the
// reference, which checks each row against its own resource.
func checkOwnResources(t *testing.T, s *Store, name string, acc *Access, all []Object) {
	filters := []Filter{{}, {Kinds: []string{"Service"}}, {Kinds: []string{"Pod"}}, {Namespaces: []string{"web"}}, {Clusters: []string{"b"}}}
	for _, f := range filters {
		m, err := NewMatcher(f, acc)
		mustNoErr(t, err)
		var want []Object
		var wantKeys []string
		for _, o := range all {
			visible := refAllows(acc, o.Cluster, GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name)
			if o.Cluster == "b" && o.Kind == "Service" && visible != (name == "list services in b") {
				t.Fatalf("reference: %s sees %s: %v", name, o.Key(), visible)
			}
			if refMatch(t, f, acc, &o) {
				want = append(want, o)
				wantKeys = append(wantKeys, o.Key().String())
			}
			if got := m.Match(&o); got != refMatch(t, f, acc, &o) {
				t.Errorf("%s, filter %+v: Matcher says %v for %s", name, f, got, o.Key())
			}
		}
		slices.Sort(wantKeys)
		got, totals := pageKeys(t, s, f, acc, 2)
		if !slices.Equal(got, wantKeys) {
			t.Errorf("%s, filter %+v: pages show %v, want %v", name, f, got, wantKeys)
		}
		for _, n := range totals {
			if n != len(want) {
				t.Errorf("%s, filter %+v: totalCount %d, want %d", name, f, n, len(want))
			}
		}
		checkFacets(t, s, f, acc, want)
	}
}

// pageKeys pages through a query and returns the keys it showed, sorted,
// and the totalCount of each page.
func pageKeys(t *testing.T, s *Store, f Filter, acc *Access, first int) (keys []string, totals []int) {
	t.Helper()
	after := ""
	for {
		p, err := s.Query(ctxb, Query{Filter: f, Access: acc, First: first, After: after})
		mustNoErr(t, err)
		totals = append(totals, p.TotalCount)
		for _, e := range p.Edges {
			keys = append(keys, e.Object.Key().String())
		}
		if !p.HasNextPage {
			break
		}
		after = p.Edges[len(p.Edges)-1].Cursor
	}
	slices.Sort(keys)
	return keys, totals
}
