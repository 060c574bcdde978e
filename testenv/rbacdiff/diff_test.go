package rbacdiff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

// casesDefault keeps `go test ./...` around ten seconds on a small machine;
// make test-rbac-full sets RBACDIFF_CASES=1000000.
const casesDefault = 50000

func describe(a *authz.Attributes) string {
	if !a.ResourceRequest {
		return fmt.Sprintf("user=%q groups=%q verb=%q path=%q", a.User.GetName(), a.User.GetGroups(), a.Verb, a.Path)
	}
	return fmt.Sprintf("user=%q groups=%q verb=%q group=%q resource=%q sub=%q name=%q ns=%q",
		a.User.GetName(), a.User.GetGroups(), a.Verb, a.APIGroup, a.Resource, a.Subresource, a.Name, a.Namespace)
}

func runCases(t *testing.T, cases []Case) {
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			oracle := c.Policy.Oracle()
			ours := authz.NewEvaluator(c.Policy.Store(Kinds()))
			check := func(a authz.Attributes, want bool) {
				if got := OracleAllows(ctx, oracle, &a); got != want {
					t.Errorf("bad seed: oracle says %v for %s", got, describe(&a))
				}
				d, _ := ours.Authorize(ctx, Cluster, &a)
				if d.Allowed != want {
					t.Errorf("authz says %v, Kubernetes %v: %s", d.Allowed, want, describe(&a))
				}
			}
			for _, a := range c.ShouldPass {
				check(a, true)
			}
			for _, a := range c.ShouldFail {
				check(a, false)
			}
		})
	}
}

// TestUpstreamCases runs the upstream rbac_test.go table through both.
func TestUpstreamCases(t *testing.T) { runCases(t, UpstreamCases()) }

// TestBootstrapCases runs questions over the bootstrap policy through both.
func TestBootstrapCases(t *testing.T) { runCases(t, BootstrapCases()) }

// coverage counts, among allowed requests, which feature of issue 4 point 1
// the allowing rule and binding used, so the test can require each one.
type coverage map[string]int

func (c coverage) record(ctx context.Context, e *authz.Evaluator, a *authz.Attributes) {
	e.VisitRulesFor(ctx, Cluster, a.User, a.Namespace, func(src authz.RuleSource, r *index.PolicyRule, _ error) bool {
		if r == nil || !authz.RuleAllows(a, r) {
			return true
		}
		if slices.Contains(r.Verbs, "*") {
			c["verb *"]++
		}
		if a.ResourceRequest {
			if slices.Contains(r.APIGroups, "*") {
				c["apiGroup *"]++
			}
			if slices.Contains(r.Resources, "*") {
				c["resource *"]++
			}
			if a.Subresource != "" {
				c["subresource"]++
				if slices.Contains(r.Resources, "*/"+a.Subresource) {
					c["*/subresource"]++
				}
			}
			if len(r.ResourceNames) > 0 {
				c["resourceNames"]++
			}
		} else {
			c["nonResourceURL"]++
		}
		b, s := src.Binding, src.Subject
		switch {
		case b.Namespace != "" && b.RoleRef.Kind == authz.RoleRefClusterRole:
			c["RoleBinding to ClusterRole"]++
		case b.Namespace != "":
			c["RoleBinding to Role"]++
		default:
			c["ClusterRoleBinding"]++
		}
		c["subject "+s.Kind]++
		if s.Kind == authz.SubjectServiceAccount && s.Namespace == "" {
			c["ServiceAccount namespace defaulted"]++
		}
		if s.Kind == authz.SubjectGroup && (s.Name == user.AllAuthenticated || strings.HasPrefix(s.Name, "system:serviceaccounts")) {
			c["group "+s.Name]++
		}
		if strings.HasPrefix(a.User.GetName(), authz.ServiceAccountUsernamePrefix) {
			c["serviceaccount username"]++
		}
		return false
	})
}

// TestDifferential compares authz with the Kubernetes authorizer on
// RBACDIFF_CASES random (policy, request) cases.
func TestDifferential(t *testing.T) {
	n := EnvCount(t, "RBACDIFF_CASES", casesDefault)
	const perPolicy = 10
	ctx := context.Background()
	g := NewGen(RandChooser{R: rand.New(rand.NewPCG(uint64(n), 42))}, nil, Seeds())
	cov := coverage{}
	var allowed, deniedWithErrors, disagreements int
	for done := 0; done < n; {
		p := g.Policy()
		oracle := p.Oracle()
		ours := authz.NewEvaluator(p.Store(Kinds()))
		for range perPolicy {
			a := g.Case(p)
			want := OracleAllows(ctx, oracle, &a)
			d, err := ours.Authorize(ctx, Cluster, &a)
			done++
			if d.Allowed != want {
				disagreements++
				if disagreements <= 5 {
					t.Errorf("case %d: authz says %v, Kubernetes %v: %s\npolicy:\n%s", done, d.Allowed, want, describe(&a), DumpPolicy(p))
				}
				continue
			}
			if want {
				allowed++
				cov.record(ctx, ours, &a)
			} else if err != nil {
				deniedWithErrors++
			}
		}
	}
	t.Logf("rbacdiff: cases=%d disagreements=%d allowed=%d denied_with_resolution_errors=%d", n, disagreements, allowed, deniedWithErrors)
	t.Logf("coverage of allowed cases: %v", map[string]int(cov))
	if disagreements > 0 {
		t.Fatalf("%d disagreements in %d cases", disagreements, n)
	}
	if allowed < n/10 {
		t.Errorf("only %d of %d cases allowed: the generator is too weak to test anything", allowed, n)
	}
	if n >= 5000 {
		for _, feature := range []string{
			"verb *", "apiGroup *", "resource *", "subresource", "*/subresource", "resourceNames", "nonResourceURL",
			"RoleBinding to ClusterRole", "RoleBinding to Role", "ClusterRoleBinding",
			"subject User", "subject Group", "subject ServiceAccount", "ServiceAccount namespace defaulted",
			"group system:authenticated", "group system:serviceaccounts", "group system:serviceaccounts:ns1", "serviceaccount username",
		} {
			if cov[feature] == 0 {
				t.Errorf("no allowed case exercised %q", feature)
			}
		}
		if deniedWithErrors == 0 {
			t.Error("no denied case met a missing role or bad role reference")
		}
	}
}

// TestAccessSetDifferential compares access sets with the Kubernetes
// authorizer: for random policies and identities, an object is visible in
// the access set exactly when the oracle allows get by name, list in its
// namespace, or list cluster-wide.
func TestAccessSetDifferential(t *testing.T) {
	n := EnvCount(t, "RBACDIFF_ACCESS_POLICIES", max(200, EnvCount(t, "RBACDIFF_CASES", casesDefault)/40))
	ctx := context.Background()
	g := NewGen(RandChooser{R: rand.New(rand.NewPCG(uint64(n), 7))}, nil, Seeds())
	objs := Universe([]string{"ns1", "ns2", "kube-system", "default"}, []string{"a", "b", "ns1", "default", "cm1"})
	var checked, visible, disagreements, anyNamespace int
	for i := range n {
		p := g.Policy()
		oracle := p.Oracle()
		a := authz.NewAuthorizer(p.Store(Kinds()), authz.Options{})
		for range 3 {
			id := authz.NewIdentity(g.User(p))
			ca := a.ClusterAccess(Cluster, id)
			mapped := a.MappedUser(Cluster, id)
			for _, o := range objs {
				want := OracleVisible(ctx, oracle, mapped, o)
				got := authz.Allows(ca, o.GR, o.Namespace, o.Name)
				if got && onlyNamedInAnyNamespace(ca, o) {
					anyNamespace++
				}
				checked++
				if want {
					visible++
				}
				if got != want {
					disagreements++
					if disagreements <= 5 {
						t.Errorf("policy %d: user %q groups %q: %+v: access set says %v, Kubernetes %v\npolicy:\n%s",
							i, mapped.GetName(), mapped.GetGroups(), o, got, want, DumpPolicy(p))
					}
				}
			}
		}
	}
	t.Logf("rbacdiff access sets: policies=%d objects_checked=%d visible=%d disagreements=%d visible_only_through_any_namespace_named=%d",
		n, checked, visible, disagreements, anyNamespace)
	if visible < checked/50 {
		t.Errorf("only %d of %d objects visible: too weak", visible, checked)
	}
	if n >= 1000 && anyNamespace == 0 {
		t.Error("no object was visible only through a name granted in every namespace")
	}
}

// onlyNamedInAnyNamespace reports whether a namespaced object is visible
// through nothing but a Named entry without a namespace (a
// ClusterRoleBinding to a rule with resourceNames): the part of the
// access set the other entries do not cover.
func onlyNamedInAnyNamespace(ca *index.ClusterAccess, o Object) bool {
	if ca == nil || ca.All || !o.Namespaced || ca.Everywhere.Has(o.GR) || ca.Namespaces[o.Namespace].Has(o.GR) {
		return false
	}
	if _, ok := ca.Named[index.NamedObject{GroupResource: o.GR, Namespace: o.Namespace, Name: o.Name}]; ok {
		return false
	}
	_, ok := ca.Named[index.NamedObject{GroupResource: o.GR, Name: o.Name}]
	return ok
}

// TestIdentityMatchesKubeAuthenticators checks that authz.Mapping adds
// groups exactly as kube-apiserver does: the authenticated-group adder for
// every authenticated user, and the ServiceAccount token authenticator's
// groups for ServiceAccount usernames.
func TestIdentityMatchesKubeAuthenticators(t *testing.T) {
	users := []*user.DefaultInfo{
		{Name: "alice"},
		{Name: "alice", Groups: []string{"devs"}},
		{Name: "bob", Groups: []string{"system:authenticated"}},
		{Name: "carol", Groups: []string{"system:unauthenticated"}},
		{Name: "system:anonymous", Groups: []string{"system:unauthenticated"}},
	}
	for _, u := range users {
		adder := group.NewAuthenticatedGroupAdder(authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
			return &authenticator.Response{User: u}, true, nil
		}))
		resp, _, err := adder.AuthenticateRequest(&http.Request{})
		if err != nil {
			t.Fatal(err)
		}
		got := authz.Mapping{}.Map(u)
		if got.GetName() != resp.User.GetName() || !slices.Equal(got.GetGroups(), resp.User.GetGroups()) {
			t.Errorf("%q %q: authz %q %q, kube %q %q", u.Name, u.Groups, got.GetName(), got.GetGroups(), resp.User.GetName(), resp.User.GetGroups())
		}
	}
	for _, sa := range [][2]string{{"ns1", "default"}, {"kube-system", "robot"}} {
		kube := serviceaccount.UserInfo(sa[0], sa[1], "uid")
		want := append(slices.Clone(kube.GetGroups()), user.AllAuthenticated)
		got := authz.Mapping{}.Map(&user.DefaultInfo{Name: kube.GetName()})
		if got.GetName() != kube.GetName() || !slices.Equal(got.GetGroups(), want) {
			t.Errorf("service account %v: authz %q %q, kube %q %q", sa, got.GetName(), got.GetGroups(), kube.GetName(), want)
		}
	}
}
