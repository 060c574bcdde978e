package index

import "testing"

// TestMatcherClusterSelector checks that a subscription's matcher reads
// the cluster's labels when it matches, so a relabelled cluster's events
// follow its new labels, and that the store-less matcher sees no labels.
func TestMatcherClusterSelector(t *testing.T) {
	s, _ := newTestStore(t)
	mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: "c0", Labels: map[string]string{"env": "prod"}, State: StateConnected}))
	o := pod("c0", "ns", "p", StatusHealthy, nil)
	all := &Access{All: true}

	m, err := s.NewMatcher(Filter{ClusterSelector: "env=prod"}, all)
	mustNoErr(t, err)
	if !m.Match(&o) {
		t.Fatal("a pod of the prod cluster does not match env=prod")
	}
	other := pod("c9", "ns", "p", StatusHealthy, nil)
	if m.Match(&other) {
		t.Fatal("a pod of a cluster without a row matches env=prod")
	}
	mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: "c0", Labels: map[string]string{"env": "staging"}, State: StateConnected}))
	if m.Match(&o) {
		t.Fatal("the cluster was relabelled env=staging, yet its pod still matches env=prod")
	}

	plain, err := NewMatcher(Filter{ClusterSelector: "env=prod"}, all)
	mustNoErr(t, err)
	if plain.Match(&o) {
		t.Error("the store-less matcher knows cluster labels")
	}
	plain, err = NewMatcher(Filter{ClusterSelector: "!env"}, all)
	mustNoErr(t, err)
	if !plain.Match(&o) {
		t.Error("the store-less matcher: !env does not match a cluster without labels")
	}
	if _, err := s.NewMatcher(Filter{ClusterSelector: "env in (("}, all); err == nil {
		t.Error("a malformed cluster selector compiled")
	}
}
