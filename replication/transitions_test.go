package replication

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestRestoredReplicaStreamsTransitions: a replica that loaded a cluster
// from its snapshot in the stream streams the cluster's later connection
// transitions to a subscriber, one per transition, as a replica that
// followed the log from its start does (issue 16: a clusterConnection
// subscription on a restarted query replica was seen to miss an outage).
func TestRestoredReplicaStreamsTransitions(t *testing.T) {
	s := natsServer(t)
	a := startNode(t, s, "collector-a", false)
	b := startNode(t, s, "collector-b", false)
	early := startNode(t, s, "", true)
	ctx := context.Background()
	state := func(st index.ConnectionState) index.Cluster {
		return index.Cluster{Name: "east", Mode: index.ModePull, State: st, Since: time.Now(), Synced: true}
	}
	acquire(t, a, "east")
	writeSome(t, a, "east", 5)
	must(t, a.UpsertCluster(ctx, state(index.StateConnected)))
	// A handover: b's takeover snapshot is the log's first message now.
	must(t, a.Release(ctx, "east"))
	acquire(t, b, "east")
	late := startNode(t, s, "", true)
	for _, r := range []*testNode{early, late} {
		waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(b.store, r.store, "east") })
	}
	// The replica holds the snapshot's state before it counts the
	// restore; it has counted it once it has applied the stream's last
	// message (b writes nothing after its takeover).
	info, err := b.stream.Info(ctx)
	must(t, err)
	waitFor(t, "the late replica applied the stream", 10*time.Second, func() error {
		if got := late.Followed(); got < info.State.LastSeq {
			return fmt.Errorf("applied up to %d of %d", got, info.State.LastSeq)
		}
		return nil
	})
	if n := testutil.ToFloat64(late.metrics.restores); n != 1 {
		t.Fatalf("the late replica restored %v snapshots, want 1", n)
	}
	all := func() *index.Access { return &index.Access{All: true} }
	var streams []*index.ClusterStream
	for _, r := range []*testNode{early, late} {
		st, err := r.store.ClusterChanges(index.ClusterChangesRequest{Access: all})
		must(t, err)
		t.Cleanup(st.Close)
		streams = append(streams, st)
	}
	must(t, b.UpsertCluster(ctx, state(index.StateDisconnected)))
	must(t, b.UpsertCluster(ctx, state(index.StateConnected)))
	for i, st := range streams {
		for _, want := range []index.ConnectionState{index.StateDisconnected, index.StateConnected} {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := st.Next(ctx)
			cancel()
			if err != nil {
				t.Fatalf("replica %d: waiting for %s: %v", i, want, err)
			}
			if c.Cluster.State != want {
				t.Fatalf("replica %d: %s, want %s", i, c.Cluster.State, want)
			}
		}
	}
}
