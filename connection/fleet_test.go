package connection

import (
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

func TestFleet(t *testing.T) {
	c := func(state index.ConnectionState, synced bool) *index.Cluster {
		return &index.Cluster{State: state, Synced: synced}
	}
	cases := []struct {
		name       string
		clusters   []*index.Cluster
		rebuilding bool
		message    string
	}{
		{"none", nil, false, "No clusters"},
		{"first sync under way", []*index.Cluster{c(index.StateConnected, true), c(index.StateConnecting, false)}, true, "Rebuilding indices... 1/2 clusters"},
		{"all synced", []*index.Cluster{c(index.StateConnected, true), c(index.StateDegraded, true)}, false, "All 2 clusters synced"},
		{
			"synced, one lost since",
			[]*index.Cluster{c(index.StateConnected, true), c(index.StateDisconnected, true)},
			false,
			"All 2 clusters synced (1 disconnected, showing last known state)",
		},
		{
			"never reachable",
			[]*index.Cluster{c(index.StateConnected, true), c(index.StateDisconnected, false)},
			false,
			"1/2 clusters synced (1 disconnected, showing last known state)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := Fleet(tc.clusters)
			if f.Rebuilding != tc.rebuilding || f.Message != tc.message || f.ClustersTotal != len(tc.clusters) {
				t.Fatalf("got %+v, want rebuilding=%v %q", f, tc.rebuilding, tc.message)
			}
		})
	}
}
