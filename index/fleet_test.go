package index

import (
	"fmt"
	"testing"
	"time"
)

func TestFleetStatus(t *testing.T) {
	c := func(state ConnectionState, synced bool) *Cluster {
		return &Cluster{State: state, Synced: synced}
	}
	cases := []struct {
		name       string
		clusters   []*Cluster
		rebuilding bool
		message    string
	}{
		{"none", nil, false, "No clusters"},
		{"first sync under way", []*Cluster{c(StateConnected, true), c(StateConnecting, false)}, true, "Rebuilding indices... 1/2 clusters"},
		{"all synced", []*Cluster{c(StateConnected, true), c(StateDegraded, true)}, false, "All 2 clusters synced"},
		{
			"synced, one lost since",
			[]*Cluster{c(StateConnected, true), c(StateDisconnected, true)},
			false,
			"All 2 clusters synced (1 disconnected, showing last known state)",
		},
		{
			"never reachable",
			[]*Cluster{c(StateConnected, true), c(StateDisconnected, false)},
			false,
			"1/2 clusters synced (1 disconnected, showing last known state)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := fleetStatus(tc.clusters)
			if f.Rebuilding != tc.rebuilding || f.Message != tc.message || f.ClustersTotal != len(tc.clusters) {
				t.Fatalf("got %+v, want rebuilding=%v %q", f, tc.rebuilding, tc.message)
			}
		})
	}
}

// TestFleetCountsVisibleClusters checks that Fleet counts the clusters an
// access shows something in, and all of them for access All.
func TestFleetCountsVisibleClusters(t *testing.T) {
	s, clk := newTestStore(t)
	for i, st := range []ConnectionState{StateConnected, StateConnected, StateDisconnected} {
		mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: fmt.Sprintf("c%d", i), State: st, Synced: i == 0, Since: clk.Now().Add(time.Duration(i))}))
	}
	only0 := &Access{Clusters: map[string]*ClusterAccess{"c0": {Everywhere: NewResources(podsGR)}, "c1": {}}}
	for _, tc := range []struct {
		a    *Access
		want string
	}{
		{&Access{All: true}, "Rebuilding indices... 1/3 clusters (1 disconnected, showing last known state)"},
		{only0, "All 1 clusters synced"},
		{&Access{}, "No clusters"},
		{nil, "No clusters"},
	} {
		if got := s.Fleet(tc.a).Message; got != tc.want {
			t.Errorf("Fleet(%+v) = %q, want %q", tc.a, got, tc.want)
		}
	}
}
