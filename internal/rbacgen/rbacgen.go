// Package rbacgen generates the least-privilege RBAC fleetgraph needs, from
// the kind registry, the cluster sources and the flags that change what it
// reads: `fleetgraph rbac` prints it, and the Helm chart is built from the
// same rules (a test fails when the two drift).
//
// Two kinds of cluster get RBAC of their own:
//
//   - a leaf (collected in pull mode, or running an edge agent): get, list
//     and watch on every collected kind and on the RBAC objects, impersonate
//     on users and groups when live object details are on, and, when the
//     Istio control-plane namespace is given, the istiod Deployments and
//     mesh ConfigMaps there that show the Istio version;
//   - the management cluster the sources read: list and watch on each
//     source's objects, and on the Secrets it reads (get too where it reads
//     a Secret's data on demand), in one namespace when the source is
//     limited to one.
//
// It does not apply anything, and it grants nothing to read Secrets of a
// leaf.
package rbacgen

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection/sources"
	"github.com/fleetgraph/fleetgraph/replication"
)

// Targets: which cluster the RBAC is for.
const (
	// TargetLeaf is a cluster fleetgraph collects, or an edge agent's own.
	TargetLeaf = "leaf"
	// TargetManager is the management cluster the sources read.
	TargetManager = "manager"
)

// Defaults of Options.
const (
	DefaultName = "fleetgraph"
	// IstioSystem is where istiod usually runs.
	IstioSystem = "istio-system"
)

// Options says what to generate.
type Options struct {
	// Targets are TargetLeaf and/or TargetManager.
	Targets []string
	// Name prefixes the roles and bindings ("<name>-collector"); the
	// ServiceAccount Namespace/ServiceAccount is their subject.
	Name, ServiceAccount, Namespace string
	// Registry is the kinds collected (leaf).
	Registry *collector.Registry
	// Details grants impersonation for live object details (leaf).
	Details bool
	// IstioNamespace is where istiod runs (leaf); empty grants nothing
	// there and Istio versions are not shown.
	IstioNamespace string
	// Sources are the sources the manager runs, with their options
	// (manager).
	Sources       []string
	SourceOptions sources.Options
	// LeaseNamespace is where collectors keep their Leases (manager,
	// serve --lease-namespace); empty grants nothing there.
	LeaseNamespace string
}

// Verbs of the rules.
var (
	readVerbs        = []string{"get", "list", "watch"}
	impersonateVerbs = []string{"impersonate"}
)

// KindRules returns one rule per collected kind, in the registry's order:
// get, list and watch on its resource. The resource is the kind's plural
// (Resource); discovery gives the real one at run time, and a kind whose
// plural breaks the rules shows a Forbidden error on each cluster.
func KindRules(reg *collector.Registry) []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 0, len(reg.Adapters()))
	for _, a := range reg.Adapters() {
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{a.Group}, Resources: []string{Resource(a.Kind)}, Verbs: readVerbs})
	}
	return out
}

// Resource is the plural resource of a kind, by the English rules
// Kubernetes API authors follow: "Gateway" is "gateways",
// "ServiceEntry" "serviceentries", "Ingress" "ingresses", "Endpoints"
// stays. (apimachinery's UnsafeGuessKindToResource would say "gatewaies".)
// The chart's templates/rbac.yaml applies the same rules to extra kinds.
func Resource(kind string) string {
	k := strings.ToLower(kind)
	n := len(k)
	switch {
	case k == "" || strings.HasSuffix(k, "endpoints"):
		return k
	case strings.HasSuffix(k, "s") || strings.HasSuffix(k, "x") || strings.HasSuffix(k, "z") ||
		strings.HasSuffix(k, "ch") || strings.HasSuffix(k, "sh"):
		return k + "es"
	case strings.HasSuffix(k, "y") && n > 1 && !strings.ContainsRune("aeiou", rune(k[n-2])):
		return k[:n-1] + "ies"
	}
	return k + "s"
}

// ImpersonateRule lets fleetgraph send a viewer's user name and groups to a
// leaf for live object details, so the leaf applies its own RBAC.
func ImpersonateRule() rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"users", "groups"}, Verbs: impersonateVerbs}
}

// IstioRules are what Istio control-plane detection reads in istiod's
// namespace: its Deployments (revision and version) and the mesh
// ConfigMaps (trust domain).
func IstioRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}},
	}
}

// Objects returns the roles and bindings, in a stable order: ClusterRoles
// with their ClusterRoleBindings, then Roles with their RoleBindings by
// namespace.
func Objects(o Options) ([]any, error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.ServiceAccount == "" || o.Namespace == "" {
		return nil, errors.New("rbac: the ServiceAccount and its namespace are required")
	}
	if len(o.Targets) == 0 {
		return nil, fmt.Errorf("rbac: no target (want %s or %s)", TargetLeaf, TargetManager)
	}
	var out []any
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: o.ServiceAccount, Namespace: o.Namespace}
	for _, t := range o.Targets {
		switch t {
		case TargetLeaf:
			if o.Registry == nil {
				o.Registry = collector.NewRegistry()
			}
			rules := KindRules(o.Registry)
			if o.Details {
				rules = append(rules, ImpersonateRule())
			}
			out = append(out, clusterRole(o.Name+"-collector", rules), clusterBinding(o.Name+"-collector", subject))
			if o.IstioNamespace != "" {
				out = append(out, role(o.Name+"-istio", o.IstioNamespace, IstioRules()), roleBinding(o.Name+"-istio", o.IstioNamespace, subject))
			}
		case TargetManager:
			var cluster []rbacv1.PolicyRule
			namespaced := map[string][]rbacv1.PolicyRule{}
			for _, name := range o.Sources {
				acc, err := sources.SourceAccess(name, o.SourceOptions)
				if err != nil {
					return nil, err
				}
				cluster = append(cluster, acc.Cluster...)
				for ns, rules := range acc.Namespaced {
					namespaced[ns] = append(namespaced[ns], rules...)
				}
			}
			cluster = dedupe(cluster)
			if len(cluster) > 0 {
				out = append(out, clusterRole(o.Name+"-sources", cluster), clusterBinding(o.Name+"-sources", subject))
			}
			for _, ns := range slices.Sorted(maps.Keys(namespaced)) {
				out = append(out, role(o.Name+"-sources", ns, dedupe(namespaced[ns])), roleBinding(o.Name+"-sources", ns, subject))
			}
			if o.LeaseNamespace != "" {
				out = append(out, role(o.Name+"-leases", o.LeaseNamespace, replication.LeaseRules()), roleBinding(o.Name+"-leases", o.LeaseNamespace, subject))
			}
		default:
			return nil, fmt.Errorf("rbac: unknown target %q (want %s or %s)", t, TargetLeaf, TargetManager)
		}
	}
	return out, nil
}

// YAML renders objects as one YAML stream.
func YAML(objs []any) ([]byte, error) {
	var b bytes.Buffer
	for _, obj := range objs {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("rbac: %w", err)
		}
		b.WriteString("---\n")
		b.Write(data)
	}
	return b.Bytes(), nil
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: kind}
}

func clusterRole(name string, rules []rbacv1.PolicyRule) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{TypeMeta: typeMeta("ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
}

func clusterBinding(name string, subject rbacv1.Subject) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		TypeMeta: typeMeta("ClusterRoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{subject},
	}
}

func role(name, namespace string, rules []rbacv1.PolicyRule) *rbacv1.Role {
	return &rbacv1.Role{TypeMeta: typeMeta("Role"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: rules}
}

func roleBinding(name, namespace string, subject rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta: typeMeta("RoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{subject},
	}
}

// dedupe drops rules equal to an earlier one (two sources reading Secrets
// the same way), keeping the order.
func dedupe(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	var out []rbacv1.PolicyRule
	seen := map[string]bool{}
	for _, r := range rules {
		k := strings.Join(r.APIGroups, ",") + "|" + strings.Join(r.Resources, ",") + "|" + strings.Join(r.Verbs, ",")
		if !seen[k] {
			seen[k] = true
			out = append(out, r)
		}
	}
	return out
}
