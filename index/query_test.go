package index

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	flux      = Kind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true}
	nodeKind  = Kind{Version: "v1", Kind: "Node", Resource: "nodes"}
	podsGR    = GroupResource{Resource: "pods"}
	fluxGR    = GroupResource{Group: flux.Group, Resource: flux.Resource}
	nodesGR   = GroupResource{Resource: "nodes"}
	randomGRs = []GroupResource{podsGR, fluxGR, nodesGR}
)

// randomObject returns a random object of a small fleet, so that random
// filters hit often. A few are cluster-scoped Nodes.
func randomObject(rnd *rand.Rand) Object {
	k := podKind
	switch rnd.IntN(8) {
	case 0, 1:
		k = flux
	case 2:
		k = nodeKind
	}
	ns := fmt.Sprintf("ns%d", rnd.IntN(4))
	if !k.Namespaced {
		ns = ""
	}
	o := Object{
		Cluster:   fmt.Sprintf("c%d", rnd.IntN(3)),
		Namespace: ns,
		Group:     k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource,
		Name:      fmt.Sprintf("obj-%02d", rnd.IntN(40)),
		Status:    Statuses[rnd.IntN(len(Statuses))],
		CreatedAt: time.Time{},
	}
	// Creation time is a property of the key, as it is of a live object.
	o.CreatedAt = time.Unix(int64(len(o.Cluster+o.Namespace+o.Kind)*7+int(o.Name[len(o.Name)-1])), 0).UTC()
	labels := map[string]string{}
	for range rnd.IntN(3) {
		labels[fmt.Sprintf("k%d", rnd.IntN(3))] = fmt.Sprintf("v%d", rnd.IntN(3))
	}
	if rnd.IntN(2) == 0 {
		labels["n"] = fmt.Sprint(rnd.IntN(10))
	}
	o.Labels = LabelsOf(labels)
	return o
}

func randomFilter(rnd *rand.Rand) Filter {
	var f Filter
	pick := func(n int, name func(int) string) []string {
		var out []string
		for range rnd.IntN(3) {
			out = append(out, name(rnd.IntN(n)))
		}
		return out
	}
	if rnd.IntN(2) == 0 {
		f.Clusters = pick(4, func(i int) string { return fmt.Sprintf("c%d", i) })
	}
	if rnd.IntN(2) == 0 {
		f.Namespaces = pick(5, func(i int) string { return fmt.Sprintf("ns%d", i) })
	}
	if rnd.IntN(2) == 0 {
		f.Kinds = pick(4, func(i int) string {
			return []string{"Pod", "Kustomization.kustomize.toolkit.fluxcd.io", "pods", "nodes"}[i]
		})
	}
	if rnd.IntN(3) == 0 {
		for range 1 + rnd.IntN(2) {
			f.Statuses = append(f.Statuses, Statuses[rnd.IntN(len(Statuses))])
		}
	}
	if rnd.IntN(4) == 0 {
		f.NameContains = fmt.Sprintf("J-%d", rnd.IntN(4))
	}
	if rnd.IntN(2) == 0 {
		f.LabelSelector = []string{
			"k0=v1", "k1!=v0", "k2 in (v0,v2)", "k0 notin (v1)", "k1", "!k2", "n>4", "n<3", "k0=v0,k1", "missing=x", "!missing",
		}[rnd.IntN(11)]
	}
	if rnd.IntN(3) == 0 {
		f.ClusterSelector = []string{
			"env=prod", "region in (eu-west-1)", "env=prod,region in (eu-west-1)", "env!=prod", "!env", "env", "missing=x",
		}[rnd.IntN(7)]
	}
	return f
}

// clusterLabels are the labels of the random fleet's clusters; c2 has no
// cluster row, so it has no labels.
var clusterLabels = map[string]map[string]string{
	"c0": {"env": "prod", "region": "eu-west-1"},
	"c1": {"env": "staging", "region": "eu-west-1"},
}

// upsertClusters writes the random fleet's cluster rows.
func upsertClusters(t testing.TB, s *Store) {
	t.Helper()
	for name, labels := range clusterLabels {
		mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: name, Labels: labels, State: StateConnected}))
	}
}

func randomAccess(rnd *rand.Rand) *Access {
	if rnd.IntN(4) == 0 {
		return &Access{All: true}
	}
	pods, ks := podsGR, fluxGR
	a := &Access{Clusters: map[string]*ClusterAccess{}}
	for c := range 3 {
		if rnd.IntN(3) == 0 {
			continue
		}
		ca := &ClusterAccess{Namespaces: map[string]*Resources{}, Named: map[NamedObject]struct{}{}}
		switch rnd.IntN(4) {
		case 0:
			ca.All = true
		case 1:
			ca.Everywhere = NewResources(ks)
		}
		for range rnd.IntN(3) {
			grs := NewResources(pods)
			if rnd.IntN(2) == 0 {
				grs = NewResources(pods, ks)
			}
			ca.Namespaces[fmt.Sprintf("ns%d", rnd.IntN(4))] = grs
		}
		for range rnd.IntN(6) {
			// Namespace "" is the name in any namespace (a
			// ClusterRoleBinding with resourceNames), or a Node.
			gr := randomGRs[rnd.IntN(len(randomGRs))]
			ns := fmt.Sprintf("ns%d", rnd.IntN(4))
			if gr == nodesGR || rnd.IntN(3) == 0 {
				ns = ""
			}
			ca.Named[NamedObject{GroupResource: gr, Namespace: ns, Name: fmt.Sprintf("obj-%02d", rnd.IntN(40))}] = struct{}{}
		}
		a.Clusters[fmt.Sprintf("c%d", c)] = ca
	}
	return a
}

// refMatch is the reference definition of a filter and access match:
// Matcher works on whole Objects with labels.Selector and Access.Allows,
// and on the clusters' labels of s when s is not nil. It also checks
// Access.Allows against refAllows.
func refMatch(t testing.TB, f Filter, a *Access, o *Object, s ...*Store) bool {
	t.Helper()
	m, err := NewMatcher(f, a)
	if len(s) > 0 {
		m, err = s[0].NewMatcher(f, a)
	}
	if err != nil {
		t.Fatal(err)
	}
	gr := GroupResource{Group: o.Group, Resource: o.Resource}
	if got, want := a.Allows(o.Cluster, gr, o.Namespace, o.Name), refAllows(a, o.Cluster, gr, o.Namespace, o.Name); got != want {
		t.Fatalf("Access.Allows(%s) = %v, reference %v; access %+v", o.Key(), got, want, a.Clusters[o.Cluster])
	}
	return m.Match(o)
}

// refAllows is the visibility rule written out plainly, apart from
// Access.Allows: list everywhere, list in the object's namespace, or get by
// name in its namespace or, through a Named entry without a namespace, in
// any namespace.
func refAllows(a *Access, cluster string, gr GroupResource, namespace, name string) bool {
	if a == nil {
		return false
	}
	if a.All {
		return true
	}
	ca := a.Clusters[cluster]
	if ca == nil {
		return false
	}
	if ca.All {
		return true
	}
	for g := range ca.Everywhere.All() {
		if g == gr {
			return true
		}
	}
	if grs, ok := ca.Namespaces[namespace]; ok && namespace != "" {
		for g := range grs.All() {
			if g == gr {
				return true
			}
		}
	}
	for no := range ca.Named {
		if no.GroupResource == gr && no.Name == name && (no.Namespace == namespace || no.Namespace == "") {
			return true
		}
	}
	return false
}

// refCompare is the reference order: the field, then the key.
func refCompare(o Order, a, b *Object) int {
	c := 0
	switch o.Field {
	case OrderName, "":
		c = cmp.Compare(a.Name, b.Name)
	case OrderNamespace:
		c = cmp.Compare(a.Namespace, b.Namespace)
	case OrderKind:
		c = cmp.Compare(a.Kind, b.Kind)
	case OrderStatus:
		c = cmp.Compare(statusIndex(a.Status), statusIndex(b.Status))
	case OrderCreatedAt:
		c = a.CreatedAt.Compare(b.CreatedAt)
	case OrderUpdatedAt:
		c = a.UpdatedAt.Compare(b.UpdatedAt)
	}
	if c == 0 {
		c = cmp.Compare(objectKey(a.Key()), objectKey(b.Key()))
	}
	if o.Desc {
		c = -c
	}
	return c
}

var allOrders = []OrderField{OrderName, OrderNamespace, OrderCluster, OrderKind, OrderStatus, OrderCreatedAt, OrderUpdatedAt}

// TestQueryMatchesReference pages through random filters, orders and
// access sets and compares every page, total and facet with brute force.
func TestQueryMatchesReference(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 7))
	s, clk := newTestStore(t)
	upsertClusters(t, s)
	model := map[Key]Object{}
	for range 400 {
		o := randomObject(rnd)
		mustNoErr(t, s.Upsert(ctxb, o))
		clk.Advance(time.Second)
	}
	for _, o := range drainObjects(t, s) {
		model[o.Key()] = *o
	}
	for i := range 300 {
		f, a := randomFilter(rnd), randomAccess(rnd)
		order := Order{Field: allOrders[rnd.IntN(len(allOrders))], Desc: rnd.IntN(2) == 0}
		var want []Object
		for _, o := range model {
			if refMatch(t, f, a, &o, s) {
				want = append(want, o)
			}
		}
		slices.SortFunc(want, func(x, y Object) int { return refCompare(order, &x, &y) })
		q := Query{Filter: f, Order: order, First: 1 + rnd.IntN(15), Access: a}
		checkPaged(t, s, q, want, fmt.Sprintf("case %d %+v order %v", i, f, order))
		checkFacets(t, s, f, a, want)
	}
}

// checkPaged pages through q from its start and checks each page's total
// and all the rows, in order, against want.
func checkPaged(t *testing.T, s *Store, q Query, want []Object, what string) {
	t.Helper()
	var got []Object
	for {
		p, err := s.Query(ctxb, q)
		mustNoErr(t, err)
		if p.TotalCount != len(want) {
			t.Fatalf("%s: total %d, want %d", what, p.TotalCount, len(want))
		}
		for _, e := range p.Edges {
			got = append(got, *e.Object)
		}
		if !p.HasNextPage {
			break
		}
		q.After = p.Edges[len(p.Edges)-1].Cursor
	}
	if len(got) != len(want) {
		t.Fatalf("%s: got %d rows, want %d", what, len(got), len(want))
	}
	for j := range got {
		if got[j].Key() != want[j].Key() {
			t.Fatalf("%s: row %d = %s, want %s", what, j, got[j].Key(), want[j].Key())
		}
	}
}

// TestWalkExactSources pages in name order through filters whose source
// is exact and large (one label value, one kind and status, seen by an
// admin), so that the planner walks the name order and takes the source's
// membership test as the whole filter; every page must match brute force.
// Rows are also deleted, so the walk meets dead items. It runs with the
// lists' own name orders (see listOrders) and without, when the walk is of
// the whole index's order.
func TestWalkExactSources(t *testing.T) {
	t.Run("whole order", func(t *testing.T) { testWalkExactSources(t, false) })
	t.Run("list orders", func(t *testing.T) { testWalkExactSources(t, true) })
}

func testWalkExactSources(t *testing.T, lists bool) {
	rnd := rand.New(rand.NewPCG(3, 9))
	s, _ := newTestStore(t)
	if !lists {
		s.x.cellOrders.min, s.x.labelOrders.min = math.MaxInt, math.MaxInt
	}
	for i := range 3000 {
		o := randomObject(rnd)
		o.Name = fmt.Sprintf("%s-%d", o.Name, i) // names repeat, keys do not
		mustNoErr(t, s.Upsert(ctxb, o))
	}
	all := drainObjects(t, s)
	for _, o := range all[:200] {
		mustNoErr(t, s.Delete(ctxb, o.Key()))
	}
	var model []Object
	for _, o := range drainObjects(t, s) {
		model = append(model, *o)
	}
	admin := &Access{All: true}
	ordered := 0 // walks of list orders
	defer func() {
		if lists && ordered == 0 {
			t.Errorf("no source had list orders")
		}
	}()
	for _, f := range []Filter{
		{LabelSelector: "k0=v1"},
		{LabelSelector: "n"},
		{Kinds: []string{"Pod"}, Statuses: []Status{StatusHealthy}},
		{Statuses: []Status{StatusUnhealthy, StatusUnknown}},
	} {
		for _, desc := range []bool{false, true} {
			order := Order{Field: OrderName, Desc: desc}
			const first = 2
			s.mu.RLock()
			p, err := s.x.compile(s.db, &f, admin)
			mustNoErr(t, err)
			src, live := p.bestSource(), len(s.x.rows)-len(s.x.free)
			s.mu.RUnlock()
			if !src.exact || !src.canTest() || src.est*src.est < exactScanRatio*first*live || (src.orders != nil && !lists) {
				t.Fatalf("%+v: source exact=%v has=%v orders=%v est=%d: the planner would not walk it", f, src.exact, src.canTest(), src.orders != nil, src.est)
			}
			if src.orders != nil {
				ordered++
			}
			var want []Object
			for _, o := range model {
				if refMatch(t, f, admin, &o) {
					want = append(want, o)
				}
			}
			slices.SortFunc(want, func(x, y Object) int { return refCompare(order, &x, &y) })
			checkPaged(t, s, Query{Filter: f, Order: order, First: first, Access: admin}, want, fmt.Sprintf("%+v desc=%v", f, desc))
		}
	}
}

// TestWalkGivesUp pages through a kind whose names but one sort after
// many other rows' names: the walk the planner chooses for such a
// plentiful kind would visit all those rows after the first match, so it
// must give up within its budget and the page come from a collect, still
// right.
func TestWalkGivesUp(t *testing.T) {
	s, _ := newTestStore(t)
	var rows []Object
	for i := range 2500 {
		o := Object{
			Cluster: "c0", Namespace: "ns0", Group: flux.Group, Version: flux.Version, Kind: flux.Kind, Resource: flux.Resource,
			Name: fmt.Sprintf("m-%04d", i), Status: StatusHealthy,
		}
		if i%5 < 2 {
			o.Group, o.Version, o.Kind, o.Resource = podKind.Group, podKind.Version, podKind.Kind, podKind.Resource
			o.Name = fmt.Sprintf("z-%04d", i)
			if i == 0 {
				o.Name = "a-pod"
			}
		}
		rows = append(rows, o)
	}
	mustNoErr(t, s.UpsertBatch(ctxb, rows))
	admin := &Access{All: true}
	f := Filter{Kinds: []string{"Pod"}}
	const first = 2
	s.mu.RLock()
	p, err := s.x.compile(s.db, &f, admin)
	mustNoErr(t, err)
	src, live := p.bestSource(), len(s.x.rows)-len(s.x.free)
	if !src.exact || src.est != 1000 || src.est*src.est < exactScanRatio*first*live {
		s.mu.RUnlock()
		t.Fatalf("source exact=%v est=%d: the planner would not walk it", src.exact, src.est)
	}
	src.orders = nil // the whole index's name order, as without the kind's own
	_, _, ok, _ := p.walk(src, Order{Field: OrderName}, nil, first, walkBudget(src, first))
	s.mu.RUnlock()
	if ok {
		t.Errorf("the walk found Pods named z-* within %d visits, past 1,500 rows named m-*", walkBudget(src, first))
	}
	page, err := s.Query(ctxb, Query{Filter: f, First: first, Access: admin})
	mustNoErr(t, err)
	if page.TotalCount != 1000 || len(page.Edges) != 2 || page.Edges[0].Object.Name != "a-pod" || page.Edges[1].Object.Name != "z-0001" {
		t.Fatalf("page: total %d, %d edges %v", page.TotalCount, len(page.Edges), page.Edges)
	}
}

// TestWalkWithinKindNames pages, both ways, through kinds whose names are
// one stretch of the name order between other kinds' (names that start
// with their kind do that): the walk must start and end at the kinds'
// names, so it finds its page within the budget, and every page must
// match brute force.
func TestWalkWithinKindNames(t *testing.T) {
	s, _ := newTestStore(t)
	var rows []Object
	for i := range 3000 {
		k, name := flux, fmt.Sprintf("a-%04d", i)
		switch i % 3 {
		case 1:
			k, name = podKind, fmt.Sprintf("m-%04d", i)
		case 2:
			k, name = nodeKind, fmt.Sprintf("z-%04d", i)
		}
		o := Object{Cluster: "c0", Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource, Name: name, Status: StatusHealthy}
		if k.Namespaced {
			o.Namespace = "ns0"
		}
		rows = append(rows, o)
	}
	mustNoErr(t, s.UpsertBatch(ctxb, rows))
	admin := &Access{All: true}
	for _, kinds := range [][]string{{"Pod"}, {flux.Kind}, {"Node"}, {"Pod", "Node"}} {
		f := Filter{Kinds: kinds}
		var want []string
		for _, o := range rows {
			if slices.Contains(kinds, o.Kind) {
				want = append(want, o.Name)
			}
		}
		for _, desc := range []bool{false, true} {
			order := Order{Field: OrderName, Desc: desc}
			const first = 2
			s.mu.RLock()
			p, err := s.x.compile(s.db, &f, admin)
			mustNoErr(t, err)
			src := p.bestSource()
			src.orders = nil // the whole index's name order
			_, _, ok, err := p.walk(src, order, nil, first, first+1)
			s.mu.RUnlock()
			mustNoErr(t, err)
			if !ok {
				t.Errorf("%v desc=%v: the walk did not find its page in %d visits", kinds, desc, first+1)
			}
			slices.Sort(want)
			if desc {
				slices.Reverse(want)
			}
			var got []string
			for after := ""; len(got) < 20; {
				page, err := s.Query(ctxb, Query{Filter: f, Order: order, First: first, After: after, Access: admin})
				mustNoErr(t, err)
				if page.TotalCount != len(want) {
					t.Fatalf("%v: total %d, want %d", kinds, page.TotalCount, len(want))
				}
				for _, e := range page.Edges {
					got = append(got, e.Object.Name)
				}
				after = page.Edges[len(page.Edges)-1].Cursor
			}
			if !slices.Equal(got, want[:len(got)]) {
				t.Fatalf("%v desc=%v: %v, want %v", kinds, desc, got, want[:len(got)])
			}
		}
	}
}

func drainObjects(t *testing.T, s *Store) []*Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*Object
	for _, r := range s.x.rows {
		if r != nil {
			out = append(out, s.x.object(r))
		}
	}
	return out
}

// checkFacets compares Facets with a brute-force count of want: the
// total, every status in the order of Statuses (zeros included), and the
// non-zero counts by kind ("Kind" or "Kind.group"), cluster and namespace
// (cluster-scoped objects under none), by count, descending, then value.
func checkFacets(t *testing.T, s *Store, f Filter, a *Access, want []Object) {
	t.Helper()
	fc, err := s.Facets(ctxb, f, a)
	mustNoErr(t, err)
	if fc.Total != len(want) {
		t.Fatalf("facets %+v: total %d, want %d", f, fc.Total, len(want))
	}
	count := func(key func(o *Object) string) []FacetCount {
		m := map[string]int{}
		for i := range want {
			if k := key(&want[i]); k != "" {
				m[k]++
			}
		}
		var out []FacetCount
		for v, n := range m {
			out = append(out, FacetCount{Value: v, Count: n})
		}
		slices.SortFunc(out, func(a, b FacetCount) int {
			return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Value, b.Value))
		})
		return out
	}
	statuses := make([]FacetCount, len(Statuses))
	for i, st := range Statuses {
		statuses[i].Value = string(st)
		for j := range want {
			if want[j].Status == st {
				statuses[i].Count++
			}
		}
	}
	for name, pair := range map[string][2][]FacetCount{
		"status":    {fc.Statuses, statuses},
		"kind":      {fc.Kinds, count(func(o *Object) string { return Kind{Group: o.Group, Kind: o.Kind}.GroupKind() })},
		"cluster":   {fc.Clusters, count(func(o *Object) string { return o.Cluster })},
		"namespace": {fc.Namespaces, count(func(o *Object) string { return o.Namespace })},
	} {
		if len(pair[0]) != len(pair[1]) || (len(pair[0]) > 0 && !slices.Equal(pair[0], pair[1])) {
			t.Fatalf("facets %+v access %v: %s = %v, want %v", f, a, name, pair[0], pair[1])
		}
	}
}

// TestCursorStableUnderChurn pages through the fleet while another
// goroutine adds, changes and deletes objects, and checks that no object
// comes twice and every object that existed throughout comes once.
func TestCursorStableUnderChurn(t *testing.T) {
	for _, field := range allOrders {
		t.Run(string(field), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(1, uint64(len(field))))
			s, clk := newTestStore(t)
			var keys []Key
			for range 300 {
				o := randomObject(rnd)
				mustNoErr(t, s.Upsert(ctxb, o))
				keys = append(keys, o.Key())
			}
			// Objects that are never touched by the churn.
			stable := map[Key]bool{}
			for _, k := range keys[:100] {
				if _, ok := s.Get(k); ok {
					stable[k] = true
				}
			}
			ctx, cancel := context.WithCancel(ctxb)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				crnd := rand.New(rand.NewPCG(2, 2))
				// Bounded, so that orders by a changing field (updatedAt)
				// cannot keep moving rows ahead of the reader forever.
				for n := 0; n < 3000 && ctx.Err() == nil; n++ {
					o := randomObject(crnd)
					if stable[o.Key()] {
						continue
					}
					if n%50 == 0 {
						time.Sleep(time.Millisecond)
					}
					clk.Advance(time.Millisecond)
					if crnd.IntN(3) == 0 {
						_ = s.Delete(ctx, o.Key())
					} else {
						_ = s.Upsert(ctx, o)
					}
				}
			}()
			defer func() { cancel(); wg.Wait() }()
			seen := map[Key]bool{}
			after := ""
			for {
				p, err := s.Query(ctxb, Query{Order: Order{Field: field}, First: 7, After: after, Access: &Access{All: true}})
				mustNoErr(t, err)
				for _, e := range p.Edges {
					k := e.Object.Key()
					if seen[k] && field != OrderUpdatedAt && field != OrderStatus {
						t.Fatalf("%s returned twice", k)
					}
					seen[k] = true
				}
				if !p.HasNextPage {
					break
				}
				after = p.Edges[len(p.Edges)-1].Cursor
				time.Sleep(100 * time.Microsecond)
			}
			for k := range stable {
				if !seen[k] {
					t.Fatalf("stable object %s skipped", k)
				}
			}
		})
	}
}

func TestQueryErrors(t *testing.T) {
	s, _ := newTestStore(t)
	mustNoErr(t, s.Upsert(ctxb, pod("c", "n", "a", StatusHealthy, nil)))
	p, err := s.Query(ctxb, Query{Access: &Access{All: true}})
	mustNoErr(t, err)
	tests := []struct {
		name string
		q    Query
	}{
		{"bad status", Query{Filter: Filter{Statuses: []Status{"NOPE"}}}},
		{"bad selector", Query{Filter: Filter{LabelSelector: "a in (("}}},
		{"bad cluster selector", Query{Filter: Filter{ClusterSelector: "env in (("}}},
		{"bad order", Query{Order: Order{Field: "SIZE"}}},
		{"bad cursor", Query{After: "!!!"}},
		{"cursor of another order", Query{After: p.Edges[0].Cursor, Order: Order{Field: OrderKind}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.q.Access = &Access{All: true}
			if _, err := s.Query(ctxb, tt.q); !errors.Is(err, ErrInvalidQuery) {
				t.Fatalf("err = %v, want ErrInvalidQuery", err)
			}
		})
	}
	// No access sees nothing.
	p, err = s.Query(ctxb, Query{})
	mustNoErr(t, err)
	if p.TotalCount != 0 || len(p.Edges) != 0 {
		t.Fatalf("nil access saw %d", p.TotalCount)
	}
}

// TestEdgeCursorsResume checks every edge's cursor, not only the last: a
// page read after edge i's cursor starts with edge i+1. Names grow along
// the page, so the cursors outgrow the buffer sized from the first one.
func TestEdgeCursorsResume(t *testing.T) {
	s, _ := newTestStore(t)
	for i := range 40 {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", fmt.Sprintf("p%02d-%s", i, strings.Repeat("x", 4*i)), StatusHealthy, nil)))
	}
	for _, field := range allOrders {
		q := Query{Order: Order{Field: field}, First: 40, Access: &Access{All: true}}
		p, err := s.Query(ctxb, q)
		mustNoErr(t, err)
		for i, e := range p.Edges[:len(p.Edges)-1] {
			next, err := s.Query(ctxb, Query{Order: q.Order, First: 1, After: e.Cursor, Access: q.Access})
			mustNoErr(t, err)
			if len(next.Edges) != 1 || next.Edges[0].Object.Key() != p.Edges[i+1].Object.Key() {
				t.Fatalf("%s: the page after edge %d (%s) does not start with edge %d (%s)", field, i, e.Object.Name, i+1, p.Edges[i+1].Object.Name)
			}
		}
	}
}

// TestLongKeyCursorsResume pages through rows whose keys are as long as
// the index takes (maxKeyLen), one with a long name and one with a long
// namespace, in every order and direction: every edge's cursor must
// resume after its row. A cursor carries its key and, in the name and
// namespace orders, that string again, in base64; Query refused such a
// cursor of its own as malformed when the bound on a cursor's length
// forgot base64's growth by a third.
func TestLongKeyCursorsResume(t *testing.T) {
	s, _ := newTestStore(t)
	long := func(n int) string { return strings.Repeat("x", n) }
	fixed := len("c0") + len("Pod")
	rows := []Object{
		pod("c0", "ns", long(maxKeyLen-fixed-len("ns")), StatusHealthy, nil),
		pod("c0", long(maxKeyLen-fixed-len("n")), "n", StatusHealthy, nil),
		pod("c0", "ns", "a", StatusHealthy, nil),
		pod("c0", "ns", "z", StatusHealthy, nil),
	}
	for i := range rows {
		if err := ValidateKey(rows[i].Key()); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		mustNoErr(t, s.Upsert(ctxb, rows[i]))
	}
	for _, field := range allOrders {
		for _, desc := range []bool{false, true} {
			q := Query{Order: Order{Field: field, Desc: desc}, First: len(rows), Access: &Access{All: true}}
			p, err := s.Query(ctxb, q)
			mustNoErr(t, err)
			for i, e := range p.Edges[:len(p.Edges)-1] {
				next, err := s.Query(ctxb, Query{Order: q.Order, First: 1, After: e.Cursor, Access: q.Access})
				if err != nil {
					t.Fatalf("%s desc %v: the cursor of edge %d (%d bytes): %v", field, desc, i, len(e.Cursor), err)
				}
				if len(next.Edges) != 1 || next.Edges[0].Object.Key() != p.Edges[i+1].Object.Key() {
					t.Fatalf("%s desc %v: the page after edge %d does not start with edge %d", field, desc, i, i+1)
				}
			}
		}
	}
}

// TestPlanEndKeepsNothing checks what a page's plan keeps once the page
// ends it and it goes back to the pool: its heap and row buffers, which
// hold no row (a pooled plan must not keep rows alive), and nothing else
// (the next page compiles its filter into it as into a new plan).
func TestPlanEndKeepsNothing(t *testing.T) {
	s, _ := newTestStore(t)
	for i := range 20 {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", fmt.Sprintf("p-%02d", i), StatusHealthy, map[string]string{"app": "web"})))
	}
	f := Filter{
		Clusters: []string{"c0"}, Namespaces: []string{"ns0"}, Kinds: []string{"Pod"}, Statuses: []Status{StatusHealthy},
		NameContains: "P-", LabelSelector: "app=web",
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, err := s.x.compile(s.db, &f, &Access{All: true})
	mustNoErr(t, err)
	p.paced(s, ctxb)
	rows, more, _, err := p.run(Order{Field: OrderName}, nil, 5, false)
	mustNoErr(t, err)
	if len(rows) != 5 || !more || rows[0].name() != "p-00" {
		t.Fatalf("a page of %d rows (more %v), want the 5 first of 20", len(rows), more)
	}
	slots, out := p.slots[:cap(p.slots)], p.rows[:cap(p.rows)]
	if len(slots) < 6 || len(out) < 5 {
		t.Fatalf("the plan kept %d slots and %d rows, want the heap's 6 and the page's 5 (the test needs collect)", len(slots), len(out))
	}
	p.end()
	for i := range slots {
		if slots[i].r != nil || slots[i].sk.row != nil || slots[i].sk.str != "" {
			t.Errorf("slot %d keeps row %q after the plan ended", i, slots[i].sk.str)
		}
	}
	for i, r := range out {
		if r != nil {
			t.Errorf("rows[%d] keeps row %q after the plan ended", i, r.name())
		}
	}
	if len(p.slots) != 0 || cap(p.slots) != len(slots) || len(p.rows) != 0 || cap(p.rows) != len(out) {
		t.Errorf("the plan keeps %d/%d slots and %d/%d rows, want its buffers, empty", len(p.slots), cap(p.slots), len(p.rows), cap(p.rows))
	}
	rest := reflect.ValueOf(p).Elem()
	for i := range rest.NumField() {
		if name := rest.Type().Field(i).Name; name != "slots" && name != "rows" && !rest.Field(i).IsZero() {
			t.Errorf("the plan keeps its %s after it ended", name)
		}
	}
}

// TestNamePrefixTies pages in name order through rows whose names share
// their first 16 bytes (the name prefix, namePfx) and differ after it, or
// are the prefix itself, spread over namespaces so that their keys' order
// is not their names': collect compares such rows by prefix and then
// reads their names (sortKey.rowName), and every page, ascending and
// descending, must follow the names across page boundaries.
func TestNamePrefixTies(t *testing.T) {
	s, _ := newTestStore(t)
	const shared = "requestauthentic" // 16 bytes
	var rows []Object
	for i := range 40 {
		name := fmt.Sprintf("%s-%02d", shared, i*17%40)
		switch i {
		case 0:
			name = shared
		case 1:
			name = shared + "-"
		case 2:
			name = shared + "z"
		}
		rows = append(rows, pod("c0", fmt.Sprintf("ns%d", i%3), name, StatusHealthy, nil))
	}
	mustNoErr(t, s.UpsertBatch(ctxb, rows))
	byName := func(a, b Object) int { return strings.Compare(a.Name, b.Name) }
	for _, f := range []Filter{
		{Namespaces: []string{"ns0", "ns1", "ns2"}},
		{Clusters: []string{"c0"}, Namespaces: []string{"ns2", "ns0"}, Kinds: []string{"Pod"}},
	} {
		var want []Object
		for _, o := range rows {
			if slices.Contains(f.Namespaces, o.Namespace) {
				want = append(want, o)
			}
		}
		for _, desc := range []bool{false, true} {
			slices.SortFunc(want, byName)
			if desc {
				slices.Reverse(want)
			}
			for _, first := range []int{1, 7, 40} {
				q := Query{Filter: f, Order: Order{Field: OrderName, Desc: desc}, First: first, Access: &Access{All: true}}
				checkPaged(t, s, q, want, fmt.Sprintf("namespaces %v desc %v first %d", f.Namespaces, desc, first))
			}
		}
	}
}
