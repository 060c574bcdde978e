package rbacdiff

import (
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
)

// Case is a policy with requests the oracle must allow (ShouldPass) and
// deny (ShouldFail).
type Case struct {
	Name       string
	Policy     *Policy
	ShouldPass []authz.Attributes
	ShouldFail []authz.Attributes
}

func split(s string) []string { return strings.Split(s, ",") }

// rule mirrors the upstream test helper: comma-separated verbs, groups,
// resources and URLs, where an empty string is one empty entry.
func rule(verbs, groups, resources, urls string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: split(verbs), APIGroups: split(groups), Resources: split(resources), NonResourceURLs: split(urls)}
}

func clusterRole(name string, rules ...rbacv1.PolicyRule) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
}

func subjectList(specs []string) []rbacv1.Subject {
	out := make([]rbacv1.Subject, len(specs))
	for i, s := range specs {
		kind, name, _ := strings.Cut(s, ":")
		out[i] = rbacv1.Subject{Kind: kind, Name: name}
		if kind != rbacv1.ServiceAccountKind {
			out[i].APIGroup = rbacv1.GroupName
		}
	}
	return out
}

func clusterRoleBinding(role string, subjects ...string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "crb-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjectList(subjects),
	}
}

func roleBindingToClusterRole(ns, role string, subjects ...string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rb-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjectList(subjects),
	}
}

// res is a resource request: user, comma-separated groups, verb, resource,
// subresource, namespace, group.
func res(name, groups, verb, resource, sub, ns, group string) authz.Attributes {
	u := &user.DefaultInfo{Name: name, Groups: split(groups)}
	return authz.Attributes{User: u, Verb: verb, Resource: resource, Subresource: sub, Namespace: ns, APIGroup: group, ResourceRequest: true}
}

func url(name string, groups []string, verb, path string) authz.Attributes {
	return authz.Attributes{User: &user.DefaultInfo{Name: name, Groups: groups}, Verb: verb, Path: path}
}

// UpstreamCases re-expresses the table of the upstream
// plugin/pkg/auth/authorizer/rbac TestAuthorizer: the same policies and
// requests, written with this package's types.
func UpstreamCases() []Case {
	return []Case{
		{
			Name: "cluster role bound in a namespace",
			Policy: &Policy{
				ClusterRoles: []*rbacv1.ClusterRole{clusterRole("admin", rule("*", "*", "*", "*"))},
				RoleBindings: []*rbacv1.RoleBinding{roleBindingToClusterRole("ns1", "admin", "User:admin", "Group:admins")},
			},
			ShouldPass: []authz.Attributes{
				res("admin", "", "get", "Pods", "", "ns1", ""),
				res("admin", "", "watch", "Pods", "", "ns1", ""),
				res("admin", "group1", "watch", "Foobar", "", "ns1", ""),
				res("joe", "admins", "watch", "Foobar", "", "ns1", ""),
				res("joe", "group1,admins", "watch", "Foobar", "", "ns1", ""),
			},
			ShouldFail: []authz.Attributes{
				res("admin", "", "GET", "Pods", "", "ns2", ""),
				res("admin", "", "GET", "Nodes", "", "", ""),
				res("admin", "admins", "GET", "Pods", "", "ns2", ""),
				res("admin", "admins", "GET", "Nodes", "", "", ""),
			},
		},
		{
			Name: "non-resource URLs",
			Policy: &Policy{
				ClusterRoles: []*rbacv1.ClusterRole{
					clusterRole("non-resource-url-getter", rule("get", "", "", "/apis")),
					clusterRole("non-resource-url", rule("*", "", "", "/apis")),
					clusterRole("non-resource-url-prefix", rule("get", "", "", "/apis/*")),
				},
				ClusterRoleBindings: []*rbacv1.ClusterRoleBinding{
					clusterRoleBinding("non-resource-url-getter", "User:foo", "Group:bar"),
					clusterRoleBinding("non-resource-url", "User:admin", "Group:admin"),
					clusterRoleBinding("non-resource-url-prefix", "User:prefixed", "Group:prefixed"),
				},
			},
			ShouldPass: []authz.Attributes{
				url("foo", nil, "get", "/apis"),
				url("", []string{"bar"}, "get", "/apis"),
				url("admin", nil, "get", "/apis"),
				url("", []string{"admin"}, "get", "/apis"),
				url("admin", nil, "watch", "/apis"),
				url("", []string{"admin"}, "watch", "/apis"),
				url("prefixed", nil, "get", "/apis/v1"),
				url("", []string{"prefixed"}, "get", "/apis/v1"),
				url("prefixed", nil, "get", "/apis/v1/foobar"),
				url("", []string{"prefixed"}, "get", "/apis/v1/foorbar"),
			},
			ShouldFail: []authz.Attributes{
				url("foo", nil, "watch", "/apis"),
				url("", []string{"bar"}, "watch", "/apis"),
				url("foo", nil, "get", "/api/v1"),
				url("", []string{"bar"}, "get", "/api/v1"),
				url("admin", nil, "get", "/api/v1"),
				url("", []string{"admin"}, "get", "/api/v1"),
				url("prefixed", nil, "get", "/api/v1"),
				url("", []string{"prefixed"}, "get", "/api/v1"),
			},
		},
		{
			Name: "subresources are not covered by their resource",
			Policy: &Policy{
				ClusterRoles: []*rbacv1.ClusterRole{clusterRole("admin", rule("*", "*", "pods", "*"))},
				RoleBindings: []*rbacv1.RoleBinding{roleBindingToClusterRole("ns1", "admin", "User:admin", "Group:admins")},
			},
			ShouldPass: []authz.Attributes{res("admin", "", "get", "pods", "", "ns1", "")},
			ShouldFail: []authz.Attributes{res("admin", "", "get", "pods", "status", "ns1", "")},
		},
		{
			Name: "subresource and */subresource rules",
			Policy: &Policy{
				ClusterRoles: []*rbacv1.ClusterRole{clusterRole("admin", rule("*", "*", "pods/status", "*"), rule("*", "*", "*/scale", "*"))},
				RoleBindings: []*rbacv1.RoleBinding{roleBindingToClusterRole("ns1", "admin", "User:admin", "Group:admins")},
			},
			ShouldPass: []authz.Attributes{
				res("admin", "", "get", "pods", "status", "ns1", ""),
				res("admin", "", "get", "pods", "scale", "ns1", ""),
				res("admin", "", "get", "deployments", "scale", "ns1", ""),
				res("admin", "", "get", "anything", "scale", "ns1", ""),
			},
			ShouldFail: []authz.Attributes{res("admin", "", "get", "pods", "", "ns1", "")},
		},
	}
}

// BootstrapCases asks the bootstrap policy the questions of the upstream
// BenchmarkAuthorize, plus a few that exercise aggregated roles. Nodes are
// authorized by the Node authorizer, not RBAC (the bootstrap system:node
// binding has no subjects), so RBAC denies the node user's requests.
func BootstrapCases() []Case {
	p := Bootstrap()
	p.ClusterRoleBindings = append(p.ClusterRoleBindings, clusterRoleBinding("view", "User:viewer"))
	p.RoleBindings = append(p.RoleBindings, roleBindingToClusterRole("ns1", "edit", "User:editor"))
	node := &user.DefaultInfo{Name: "system:node:node1", Groups: []string{"system:nodes", "system:authenticated"}}
	nodeReq := func(verb, resource, sub, name, ns string) authz.Attributes {
		return authz.Attributes{User: node, Verb: verb, Resource: resource, Subresource: sub, Name: name, Namespace: ns, ResourceRequest: true}
	}
	return []Case{{
		Name:   "bootstrap policy",
		Policy: p,
		ShouldPass: []authz.Attributes{
			res("system:kube-scheduler", "", "list", "pods", "", "", ""),
			res("system:kube-proxy", "", "list", "services", "", "", ""),
			res("viewer", "system:authenticated", "list", "deployments", "", "ns1", "apps"),
			res("editor", "system:authenticated", "create", "deployments", "", "ns1", "apps"),
			res("anyone", "system:authenticated", "create", "selfsubjectaccessreviews", "", "", "authorization.k8s.io"),
			url("anyone", []string{"system:authenticated"}, "get", "/version"),
			url("", []string{"system:unauthenticated"}, "get", "/healthz"),
		},
		ShouldFail: []authz.Attributes{
			nodeReq("list", "pods", "", "", ""),
			nodeReq("update", "pods", "status", "mypods", "myns"),
			nodeReq("educate", "dolphins", "", "", ""),
			res("viewer", "system:authenticated", "get", "secrets", "", "ns1", ""),
			res("editor", "system:authenticated", "create", "deployments", "", "ns2", "apps"),
			res("editor", "system:authenticated", "create", "rolebindings", "", "ns1", "rbac.authorization.k8s.io"),
			res("anyone", "system:authenticated", "list", "pods", "", "", ""),
		},
	}}
}
