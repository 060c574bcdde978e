package index

import (
	"iter"
	"sync/atomic"
)

// GroupResource names a resource the way RBAC rules do: API group plus
// plural resource name.
type GroupResource struct {
	Group    string
	Resource string
}

// Access describes which objects one viewer may see. authz computes it from
// each cluster's RBAC (authz.Authorizer.Access, which caches one per viewer
// until some cluster's policy changes); the index applies it inside
// queries, facets and subscriptions, before pagination and counting, so
// pages are full and totals never count hidden objects.
//
// The zero value sees nothing. Access values are immutable once built and
// may be shared between goroutines and cached.
type Access struct {
	// All means every object in every cluster is visible.
	All bool
	// Clusters holds what is visible per cluster. A cluster that is absent
	// shows nothing.
	Clusters map[string]*ClusterAccess

	// byCID is Clusters resolved against the index it was last queried
	// on (see viewerClusters): derived state, like ClusterAccess.ids.
	byCID atomic.Pointer[viewerClusters]
}

// ClusterAccess is what a viewer may see in one cluster. An object is
// visible when any one of the fields allows it; Allows is the definition
// that queries, counts, facets and subscriptions all follow. Resources
// are checked against the resource each row's own cluster reported for
// its kind.
type ClusterAccess struct {
	// All means every object of the cluster is visible.
	All bool
	// Everywhere lists resources the viewer may list cluster-wide: every
	// object of those resources, namespaced or not, is visible.
	Everywhere *Resources
	// Namespaces lists, per namespace, the namespaced resources the viewer
	// may list in that namespace. Namespaces that a role grants the same
	// resources in share one *Resources (see Resources).
	Namespaces map[string]*Resources
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

// Resources is an immutable set of resources. Access sets share them by
// pointer: authz builds one value per distinct set of resources of a
// policy, so the 2,000 namespaces in which a viewer holds the same roles
// point at one Resources, and whoever derives something from a set (the
// index turns each into a bitmap of its kinds) does it once per pointer.
// A nil *Resources is the empty set.
type Resources struct {
	set map[GroupResource]struct{}
}

// NewResources returns the set of grs.
func NewResources(grs ...GroupResource) *Resources {
	r := &Resources{set: make(map[GroupResource]struct{}, len(grs))}
	for _, gr := range grs {
		r.set[gr] = struct{}{}
	}
	return r
}

// Has reports whether gr is in the set.
func (r *Resources) Has(gr GroupResource) bool {
	if r == nil {
		return false
	}
	_, ok := r.set[gr]
	return ok
}

// Len returns the number of resources in the set.
func (r *Resources) Len() int {
	if r == nil {
		return 0
	}
	return len(r.set)
}

// All yields the resources of the set, in no particular order.
func (r *Resources) All() iter.Seq[GroupResource] {
	return func(yield func(GroupResource) bool) {
		if r == nil {
			return
		}
		for gr := range r.set {
			if !yield(gr) {
				return
			}
		}
	}
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

// Empty reports whether the access set shows nothing at all (a nil one
// included).
func (c *ClusterAccess) Empty() bool {
	return c == nil || (!c.All && c.Everywhere.Len() == 0 && len(c.Namespaces) == 0 && len(c.Named) == 0)
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
	if c.Everywhere.Has(gr) {
		return true
	}
	if namespace != "" && c.Namespaces[namespace].Has(gr) {
		return true
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
