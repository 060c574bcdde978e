package index

import "sync/atomic"

// GroupResource names a resource the way RBAC rules do: API group plus
// plural resource name.
type GroupResource struct {
	Group    string
	Resource string
}

// Access describes which objects one viewer may see. authz computes it from
// each cluster's RBAC; the index applies it inside queries, facets and the
// change feed, before pagination and counting, so pages are full and totals
// never count hidden objects.
//
// The zero value sees nothing. Access values are immutable once built and
// may be shared between goroutines and cached.
type Access struct {
	// All means every object in every cluster is visible.
	All bool
	// Clusters holds what is visible per cluster. A cluster that is absent
	// shows nothing.
	Clusters map[string]*ClusterAccess
}

// ClusterAccess is what a viewer may see in one cluster. An object is
// visible when any one of the fields allows it; Allows is the definition
// that queries, counts, facets and Matcher all follow.
type ClusterAccess struct {
	// All means every object of the cluster is visible.
	All bool
	// Everywhere lists resources the viewer may list cluster-wide: every
	// object of those resources, namespaced or not, is visible.
	Everywhere map[GroupResource]struct{}
	// Namespaces lists, per namespace, the namespaced resources the viewer
	// may list in that namespace.
	Namespaces map[string]map[GroupResource]struct{}
	// Named lists single objects the viewer may get by name. For
	// cluster-scoped objects Namespace is empty. An entry with an empty
	// Namespace also stands for that name of a namespaced resource in
	// every namespace: it is what a ClusterRoleBinding to a rule with
	// resourceNames grants (get pods/x in any namespace), and authz cannot
	// list the namespaces instead because they are not RBAC rows.
	Named map[NamedObject]struct{}

	// ids is this access set resolved against the index it was last
	// queried on (see accessIDs). It is derived state: the exported fields
	// stay the definition, and are never changed.
	ids atomic.Pointer[accessIDs]
}

// NamedObject is one object that is visible by name only; with an empty
// Namespace, that name in any namespace (see ClusterAccess.Named).
type NamedObject struct {
	GroupResource
	Namespace string
	Name      string
}

// Allows reports whether the object with this resource, namespace and name
// in this cluster is visible. Queries use cheaper plans where they can; this
// is the definition they must agree with.
func (a *Access) Allows(cluster string, gr GroupResource, namespace, name string) bool {
	if a == nil {
		return false
	}
	if a.All {
		return true
	}
	return a.Clusters[cluster].Allows(gr, namespace, name)
}

// Allows reports whether the object is visible in this cluster: the
// cluster is All, or gr is listed Everywhere, or gr is listed in the
// object's namespace, or the name is Named in the object's namespace or in
// any namespace (Namespace ""). It is the one definition of an access set;
// authz.Allows is this method.
func (c *ClusterAccess) Allows(gr GroupResource, namespace, name string) bool {
	if c == nil {
		return false
	}
	if c.All {
		return true
	}
	if _, ok := c.Everywhere[gr]; ok {
		return true
	}
	if namespace != "" {
		if _, ok := c.Namespaces[namespace][gr]; ok {
			return true
		}
	}
	return c.allowsNamed(gr, namespace, name)
}

// allowsNamed is the Named part of Allows.
func (c *ClusterAccess) allowsNamed(gr GroupResource, namespace, name string) bool {
	if len(c.Named) == 0 {
		return false
	}
	no := NamedObject{GroupResource: gr, Namespace: namespace, Name: name}
	if _, ok := c.Named[no]; ok {
		return true
	}
	if namespace == "" {
		return false
	}
	no.Namespace = "" // the name in any namespace
	_, ok := c.Named[no]
	return ok
}
