package main

import (
	"context"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// TestReplicationBenchSmall runs the replication benchmark on 10,000
// objects (10 clusters), so that it cannot rot: every phase runs and ends
// with its check that the replicas equal the owner, and the line has every
// figure.
func TestReplicationBenchSmall(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := replicationBench(ctx, replOptions{
		fleet:    indextest.Fleet{Clusters: 10, Namespaces: 100, PerNamespace: 10, Seed: 1},
		replicas: 2, rate: 1000, churnFor: time.Second, writers: 10, dir: t.TempDir(), logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	line := r.line()
	t.Log(line)
	want := regexp.MustCompile(`^replication: objects=10000 query_replicas=2 lag_p99_ms=[0-9.]+ warm_start_s=[0-9.]+ cold_start_s=[0-9.]+ stream_bytes_per_object=[0-9.]+ stream_bytes_per_change=[0-9.]+$`)
	if !want.MatchString(line) {
		t.Fatalf("the line does not read as expected: %s", line)
	}
	if r.changes == 0 || r.lagP99 <= 0 || r.warm <= 0 || r.cold <= 0 || r.bytesPerObject <= 0 || r.bytesPerChange <= 0 {
		t.Fatalf("a figure is missing: %+v", r)
	}
}

// TestSameFleet: the benchmark's check tells a replica that equals the
// owner from one that misses a row, holds an older version of one, or has
// another cluster row.
func TestSameFleet(t *testing.T) {
	ctx := context.Background()
	fleet := indextest.Fleet{Clusters: 2, Namespaces: 10, PerNamespace: 5, Seed: 1}
	clusters := []string{indextest.ClusterName(0), indextest.ClusterName(1)}
	load := func() *index.Store {
		s := index.New(memtables.Open)
		for c, name := range clusters {
			if err := fleet.ReplaceCluster(ctx, s.At(time.Unix(1, 0)), c); err != nil {
				t.Fatal(err)
			}
			if err := s.UpsertCluster(ctx, index.Cluster{Name: name, Mode: index.ModePull, State: index.StateConnected, Since: time.Unix(1, 0), Synced: true}); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	owner := load()
	if err := sameFleet(owner, load(), clusters); err != nil {
		t.Fatalf("equal indexes: %v", err)
	}
	last := fleet.Size() - 1
	for _, tc := range []struct {
		name   string
		tamper func(s *index.Store) error
	}{
		{"missing row", func(s *index.Store) error {
			o := fleet.Object(last)
			return s.Delete(ctx, o.Key())
		}},
		{"older version", func(s *index.Store) error {
			o, _ := fleet.NextChange(last, 0)
			return s.At(time.Unix(1, 0)).Upsert(ctx, o)
		}},
		{"cluster row", func(s *index.Store) error {
			return s.UpsertCluster(ctx, index.Cluster{Name: clusters[1], Mode: index.ModePull, State: index.StateDegraded, Since: time.Unix(1, 0), Synced: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replica := load()
			if err := tc.tamper(replica); err != nil {
				t.Fatal(err)
			}
			if err := sameFleet(owner, replica, clusters); err == nil {
				t.Fatal("the check found no difference")
			} else {
				t.Log(err)
			}
		})
	}
}
