package index

import (
	"slices"
	"testing"
)

// TestPolicyKinds: PolicyKinds lists exactly the kinds IsPolicyKind names,
// as an API server serves them, and SnapshotCluster rebuilds RBAC rows
// with their kind's version and resource.
func TestPolicyKinds(t *testing.T) {
	kinds := PolicyKinds()
	var names []string
	for _, k := range kinds {
		names = append(names, k.Kind)
		if !IsPolicyKind(k.Group, k.Kind) {
			t.Errorf("%+v is not a policy kind", k)
		}
		if k.Namespaced != (k.Kind == KindRole || k.Kind == KindRoleBinding) {
			t.Errorf("%s namespaced %v", k.Kind, k.Namespaced)
		}
	}
	slices.Sort(names)
	if want := []string{KindClusterRole, KindClusterRoleBinding, KindRole, KindRoleBinding}; !slices.Equal(names, want) {
		t.Errorf("PolicyKinds %v, want %v", names, want)
	}
	for _, gk := range [][2]string{{"", KindRole}, {"example.com", KindRoleBinding}, {RBACGroup, "Pod"}} {
		if IsPolicyKind(gk[0], gk[1]) {
			t.Errorf("%s.%s is a policy kind", gk[1], gk[0])
		}
	}
	kinds[0].Resource = "changed"
	if PolicyKinds()[0].Resource == "changed" {
		t.Error("PolicyKinds returns the index's own list")
	}

	s, _ := newTestStore(t)
	var rows []Object
	for _, k := range PolicyKinds() {
		o := Object{Cluster: "c0", Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource, Name: "r"}
		if k.Namespaced {
			o.Namespace = "ns0"
		}
		if k.Kind == KindRole || k.Kind == KindClusterRole {
			o.Policy = &Policy{Rules: []PolicyRule{{Verbs: []string{"get"}, Resources: []string{"pods"}}}}
		} else {
			o.Policy = &Policy{RoleRef: RoleRef{Kind: KindClusterRole, Name: "r"}, Subjects: []Subject{{Kind: "User", Name: "alice"}}}
		}
		rows = append(rows, o)
	}
	mustNoErr(t, s.UpsertBatch(ctxb, rows))
	snap := s.SnapshotCluster("c0")
	if len(snap.Rows) != len(rows) {
		t.Fatalf("snapshot has %d RBAC rows, want %d", len(snap.Rows), len(rows))
	}
	for _, o := range snap.Rows {
		i := slices.IndexFunc(kinds, func(k Kind) bool { return k.Kind == o.Kind })
		if k := PolicyKinds()[i]; o.Group != k.Group || o.Version != k.Version || o.Resource != k.Resource {
			t.Errorf("snapshot row %s: %s/%s %s, want %s/%s %s", o.Key(), o.Group, o.Version, o.Resource, k.Group, k.Version, k.Resource)
		}
	}
}
