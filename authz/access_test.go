package authz

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// object is one object of the test universe.
type object struct {
	gr         index.GroupResource
	namespaced bool
	namespace  string
	name       string
}

func (o object) String() string {
	return fmt.Sprintf("%s/%s %s/%s", o.gr.Group, o.gr.Resource, o.namespace, o.name)
}

// universe returns objects of every test kind in every namespace with the
// given names, plus one Namespace object per namespace.
func universe(namespaces, names []string) []object {
	var out []object
	for _, k := range newKindTable(testKinds()).all {
		switch {
		case k.namespaced:
			for _, ns := range namespaces {
				for _, n := range names {
					out = append(out, object{gr: k.gr, namespaced: true, namespace: ns, name: n})
				}
			}
		case isNamespaces(k.gr):
			for _, ns := range namespaces {
				out = append(out, object{gr: k.gr, name: ns})
			}
		default:
			for _, n := range names {
				out = append(out, object{gr: k.gr, name: n})
			}
		}
	}
	return out
}

// checkAccess compares the access set of u with the evaluator's answer for
// every object of the universe. The Authorizer maps the identity (adding
// system:authenticated), so the evaluator is asked about the mapped user.
func checkAccess(t *testing.T, f *fakeStore, u user.Info, objs []object) {
	t.Helper()
	a := NewAuthorizer(f, Options{})
	id := NewIdentity(u)
	ca := a.ClusterAccess(testCluster, id)
	mapped := a.MappedUser(testCluster, id)
	e := NewEvaluator(f)
	for _, o := range objs {
		want, _ := e.ObjectVisible(context.Background(), testCluster, mapped, o.gr, o.namespaced, o.namespace, o.name)
		if got := Allows(ca, o.gr, o.namespace, o.name); got != want {
			t.Errorf("user %q groups %q: %s: access set says %v, evaluator %v", u.GetName(), u.GetGroups(), o, got, want)
		}
	}
}

func TestAccessSetTable(t *testing.T) {
	namespaces := []string{"ns1", "ns2", "kube-system"}
	names := []string{"a", "b", "ns1"}
	objs := universe(namespaces, names)
	// visible matches (path.Match) exactly the objects the user may see;
	// every other object must be invisible. It is checked beside the
	// evaluator, which is another reading of the same rules.
	tests := []struct {
		name    string
		policy  policy
		user    user.Info
		visible []string
	}{
		{
			name: "RoleBinding to view in one namespace",
			policy: policy{
				roles:    []*index.Role{clusterRole("view", rule("get,list,watch", "-", "pods,services"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "view", "User:alice")},
			},
			user:    &user.DefaultInfo{Name: "alice"},
			visible: []string{"/pods ns1/*", "/services ns1/*"},
		},
		{
			name: "ClusterRoleBinding with resourceNames on a namespaced resource: that name in every namespace",
			policy: policy{
				roles:    []*index.Role{clusterRole("one", rule("get", "-", "pods", "a"))},
				bindings: []*index.Binding{clusterRoleBinding("b", "one", "User:alice")},
			},
			user:    &user.DefaultInfo{Name: "alice"},
			visible: []string{"/pods */a"},
		},
		{
			name: "RoleBinding in a namespace granting get on namespaces shows that Namespace only",
			policy: policy{
				roles:    []*index.Role{clusterRole("ns", rule("get", "-", "namespaces"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "ns", "User:alice")},
			},
			user:    &user.DefaultInfo{Name: "alice"},
			visible: []string{"/namespaces /ns1"},
		},
		{
			name: "list on namespaces inside a namespace shows nothing",
			policy: policy{
				roles:    []*index.Role{clusterRole("ns", rule("list", "-", "namespaces"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "ns", "User:alice")},
			},
			user: &user.DefaultInfo{Name: "alice"},
		},
		{
			name: "resourceNames on namespaces through RoleBindings",
			policy: policy{
				roles: []*index.Role{
					clusterRole("ns1-only", rule("get", "-", "namespaces", "ns1")),
				},
				bindings: []*index.Binding{
					roleBinding("ns1", "b1", RoleRefClusterRole, "ns1-only", "User:alice"),
					roleBinding("ns2", "b2", RoleRefClusterRole, "ns1-only", "User:alice"),
				},
			},
			user:    &user.DefaultInfo{Name: "alice"},
			visible: []string{"/namespaces /ns1"},
		},
		{
			name: "cluster-admin through a group sees everything",
			policy: policy{
				roles:    []*index.Role{clusterRole("cluster-admin", rule("*", "*", "*"), urlRule("*", "*"))},
				bindings: []*index.Binding{clusterRoleBinding("b", "cluster-admin", "Group:system:masters")},
			},
			user:    &user.DefaultInfo{Name: "root", Groups: []string{"system:masters"}},
			visible: []string{"*/* */*"}, // every object
		},
		{
			name: "wildcard group matches the same plural in two groups; wildcard resource in one group",
			policy: policy{
				roles: []*index.Role{
					clusterRole("pods-any-group", rule("list", "*", "pods")),
					clusterRole("all-flux", rule("get", "kustomize.toolkit.fluxcd.io", "*")),
				},
				bindings: []*index.Binding{
					roleBinding("ns2", "b1", RoleRefClusterRole, "pods-any-group", "Group:devs"),
					clusterRoleBinding("b2", "all-flux", "Group:devs"),
				},
			},
			user: &user.DefaultInfo{Name: "x", Groups: []string{"devs"}},
			visible: []string{
				"/pods ns2/*", "metrics.k8s.io/pods ns2/*", // list pods of any group in ns2
				"kustomize.toolkit.fluxcd.io/kustomizations */*", // get any Kustomization by name
			},
		},
		{
			name: "subresource and non-read verbs never make objects visible",
			policy: policy{
				roles: []*index.Role{clusterRole("odd",
					rule("get,list", "-", "pods/log,*/status"),
					rule("create,update,watch", "*", "*"),
					rule("list", "-", "secrets", "a"),
				)},
				bindings: []*index.Binding{clusterRoleBinding("b", "odd", "User:alice")},
			},
			user: &user.DefaultInfo{Name: "alice"},
		},
		{
			name: "list with resourceNames [\"\"] is a nameless list",
			policy: policy{
				roles:    []*index.Role{clusterRole("odd", rule("list", "-", "secrets", ""))},
				bindings: []*index.Binding{roleBinding("ns2", "b", RoleRefClusterRole, "odd", "User:alice")},
			},
			user:    &user.DefaultInfo{Name: "alice"},
			visible: []string{"/secrets ns2/*"},
		},
		{
			name: "ServiceAccount defaulting, missing role, and two roles merged in a namespace",
			policy: policy{
				roles: []*index.Role{
					clusterRole("pods", rule("list", "-", "pods")),
					nsRole("ns1", "svc", rule("get", "-", "services")),
				},
				bindings: []*index.Binding{
					roleBinding("ns1", "b1", RoleRefClusterRole, "pods", "ServiceAccount:robot"),
					roleBinding("ns1", "b2", RoleRefRole, "svc", "ServiceAccount:ns1/robot"),
					roleBinding("ns2", "b3", RoleRefRole, "svc", "ServiceAccount:robot"),
					roleBinding("ns2", "b4", RoleRefClusterRole, "gone", "ServiceAccount:robot"),
				},
			},
			user:    &user.DefaultInfo{Name: "system:serviceaccount:ns1:robot"},
			visible: []string{"/pods ns1/*", "/services ns1/*"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.policy.store()
			checkAccess(t, f, tt.user, objs)
			ca := NewAuthorizer(f, Options{}).ClusterAccess(testCluster, NewIdentity(tt.user))
			used := map[string]bool{}
			for _, o := range objs {
				want := false
				for _, v := range tt.visible {
					if ok, err := path.Match(v, o.String()); err != nil {
						t.Fatalf("bad pattern %q: %v", v, err)
					} else if ok {
						want, used[v] = true, true
					}
				}
				if got := Allows(ca, o.gr, o.namespace, o.name); got != want {
					t.Errorf("%s: visible %v, want %v", o, got, want)
				}
			}
			for _, v := range tt.visible {
				if !used[v] {
					t.Fatalf("bad test: no object matches %s", v)
				}
			}
		})
	}
}

// TestAccessSetRandom is a quick in-package differential test between the
// compiled access sets and the evaluator; testenv/rbacdiff does the same
// against the Kubernetes authorizer at scale.
func TestAccessSetRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	namespaces := []string{"ns1", "ns2", "ns3"}
	names := []string{"a", "b", "ns2"}
	objs := universe(namespaces, names)
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	verbs := []string{"get", "list", "watch", "*", "create"}
	groups := []string{"", "apps", "*", "metrics.k8s.io", "kustomize.toolkit.fluxcd.io"}
	resources := []string{"pods", "services", "namespaces", "nodes", "deployments", "kustomizations", "*", "pods/log", "*/scale", "secrets"}
	resNames := [][]string{nil, nil, nil, {"a"}, {"b", "ns2"}, {""}}
	subjectsPool := []string{"User:alice", "Group:devs", "Group:system:authenticated", "ServiceAccount:robot", "ServiceAccount:ns1/robot", "User:system:serviceaccount:ns2:robot"}
	users := []user.Info{
		&user.DefaultInfo{Name: "alice"},
		&user.DefaultInfo{Name: "bob", Groups: []string{"devs", "system:authenticated"}},
		&user.DefaultInfo{Name: "system:serviceaccount:ns1:robot", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:ns1"}},
		&user.DefaultInfo{Name: "system:serviceaccount:ns2:robot"},
	}
	randRule := func() index.PolicyRule {
		r := index.PolicyRule{Verbs: []string{pick(verbs)}, APIGroups: []string{pick(groups)}, Resources: []string{pick(resources)}, ResourceNames: resNames[rng.IntN(len(resNames))]}
		if rng.IntN(3) == 0 {
			r.Resources = append(r.Resources, pick(resources))
		}
		if rng.IntN(3) == 0 {
			r.Verbs = append(r.Verbs, pick(verbs))
		}
		return r
	}
	iterations := 300
	if testing.Short() {
		iterations = 50
	}
	for i := range iterations {
		var p policy
		roleNames := []string{"r0", "r1", "r2"}
		for _, n := range roleNames {
			p.roles = append(p.roles, clusterRole(n, randRule(), randRule()))
			p.roles = append(p.roles, nsRole(pick(namespaces), n, randRule()))
		}
		for j := range 1 + rng.IntN(5) {
			name := fmt.Sprintf("b%d", j)
			subs := []string{pick(subjectsPool)}
			switch rng.IntN(3) {
			case 0:
				p.bindings = append(p.bindings, clusterRoleBinding(name, pick(roleNames), subs...))
			case 1:
				p.bindings = append(p.bindings, roleBinding(pick(namespaces), name, RoleRefClusterRole, pick(roleNames), subs...))
			default:
				p.bindings = append(p.bindings, roleBinding(pick(namespaces), name, RoleRefRole, pick(roleNames), subs...))
			}
		}
		f := p.store()
		for _, u := range users {
			checkAccess(t, f, u, objs)
		}
		if t.Failed() {
			for _, r := range p.roles {
				t.Logf("role %s/%s %+v", r.Namespace, r.Name, r.Rules)
			}
			for _, b := range p.bindings {
				t.Logf("binding %s/%s %+v %+v", b.Namespace, b.Name, b.RoleRef, b.Subjects)
			}
			t.Fatalf("iteration %d", i)
		}
	}
}

// TestClusterNamedGrantInIndex checks, with a real index, that a
// ClusterRoleBinding to a rule with resourceNames on a namespaced resource
// shows that name in every namespace, in queries as in Allows: both use the
// one definition, index.ClusterAccess.Allows.
func TestClusterNamedGrantInIndex(t *testing.T) {
	ctx := context.Background()
	const cluster = "c1"
	s := index.New(memtables.Open)
	podKind := index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	var pods []index.Object
	for _, ns := range []string{"ns1", "ns2", "ns3"} {
		for _, name := range []string{"x", "y"} {
			pods = append(pods, index.Object{Cluster: cluster, Namespace: ns, Version: "v1", Kind: "Pod", Resource: "pods", Name: name, Status: index.StatusHealthy})
		}
	}
	if err := s.Replace(ctx, cluster, podKind, pods); err != nil {
		t.Fatal(err)
	}
	rbac := func(kind, name string, p *index.Policy) {
		t.Helper()
		k := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: kind}
		row := index.Object{Cluster: cluster, Group: index.RBACGroup, Version: "v1", Kind: kind, Name: name, Status: index.StatusUnknown, Policy: p}
		if err := s.Replace(ctx, cluster, k, []index.Object{row}); err != nil {
			t.Fatal(err)
		}
	}
	rbac(index.KindClusterRole, "get-x", &index.Policy{Rules: []index.PolicyRule{
		{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"x"}},
	}})
	rbac(index.KindClusterRoleBinding, "alice-get-x", &index.Policy{
		RoleRef:  index.RoleRef{Kind: RoleRefClusterRole, Name: "get-x"},
		Subjects: []index.Subject{{Kind: SubjectUser, Name: "alice"}},
	})
	a := NewAuthorizer(s, Options{})
	id := NewIdentity(&user.DefaultInfo{Name: "alice"})
	ca := a.ClusterAccess(cluster, id)
	podsGR := index.GroupResource{Resource: "pods"}
	if !Allows(ca, podsGR, "ns2", "x") || Allows(ca, podsGR, "ns2", "y") {
		t.Fatalf("Allows: x should be visible in ns2, y not; access %+v", ca)
	}
	p, err := s.Query(ctx, index.Query{Access: a.Access(id)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range p.Edges {
		got = append(got, e.Object.Namespace+"/"+e.Object.Name)
	}
	if fmt.Sprint(got) != "[ns1/x ns2/x ns3/x]" || p.TotalCount != 3 {
		t.Fatalf("query shows %v (total %d), want x in each namespace", got, p.TotalCount)
	}
}
