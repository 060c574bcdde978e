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

// KindLister returns the kinds discovery reported for a cluster. Wildcard
// rules ("*" resources or groups) are expanded against these, and the
// plural resource names come from here, never from a hand-written table:
// each cluster's own.
type KindLister interface {
	Kinds(cluster string) []index.Kind
}

// PolicyWatcher reports the policy revision of every cluster of the fleet
// (a number that changes whenever the cluster's RBAC rows or kinds change,
// and only then) and a channel closed at the next change, including a
// cluster entering or leaving the fleet. The Authorizer's cache is valid
// while that channel is open, so no time-based expiry is needed; a source
// that never changes may return a nil channel. *index.Store implements it
// (index.Store.WatchPolicies).
type PolicyWatcher interface {
	WatchPolicies() index.PolicyRevisions
}

// PolicySource is everything the evaluator and the Authorizer read.
// *index.Store implements it.
type PolicySource interface {
	RuleReader
	KindLister
	PolicyWatcher
}
