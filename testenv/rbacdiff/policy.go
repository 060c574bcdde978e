package rbacdiff

import (
	"context"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/kubernetes/pkg/registry/rbac/validation"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/collector/rbacrow"
	"github.com/fleetgraph/fleetgraph/index"
)

// Cluster is the cluster name every Store answers for.
const Cluster = "diff"

// Policy is one cluster's RBAC as Kubernetes objects. The same value feeds
// the oracle and, converted, authz.
type Policy struct {
	Roles               []*rbacv1.Role
	RoleBindings        []*rbacv1.RoleBinding
	ClusterRoles        []*rbacv1.ClusterRole
	ClusterRoleBindings []*rbacv1.ClusterRoleBinding
}

// Oracle returns the real Kubernetes RBAC authorizer over the policy, built
// the way upstream tests build it.
func (p *Policy) Oracle() *rbac.RBACAuthorizer {
	_, s := validation.NewTestRuleResolver(p.Roles, p.RoleBindings, p.ClusterRoles, p.ClusterRoleBindings)
	return rbac.New(s, s, s, s)
}

// OracleAllows asks the oracle about one request.
func OracleAllows(ctx context.Context, o *rbac.RBACAuthorizer, a *authz.Attributes) bool {
	d, _, _ := o.Authorize(ctx, OracleAttributes(a))
	return d == authorizer.DecisionAllow
}

// OracleAttributes converts a request to the apiserver's attributes.
func OracleAttributes(a *authz.Attributes) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{
		User:            a.User,
		Verb:            a.Verb,
		Namespace:       a.Namespace,
		APIGroup:        a.APIGroup,
		Resource:        a.Resource,
		Subresource:     a.Subresource,
		Name:            a.Name,
		ResourceRequest: a.ResourceRequest,
		Path:            a.Path,
	}
}

// Store is the policy converted to index rows, served through the getters
// authz reads. It never changes, so its revision is constant.
type Store struct {
	roles        map[[2]string]*index.Role
	clusterRoles map[string]*index.Role
	roleBindings []*index.Binding
	crbs         []*index.Binding
	kinds        []index.Kind
}

// Store converts the policy for authz, with the given discovery kinds.
func (p *Policy) Store(kinds []index.Kind) *Store {
	s := &Store{roles: map[[2]string]*index.Role{}, clusterRoles: map[string]*index.Role{}, kinds: kinds}
	for _, r := range p.Roles {
		// Later duplicates win in neither implementation: the oracle
		// returns the first match, so keep the first.
		if _, dup := s.roles[[2]string{r.Namespace, r.Name}]; !dup {
			s.roles[[2]string{r.Namespace, r.Name}] = &index.Role{Cluster: Cluster, Namespace: r.Namespace, Name: r.Name, Rules: rbacrow.Rules(r.Rules)}
		}
	}
	for _, r := range p.ClusterRoles {
		if _, dup := s.clusterRoles[r.Name]; !dup {
			s.clusterRoles[r.Name] = &index.Role{Cluster: Cluster, Name: r.Name, Rules: rbacrow.Rules(r.Rules)}
		}
	}
	for _, b := range p.RoleBindings {
		s.roleBindings = append(s.roleBindings, &index.Binding{Cluster: Cluster, Namespace: b.Namespace, Name: b.Name, RoleRef: rbacrow.RoleRef(b.RoleRef), Subjects: rbacrow.Subjects(b.Subjects)})
	}
	for _, b := range p.ClusterRoleBindings {
		s.crbs = append(s.crbs, &index.Binding{Cluster: Cluster, Name: b.Name, RoleRef: rbacrow.RoleRef(b.RoleRef), Subjects: rbacrow.Subjects(b.Subjects)})
	}
	return s
}

// GetRole implements authz.RoleGetter.
func (s *Store) GetRole(_, namespace, name string) (*index.Role, bool) {
	r, ok := s.roles[[2]string{namespace, name}]
	return r, ok
}

// GetClusterRole implements authz.ClusterRoleGetter.
func (s *Store) GetClusterRole(_, name string) (*index.Role, bool) {
	r, ok := s.clusterRoles[name]
	return r, ok
}

// ListRoleBindings implements authz.RoleBindingLister.
func (s *Store) ListRoleBindings(_, namespace string) []*index.Binding {
	if namespace == "" {
		return s.roleBindings
	}
	var out []*index.Binding
	for _, b := range s.roleBindings {
		if b.Namespace == namespace {
			out = append(out, b)
		}
	}
	return out
}

// ListClusterRoleBindings implements authz.ClusterRoleBindingLister.
func (s *Store) ListClusterRoleBindings(string) []*index.Binding { return s.crbs }

// WatchPolicies implements authz.PolicyWatcher: the Store holds one
// cluster and never changes, so the channel is nil.
func (s *Store) WatchPolicies() index.PolicyRevisions {
	return index.PolicyRevisions{Clusters: map[string]uint64{Cluster: 1}}
}

// Kinds implements authz.KindLister.
func (s *Store) Kinds(string) []index.Kind { return s.kinds }

// Bootstrap returns the bootstrap ClusterRoles and ClusterRoleBindings of
// kube-apiserver (including the controller roles), the bootstrap Roles and
// RoleBindings of kube-system and kube-public, with aggregated ClusterRoles
// (admin, edit, view, ...) filled in as the aggregation controller would:
// the union of the rules of every ClusterRole their selectors match.
func Bootstrap() *Policy {
	p := &Policy{}
	for _, r := range append(bootstrappolicy.ClusterRoles(), bootstrappolicy.ControllerRoles()...) {
		p.ClusterRoles = append(p.ClusterRoles, r.DeepCopy())
	}
	for _, b := range append(bootstrappolicy.ClusterRoleBindings(), bootstrappolicy.ControllerRoleBindings()...) {
		p.ClusterRoleBindings = append(p.ClusterRoleBindings, b.DeepCopy())
	}
	for _, roles := range bootstrappolicy.NamespaceRoles() {
		for _, r := range roles {
			p.Roles = append(p.Roles, r.DeepCopy())
		}
	}
	for _, bindings := range bootstrappolicy.NamespaceRoleBindings() {
		for _, b := range bindings {
			p.RoleBindings = append(p.RoleBindings, b.DeepCopy())
		}
	}
	slices.SortFunc(p.Roles, func(a, b *rbacv1.Role) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	slices.SortFunc(p.RoleBindings, func(a, b *rbacv1.RoleBinding) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	Aggregate(p.ClusterRoles)
	return p
}

// Aggregate fills the rules of every ClusterRole with an aggregation rule
// from the ClusterRoles its selectors match, as the clusterrole-aggregation
// controller does; both sides then evaluate the stored rules only.
func Aggregate(roles []*rbacv1.ClusterRole) {
	for _, agg := range roles {
		if agg.AggregationRule == nil {
			continue
		}
		var rules []rbacv1.PolicyRule
		for _, sel := range agg.AggregationRule.ClusterRoleSelectors {
			selector, err := metav1.LabelSelectorAsSelector(&sel)
			if err != nil {
				continue
			}
			for _, r := range roles {
				if r.Name == agg.Name || !selector.Matches(labels.Set(r.Labels)) {
					continue
				}
				for _, rule := range r.Rules {
					if !slices.ContainsFunc(rules, func(x rbacv1.PolicyRule) bool { return ruleEqual(x, rule) }) {
						rules = append(rules, rule)
					}
				}
			}
		}
		agg.Rules = rules
	}
}

func ruleEqual(a, b rbacv1.PolicyRule) bool {
	return slices.Equal(a.Verbs, b.Verbs) && slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
		slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.NonResourceURLs, b.NonResourceURLs)
}

// Kinds is the discovery result both sides use: core, apps, Flux and a
// metrics group that reuses the "pods" plural, namespaced and
// cluster-scoped.
func Kinds() []index.Kind {
	return []index.Kind{
		{Group: "", Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Service", Resource: "services", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Secret", Resource: "secrets", Namespaced: true},
		{Group: "", Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Namespace", Resource: "namespaces"},
		{Group: "", Version: "v1", Kind: "Node", Resource: "nodes"},
		{Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments", Namespaced: true},
		{Group: "metrics.k8s.io", Version: "v1beta1", Kind: "PodMetrics", Resource: "pods", Namespaced: true},
		{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole", Resource: "clusterroles"},
	}
}

// Object is one object whose visibility both sides must agree on.
type Object struct {
	GR         index.GroupResource
	Namespaced bool
	Namespace  string
	Name       string
}

// OracleVisible decides the visibility rule of docs/design.md with the oracle,
// spelled out independently of authz.VisibilityAttributes: get by name
// with the object's namespace (a Namespace's own name for namespaces),
// list in the object's namespace, list cluster-wide.
func OracleVisible(ctx context.Context, o *rbac.RBACAuthorizer, u user.Info, obj Object) bool {
	rec := func(verb, ns, name string) authorizer.AttributesRecord {
		return authorizer.AttributesRecord{User: u, Verb: verb, Namespace: ns, APIGroup: obj.GR.Group, Resource: obj.GR.Resource, Name: name, ResourceRequest: true}
	}
	var reqs []authorizer.AttributesRecord
	switch {
	case obj.Namespaced:
		reqs = []authorizer.AttributesRecord{rec("get", obj.Namespace, obj.Name), rec("list", obj.Namespace, ""), rec("list", "", "")}
	case obj.GR.Group == "" && obj.GR.Resource == "namespaces":
		reqs = []authorizer.AttributesRecord{rec("get", obj.Name, obj.Name), rec("list", "", "")}
	default:
		reqs = []authorizer.AttributesRecord{rec("get", "", obj.Name), rec("list", "", "")}
	}
	for _, r := range reqs {
		if d, _, _ := o.Authorize(ctx, r); d == authorizer.DecisionAllow {
			return true
		}
	}
	return false
}

// Universe returns every object of Kinds in the namespaces with the names,
// plus a Namespace object per namespace. RBAC objects are not in it:
// fleetgraph never lists them (index.IsPolicyKind), so no grant on them
// shows anything.
func Universe(namespaces, names []string) []Object {
	var out []Object
	seen := map[index.GroupResource]bool{}
	for _, k := range Kinds() {
		gr := index.GroupResource{Group: k.Group, Resource: k.Resource}
		if seen[gr] || index.IsPolicyKind(k.Group, k.Kind) {
			continue
		}
		seen[gr] = true
		switch {
		case k.Namespaced:
			for _, ns := range namespaces {
				for _, n := range names {
					out = append(out, Object{GR: gr, Namespaced: true, Namespace: ns, Name: n})
				}
			}
		case gr.Group == "" && gr.Resource == "namespaces":
			for _, ns := range namespaces {
				out = append(out, Object{GR: gr, Name: ns})
			}
		default:
			for _, n := range names {
				out = append(out, Object{GR: gr, Name: n})
			}
		}
	}
	return out
}
