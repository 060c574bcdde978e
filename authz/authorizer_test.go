package authz

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

var podsGR = index.GroupResource{Resource: "pods"}

func twoClusterStore() *fakeStore {
	f := newFakeStore()
	for _, c := range []string{"east", "west"} {
		f.setKinds(c, testKinds())
		f.addRole(c, clusterRole("view", rule("get,list,watch", "-", "pods")))
		f.addBinding(c, roleBinding("ns1", "alice-view", RoleRefClusterRole, "view", "User:alice"))
	}
	return f
}

func TestClusterAccessRevokeAndInvalidation(t *testing.T) {
	f := twoClusterStore()
	a := NewAuthorizer(f, Options{})
	alice := NewIdentity(&user.DefaultInfo{Name: "alice"})

	for _, c := range []string{"east", "west"} {
		if !a.ClusterAccess(c, alice).Allows(podsGR, "ns1", "p") {
			t.Fatalf("%s: alice should see pods in ns1", c)
		}
	}
	eastCompiles, westCompiles := f.compiles("east"), f.compiles("west")

	// Cached: no recompilation, and the same value comes back.
	first := a.Access(alice)
	if first != a.Access(alice) || first.Clusters["east"] != a.ClusterAccess("east", alice) {
		t.Error("cached lookups should return the same access set")
	}
	if f.compiles("east") != eastCompiles {
		t.Error("a cached lookup recompiled the policy")
	}

	// Revoke in east: effective on the next call there, west untouched:
	// not compiled again, and its part of the answer is the same value.
	f.deleteBinding("east", "ns1", "alice-view")
	if a.ClusterAccess("east", alice).Allows(podsGR, "ns1", "p") {
		t.Error("east: revoked binding still grants access")
	}
	if f.compiles("east") != eastCompiles+1 {
		t.Errorf("east compiled %d times after one change, want 1", f.compiles("east")-eastCompiles)
	}
	if !a.ClusterAccess("west", alice).Allows(podsGR, "ns1", "p") {
		t.Error("west: lost access after a change in east")
	}
	if f.compiles("west") != westCompiles {
		t.Error("a change in east invalidated west")
	}
	if a.ClusterAccess("west", alice) != first.Clusters["west"] {
		t.Error("a change in east rebuilt alice's access in west")
	}

	// Deleting the role a binding references revokes too.
	f.addBinding("west", roleBinding("ns7", "alice-local", RoleRefRole, "local", "User:alice"))
	f.addRole("west", nsRole("ns7", "local", rule("list", "-", "pods")))
	if !a.ClusterAccess("west", alice).Allows(podsGR, "ns7", "p") {
		t.Error("west: Role grant missing")
	}
	f.deleteRole("west", "ns7", "local")
	if a.ClusterAccess("west", alice).Allows(podsGR, "ns7", "p") {
		t.Error("west: deleted Role still grants access")
	}
	// Role changes count too: narrowing the ClusterRole revokes.
	f.addRole("west", clusterRole("view", rule("get,list,watch", "-", "services")))
	if a.ClusterAccess("west", alice).Allows(podsGR, "ns1", "p") {
		t.Error("west: narrowed role still grants pods")
	}
	// Kinds changes count: a new kind under a wildcard shows up.
	f.addRole("west", clusterRole("view", rule("list", "*", "*")))
	if a.ClusterAccess("west", alice).Allows(index.GroupResource{Group: "example.com", Resource: "widgets"}, "ns1", "w") {
		t.Error("unknown kind visible before discovery reported it")
	}
	f.setKinds("west", append(testKinds(), index.Kind{Group: "example.com", Version: "v1", Kind: "Widget", Resource: "widgets", Namespaced: true}))
	if !a.ClusterAccess("west", alice).Allows(index.GroupResource{Group: "example.com", Resource: "widgets"}, "ns1", "w") {
		t.Error("new kind under a wildcard rule not visible after discovery")
	}
}

func TestClusterAccessIdentityKey(t *testing.T) {
	f := twoClusterStore()
	f.addBinding("east", roleBinding("ns2", "devs-view", RoleRefClusterRole, "view", "Group:devs"))
	a := NewAuthorizer(f, Options{})
	bob := NewIdentity(&user.DefaultInfo{Name: "bob"})
	bobDev := NewIdentity(&user.DefaultInfo{Name: "bob", Groups: []string{"devs"}})
	bobDev2 := NewIdentity(&user.DefaultInfo{Name: "bob", Groups: []string{"devs", "devs"}, UID: "other"})
	if bob.Key() == bobDev.Key() || bobDev.Key() != bobDev2.Key() {
		t.Fatalf("keys: %q %q %q", bob.Key(), bobDev.Key(), bobDev2.Key())
	}
	if a.ClusterAccess("east", bob).Allows(podsGR, "ns2", "p") {
		t.Error("bob without devs sees ns2")
	}
	if !a.ClusterAccess("east", bobDev).Allows(podsGR, "ns2", "p") {
		t.Error("bob in devs does not see ns2")
	}
	// Injective keys: a name with separators cannot collide with groups.
	x := NewIdentity(&user.DefaultInfo{Name: "a", Groups: []string{"b"}})
	y := NewIdentity(&user.DefaultInfo{Name: "a1:b"})
	if x.Key() == y.Key() {
		t.Error("identity keys collide")
	}
}

func TestClusterAccessMappingPerCluster(t *testing.T) {
	f := newFakeStore()
	f.setKinds("east", testKinds())
	f.addRole("east", clusterRole("view", rule("list", "-", "pods")))
	f.addBinding("east", roleBinding("ns1", "b1", RoleRefClusterRole, "view", "User:oidc:alice"))
	f.addBinding("east", roleBinding("ns2", "b2", RoleRefClusterRole, "view", "Group:oidc:devs"))
	f.addBinding("east", roleBinding("ns3", "b3", RoleRefClusterRole, "view", "User:alice"))
	a := NewAuthorizer(f, Options{Mappings: map[string]Mapping{"east": {UsernamePrefix: "oidc:", GroupsPrefix: "oidc:"}}})
	alice := NewIdentity(&user.DefaultInfo{Name: "alice", Groups: []string{"devs"}})
	ca := a.ClusterAccess("east", alice)
	if !ca.Allows(podsGR, "ns1", "p") || !ca.Allows(podsGR, "ns2", "p") || ca.Allows(podsGR, "ns3", "p") {
		t.Errorf("prefixes not applied: %+v", ca)
	}
	d, err := a.Authorize(context.Background(), "east", alice, Attributes{Verb: "list", Resource: "pods", Namespace: "ns2", ResourceRequest: true})
	if !d.Allowed || err != nil {
		t.Errorf("Authorize with mapping: %+v %v", d, err)
	}
}

func TestAccessAcrossClusters(t *testing.T) {
	f := twoClusterStore()
	f.setKinds("empty", testKinds())
	a := NewAuthorizer(f, Options{})
	alice := NewIdentity(&user.DefaultInfo{Name: "alice"})
	acc := a.Access(alice)
	if len(acc.Clusters) != 2 || acc.Clusters["east"] == nil || acc.Clusters["west"] == nil {
		t.Fatalf("clusters with nothing visible must be left out: %v", acc.Clusters)
	}
	if !acc.Allows("west", podsGR, "ns1", "p") || acc.Allows("empty", podsGR, "ns1", "p") {
		t.Error("wrong fleet access")
	}
	if !a.ClusterAccess("unknown", alice).Empty() {
		t.Error("a cluster the source does not know shows something")
	}

	// A cluster joins: its first RBAC rows show up in the next answer.
	f.setKinds("south", testKinds())
	f.addRole("south", clusterRole("view", rule("list", "-", "pods")))
	f.addBinding("south", clusterRoleBinding("alice-all", "view", "User:alice"))
	if acc = a.Access(alice); !acc.Allows("south", podsGR, "any", "p") || acc.Clusters["east"] == nil {
		t.Errorf("after south joined: %v", acc.Clusters)
	}
	// It leaves: gone from the next answer.
	f.removeCluster("south")
	if acc = a.Access(alice); acc.Clusters["south"] != nil || len(acc.Clusters) != 2 {
		t.Errorf("after south left: %v", acc.Clusters)
	}
}

// TestSpuriousWakeKeepsAnswers closes the source's channel without changing
// any revision (as a memdb watch may): answers and compiled policies stay.
func TestSpuriousWakeKeepsAnswers(t *testing.T) {
	f := twoClusterStore()
	a := NewAuthorizer(f, Options{})
	alice := NewIdentity(&user.DefaultInfo{Name: "alice"})
	first := a.Access(alice)
	compiles := f.compiles("east")
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	if a.Access(alice) != first || f.compiles("east") != compiles {
		t.Error("a wake without a revision change dropped cached answers")
	}
}

func TestClusterAccessBoundedCache(t *testing.T) {
	f := twoClusterStore()
	a := NewAuthorizer(f, Options{MaxIdentities: 3})
	for i := range 20 {
		id := NewIdentity(&user.DefaultInfo{Name: fmt.Sprintf("u%d", i)})
		a.Access(id)
		if n := a.cur.Load().views.Load().n.Load(); n > 4 {
			t.Fatalf("cache grew to %d entries with a bound of 3", n)
		}
	}
	alice := NewIdentity(&user.DefaultInfo{Name: "alice"})
	if !a.ClusterAccess("east", alice).Allows(podsGR, "ns1", "p") {
		t.Error("correctness lost after cache reset")
	}
}

func TestPolicyErrors(t *testing.T) {
	f := twoClusterStore()
	f.addBinding("east", clusterRoleBinding("dangling", "gone", "User:alice"))
	a := NewAuthorizer(f, Options{})
	errs := a.PolicyErrors("east")
	if len(errs) != 1 || !errors.Is(errs[0], ErrRoleNotFound) {
		t.Fatalf("got %v, want one missing-role error", errs)
	}
	f.removeCluster("east")
	if errs := a.PolicyErrors("east"); len(errs) != 0 {
		t.Errorf("a cluster that left still reports %v", errs)
	}
}

// TestClusterAccessConcurrent runs lookups, builds and revisions at once;
// run with -race.
func TestClusterAccessConcurrent(t *testing.T) {
	f := twoClusterStore()
	a := NewAuthorizer(f, Options{MaxIdentities: 8})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			f.addBinding("east", roleBinding("ns9", fmt.Sprintf("b%d", i), RoleRefClusterRole, "view", "User:u1"))
		}
	})
	for r := range 4 {
		wg.Go(func() {
			for i := range 300 {
				id := NewIdentity(&user.DefaultInfo{Name: fmt.Sprintf("u%d", (i+r)%12)})
				a.ClusterAccess("east", id)
				a.ClusterAccess("west", id)
			}
		})
	}
	wg.Wait()
	if !a.ClusterAccess("east", NewIdentity(&user.DefaultInfo{Name: "u1"})).Allows(podsGR, "ns9", "p") {
		t.Error("u1 should see ns9 after the writer stopped")
	}
}

func TestMapping(t *testing.T) {
	tests := []struct {
		name   string
		m      Mapping
		in     user.Info
		name2  string
		groups []string
	}{
		{"plain user gets system:authenticated", Mapping{}, &user.DefaultInfo{Name: "alice", Groups: []string{"devs"}}, "alice", []string{"devs", "system:authenticated"}},
		{"prefixes", Mapping{UsernamePrefix: "oidc:", GroupsPrefix: "g:"}, &user.DefaultInfo{Name: "alice", Groups: []string{"devs"}}, "oidc:alice", []string{"g:devs", "system:authenticated"}},
		{"already authenticated", Mapping{}, &user.DefaultInfo{Name: "x", Groups: []string{"system:authenticated"}}, "x", []string{"system:authenticated"}},
		{"unauthenticated group is left alone", Mapping{}, &user.DefaultInfo{Name: "x", Groups: []string{"system:unauthenticated"}}, "x", []string{"system:unauthenticated"}},
		{"anonymous is never prefixed or authenticated", Mapping{UsernamePrefix: "p:"}, &user.DefaultInfo{Name: "system:anonymous", Groups: []string{"system:unauthenticated"}}, "system:anonymous", []string{"system:unauthenticated"}},
		{"service account groups", Mapping{}, &user.DefaultInfo{Name: "system:serviceaccount:ns1:robot"}, "system:serviceaccount:ns1:robot", []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"}},
		{"service account groups not duplicated", Mapping{}, &user.DefaultInfo{Name: "system:serviceaccount:ns1:robot", Groups: []string{"system:serviceaccounts"}}, "system:serviceaccount:ns1:robot", []string{"system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"}},
		{"a prefixed name is not a service account", Mapping{UsernamePrefix: "oidc:"}, &user.DefaultInfo{Name: "system:serviceaccount:ns1:robot"}, "oidc:system:serviceaccount:ns1:robot", []string{"system:authenticated"}},
		{"malformed service account names get no groups", Mapping{}, &user.DefaultInfo{Name: "system:serviceaccount:ns1:a:b"}, "system:serviceaccount:ns1:a:b", []string{"system:authenticated"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := tt.m.Map(tt.in)
			if out.GetName() != tt.name2 || fmt.Sprint(out.GetGroups()) != fmt.Sprint(tt.groups) {
				t.Errorf("got %q %q, want %q %q", out.GetName(), out.GetGroups(), tt.name2, tt.groups)
			}
		})
	}
}
