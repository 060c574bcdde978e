package graph

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

// allTestObjects lists every object row of the test fleet.
func allTestObjects(t *testing.T, s *index.Store) []*index.Object {
	t.Helper()
	p, err := s.Query(context.Background(), index.Query{Access: &index.Access{All: true}, First: index.MaxPageSize})
	must(t, err)
	out := make([]*index.Object, len(p.Edges))
	for i, e := range p.Edges {
		out[i] = e.Object
	}
	return out
}

// expectVisible is the visibility of the test fleet's RBAC, spelled out
// independently of authz.
func expectVisible(user string, o *index.Object) bool {
	viewable := o.Resource == "pods" || o.Resource == "services" || o.Resource == "kustomizations"
	switch user {
	case "admin", "root":
		return true
	case "alice":
		return o.Cluster == "east" && o.Namespace == "team-a" && viewable
	case "bob":
		return (o.Cluster == "west" && o.Namespace == "team-c" && viewable) ||
			(o.Cluster == "east" && o.Namespace == "team-b" && o.Kind == "Pod" && o.Name == "pod-team-b-0")
	}
	return false
}

const objectsQuery = `query($first: Int, $after: String, $filter: ObjectFilter, $order: ObjectOrder) {
  objects(first: $first, after: $after, filter: $filter, orderBy: $order) {
    totalCount staleClusters changesCursor
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    edges { cursor node { id cluster namespace group version kind resource name uid status message
      labels { key value } ownerReferences { kind name } createdAt updatedAt resourceVersion summary stale } }
  }
}`

type objectsResult struct {
	Objects struct {
		TotalCount    int
		StaleClusters []string
		ChangesCursor string
		PageInfo      struct {
			HasNextPage, HasPreviousPage bool
			StartCursor, EndCursor       *string
		}
		Edges []struct {
			Cursor string
			Node   struct {
				ID, Cluster, Group, Version, Kind, Resource, Name, UID, Status string
				Namespace, Message                                             *string
				Labels                                                         []struct{ Key, Value string }
				Stale                                                          bool
				Summary                                                        map[string]any
			}
		}
	}
}

// pageAll walks every page of objects with page size n and checks that
// every page but the last is full and that totalCount never changes.
func (f *fixture) pageAll(user string, n int, filter map[string]any) (ids []string, total int, stale map[string]bool) {
	t := f.t
	t.Helper()
	stale = map[string]bool{}
	var after any
	for page := 0; ; page++ {
		var r objectsResult
		f.query(user, objectsQuery, map[string]any{"first": n, "after": after, "filter": filter}, &r)
		o := r.Objects
		if page == 0 {
			total = o.TotalCount
		} else if o.TotalCount != total {
			t.Fatalf("%s: totalCount changed between pages: %d then %d", user, total, o.TotalCount)
		}
		if o.PageInfo.HasPreviousPage != (page > 0) {
			t.Errorf("%s page %d: hasPreviousPage %v", user, page, o.PageInfo.HasPreviousPage)
		}
		if o.PageInfo.HasNextPage && len(o.Edges) != n {
			t.Fatalf("%s page %d: short page of %d with more to come", user, page, len(o.Edges))
		}
		for _, e := range o.Edges {
			ids = append(ids, e.Node.ID)
			if e.Node.Stale {
				stale[e.Node.Cluster] = true
			}
		}
		if !o.PageInfo.HasNextPage {
			return ids, total, stale
		}
		after = *o.PageInfo.EndCursor
	}
}

func TestObjectsShowExactlyWhatRBACAllows(t *testing.T) {
	f := newFixture(t)
	all := allTestObjects(t, f.store)
	for _, user := range []string{"admin", "root", "alice", "bob", "carol"} {
		t.Run(user, func(t *testing.T) {
			var want []string
			for _, o := range all {
				if expectVisible(user, o) {
					want = append(want, o.Key().String())
				}
			}
			sort.Strings(want)
			for _, n := range []int{1, 3, 100} {
				got, total, _ := f.pageAll(user, n, nil)
				if total != len(want) {
					t.Errorf("page size %d: totalCount %d, want %d", n, total, len(want))
				}
				sorted := slices.Sorted(slices.Values(got))
				if !slices.Equal(sorted, want) {
					t.Errorf("page size %d: got %d objects %v, want %d %v", n, len(got), got, len(want), want)
				}
				if len(slices.Compact(sorted)) != len(got) {
					t.Errorf("page size %d: an object came twice", n)
				}
			}
		})
	}
}

func TestObjectsFields(t *testing.T) {
	f := newFixture(t)
	var r objectsResult
	f.query("alice", objectsQuery, map[string]any{
		"first": 10, "filter": map[string]any{"kinds": []string{"Pod"}, "nameContains": "TEAM-A-2"},
	}, &r)
	if len(r.Objects.Edges) != 1 {
		t.Fatalf("got %d edges, want 1", len(r.Objects.Edges))
	}
	n := r.Objects.Edges[0].Node
	if n.ID != "east//Pod/team-a/pod-team-a-2" || n.Cluster != "east" || *n.Namespace != "team-a" || n.Group != "" ||
		n.Version != "v1" || n.Kind != "Pod" || n.Resource != "pods" || n.Status != "UNHEALTHY" ||
		n.UID != "uid-east-team-a-pod-team-a-2" || *n.Message != "message of pod-team-a-2" || n.Stale {
		t.Errorf("unexpected node %+v", n)
	}
	if len(n.Labels) != 2 || n.Labels[0].Key != "app" || n.Labels[1].Key != "team" {
		t.Errorf("labels %+v, want app and team sorted", n.Labels)
	}
	if n.Summary["phase"] != "Running" {
		t.Errorf("summary %v", n.Summary)
	}
	if r.Objects.ChangesCursor == "" {
		t.Error("no changesCursor")
	}
}

func TestObjectsFilters(t *testing.T) {
	f := newFixture(t)
	all := allTestObjects(t, f.store)
	count := func(user string, pred func(o *index.Object) bool) int {
		n := 0
		for _, o := range all {
			if expectVisible(user, o) && pred(o) {
				n++
			}
		}
		return n
	}
	tests := []struct {
		name   string
		filter map[string]any
		pred   func(o *index.Object) bool
	}{
		{"kind", map[string]any{"kinds": []string{"Pod"}}, func(o *index.Object) bool { return o.Kind == "Pod" }},
		{"plural kind", map[string]any{"kinds": []string{"services"}}, func(o *index.Object) bool { return o.Kind == "Service" }},
		{"qualified kind", map[string]any{"kinds": []string{"Kustomization.kustomize.toolkit.fluxcd.io"}}, func(o *index.Object) bool { return o.Kind == "Kustomization" }},
		{"status", map[string]any{"statuses": []string{"UNHEALTHY", "PROGRESSING"}}, func(o *index.Object) bool {
			return o.Status == index.StatusUnhealthy || o.Status == index.StatusProgressing
		}},
		{"cluster and namespace", map[string]any{"clusters": []string{"west"}, "namespaces": []string{"team-a"}}, func(o *index.Object) bool {
			return o.Cluster == "west" && o.Namespace == "team-a"
		}},
		{"label selector", map[string]any{"labelSelector": "team in (team-a,team-c),app!=pod-team-a-0"}, func(o *index.Object) bool {
			return (o.Labels.Get("team") == "team-a" || o.Labels.Get("team") == "team-c") && o.Labels.Get("app") != "pod-team-a-0"
		}},
		{"name contains", map[string]any{"nameContains": "SVC"}, func(o *index.Object) bool { return o.Kind == "Service" }},
		// The fixture's clusters are labelled region=<name>.
		{"cluster label selector", map[string]any{"clusterLabelSelector": "region in (east,north)"}, func(o *index.Object) bool {
			return o.Cluster == "east" || o.Cluster == "north"
		}},
		{"cluster label selector and kind", map[string]any{"clusterLabelSelector": "region!=east", "kinds": []string{"Pod"}}, func(o *index.Object) bool {
			return o.Cluster != "east" && o.Kind == "Pod"
		}},
		{"cluster label selector matching none", map[string]any{"clusterLabelSelector": "env=prod"}, func(*index.Object) bool { return false }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, user := range []string{"admin", "alice", "bob"} {
				_, total, _ := f.pageAll(user, 2, tc.filter)
				if want := count(user, tc.pred); total != want {
					t.Errorf("%s: totalCount %d, want %d", user, total, want)
				}
			}
		})
	}
}

func TestObjectsOrder(t *testing.T) {
	f := newFixture(t)
	var r objectsResult
	f.query("admin", objectsQuery, map[string]any{"first": 1000, "order": map[string]any{"field": "NAME", "direction": "DESC"}}, &r)
	names := make([]string, len(r.Objects.Edges))
	for i, e := range r.Objects.Edges {
		names[i] = e.Node.Name
	}
	if !slices.IsSortedFunc(names, func(a, b string) int { return -compareStrings(a, b) }) {
		t.Errorf("not in descending name order: %v", names)
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestObjectsBadInput(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name string
		vars map[string]any
	}{
		{"page too large", map[string]any{"first": 1001}},
		{"negative page", map[string]any{"first": -1}},
		{"bad cursor", map[string]any{"after": "not-a-cursor"}},
		{"bad selector", map[string]any{"filter": map[string]any{"labelSelector": "a in (b"}}},
		{"bad cluster selector", map[string]any{"filter": map[string]any{"clusterLabelSelector": "region in (("}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := f.post("admin", objectsQuery, tc.vars)
			if status != http.StatusOK || resp.code() != CodeBadUserInput {
				t.Errorf("status %d, errors %+v; want 200 with %s", status, resp.Errors, CodeBadUserInput)
			}
		})
	}
}

func TestObjectsCountOnly(t *testing.T) {
	f := newFixture(t)
	var r objectsResult
	f.query("alice", objectsQuery, map[string]any{"first": 0}, &r)
	if len(r.Objects.Edges) != 0 || r.Objects.TotalCount != objsPerNS || !r.Objects.PageInfo.HasNextPage {
		t.Errorf("first: 0 gave %d edges, total %d, hasNextPage %v", len(r.Objects.Edges), r.Objects.TotalCount, r.Objects.PageInfo.HasNextPage)
	}
}

func TestStaleClusters(t *testing.T) {
	f := newFixture(t)
	_, _, stale := f.pageAll("admin", 100, nil)
	if !maps.Equal(stale, map[string]bool{"north": true}) {
		t.Errorf("stale edges in %v, want north only", stale)
	}
	var r objectsResult
	f.query("admin", objectsQuery, nil, &r)
	if !slices.Equal(r.Objects.StaleClusters, []string{"north"}) {
		t.Errorf("admin staleClusters %v", r.Objects.StaleClusters)
	}
	f.query("alice", objectsQuery, nil, &r)
	if len(r.Objects.StaleClusters) != 0 {
		t.Errorf("alice staleClusters %v: north is not in her scope", r.Objects.StaleClusters)
	}
}

const facetsQuery = `query($filter: ObjectFilter) { facets(filter: $filter) {
  total staleClusters statuses { value count } kinds { value count } clusters { value count } namespaces { value count } } }`

type facetsResult struct {
	Facets struct {
		Total                                 int
		StaleClusters                         []string
		Statuses, Kinds, Clusters, Namespaces []struct {
			Value string
			Count int
		}
	}
}

func TestFacetsCountOnlyVisibleObjects(t *testing.T) {
	f := newFixture(t)
	all := allTestObjects(t, f.store)
	for _, user := range []string{"admin", "root", "alice", "bob", "carol"} {
		t.Run(user, func(t *testing.T) {
			want := map[string]map[string]int{"status": {}, "kind": {}, "cluster": {}, "namespace": {}}
			total := 0
			for _, o := range all {
				if !expectVisible(user, o) {
					continue
				}
				total++
				want["status"][string(o.Status)]++
				want["kind"][index.Kind{Group: o.Group, Kind: o.Kind}.GroupKind()]++
				want["cluster"][o.Cluster]++
				if o.Namespace != "" {
					want["namespace"][o.Namespace]++
				}
			}
			var r facetsResult
			f.query(user, facetsQuery, nil, &r)
			if r.Facets.Total != total {
				t.Errorf("total %d, want %d", r.Facets.Total, total)
			}
			got := map[string]map[string]int{"status": {}, "kind": {}, "cluster": {}, "namespace": {}}
			for dim, list := range map[string][]struct {
				Value string
				Count int
			}{"status": r.Facets.Statuses, "kind": r.Facets.Kinds, "cluster": r.Facets.Clusters, "namespace": r.Facets.Namespaces} {
				for _, c := range list {
					if c.Count > 0 {
						got[dim][c.Value] = c.Count
					}
				}
			}
			for dim := range want {
				if !maps.Equal(got[dim], want[dim]) {
					t.Errorf("%s facet %v, want %v", dim, got[dim], want[dim])
				}
			}
			if len(r.Facets.Statuses) != len(index.Statuses) {
				t.Errorf("statuses facet lists %d statuses, want all %d", len(r.Facets.Statuses), len(index.Statuses))
			}
		})
	}
}

// TestFacetsHonourClusterLabelSelector: facets count only the objects of
// the clusters whose labels match, and nothing of the others.
func TestFacetsHonourClusterLabelSelector(t *testing.T) {
	f := newFixture(t)
	all := allTestObjects(t, f.store)
	for _, user := range []string{"admin", "bob"} {
		want := 0
		for _, o := range all {
			if expectVisible(user, o) && o.Cluster == "west" {
				want++
			}
		}
		var r facetsResult
		f.query(user, facetsQuery, map[string]any{"filter": map[string]any{"clusterLabelSelector": "region=west"}}, &r)
		if r.Facets.Total != want || want == 0 {
			t.Errorf("%s: total %d, want %d", user, r.Facets.Total, want)
		}
		for _, c := range r.Facets.Clusters {
			if c.Count > 0 && (c.Value != "west" || c.Count != want) {
				t.Errorf("%s: cluster facet %s=%d, want only west=%d", user, c.Value, c.Count, want)
			}
		}
	}
}

// TestClustersByLabelSelector lists the visible clusters whose labels match.
func TestClustersByLabelSelector(t *testing.T) {
	f := newFixture(t)
	q := `query($s: String) { clusters(labelSelector: $s) { name labels { key value } } }`
	for _, tc := range []struct {
		user, selector string
		want           []string
	}{
		{"admin", "region in (east,west)", []string{"east", "west"}},
		{"admin", "region!=east", []string{"north", "west"}},
		{"admin", "env=prod", nil},
		{"alice", "region in (east,west)", []string{"east"}},
	} {
		var r struct{ Clusters []struct{ Name string } }
		f.query(tc.user, q, map[string]any{"s": tc.selector}, &r)
		var names []string
		for _, c := range r.Clusters {
			names = append(names, c.Name)
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s %q: clusters %v, want %v", tc.user, tc.selector, names, tc.want)
		}
	}
	if status, resp := f.post("admin", q, map[string]any{"s": "region in (("}); status != http.StatusOK || resp.code() != CodeBadUserInput {
		t.Errorf("bad selector: status %d, errors %+v; want %s", status, resp.Errors, CodeBadUserInput)
	}
}

const clustersQuery = `{ clusters { name labels { key value } mode stale metadata { key }
  connection { state since lastSeen lastError }
  sync { synced kinds kindErrors { kind group version resource error since } } }
  fleet { clustersTotal clustersSynced rebuilding message } }`

type clustersResult struct {
	Clusters []struct {
		Name       string
		Mode       string
		Stale      bool
		Connection struct {
			State     string
			LastError *string
		}
		Sync struct {
			Synced     bool
			Kinds      int
			KindErrors []struct{ Kind, Group, Error string }
		}
	}
	Fleet struct {
		ClustersTotal, ClustersSynced int
		Rebuilding                    bool
		Message                       string
	}
}

func TestClustersAndFleet(t *testing.T) {
	f := newFixture(t)
	must(t, f.store.ReportKindError(context.Background(), "east", ksKind, errors.New("the server could not find the requested resource")))
	tests := []struct {
		user     string
		clusters []string
		synced   int
		message  string
	}{
		// north never synced and is disconnected: the fleet is not
		// rebuilding, it is missing a cluster.
		{"admin", []string{"east", "north", "west"}, 2, "2/3 clusters synced (1 disconnected, showing last known state)"},
		{"root", []string{"east", "north", "west"}, 2, "2/3 clusters synced (1 disconnected, showing last known state)"},
		{"alice", []string{"east"}, 1, "All 1 clusters synced"},
		{"bob", []string{"east", "west"}, 2, "All 2 clusters synced"},
		{"carol", nil, 0, "No clusters"},
	}
	for _, tc := range tests {
		t.Run(tc.user, func(t *testing.T) {
			var r clustersResult
			f.query(tc.user, clustersQuery, nil, &r)
			var names []string
			for _, c := range r.Clusters {
				names = append(names, c.Name)
				if c.Mode != "PULL" {
					t.Errorf("%s mode %s", c.Name, c.Mode)
				}
				if c.Name == "north" && (c.Connection.State != "DISCONNECTED" || !c.Stale || c.Sync.Synced || c.Connection.LastError == nil) {
					t.Errorf("north: %+v", c)
				}
				if c.Name == "east" {
					if c.Connection.State != "CONNECTED" || c.Stale || !c.Sync.Synced || c.Sync.Kinds == 0 {
						t.Errorf("east: %+v", c)
					}
					if len(c.Sync.KindErrors) != 1 || c.Sync.KindErrors[0].Kind != "Kustomization.kustomize.toolkit.fluxcd.io" {
						t.Errorf("east kind errors %+v", c.Sync.KindErrors)
					}
				}
			}
			if !slices.Equal(names, tc.clusters) {
				t.Errorf("clusters %v, want %v", names, tc.clusters)
			}
			fl := r.Fleet
			if fl.ClustersTotal != len(tc.clusters) || fl.ClustersSynced != tc.synced || fl.Message != tc.message || fl.Rebuilding {
				t.Errorf("fleet %+v", fl)
			}
		})
	}
}

func TestClusterByName(t *testing.T) {
	f := newFixture(t)
	q := `query($n: String!) { cluster(name: $n) { name } }`
	for _, tc := range []struct {
		user, cluster string
		found         bool
	}{
		{"admin", "west", true}, {"alice", "east", true}, {"alice", "west", false}, {"alice", "nowhere", false}, {"carol", "east", false},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.user, tc.cluster), func(t *testing.T) {
			var r struct{ Cluster *struct{ Name string } }
			f.query(tc.user, q, map[string]any{"n": tc.cluster}, &r)
			if (r.Cluster != nil) != tc.found {
				t.Errorf("found %v, want %v", r.Cluster != nil, tc.found)
			}
		})
	}
}

func TestViewer(t *testing.T) {
	f := newFixture(t)
	var r struct {
		Viewer struct {
			Username string
			Groups   []string
		}
	}
	f.query("admin", `{ viewer { username groups } }`, nil, &r)
	if r.Viewer.Username != "admin" || !slices.Equal(r.Viewer.Groups, []string{"system:masters"}) {
		t.Errorf("viewer %+v", r.Viewer)
	}
}

// TestAccessFollowsFleetChanges checks that a viewer's cached access
// follows a cluster joining with RBAC for them, and a binding removed.
func TestAccessFollowsFleetChanges(t *testing.T) {
	f := newFixture(t)
	count := func() int {
		var r objectsResult
		f.query("alice", objectsQuery, map[string]any{"first": 0}, &r)
		return r.Objects.TotalCount
	}
	if n := count(); n != objsPerNS {
		t.Fatalf("alice sees %d objects, want %d", n, objsPerNS)
	}
	seedCluster(t, f.store, "south", index.StateConnected, true) // RBAC roles, no objects
	ctx := context.Background()
	var pods []index.Object
	for i := range objsPerNS {
		pods = append(pods, testObject(podKind, "south", "team-a", fmt.Sprintf("south-%d", i), index.StatusHealthy))
	}
	must(t, f.store.Replace(ctx, "south", podKind, pods))
	must(t, f.store.Replace(ctx, "south", rbKind, []index.Object{
		binding("south", "team-a", "alice-view", index.KindClusterRole, "view", userSubject("alice")),
	}))
	if n := count(); n != 2*objsPerNS {
		t.Errorf("after south joined alice sees %d objects, want %d", n, 2*objsPerNS)
	}
	must(t, f.store.Replace(ctx, "east", rbKind, nil))
	if n := count(); n != objsPerNS {
		t.Errorf("after east's binding went alice sees %d objects, want %d", n, objsPerNS)
	}
	must(t, f.store.RemoveCluster(ctx, "south"))
	if n := count(); n != 0 {
		t.Errorf("after south left alice sees %d objects, want 0", n)
	}
}
