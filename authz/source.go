package authz

import "github.com/fleetgraph/fleetgraph/index"

// RoleGetter returns a Role of a cluster by namespace and name. It is one of
// the narrow getters the evaluator reads RBAC through, so tests can feed it
// from a slice and production from *index.Store.
type RoleGetter interface {
	GetRole(cluster, namespace, name string) (*index.Role, bool)
}

// ClusterRoleGetter returns a ClusterRole of a cluster by name. Aggregated
// ClusterRoles must come back with the rules the aggregation controller
// stored, which is what Kubernetes evaluates.
type ClusterRoleGetter interface {
	GetClusterRole(cluster, name string) (*index.Role, bool)
}

// RoleBindingLister lists the RoleBindings of one namespace of a cluster,
// or of every namespace when namespace is "".
type RoleBindingLister interface {
	ListRoleBindings(cluster, namespace string) []*index.Binding
}

// ClusterRoleBindingLister lists the ClusterRoleBindings of a cluster.
type ClusterRoleBindingLister interface {
	ListClusterRoleBindings(cluster string) []*index.Binding
}

// RevisionSource reports a number that changes whenever any RBAC row of the
// cluster, or the cluster's set of kinds, changes, and only then. Access
// sets are cached under it, so a change in one cluster invalidates only that
// cluster's sets, and no time-based expiry is needed.
type RevisionSource interface {
	PolicyRevision(cluster string) uint64
}

// RevisionNotifier is optionally implemented by a PolicySource that can
// also hand out a channel closed at the cluster's next policy change (for
// *index.Store, the memdb watch channel of the revision row). The
// Authorizer then checks that channel on every lookup, a non-blocking
// receive of a few nanoseconds, instead of reading the revision, which
// keeps cached lookups far below a memdb read. A nil channel means "cannot
// watch"; the revision is read instead.
type RevisionNotifier interface {
	PolicyRevisionNotify(cluster string) (rev uint64, changed <-chan struct{})
}

// KindLister returns the kinds discovery reported for a cluster. Wildcard
// rules ("*" resources or groups) are expanded against these, and the
// plural resource names come from here, never from a hand-written table.
type KindLister interface {
	Kinds(cluster string) []index.Kind
}

// PolicySource is everything the evaluator and the access-set cache read.
// *index.Store implements it.
type PolicySource interface {
	RoleGetter
	ClusterRoleGetter
	RoleBindingLister
	ClusterRoleBindingLister
	RevisionSource
	KindLister
}
