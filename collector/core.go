package collector

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fleetgraph/fleetgraph/collector/rbacrow"
	"github.com/fleetgraph/fleetgraph/index"
)

type (
	listFunc[L any] = func(context.Context, metav1.ListOptions) (L, error)
	watchFunc       = func(context.Context, metav1.ListOptions) (watch.Interface, error)
)

func coreAdapters() []*Adapter {
	return []*Adapter{
		typed("", "v1", "Namespace", func() *corev1.Namespace { return &corev1.Namespace{} },
			func(c *Clients) (listFunc[*corev1.NamespaceList], watchFunc) {
				ns := c.Kube.CoreV1().Namespaces()
				return ns.List, ns.Watch
			}, namespaceStatus),
		typed("", "v1", "Service", func() *corev1.Service { return &corev1.Service{} },
			func(c *Clients) (listFunc[*corev1.ServiceList], watchFunc) {
				s := c.Kube.CoreV1().Services(metav1.NamespaceAll)
				return s.List, s.Watch
			}, serviceStatus),
		typed("", "v1", "Pod", func() *corev1.Pod { return &corev1.Pod{} },
			func(c *Clients) (listFunc[*corev1.PodList], watchFunc) {
				p := c.Kube.CoreV1().Pods(metav1.NamespaceAll)
				return p.List, p.Watch
			}, podStatus),
		typed("discovery.k8s.io", "v1", "EndpointSlice", func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} },
			func(c *Clients) (listFunc[*discoveryv1.EndpointSliceList], watchFunc) {
				e := c.Kube.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
				return e.List, e.Watch
			}, endpointSliceStatus),
	}
}

// rbacAdapters collect the RBAC kinds. Their rows carry a Policy and fill
// the index's RBAC tables; they are never listed as objects.
func rbacAdapters() []*Adapter {
	return []*Adapter{
		typed(index.RBACGroup, "v1", index.KindRole, func() *rbacv1.Role { return &rbacv1.Role{} },
			func(c *Clients) (listFunc[*rbacv1.RoleList], watchFunc) {
				r := c.Kube.RbacV1().Roles(metav1.NamespaceAll)
				return r.List, r.Watch
			}, func(r *rbacv1.Role) Normalized { return policyRow(&index.Policy{Rules: rbacrow.Rules(r.Rules)}) }),
		typed(index.RBACGroup, "v1", index.KindClusterRole, func() *rbacv1.ClusterRole { return &rbacv1.ClusterRole{} },
			func(c *Clients) (listFunc[*rbacv1.ClusterRoleList], watchFunc) {
				r := c.Kube.RbacV1().ClusterRoles()
				return r.List, r.Watch
			}, func(r *rbacv1.ClusterRole) Normalized {
				// Aggregated roles are evaluated through the rules the
				// aggregation controller stored, as the authorizer does.
				return policyRow(&index.Policy{Rules: rbacrow.Rules(r.Rules)})
			}),
		typed(index.RBACGroup, "v1", index.KindRoleBinding, func() *rbacv1.RoleBinding { return &rbacv1.RoleBinding{} },
			func(c *Clients) (listFunc[*rbacv1.RoleBindingList], watchFunc) {
				r := c.Kube.RbacV1().RoleBindings(metav1.NamespaceAll)
				return r.List, r.Watch
			}, func(b *rbacv1.RoleBinding) Normalized {
				return policyRow(&index.Policy{RoleRef: rbacrow.RoleRef(b.RoleRef), Subjects: rbacrow.Subjects(b.Subjects)})
			}),
		typed(index.RBACGroup, "v1", index.KindClusterRoleBinding, func() *rbacv1.ClusterRoleBinding { return &rbacv1.ClusterRoleBinding{} },
			func(c *Clients) (listFunc[*rbacv1.ClusterRoleBindingList], watchFunc) {
				r := c.Kube.RbacV1().ClusterRoleBindings()
				return r.List, r.Watch
			}, func(b *rbacv1.ClusterRoleBinding) Normalized {
				return policyRow(&index.Policy{RoleRef: rbacrow.RoleRef(b.RoleRef), Subjects: rbacrow.Subjects(b.Subjects)})
			}),
	}
}

func policyRow(p *index.Policy) Normalized {
	return Normalized{Status: index.StatusHealthy, Policy: p}
}
