package graph

import (
	"encoding/json"
	"strings"
	"testing"
)

const whyQuery = `query($c: String!, $k: String!, $ns: String, $n: String!) {
  whyVisible(cluster: $c, kind: $k, namespace: $ns, name: $n) {
    visible fleetAdminGroup summary problems
    grants { verb scope description binding { kind name namespace } role { kind name } subject { kind name } rule { verbs resources resourceNames } }
  }
}`

type whyAnswer struct {
	WhyVisible struct {
		Visible         bool
		FleetAdminGroup *string
		Summary         string
		Problems        []string
		Grants          []struct {
			Verb, Scope, Description string
			Binding                  struct {
				Kind, Name string
				Namespace  *string
			}
			Role    struct{ Kind, Name string }
			Subject struct{ Kind, Name string }
			Rule    struct{ Verbs, Resources, ResourceNames []string }
		}
	}
}

// TestWhyVisible asks, over HTTP, why each user of the test fleet sees (or
// not) a few objects, and checks the answer against the fleet's bindings
// and against what objects(...) shows the same user.
func TestWhyVisible(t *testing.T) {
	f := newFixture(t)
	ask := func(user, cluster, kind, ns, name string) whyAnswer {
		t.Helper()
		vars := map[string]any{"c": cluster, "k": kind, "n": name}
		if ns != "" {
			vars["ns"] = ns
		}
		var out whyAnswer
		f.query(user, whyQuery, vars, &out)
		return out
	}
	shown := func(user, cluster, ns, name string) bool {
		t.Helper()
		var out struct{ Objects struct{ TotalCount int } }
		f.query(user, `query($f: ObjectFilter) { objects(filter: $f, first: 0) { totalCount } }`,
			map[string]any{"f": map[string]any{"clusters": []string{cluster}, "namespaces": []string{ns}, "kinds": []string{"Pod"}, "nameContains": name}}, &out)
		return out.Objects.TotalCount > 0
	}

	alice := ask("alice", "east", "Pod", "team-a", "pod-team-a-0").WhyVisible
	if !alice.Visible || len(alice.Grants) != 2 {
		t.Fatalf("alice: %+v", alice)
	}
	g := alice.Grants[0]
	if g.Verb != "get" || g.Binding.Kind != "RoleBinding" || g.Binding.Name != "alice-view" || *g.Binding.Namespace != "team-a" ||
		g.Role.Kind != "ClusterRole" || g.Role.Name != "view" || g.Subject.Name != "alice" || !strings.Contains(strings.Join(g.Rule.Resources, ","), "pods") {
		t.Errorf("alice's get grant: %+v", g)
	}
	if alice.Grants[1].Verb != "list" || alice.Grants[1].Scope != "pods in namespace team-a" {
		t.Errorf("alice's list grant: %+v", alice.Grants[1])
	}
	if !strings.Contains(alice.Summary, `RoleBinding "alice-view/team-a" of ClusterRole "view"`) {
		t.Errorf("alice's summary: %s", alice.Summary)
	}

	bob := ask("bob", "east", "Pod", "team-b", "pod-team-b-0").WhyVisible
	if !bob.Visible || len(bob.Grants) != 1 || bob.Grants[0].Verb != "get" || bob.Grants[0].Role.Kind != "Role" ||
		bob.Grants[0].Rule.ResourceNames[0] != "pod-team-b-0" || bob.Grants[0].Scope != `pods "pod-team-b-0" in namespace team-b` {
		t.Errorf("bob's one pod: %+v", bob)
	}
	if other := ask("bob", "east", "Pod", "team-b", "pod-team-b-1").WhyVisible; other.Visible || len(other.Grants) != 0 || !strings.Contains(other.Summary, "cannot see") {
		t.Errorf("bob, another pod: %+v", other)
	}

	// The answer agrees with the list for each user and object.
	for _, user := range []string{"alice", "bob", "admin"} {
		for _, o := range []struct{ cluster, ns, name string }{
			{"east", "team-a", "pod-team-a-1"}, {"east", "team-b", "pod-team-b-0"}, {"east", "team-b", "pod-team-b-2"}, {"west", "team-c", "pod-team-c-3"},
		} {
			if got, want := ask(user, o.cluster, "Pod", o.ns, o.name).WhyVisible.Visible, shown(user, o.cluster, o.ns, o.name); got != want {
				t.Errorf("%s, %v: whyVisible says %v, objects shows %v", user, o, got, want)
			}
		}
	}

	root := ask("root", "west", "Pod", "team-a", "pod-team-a-0").WhyVisible
	if !root.Visible || root.FleetAdminGroup == nil || *root.FleetAdminGroup != "fleet-admins" || !strings.Contains(root.Summary, "fleet admin") {
		t.Errorf("fleet admin: %+v", root)
	}

	// carol sees nothing in east: the answer is the one for a cluster that
	// does not exist, so it does not tell her east exists.
	carol := ask("carol", "east", "Pod", "team-a", "pod-team-a-0").WhyVisible
	ghost := ask("carol", "no-such-cluster", "Pod", "team-a", "pod-team-a-0").WhyVisible
	if carol.Visible || strings.ReplaceAll(carol.Summary, "east", "X") != strings.ReplaceAll(ghost.Summary, "no-such-cluster", "X") {
		t.Errorf("carol: %+v vs %+v", carol, ghost)
	}
}

func TestWhyVisibleBadInput(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct{ kind, ns, want string }{
		{"Gadget", "team-a", "not collected"},
		{"Pod", "", "namespace is required"},
		{"Namespace", "team-a", "omit namespace"},
	} {
		vars := map[string]any{"c": "east", "k": c.kind, "n": "x"}
		if c.ns != "" {
			vars["ns"] = c.ns
		}
		_, res := f.post("alice", whyQuery, vars)
		if len(res.Errors) == 0 || !strings.Contains(res.Errors[0].Message, c.want) || res.Errors[0].Extensions["code"] != "BAD_USER_INPUT" {
			b, _ := json.Marshal(res)
			t.Errorf("%s/%s: %s", c.kind, c.ns, b)
		}
	}
}
