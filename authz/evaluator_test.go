package authz

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

const testCluster = "c1"

// req builds a resource request the way the upstream rbac_test.go
// defaultAttributes does: user, comma-separated groups, verb, resource,
// subresource, namespace, API group.
func req(name, groups, verb, resource, sub, ns, group string) Attributes {
	return Attributes{
		User: &user.DefaultInfo{Name: name, Groups: list(groups)}, Verb: verb, Resource: resource,
		Subresource: sub, Namespace: ns, APIGroup: group, ResourceRequest: true,
	}
}

func named(a Attributes, name string) Attributes {
	a.Name = name
	return a
}

func nonResource(name, groups, verb, path string) Attributes {
	return Attributes{User: &user.DefaultInfo{Name: name, Groups: list(groups)}, Verb: verb, Path: path}
}

func describe(a Attributes) string {
	return fmt.Sprintf("user=%q groups=%q verb=%q %s/%s/%s name=%q ns=%q path=%q",
		a.User.GetName(), a.User.GetGroups(), a.Verb, a.APIGroup, a.Resource, a.Subresource, a.Name, a.Namespace, a.Path)
}

type policy struct {
	roles    []*index.Role // Namespace "" means ClusterRole
	bindings []*index.Binding
}

func (p policy) store() *fakeStore {
	f := newFakeStore()
	for _, r := range p.roles {
		f.addRole(testCluster, r)
	}
	for _, b := range p.bindings {
		f.addBinding(testCluster, b)
	}
	f.setKinds(testCluster, testKinds())
	return f
}

func clusterRole(name string, rules ...index.PolicyRule) *index.Role {
	return &index.Role{Name: name, Rules: rules}
}

func nsRole(ns, name string, rules ...index.PolicyRule) *index.Role {
	return &index.Role{Namespace: ns, Name: name, Rules: rules}
}

// TestAuthorize re-expresses the cases of the upstream
// plugin/pkg/auth/authorizer/rbac TestAuthorizer, then adds one table per
// item of issue 4 point 1.
func TestAuthorize(t *testing.T) {
	tests := []struct {
		name       string
		policy     policy
		shouldPass []Attributes
		shouldFail []Attributes
	}{
		{
			name: "upstream: cluster role bound in one namespace",
			policy: policy{
				roles:    []*index.Role{clusterRole("admin", rule("*", "*", "*"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "admin", "User:admin", "Group:admins")},
			},
			shouldPass: []Attributes{
				req("admin", "", "get", "Pods", "", "ns1", ""),
				req("admin", "", "watch", "Pods", "", "ns1", ""),
				req("admin", "group1", "watch", "Foobar", "", "ns1", ""),
				req("joe", "admins", "watch", "Foobar", "", "ns1", ""),
				req("joe", "group1,admins", "watch", "Foobar", "", "ns1", ""),
			},
			shouldFail: []Attributes{
				req("admin", "", "GET", "Pods", "", "ns2", ""),
				req("admin", "", "GET", "Nodes", "", "", ""),
				req("admin", "admins", "GET", "Pods", "", "ns2", ""),
				req("admin", "admins", "GET", "Nodes", "", "", ""),
			},
		},
		{
			name: "upstream: non-resource URLs",
			policy: policy{
				roles: []*index.Role{
					clusterRole("getter", urlRule("get", "/apis")),
					clusterRole("all-verbs", urlRule("*", "/apis")),
					clusterRole("prefix", urlRule("get", "/apis/*")),
				},
				bindings: []*index.Binding{
					clusterRoleBinding("b1", "getter", "User:foo", "Group:bar"),
					clusterRoleBinding("b2", "all-verbs", "User:admin", "Group:admin"),
					clusterRoleBinding("b3", "prefix", "User:prefixed", "Group:prefixed"),
				},
			},
			shouldPass: []Attributes{
				nonResource("foo", "", "get", "/apis"),
				nonResource("", "bar", "get", "/apis"),
				nonResource("admin", "", "get", "/apis"),
				nonResource("", "admin", "get", "/apis"),
				nonResource("admin", "", "watch", "/apis"),
				nonResource("", "admin", "watch", "/apis"),
				nonResource("prefixed", "", "get", "/apis/v1"),
				nonResource("", "prefixed", "get", "/apis/v1"),
				nonResource("prefixed", "", "get", "/apis/v1/foobar"),
				nonResource("", "prefixed", "get", "/apis/v1/foorbar"),
			},
			shouldFail: []Attributes{
				nonResource("foo", "", "watch", "/apis"),
				nonResource("", "bar", "watch", "/apis"),
				nonResource("foo", "", "get", "/api/v1"),
				nonResource("", "bar", "get", "/api/v1"),
				nonResource("admin", "", "get", "/api/v1"),
				nonResource("", "admin", "get", "/api/v1"),
				nonResource("prefixed", "", "get", "/api/v1"),
				nonResource("", "prefixed", "get", "/api/v1"),
			},
		},
		{
			name: "upstream: a resource rule does not cover its subresources",
			policy: policy{
				roles:    []*index.Role{clusterRole("admin", rule("*", "*", "pods"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "admin", "User:admin", "Group:admins")},
			},
			shouldPass: []Attributes{req("admin", "", "get", "pods", "", "ns1", "")},
			shouldFail: []Attributes{req("admin", "", "get", "pods", "status", "ns1", "")},
		},
		{
			name: "upstream: subresource and */subresource rules",
			policy: policy{
				roles:    []*index.Role{clusterRole("admin", rule("*", "*", "pods/status"), rule("*", "*", "*/scale"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "admin", "User:admin", "Group:admins")},
			},
			shouldPass: []Attributes{
				req("admin", "", "get", "pods", "status", "ns1", ""),
				req("admin", "", "get", "pods", "scale", "ns1", ""),
				req("admin", "", "get", "deployments", "scale", "ns1", ""),
				req("admin", "", "get", "anything", "scale", "ns1", ""),
			},
			shouldFail: []Attributes{
				req("admin", "", "get", "pods", "", "ns1", ""),
				req("admin", "", "get", "deployments", "", "ns1", ""),
				req("admin", "", "get", "pods", "log", "ns1", ""),
			},
		},
		{
			name: "wildcards in verbs, groups and resources",
			policy: policy{
				roles: []*index.Role{
					clusterRole("verbs", rule("*", "-", "pods")),
					clusterRole("groups", rule("get", "*", "deployments")),
					clusterRole("resources", rule("list", "apps", "*")),
				},
				bindings: []*index.Binding{
					clusterRoleBinding("b1", "verbs", "User:v"),
					clusterRoleBinding("b2", "groups", "User:g"),
					clusterRoleBinding("b3", "resources", "User:r"),
				},
			},
			shouldPass: []Attributes{
				req("v", "", "delete", "pods", "", "ns1", ""),
				req("v", "", "escalate", "pods", "", "", ""),
				req("g", "", "get", "deployments", "", "ns1", "apps"),
				req("g", "", "get", "deployments", "", "ns1", "extensions"),
				req("r", "", "list", "deployments", "", "", "apps"),
				req("r", "", "list", "replicasets", "scale", "ns1", "apps"),
			},
			shouldFail: []Attributes{
				req("v", "", "delete", "pods", "", "ns1", "apps"),
				req("v", "", "delete", "services", "", "ns1", ""),
				req("g", "", "list", "deployments", "", "ns1", "apps"),
				req("r", "", "list", "deployments", "", "", ""),
				req("r", "", "get", "deployments", "", "", "apps"),
			},
		},
		{
			name: "resourceNames restrict by name and never match a nameless request",
			policy: policy{
				roles:    []*index.Role{clusterRole("one", rule("get,list,watch", "-", "configmaps", "cm1", "cm2"))},
				bindings: []*index.Binding{roleBinding("ns1", "b", RoleRefClusterRole, "one", "User:alice")},
			},
			shouldPass: []Attributes{
				named(req("alice", "", "get", "configmaps", "", "ns1", ""), "cm1"),
				named(req("alice", "", "watch", "configmaps", "", "ns1", ""), "cm2"),
				named(req("alice", "", "list", "configmaps", "", "ns1", ""), "cm2"),
			},
			shouldFail: []Attributes{
				req("alice", "", "list", "configmaps", "", "ns1", ""),
				req("alice", "", "get", "configmaps", "", "ns1", ""),
				named(req("alice", "", "get", "configmaps", "", "ns1", ""), "cm3"),
				named(req("alice", "", "get", "configmaps", "", "ns2", ""), "cm1"),
				named(req("alice", "", "get", "configmaps", "status", "ns1", ""), "cm1"),
			},
		},
		{
			name: "RoleBinding to a ClusterRole applies in its namespace only; to a Role, the Role of its namespace",
			policy: policy{
				roles: []*index.Role{
					clusterRole("view", rule("get,list", "-", "pods")),
					nsRole("ns1", "edit", rule("update", "-", "pods")),
					nsRole("ns2", "edit", rule("delete", "-", "pods")),
				},
				bindings: []*index.Binding{
					roleBinding("ns1", "b1", RoleRefClusterRole, "view", "User:alice"),
					roleBinding("ns1", "b2", RoleRefRole, "edit", "User:alice"),
				},
			},
			shouldPass: []Attributes{
				req("alice", "", "list", "pods", "", "ns1", ""),
				req("alice", "", "update", "pods", "", "ns1", ""),
			},
			shouldFail: []Attributes{
				req("alice", "", "list", "pods", "", "ns2", ""),
				req("alice", "", "list", "pods", "", "", ""),
				req("alice", "", "delete", "pods", "", "ns1", ""),
				req("alice", "", "update", "pods", "", "ns2", ""),
			},
		},
		{
			name: "ServiceAccount subjects, namespace defaulting inside a RoleBinding",
			policy: policy{
				roles: []*index.Role{clusterRole("view", rule("list", "-", "pods"))},
				bindings: []*index.Binding{
					roleBinding("ns1", "local", RoleRefClusterRole, "view", "ServiceAccount:robot"),
					roleBinding("ns2", "remote", RoleRefClusterRole, "view", "ServiceAccount:ns9/robot"),
					clusterRoleBinding("no-ns", "view", "ServiceAccount:robot"),
				},
			},
			shouldPass: []Attributes{
				req("system:serviceaccount:ns1:robot", "", "list", "pods", "", "ns1", ""),
				req("system:serviceaccount:ns9:robot", "", "list", "pods", "", "ns2", ""),
			},
			shouldFail: []Attributes{
				req("system:serviceaccount:ns2:robot", "", "list", "pods", "", "ns2", ""),
				req("system:serviceaccount:ns1:robot", "", "list", "pods", "", "ns2", ""),
				req("system:serviceaccount:ns1:robot", "", "list", "pods", "", "", ""),
				req("system:serviceaccount::robot", "", "list", "pods", "", "", ""),
				req("robot", "", "list", "pods", "", "ns1", ""),
				req("system:serviceaccount:ns1:robot2", "", "list", "pods", "", "ns1", ""),
			},
		},
		{
			name: "User and Group subjects, and the groups authenticators add",
			policy: policy{
				roles: []*index.Role{clusterRole("view", rule("list", "-", "pods"))},
				bindings: []*index.Binding{
					clusterRoleBinding("authn", "view", "Group:system:authenticated"),
					roleBinding("ns1", "sas", RoleRefClusterRole, "view", "Group:system:serviceaccounts:ns1"),
					roleBinding("ns2", "user", RoleRefClusterRole, "view", "User:bob"),
				},
			},
			shouldPass: []Attributes{
				req("anyone", "system:authenticated", "list", "pods", "", "", ""),
				req("system:serviceaccount:ns1:x", "system:serviceaccounts,system:serviceaccounts:ns1", "list", "pods", "", "ns1", ""),
				req("bob", "", "list", "pods", "", "ns2", ""),
			},
			shouldFail: []Attributes{
				req("anyone", "", "list", "pods", "", "", ""),
				req("system:anonymous", "system:unauthenticated", "list", "pods", "", "", ""),
				req("system:serviceaccount:ns1:x", "", "list", "pods", "", "ns1", ""),
				req("bobby", "", "list", "pods", "", "ns2", ""),
				req("alice", "bob", "list", "pods", "", "ns2", ""),
			},
		},
		{
			name: "aggregated ClusterRoles are evaluated through their stored rules",
			policy: policy{
				roles: []*index.Role{
					// The aggregation controller copied the rules of the
					// labeled roles into .rules; only those count.
					clusterRole("aggregate", rule("get,list", "-", "pods"), rule("get", "apps", "deployments")),
					clusterRole("not-aggregated-yet", rule("list", "-", "secrets")),
				},
				bindings: []*index.Binding{clusterRoleBinding("b", "aggregate", "User:alice")},
			},
			shouldPass: []Attributes{
				req("alice", "", "list", "pods", "", "ns1", ""),
				req("alice", "", "get", "deployments", "", "ns1", "apps"),
			},
			shouldFail: []Attributes{req("alice", "", "list", "secrets", "", "ns1", "")},
		},
		{
			name: "missing roles and bad role references deny",
			policy: policy{
				roles: []*index.Role{nsRole("ns1", "r", rule("*", "*", "*"))},
				bindings: []*index.Binding{
					roleBinding("ns1", "b1", RoleRefClusterRole, "gone", "User:alice"),
					roleBinding("ns2", "b2", RoleRefRole, "r", "User:alice"),
					clusterRoleBinding("b3", "gone", "User:alice"),
					roleBinding("", "b4", RoleRefRole, "r", "User:alice"),
					roleBinding("ns1", "b5", "Unknown", "r", "User:alice"),
				},
			},
			shouldFail: []Attributes{
				req("alice", "", "get", "pods", "", "ns1", ""),
				req("alice", "", "get", "pods", "", "ns2", ""),
				req("alice", "", "get", "pods", "", "", ""),
			},
		},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEvaluator(tt.policy.store())
			for _, a := range tt.shouldPass {
				if d, err := e.Authorize(ctx, testCluster, &a); !d.Allowed {
					t.Errorf("incorrectly restricted %s (err %v)", describe(a), err)
				}
			}
			for _, a := range tt.shouldFail {
				if d, _ := e.Authorize(ctx, testCluster, &a); d.Allowed {
					t.Errorf("incorrectly passed %s: %s", describe(a), d.Reason)
				}
			}
		})
	}
}

func TestAuthorizeReportsResolutionErrors(t *testing.T) {
	p := policy{
		roles: []*index.Role{clusterRole("view", rule("list", "-", "pods"))},
		bindings: []*index.Binding{
			roleBinding("ns1", "b1", RoleRefClusterRole, "gone", "User:alice"),
			clusterRoleBinding("b2", "view", "User:alice"),
			clusterRoleBinding("b3", "view", "User:bob"),
			roleBinding("ns1", "b4", "Bogus", "x", "User:carol"),
		},
	}
	e := NewEvaluator(p.store())
	ctx := context.Background()

	a := req("alice", "", "delete", "pods", "", "ns1", "")
	d, err := e.Authorize(ctx, testCluster, &a)
	if d.Allowed || !errors.Is(err, ErrRoleNotFound) {
		t.Fatalf("got %+v, %v; want deny with ErrRoleNotFound", d, err)
	}
	a = req("alice", "", "list", "pods", "", "ns1", "")
	d, err = e.Authorize(ctx, testCluster, &a)
	if !d.Allowed || err != nil {
		t.Fatalf("a missing role must not hide other grants: got %+v, %v", d, err)
	}
	if want := `RBAC: allowed by ClusterRoleBinding "b2" of ClusterRole "view" to User "alice"`; d.Reason != want {
		t.Errorf("reason %q, want %q", d.Reason, want)
	}
	a = req("carol", "", "list", "pods", "", "ns1", "")
	if _, err = e.Authorize(ctx, testCluster, &a); !errors.Is(err, ErrUnsupportedRoleRef) {
		t.Errorf("got %v, want ErrUnsupportedRoleRef", err)
	}
}

func TestVisitRulesForStopsEarly(t *testing.T) {
	p := policy{
		roles: []*index.Role{clusterRole("many", rule("get", "-", "a"), rule("get", "-", "b"), rule("get", "-", "c"))},
		bindings: []*index.Binding{
			clusterRoleBinding("b1", "many", "User:alice"),
			roleBinding("ns1", "b2", RoleRefClusterRole, "many", "User:alice"),
		},
	}
	e := NewEvaluator(p.store())
	u := &user.DefaultInfo{Name: "alice"}
	var all, some int
	e.VisitRulesFor(context.Background(), testCluster, u, "ns1", func(RuleSource, *index.PolicyRule, error) bool { all++; return true })
	e.VisitRulesFor(context.Background(), testCluster, u, "ns1", func(RuleSource, *index.PolicyRule, error) bool { some++; return some < 2 })
	if all != 6 || some != 2 {
		t.Errorf("visited %d rules (want 6) and %d when stopping at 2", all, some)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var errs []error
	e.VisitRulesFor(ctx, testCluster, u, "ns1", func(_ RuleSource, r *index.PolicyRule, err error) bool {
		if r != nil {
			t.Error("visited a rule after cancel")
		}
		errs = append(errs, err)
		return true
	})
	if len(errs) != 1 || !errors.Is(errs[0], context.Canceled) {
		t.Errorf("got %v, want one context.Canceled", errs)
	}
}

// TestRuleAllows re-expresses the upstream TestRuleMatches table.
func TestRuleAllows(t *testing.T) {
	res := func(verb, group, resource, sub string) Attributes {
		return Attributes{Verb: verb, APIGroup: group, Resource: resource, Subresource: sub, ResourceRequest: true}
	}
	url := func(verb, path string) Attributes { return Attributes{Verb: verb, Path: path} }
	tests := []struct {
		name       string
		rule       index.PolicyRule
		shouldPass []Attributes
		shouldFail []Attributes
	}{
		{
			name:       "star verb, exact match other",
			rule:       rule("*", "group1", "resource1"),
			shouldPass: []Attributes{res("verb1", "group1", "resource1", ""), res("verb2", "group1", "resource1", "")},
			shouldFail: []Attributes{
				res("verb1", "group2", "resource1", ""), res("verb1", "group1", "resource2", ""), res("verb1", "group2", "resource2", ""),
				res("verb2", "group2", "resource1", ""), res("verb2", "group1", "resource2", ""), res("verb2", "group2", "resource2", ""),
			},
		},
		{
			name:       "star group, exact match other",
			rule:       rule("verb1", "*", "resource1"),
			shouldPass: []Attributes{res("verb1", "group1", "resource1", ""), res("verb1", "group2", "resource1", "")},
			shouldFail: []Attributes{
				res("verb1", "group1", "resource2", ""), res("verb1", "group2", "resource2", ""),
				res("verb2", "group1", "resource1", ""), res("verb2", "group2", "resource1", ""),
				res("verb2", "group1", "resource2", ""), res("verb2", "group2", "resource2", ""),
			},
		},
		{
			name:       "star resource, exact match other",
			rule:       rule("verb1", "group1", "*"),
			shouldPass: []Attributes{res("verb1", "group1", "resource1", ""), res("verb1", "group1", "resource2", "")},
			shouldFail: []Attributes{
				res("verb1", "group2", "resource1", ""), res("verb1", "group2", "resource2", ""),
				res("verb2", "group1", "resource1", ""), res("verb2", "group2", "resource1", ""),
				res("verb2", "group1", "resource2", ""), res("verb2", "group2", "resource2", ""),
			},
		},
		{
			name: "tuple expansion",
			rule: rule("verb1,verb2", "group1,group2", "resource1,resource2"),
			shouldPass: []Attributes{
				res("verb1", "group1", "resource1", ""), res("verb1", "group2", "resource1", ""),
				res("verb1", "group1", "resource2", ""), res("verb1", "group2", "resource2", ""),
				res("verb2", "group1", "resource1", ""), res("verb2", "group2", "resource1", ""),
				res("verb2", "group1", "resource2", ""), res("verb2", "group2", "resource2", ""),
			},
		},
		{
			name:       "subresource expansion",
			rule:       rule("*", "*", "resource1/subresource1"),
			shouldPass: []Attributes{res("verb1", "group1", "resource1", "subresource1"), res("verb2", "group1", "resource1", "subresource1")},
			shouldFail: []Attributes{
				res("verb1", "group2", "resource1", "subresource2"), res("verb1", "group1", "resource2", "subresource1"),
				res("verb1", "group2", "resource2", "subresource1"), res("verb2", "group2", "resource1", "subresource2"),
				res("verb2", "group1", "resource2", "subresource1"), res("verb2", "group2", "resource2", "subresource1"),
				res("verb1", "group1", "resource1", ""),
			},
		},
		{
			name: "star nonresource, exact match other",
			rule: urlRule("verb1", "*"),
			shouldPass: []Attributes{
				url("verb1", "/foo"), url("verb1", "/foo/bar"), url("verb1", "/foo/baz"), url("verb1", "/foo/bar/one"), url("verb1", "/foo/baz/one"),
			},
			shouldFail: []Attributes{
				url("verb2", "/foo"), url("verb2", "/foo/bar"), url("verb2", "/foo/baz"), url("verb2", "/foo/bar/one"), url("verb2", "/foo/baz/one"),
			},
		},
		{
			name:       "star nonresource subpath",
			rule:       urlRule("verb1", "/foo/*"),
			shouldPass: []Attributes{url("verb1", "/foo/bar"), url("verb1", "/foo/baz"), url("verb1", "/foo/bar/one"), url("verb1", "/foo/baz/one")},
			shouldFail: []Attributes{
				url("verb1", "/foo"), url("verb1", "/notfoo"), url("verb1", "/notfoo/bar"), url("verb1", "/notfoo/baz"),
				url("verb1", "/notfoo/bar/one"), url("verb1", "/notfoo/baz/one"),
			},
		},
		{
			name: "star verb, exact nonresource",
			rule: urlRule("*", "/foo,/foo/bar/one"),
			shouldPass: []Attributes{
				url("verb1", "/foo"), url("verb1", "/foo/bar/one"), url("verb2", "/foo"), url("verb2", "/foo/bar/one"),
			},
			shouldFail: []Attributes{
				url("verb1", "/foo/bar"), url("verb1", "/foo/baz"), url("verb1", "/foo/baz/one"),
				url("verb2", "/foo/bar"), url("verb2", "/foo/baz"), url("verb2", "/foo/baz/one"),
			},
		},
		{
			name:       "a resource rule never allows a non-resource request, and the reverse",
			rule:       index.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}},
			shouldPass: []Attributes{res("get", "", "pods", "")},
			shouldFail: []Attributes{url("get", "/healthz")},
		},
		{
			name:       "*/subresource needs a subresource of exactly that name",
			rule:       rule("get", "*", "*/scale"),
			shouldPass: []Attributes{res("get", "apps", "deployments", "scale")},
			shouldFail: []Attributes{res("get", "apps", "deployments", ""), res("get", "apps", "deployments", "xscale"), res("get", "apps", "deployments", "scal")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, a := range tt.shouldPass {
				if !RuleAllows(&a, &tt.rule) {
					t.Errorf("incorrectly restricted %s", describe2(a))
				}
			}
			for _, a := range tt.shouldFail {
				if RuleAllows(&a, &tt.rule) {
					t.Errorf("incorrectly passed %s", describe2(a))
				}
			}
		})
	}
}

func describe2(a Attributes) string {
	return fmt.Sprintf("verb=%q %s/%s/%s path=%q", a.Verb, a.APIGroup, a.Resource, a.Subresource, a.Path)
}
