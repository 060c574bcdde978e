package graph

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
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
	store := index.New()
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
