package index

import (
	"errors"
	"reflect"
	"testing"
)

// TestWriteRefusesWhatValidateRowLetThrough is the attacker's test of the
// write paths: rows an edge pushes, a leaf cluster lists or the
// replication stream carries reach UpsertBatch, Replace, ApplySnapshot and
// RestoreCluster. Each holds its rows to ValidateRow first, but must not
// rely on it: here the store's check lets everything through, as a
// ValidateRow that drifted from the RBAC tables would, and an RBAC row of
// the wrong scope (a namespaced ClusterRole, which the RBAC tables cannot
// key) among good rows must still be refused with ErrInvalidRow, without
// a panic (which would take the whole manager down) and without changing
// what the index holds.
func TestWriteRefusesWhatValidateRowLetThrough(t *testing.T) {
	const cluster = "c"
	clusterRoleKind := Kind{Group: RBACGroup, Version: "v1", Kind: KindClusterRole, Resource: "clusterroles"}
	roleKind := Kind{Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespaced: true}
	bad := Object{
		Cluster: cluster, Group: RBACGroup, Version: "v1", Kind: KindClusterRole, Resource: "clusterroles", Namespace: "ns", Name: "evil",
		Policy: &Policy{Rules: []PolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}}},
	}
	badRole := Object{Cluster: cluster, Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Name: "evil"}
	goodRole := Object{
		Cluster: cluster, Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespace: "ns", Name: "reader",
		Policy: &Policy{Rules: []PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}},
	}
	newPod := pod(cluster, "ns", "new", StatusHealthy, map[string]string{"app": "new"})

	for _, tc := range []struct {
		name  string
		write func(s *Store) error
	}{
		{"UpsertBatch", func(s *Store) error {
			return s.UpsertBatch(t.Context(), []Object{newPod, goodRole, bad})
		}},
		{"UpsertBatch/namespaceless Role", func(s *Store) error {
			return s.UpsertBatch(t.Context(), []Object{newPod, badRole})
		}},
		{"Replace", func(s *Store) error {
			return s.Replace(t.Context(), cluster, clusterRoleKind, []Object{bad})
		}},
		{"ApplySnapshot", func(s *Store) error {
			return s.ApplySnapshot(t.Context(), cluster, []KindSnapshot{
				{Kind: podKind, Synced: true, Rows: []Object{newPod}},
				{Kind: roleKind, Synced: true, Rows: []Object{goodRole}},
				{Kind: clusterRoleKind, Synced: true, Rows: []Object{bad}},
			}, true)
		}},
		{"RestoreCluster", func(s *Store) error {
			return s.RestoreCluster(t.Context(), ClusterSnapshot{Name: cluster, Rows: []Object{newPod, goodRole, bad}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t)
			seed := []Object{
				pod(cluster, "ns", "old", StatusHealthy, map[string]string{"app": "old"}),
				{Cluster: cluster, Group: RBACGroup, Version: "v1", Kind: KindClusterRole, Resource: "clusterroles", Name: "admin", Policy: &Policy{}},
			}
			if err := s.UpsertBatch(t.Context(), seed); err != nil {
				t.Fatal(err)
			}
			before, seq := s.SnapshotCluster(cluster), s.LastSeq()

			s.validateRow = func(*Object) error { return nil }
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("the write panicked instead of refusing the row: %v", p)
					}
				}()
				err = tc.write(s)
			}()
			if !errors.Is(err, ErrInvalidRow) {
				t.Fatalf("err = %v, want ErrInvalidRow", err)
			}
			if after := s.SnapshotCluster(cluster); !reflect.DeepEqual(after, before) {
				t.Errorf("the refused write changed the index:\nbefore %+v\nafter  %+v", before, after)
			}
			if got := s.LastSeq(); got != seq {
				t.Errorf("LastSeq = %d after a refused write, want %d", got, seq)
			}
			if _, ok := s.GetClusterRole(cluster, "evil"); ok {
				t.Error("the refused ClusterRole is stored")
			}

			// The store keeps serving: a good write after the refused one
			// is applied.
			s.validateRow = ValidateRow
			if err := s.UpsertBatch(t.Context(), []Object{newPod, goodRole}); err != nil {
				t.Fatalf("a good write after the refused one: %v", err)
			}
			if _, ok := s.Get(newPod.Key()); !ok {
				t.Error("the good write after the refused one is not stored")
			}
			if _, ok := s.GetRole(cluster, "ns", "reader"); !ok {
				t.Error("the good Role after the refused write is not stored")
			}
		})
	}
}
