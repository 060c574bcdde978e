package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestClusterAccessAllows spells out the visibility rule of an access set,
// including Named entries without a namespace, which stand for the name in
// every namespace.
func TestClusterAccessAllows(t *testing.T) {
	ca := &ClusterAccess{
		Everywhere: NewResources(fluxGR),
		Namespaces: map[string]*Resources{"team": NewResources(podsGR)},
		Named: map[NamedObject]struct{}{
			{GroupResource: podsGR, Namespace: "ns1", Name: "one"}: {},
			{GroupResource: podsGR, Name: "any"}:                   {},
			{GroupResource: nodesGR, Name: "node-1"}:               {},
		},
	}
	type obj struct {
		gr            GroupResource
		namespace, nm string
	}
	shouldPass := []obj{
		{fluxGR, "ns9", "k"},    // Everywhere
		{podsGR, "team", "p"},   // listed in the namespace
		{podsGR, "ns1", "one"},  // named in its namespace
		{podsGR, "ns1", "any"},  // named in any namespace
		{podsGR, "ns2", "any"},  // named in any namespace
		{nodesGR, "", "node-1"}, // cluster-scoped, named
		{podsGR, "", "any"},     // the entry itself
		{podsGR, "kube-system", "any"},
	}
	shouldFail := []obj{
		{podsGR, "ns2", "one"},     // named in another namespace
		{podsGR, "ns1", "p"},       // not named
		{nodesGR, "", "node-2"},    // another node
		{nodesGR, "ns1", "node-2"}, // not named anywhere
		{fluxGR.withResource("x"), "ns1", "any"},
	}
	for _, o := range shouldPass {
		if !ca.Allows(o.gr, o.namespace, o.nm) {
			t.Errorf("should allow %+v", o)
		}
	}
	for _, o := range shouldFail {
		if ca.Allows(o.gr, o.namespace, o.nm) {
			t.Errorf("should not allow %+v", o)
		}
	}
	var nilCA *ClusterAccess
	if nilCA.Allows(podsGR, "ns1", "any") {
		t.Error("a nil ClusterAccess allows nothing")
	}
}

func (gr GroupResource) withResource(r string) GroupResource {
	gr.Resource = r
	return gr
}

// TestAnyNamespaceNamedInQueries checks that queries (with the access set
// as the candidate source and as a filter), counts, facets and Matcher all
// show a name granted in any namespace, once, next to an exact Named entry
// and a namespace list that cover some of the same objects.
func TestAnyNamespaceNamedInQueries(t *testing.T) {
	s, _ := newTestStore(t)
	var rows []Object
	for _, ns := range []string{"a", "b", "c", "d"} {
		rows = append(rows, pod("c1", ns, "x", StatusHealthy, nil), pod("c1", ns, "y", StatusUnhealthy, nil))
		for i := range 50 { // filler, so that the access set is the smallest source
			rows = append(rows, pod("c1", ns, fmt.Sprintf("filler-%02d", i), StatusHealthy, nil))
		}
	}
	rows = append(rows, pod("c2", "a", "x", StatusHealthy, nil)) // another cluster
	node := Object{Cluster: "c1", Version: "v1", Kind: "Node", Resource: "nodes", Name: "x", Status: StatusHealthy}
	rows = append(rows, node)
	mustNoErr(t, s.UpsertBatch(ctxb, rows))

	acc := &Access{Clusters: map[string]*ClusterAccess{"c1": {
		Namespaces: map[string]*Resources{"c": NewResources(podsGR)},
		Named: map[NamedObject]struct{}{
			{GroupResource: podsGR, Name: "x"}:                 {}, // x in a, b, c, d
			{GroupResource: podsGR, Namespace: "a", Name: "x"}: {}, // again in a
			{GroupResource: podsGR, Namespace: "b", Name: "y"}: {},
		},
	}}}
	var want []string // c1 pods x in a, b, d, y in b, everything in c
	for _, o := range rows {
		if refAllows(acc, o.Cluster, GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name) {
			want = append(want, o.Key().String())
		}
	}
	slices.Sort(want)
	if len(want) != 3+1+52 {
		t.Fatalf("reference sees %d objects: %v", len(want), want)
	}
	for _, f := range []Filter{{}, {Kinds: []string{"Pod"}}, {Namespaces: []string{"a", "b"}}, {NameContains: "x"}} {
		got, _ := pageKeys(t, s, f, acc, 7)
		var wantF []Object
		var wantKeys []string
		m, err := NewMatcher(f, acc)
		mustNoErr(t, err)
		for i := range rows {
			if m.Match(&rows[i]) {
				wantF = append(wantF, rows[i])
				wantKeys = append(wantKeys, rows[i].Key().String())
			}
		}
		slices.Sort(wantKeys)
		if !slices.Equal(got, wantKeys) {
			t.Errorf("filter %+v: query shows %v, want %v", f, got, wantKeys)
		}
		if len(f.Kinds)+len(f.Namespaces)+len(f.NameContains) == 0 && !slices.Equal(got, want) {
			t.Errorf("query shows %v, want %v", got, want)
		}
		checkFacets(t, s, f, acc, wantF)
	}
}

// TestAccessReusedAsTheIndexGrows queries with the same Access values while
// namespaces and kinds they name appear in the index: a query resolves an
// access set against the index's dictionaries once and keeps the result on
// it (accessIDs), so that result must notice a namespace or kind that had
// no id when it was built. Resource sets are shared between namespaces, as
// authz shares them.
func TestAccessReusedAsTheIndexGrows(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 9))
	s, _ := newTestStore(t)
	hr := Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	hrGR := GroupResource{Group: hr.Group, Resource: hr.Resource}
	grSets := []*Resources{
		NewResources(podsGR), NewResources(podsGR, hrGR), NewResources(fluxGR, hrGR),
	}
	var accesses []*Access
	for range 40 {
		a := &Access{Clusters: map[string]*ClusterAccess{}}
		for c := range 2 {
			ca := &ClusterAccess{Namespaces: map[string]*Resources{}}
			if rnd.IntN(3) == 0 {
				ca.Everywhere = NewResources([]GroupResource{hrGR, nodesGR, fluxGR}[rnd.IntN(3)])
			}
			for range 1 + rnd.IntN(4) {
				ca.Namespaces[fmt.Sprintf("ns%d", rnd.IntN(6))] = grSets[rnd.IntN(len(grSets))]
			}
			if rnd.IntN(4) == 0 {
				ca.Named = map[NamedObject]struct{}{{GroupResource: hrGR, Name: fmt.Sprintf("o%d", rnd.IntN(5))}: {}}
			}
			a.Clusters[fmt.Sprintf("c%d", c)] = ca
		}
		accesses = append(accesses, a)
	}
	model := map[Key]Object{}
	add := func(k Kind, namespaces int) {
		for range 60 {
			ns := fmt.Sprintf("ns%d", rnd.IntN(namespaces))
			if !k.Namespaced {
				ns = ""
			}
			o := Object{
				Cluster: fmt.Sprintf("c%d", rnd.IntN(2)), Namespace: ns, Name: fmt.Sprintf("o%d", rnd.IntN(5)),
				Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource, Status: StatusHealthy,
			}
			mustNoErr(t, s.Upsert(ctxb, o))
			model[o.Key()] = o
		}
	}
	check := func(phase string) {
		t.Helper()
		for i, a := range accesses {
			want := map[Key]bool{}
			for k, o := range model {
				if refAllows(a, o.Cluster, GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name) {
					want[k] = true
				}
			}
			p, err := s.Query(ctxb, Query{Access: a, First: MaxPageSize})
			mustNoErr(t, err)
			if p.TotalCount != len(want) || len(p.Edges) != len(want) {
				t.Fatalf("%s: access %d: %d rows (total %d), want %d", phase, i, len(p.Edges), p.TotalCount, len(want))
			}
			for _, e := range p.Edges {
				if !want[e.Object.Key()] {
					t.Fatalf("%s: access %d shows %s, which it may not see", phase, i, e.Object.Key())
				}
			}
		}
	}
	add(podKind, 2) // ns0 and ns1 only; no Kustomizations, HelmReleases or Nodes
	check("pods in two namespaces")
	add(podKind, 6) // namespaces the access sets named without ids so far
	check("pods in six namespaces")
	add(flux, 6)
	add(nodeKind, 1)
	check("Kustomizations and Nodes")
	add(hr, 6) // a kind the access sets named before it existed
	check("HelmReleases")
}

// TestAccessEstimateFollowsRows checks that the access source's estimate,
// kept on the ClusterAccess between queries, changes when a row of the
// cluster comes or goes, and only then, and that an estimate stopped at a
// limit is not taken for a whole one.
func TestAccessEstimateFollowsRows(t *testing.T) {
	s, _ := newTestStore(t)
	for _, o := range []Object{
		pod("c1", "a", "a1", StatusHealthy, nil), pod("c1", "a", "a2", StatusHealthy, nil), pod("c1", "a", "a3", StatusHealthy, nil),
		pod("c1", "b", "b1", StatusHealthy, nil), pod("c1", "b", "b2", StatusHealthy, nil),
		pod("c1", "z", "z1", StatusHealthy, nil), pod("c2", "a", "a1", StatusHealthy, nil),
	} {
		mustNoErr(t, s.Upsert(ctxb, o))
	}
	pods := NewResources(GroupResource{Resource: "pods"})
	ca := &ClusterAccess{Namespaces: map[string]*Resources{"a": pods, "b": pods, "new": pods}}
	estimate := func(limit int) (int, *accessEst) {
		s.mu.RLock()
		defer s.mu.RUnlock()
		cid, _ := s.x.clusters.lookup("c1")
		n := s.x.accessEstimate(cid, ca, limit)
		return n, s.x.resolveAccess(ca).est.Load()
	}
	check := func(what string, want int, same *accessEst) *accessEst {
		t.Helper()
		n, e := estimate(1000)
		if n != want {
			t.Fatalf("%s: estimate %d, want %d", what, n, want)
		}
		if same != nil && e != same {
			t.Fatalf("%s: estimated again; the cluster's rows did not change", what)
		}
		return e
	}
	e := check("first", 5, nil)
	check("again", 5, e)
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", "a1", StatusUnhealthy, nil)))
	check("a status change", 5, e)
	mustNoErr(t, s.Upsert(ctxb, pod("c2", "b", "b9", StatusHealthy, nil)))
	check("a row of another cluster", 5, e)
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", "a4", StatusHealthy, nil)))
	check("a row comes", 6, nil)
	mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c1", Kind: "Pod", Namespace: "b", Name: "b1"}))
	check("a row goes", 5, nil)
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "new", "n1", StatusHealthy, nil)))
	check("a row in a namespace that had no id", 6, nil)
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "b", "b3", StatusHealthy, nil)))
	if n, e := estimate(3); n < 3 || e.full {
		t.Fatalf("limit 3: estimate %d (kept as whole: %v), want at least 3, not whole", n, e.full)
	}
	e = check("after a limited estimate", 7, nil)
	check("again", 7, e)
}
