package graph

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// TestClustersThatDisagreeOnAResource checks, through the real authorizer,
// HTTP and a websocket, that each cluster's rows are checked against the
// resource that cluster reported for their kind. Cluster "liar" (as an edge
// could) reports Services under the resource "pods" before cluster "honest"
// reports its own; carol may list only pods in "honest". Her pages,
// totalCount, facets and objectChanges must show honest's Pods and none of
// its Services (issue 12: the counts used the first cluster's mapping).
func TestClustersThatDisagreeOnAResource(t *testing.T) {
	ctx := context.Background()
	store := index.New(memtables.Open)
	lying := index.Kind{Version: "v1", Kind: "Service", Resource: "pods", Namespaced: true}
	for _, c := range []string{"liar", "honest"} {
		must(t, store.UpsertCluster(ctx, index.Cluster{Name: c, Mode: index.ModePush, State: index.StateConnected, Since: time.Now(), Synced: true}))
	}
	must(t, store.Replace(ctx, "liar", lying, []index.Object{testObject(lying, "liar", "web", "svc-liar", index.StatusHealthy)}))
	var pods, svcs []index.Object
	for i := range 6 {
		pods = append(pods, testObject(podKind, "honest", "web", fmt.Sprintf("pod-%d", i), index.StatusHealthy))
		svcs = append(svcs, testObject(svcKind, "honest", "web", fmt.Sprintf("svc-%d", i), index.StatusHealthy))
	}
	must(t, store.Replace(ctx, "honest", podKind, pods))
	must(t, store.Replace(ctx, "honest", svcKind, svcs))
	must(t, store.Replace(ctx, "honest", clusterRoleKind, []index.Object{clusterRole("honest", "pod-lister",
		index.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}})}))
	must(t, store.Replace(ctx, "honest", crbKind, []index.Object{
		binding("honest", "", "carol-pods", index.KindClusterRole, "pod-lister", userSubject("carol")),
	}))
	f := newFixtureWith(t, store)

	var want []string
	for _, p := range pods {
		want = append(want, p.Key().String())
	}
	slices.Sort(want)
	for _, filter := range []map[string]any{nil, {"kinds": []string{"Service"}}, {"namespaces": []string{"web"}}} {
		ids, total, _ := f.pageAll("carol", 2, filter)
		slices.Sort(ids)
		wantF := want
		if filter["kinds"] != nil {
			wantF = nil
		}
		if !slices.Equal(ids, wantF) || total != len(wantF) {
			t.Errorf("filter %v: carol's pages show %v (totalCount %d), want %v", filter, ids, total, wantF)
		}
		var fr facetsResult
		f.query("carol", facetsQuery, map[string]any{"filter": filter}, &fr)
		kinds := map[string]int{}
		for _, k := range fr.Facets.Kinds {
			kinds[k.Value] = k.Count
		}
		wantKinds := map[string]int{"Pod": len(wantF)}
		if len(wantF) == 0 {
			wantKinds = map[string]int{}
		}
		if fr.Facets.Total != len(wantF) || fmt.Sprint(kinds) != fmt.Sprint(wantKinds) {
			t.Errorf("filter %v: carol's facets: total %d, kinds %v; want %d, %v", filter, fr.Facets.Total, kinds, len(wantF), wantKinds)
		}
	}

	c := f.connect("carol")
	c.subscribe("1", objectChangesSub, nil)
	f.waitSubscribers(1)
	svc := svcs[0]
	svc.Status = index.StatusUnhealthy
	upsert(t, store, svc)
	pod := pods[0]
	pod.Status = index.StatusUnhealthy
	upsert(t, store, pod)
	if e := c.nextChange("1").ObjectChanges; e.Object.ID != pod.Key().String() || e.Type != "MODIFIED" {
		t.Errorf("carol's first change is %s %s, want MODIFIED %s", e.Type, e.Object.ID, pod.Key())
	}
	c.expectQuiet(200 * time.Millisecond)
}

// TestObjectChangesShowNamedGrants checks that objectChanges delivers
// changes of every object the same viewer's objects query returns,
// including objects granted by name through a ClusterRoleBinding on a
// namespaced resource (get pods/x in every namespace; issue 12 item 5).
func TestObjectChangesShowNamedGrants(t *testing.T) {
	store := seededStore(t)
	ctx := context.Background()
	must(t, store.Replace(ctx, "west", clusterRoleKind, []index.Object{
		clusterRole("west", "view", viewRules...),
		clusterRole("west", "cluster-admin", index.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}),
		clusterRole("west", "get-pod-0", index.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"pod-team-a-0", "pod-team-c-0"}}),
	}))
	must(t, store.Replace(ctx, "west", crbKind, []index.Object{
		binding("west", "", "cluster-admin", index.KindClusterRole, "cluster-admin", groupSubject("system:masters")),
		binding("west", "", "carol-pod-0", index.KindClusterRole, "get-pod-0", userSubject("carol")),
	}))
	f := newFixtureWith(t, store)
	ids, total, _ := f.pageAll("carol", 10, nil)
	want := []string{"west//Pod/team-a/pod-team-a-0", "west//Pod/team-c/pod-team-c-0"}
	if slices.Sort(ids); !slices.Equal(ids, want) || total != 2 {
		t.Fatalf("carol's objects: %v (total %d), want %v", ids, total, want)
	}

	c := f.connect("carol")
	c.subscribe("1", objectChangesSub, nil)
	f.waitSubscribers(1)
	for _, name := range []string{"pod-team-a-0", "pod-team-a-1", "pod-team-c-0"} {
		ns := name[len("pod-") : len("pod-")+len("team-a")]
		upsert(t, store, testObject(podKind, "west", ns, name, index.StatusUnhealthy))
	}
	for _, id := range want {
		if e := c.nextChange("1").ObjectChanges; e.Type != "MODIFIED" || e.Object.ID != id {
			t.Errorf("got %s %s, want MODIFIED %s", e.Type, e.Object.ID, id)
		}
	}
	c.expectQuiet(200 * time.Millisecond)
}
