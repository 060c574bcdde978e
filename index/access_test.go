package index

import (
	"fmt"
	"slices"
	"testing"
)

// TestClusterAccessAllows spells out the visibility rule of an access set,
// including Named entries without a namespace, which stand for the name in
// every namespace.
func TestClusterAccessAllows(t *testing.T) {
	ca := &ClusterAccess{
		Everywhere: map[GroupResource]struct{}{fluxGR: {}},
		Namespaces: map[string]map[GroupResource]struct{}{"team": {podsGR: {}}},
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
		Namespaces: map[string]map[GroupResource]struct{}{"c": {podsGR: {}}},
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
		var got []string
		after := ""
		for {
			p, err := s.Query(ctxb, Query{Filter: f, Access: acc, First: 7, After: after})
			mustNoErr(t, err)
			for _, e := range p.Edges {
				got = append(got, e.Object.Key().String())
			}
			if !p.HasNextPage {
				break
			}
			after = p.Edges[len(p.Edges)-1].Cursor
		}
		slices.Sort(got)
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
