package authz

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

func TestExplainVisibility(t *testing.T) {
	pods := index.GroupResource{Resource: "pods"}
	p := policy{
		roles: []*index.Role{
			clusterRole("view", rule("get,list,watch", "-", "pods,services")),
			clusterRole("one-pod", rule("get", "-", "pods", "web")),
			nsRole("ns2", "lister", rule("list", "-", "pods")),
		},
		bindings: []*index.Binding{
			roleBinding("ns1", "alice-view", RoleRefClusterRole, "view", "User:alice"),
			clusterRoleBinding("bob-web", "one-pod", "Group:team-b"),
			roleBinding("ns2", "carol-list", RoleRefRole, "lister", "User:carol"),
			roleBinding("ns2", "carol-gone", RoleRefClusterRole, "no-such-role", "User:carol"),
		},
	}
	e := NewEvaluator(p.store())
	explain := func(u user.Info, ns, name string) Explanation {
		t.Helper()
		x, err := e.ExplainVisibility(context.Background(), testCluster, u, pods, true, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	grants := func(x Explanation) []string {
		var out []string
		for _, g := range x.Grants {
			out = append(out, fmt.Sprintf("%s ns=%q by %s rule=%v/%v/%v", g.Request.Verb, g.Request.Namespace, g.Source, g.Rule.Verbs, g.Rule.Resources, g.Rule.ResourceNames))
		}
		return out
	}
	check := func(what string, x Explanation, visible bool, want ...string) {
		t.Helper()
		got := grants(x)
		if x.Visible != visible || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: visible %v, grants\n  %q\nwant visible %v,\n  %q", what, x.Visible, got, visible, want)
		}
	}

	alice := &user.DefaultInfo{Name: "alice"}
	check("alice in her namespace", explain(alice, "ns1", "web"), true,
		`get ns="ns1" by RoleBinding "alice-view/ns1" of ClusterRole "view" to User "alice" rule=[get list watch]/[pods services]/[]`,
		`list ns="ns1" by RoleBinding "alice-view/ns1" of ClusterRole "view" to User "alice" rule=[get list watch]/[pods services]/[]`)
	check("alice elsewhere", explain(alice, "ns2", "web"), false)

	bob := &user.DefaultInfo{Name: "bob", Groups: []string{"team-b"}}
	check("bob's one pod, by name in any namespace", explain(bob, "ns2", "web"), true,
		`get ns="ns2" by ClusterRoleBinding "bob-web" of ClusterRole "one-pod" to Group "team-b" rule=[get]/[pods]/[web]`)
	check("bob, another pod", explain(bob, "ns2", "api"), false)

	carol := explain(&user.DefaultInfo{Name: "carol"}, "ns2", "web")
	check("carol lists in ns2", carol, true,
		`list ns="ns2" by RoleBinding "carol-list/ns2" of Role "lister" to User "carol" rule=[list]/[pods]/[]`)
	if len(carol.Problems) != 1 || !errors.Is(carol.Problems[0], ErrRoleNotFound) {
		t.Errorf("carol's binding to a missing role: problems %v", carol.Problems)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.ExplainVisibility(ctx, testCluster, alice, pods, true, "ns1", "web"); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
}

// TestExplainAgreesWithAccessSets checks, over random policies, that the
// explanation's answer is the access set's, and that every grant it names
// is a rule of a binding of the user that allows its request.
func TestExplainAgreesWithAccessSets(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	namespaces := []string{"ns1", "ns2"}
	objs := universe(namespaces, []string{"a", "ns2"})
	users := []user.Info{
		&user.DefaultInfo{Name: "alice"},
		&user.DefaultInfo{Name: "bob", Groups: []string{"devs"}},
	}
	for i := range 100 {
		var p policy
		for _, n := range []string{"r0", "r1"} {
			p.roles = append(p.roles,
				clusterRole(n, rule(pick([]string{"get", "list", "*", "watch"}), pick([]string{"-", "*", "apps"}), pick([]string{"pods", "*", "namespaces", "deployments"}))),
				nsRole(pick(namespaces), n, rule(pick([]string{"get", "list"}), "-", pick([]string{"pods", "namespaces"}), []string{"a", "ns2", ""}[rng.IntN(3)])))
		}
		for j := range 1 + rng.IntN(4) {
			sub := pick([]string{"User:alice", "Group:devs", "Group:system:authenticated"})
			name := fmt.Sprintf("b%d", j)
			switch rng.IntN(3) {
			case 0:
				p.bindings = append(p.bindings, clusterRoleBinding(name, pick([]string{"r0", "r1", "missing"}), sub))
			case 1:
				p.bindings = append(p.bindings, roleBinding(pick(namespaces), name, RoleRefClusterRole, pick([]string{"r0", "r1"}), sub))
			default:
				p.bindings = append(p.bindings, roleBinding(pick(namespaces), name, RoleRefRole, pick([]string{"r0", "r1"}), sub))
			}
		}
		f := p.store()
		a := NewAuthorizer(f, Options{})
		for _, u := range users {
			id := NewIdentity(u)
			ca := a.ClusterAccess(testCluster, id)
			for _, o := range objs {
				x, err := a.ExplainVisibility(context.Background(), testCluster, id, o.gr, o.namespaced, o.namespace, o.name)
				if err != nil {
					t.Fatal(err)
				}
				if want := Allows(ca, o.gr, o.namespace, o.name); x.Visible != want {
					t.Fatalf("policy %d, %s, %s: explanation says visible=%v, access set %v", i, u.GetName(), o, x.Visible, want)
				}
				for _, g := range x.Grants {
					if !RuleAllows(&g.Request, &g.Rule) || !appliesToAny(g.Request.User, g.Source.Binding) {
						t.Fatalf("policy %d, %s, %s: grant %s does not allow %s", i, u.GetName(), o, g.Source, describe(g.Request))
					}
				}
			}
		}
	}
}

func appliesToAny(u user.Info, b *index.Binding) bool {
	_, ok := appliesTo(u, b)
	return ok
}
