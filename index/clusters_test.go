package index

import (
	"errors"
	"testing"
	"time"
)

func TestClustersAndStaleness(t *testing.T) {
	s, clk := newTestStore(t)
	c := Cluster{Name: "c1", Mode: ModePull, State: StateConnected, Since: clk.Now()}
	mustNoErr(t, s.UpsertCluster(ctxb, c))
	mustNoErr(t, s.UpsertCluster(ctxb, c)) // unchanged: no event
	mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: "c2", State: StateDisconnected}))
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "ns", "a", StatusHealthy, nil)))
	mustNoErr(t, s.Upsert(ctxb, pod("c2", "ns", "b", StatusHealthy, nil)))

	ws := NewWatch()
	if got := s.ListClusters(ws); len(got) != 2 || got[0].Name != "c1" {
		t.Fatalf("ListClusters = %+v", got)
	}
	p, err := s.Query(ctxb, Query{Access: &Access{All: true}})
	mustNoErr(t, err)
	if len(p.StaleClusters) != 1 || p.StaleClusters[0] != "c2" {
		t.Fatalf("StaleClusters = %v", p.StaleClusters)
	}
	for _, e := range p.Edges {
		if e.Stale != (e.Object.Cluster == "c2") {
			t.Errorf("%s stale = %v", e.Object.Name, e.Stale)
		}
	}
	// A viewer without access to c2 is not told about it.
	only1 := &Access{Clusters: map[string]*ClusterAccess{"c1": {All: true}}}
	if p, _ := s.Query(ctxb, Query{Access: only1}); len(p.StaleClusters) != 0 || p.TotalCount != 1 {
		t.Fatalf("restricted viewer: stale %v total %d", p.StaleClusters, p.TotalCount)
	}

	c.State, c.Since = StateDisconnected, clk.Now().Add(time.Second)
	mustNoErr(t, s.UpsertCluster(ctxb, c))
	if !watchFired(t, ws) {
		t.Fatal("cluster watch did not fire")
	}
	evs := drain(t, s, 0)
	var clusterEvents []*Event
	for _, e := range evs {
		if e.Type == EventCluster {
			clusterEvents = append(clusterEvents, e)
		}
	}
	if len(clusterEvents) != 3 || clusterEvents[2].PreviousCluster.State != StateConnected || clusterEvents[2].ClusterRow.State != StateDisconnected {
		t.Fatalf("cluster events = %v", types(clusterEvents))
	}

	seq := s.LastSeq()
	mustNoErr(t, s.RemoveCluster(ctxb, "c1"))
	if got := types(drain(t, s, seq)); len(got) != 2 || got[0] != "DELETED a" || got[1] != "CLUSTER_REMOVED" {
		t.Fatalf("remove events = %v", got)
	}
	if _, ok := s.GetCluster(nil, "c1"); ok {
		t.Fatal("cluster still there")
	}
	if p, _ := s.Query(ctxb, Query{Access: &Access{All: true}}); p.TotalCount != 1 {
		t.Fatalf("rows left = %d", p.TotalCount)
	}
}

func TestKindErrors(t *testing.T) {
	s, clk := newTestStore(t)
	hr := Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	mustNoErr(t, s.ReportKindError(ctxb, "c1", hr, errors.New("no matches for kind")))
	errs := s.KindErrors(nil, "c1")
	if len(errs) != 1 || errs[0].Error != "no matches for kind" || !errs[0].Since.Equal(clk.Now()) {
		t.Fatalf("KindErrors = %+v", errs)
	}
	if len(s.Kinds("c1")) != 0 {
		t.Fatal("an erroring kind was recorded as present")
	}
	clk.Advance(time.Minute)
	mustNoErr(t, s.ReportKindError(ctxb, "c1", hr, errors.New("no matches for kind")))
	if errs := s.KindErrors(nil, "c1"); !errs[0].Since.Equal(clk.Now().Add(-time.Minute)) {
		t.Fatal("a repeated error moved Since")
	}
	mustNoErr(t, s.Replace(ctxb, "c1", hr, nil))
	if errs := s.KindErrors(nil, "c1"); len(errs) != 0 {
		t.Fatalf("Replace did not clear the error: %+v", errs)
	}
	if ks := s.Kinds("c1"); len(ks) != 1 || ks[0] != hr {
		t.Fatalf("Kinds = %+v", ks)
	}
}
