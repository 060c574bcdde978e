package index

import (
	"testing"
)

func policyRow(kind, ns, name string, p *Policy) Object {
	return Object{Cluster: "c1", Group: RBACGroup, Version: "v1", Kind: kind, Namespace: ns, Name: name, Policy: p}
}

func TestPolicyRowsAndRevision(t *testing.T) {
	s, _ := newTestStore(t)
	roleKind := Kind{Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespaced: true}
	rules := []PolicyRule{{Verbs: []string{"list"}, Resources: []string{"pods"}}}
	mustNoErr(t, s.Replace(ctxb, "c1", roleKind, []Object{policyRow(KindRole, "ns", "r", &Policy{Rules: rules})}))
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRole, "", "cr", &Policy{Rules: rules})))
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindRoleBinding, "ns", "rb", &Policy{RoleRef: RoleRef{Kind: KindRole, Name: "r"}, Subjects: []Subject{{Kind: "User", Name: "u"}}})))
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRoleBinding, "", "crb", &Policy{RoleRef: RoleRef{Kind: KindClusterRole, Name: "cr"}})))

	if r, ok := s.GetRole("c1", "ns", "r"); !ok || len(r.Rules) != 1 {
		t.Fatalf("GetRole = %+v, %v", r, ok)
	}
	if _, ok := s.GetClusterRole("c1", "cr"); !ok {
		t.Fatal("GetClusterRole missing")
	}
	if got := s.ListRoleBindings("c1", ""); len(got) != 1 || got[0].Subjects[0].Name != "u" {
		t.Fatalf("ListRoleBindings = %+v", got)
	}
	if got := s.ListRoleBindings("c1", "other"); len(got) != 0 {
		t.Fatalf("ListRoleBindings(other) = %+v", got)
	}
	if got := s.ListClusterRoleBindings("c1"); len(got) != 1 {
		t.Fatalf("ListClusterRoleBindings = %+v", got)
	}
	if ks := s.Kinds("c1"); len(ks) != 1 || ks[0].Resource != "roles" {
		t.Fatalf("Kinds = %+v", ks)
	}
	// Policy rows are never objects.
	if p, _ := s.Query(ctxb, Query{Access: &Access{All: true}}); p.TotalCount != 0 {
		t.Fatalf("policy rows listed as objects: %d", p.TotalCount)
	}

	rev := s.PolicyRevision("c1")
	steps := []struct {
		name    string
		do      func() error
		changes bool
	}{
		{"unchanged upsert", func() error {
			return s.Upsert(ctxb, policyRow(KindClusterRole, "", "cr", &Policy{Rules: rules}))
		}, false},
		{"object in the cluster", func() error { return s.Upsert(ctxb, pod("c1", "ns", "p", StatusHealthy, nil)) }, true},
		{"policy in another cluster", func() error {
			o := policyRow(KindClusterRole, "", "cr", nil)
			o.Cluster = "c2"
			return s.Upsert(ctxb, o)
		}, false},
		{"rule change", func() error {
			return s.Upsert(ctxb, policyRow(KindClusterRole, "", "cr", &Policy{Rules: append(rules, PolicyRule{Verbs: []string{"get"}})}))
		}, true},
		{"binding delete", func() error {
			o := policyRow(KindRoleBinding, "ns", "rb", nil)
			return s.Delete(ctxb, o.Key())
		}, true},
		{"replace to empty", func() error { return s.Replace(ctxb, "c1", roleKind, nil) }, true},
	}
	for _, st := range steps {
		pr := s.WatchPolicies()
		if pr.Clusters["c1"] != rev {
			t.Errorf("%s: WatchPolicies has revision %d, PolicyRevision %d", st.name, pr.Clusters["c1"], rev)
		}
		mustNoErr(t, st.do())
		now := s.PolicyRevision("c1")
		// A new kind (Pod via Upsert) does not change the kinds set: only
		// Replace records kinds.
		if st.name == "object in the cluster" {
			st.changes = false
		}
		if (now != rev) != st.changes {
			t.Errorf("%s: revision %d -> %d, want changed=%v", st.name, rev, now, st.changes)
		}
		// The channel watches every cluster: c2's first policy row closes it too.
		fleetChanges := st.changes || st.name == "policy in another cluster"
		select {
		case <-pr.Changed:
			if !fleetChanges {
				t.Errorf("%s: WatchPolicies channel closed without a policy change", st.name)
			}
		default:
			if fleetChanges {
				t.Errorf("%s: WatchPolicies channel still open after a policy change", st.name)
			}
		}
		rev = now
	}
	if _, ok := s.GetRole("c1", "ns", "r"); ok {
		t.Error("Replace to empty kept the role")
	}
}

// TestWatchPoliciesEnterAndLeave checks the clusters WatchPolicies lists:
// a cluster enters with its first policy row (an object row is not one)
// and leaves with RemoveCluster, and each step closes the channel.
func TestWatchPoliciesEnterAndLeave(t *testing.T) {
	s, _ := newTestStore(t)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	pr := s.WatchPolicies()
	if len(pr.Clusters) != 0 || pr.Changed == nil {
		t.Fatalf("WatchPolicies of an empty index = %+v", pr)
	}
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "ns", "p", StatusHealthy, nil)))
	if closed(pr.Changed) {
		t.Fatal("closed by an object write")
	}
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRole, "", "cr", nil)))
	if !closed(pr.Changed) {
		t.Fatal("not closed by the first policy change")
	}
	pr = s.WatchPolicies()
	if rev := pr.Clusters["c1"]; len(pr.Clusters) != 1 || rev == 0 || rev != s.PolicyRevision("c1") {
		t.Fatalf("after the first policy row: %v, PolicyRevision %d", pr.Clusters, s.PolicyRevision("c1"))
	}
	mustNoErr(t, s.RemoveCluster(ctxb, "c1"))
	if !closed(pr.Changed) {
		t.Fatal("not closed by RemoveCluster")
	}
	if pr = s.WatchPolicies(); len(pr.Clusters) != 0 || s.PolicyRevision("c1") != 0 {
		t.Fatalf("after RemoveCluster: %v, PolicyRevision %d", pr.Clusters, s.PolicyRevision("c1"))
	}
}

func TestPolicyRowValidation(t *testing.T) {
	s, _ := newTestStore(t)
	if err := s.Upsert(ctxb, policyRow(KindRole, "", "r", nil)); err == nil {
		t.Fatal("a Role without namespace was accepted")
	}
	if err := s.Upsert(ctxb, policyRow(KindClusterRole, "ns", "r", nil)); err == nil {
		t.Fatal("a namespaced ClusterRole was accepted")
	}
}
