package index

import (
	"encoding/json"
	"time"
)

// Status is the normalized health of an object, computed by the collector
// with kstatus plus kind-specific rules.
type Status string

// The statuses an object can have. The zero value is not valid; collectors
// use StatusUnknown when they cannot tell.
const (
	StatusHealthy     Status = "HEALTHY"
	StatusProgressing Status = "PROGRESSING"
	StatusUnhealthy   Status = "UNHEALTHY"
	StatusTerminating Status = "TERMINATING"
	StatusUnknown     Status = "UNKNOWN"
)

// Statuses lists every valid Status, in display order.
var Statuses = []Status{StatusHealthy, StatusProgressing, StatusUnhealthy, StatusTerminating, StatusUnknown}

// RBACGroup is the API group of the RBAC kinds. Rows of this group with the
// kinds Role, ClusterRole, RoleBinding or ClusterRoleBinding are policy rows:
// they fill the RBAC tables for authz and are never listed as objects.
const RBACGroup = "rbac.authorization.k8s.io"

// Kind identifies one kind of object on a cluster as discovery reported it.
// Resource (the plural) is what RBAC rules name, so authz maps kinds to
// resources from this record, never from a hand-written table.
type Kind struct {
	Group      string `json:"group"`
	Version    string `json:"version"`
	Kind       string `json:"kind"`
	Resource   string `json:"resource"`
	Namespaced bool   `json:"namespaced"`
}

// GroupKind returns "Kind" for the core group and "Kind.group" otherwise,
// the form the GraphQL kinds filter accepts.
func (k Kind) GroupKind() string {
	if k.Group == "" {
		return k.Kind
	}
	return k.Kind + "." + k.Group
}

// Key identifies one object in the fleet. Namespace is empty for
// cluster-scoped objects.
type Key struct {
	Cluster   string `json:"cluster"`
	Group     string `json:"group"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// String returns "cluster/group/kind/namespace/name".
func (k Key) String() string {
	return k.Cluster + "/" + k.Group + "/" + k.Kind + "/" + k.Namespace + "/" + k.Name
}

// OwnerRef names the owner of an object in the same cluster.
type OwnerRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
}

// Object is the normalized row for one Kubernetes object. It is what
// collectors produce and what queries return. It is a plain value that
// serializes to JSON, so it can cross processes unchanged.
//
// Rows handed to the index must not be mutated afterwards, and rows the
// index returns must not be mutated by callers: the index may share them
// (a query page's Objects are shared with other pages that returned the
// same row lately).
type Object struct {
	Cluster         string     `json:"cluster"`
	Namespace       string     `json:"namespace,omitempty"`
	Group           string     `json:"group"`
	Version         string     `json:"version"`
	Kind            string     `json:"kind"`
	Resource        string     `json:"resource"`
	Name            string     `json:"name"`
	UID             string     `json:"uid"`
	Labels          Labels     `json:"labels,omitzero"` // immutable; Labels.Map gives a copy to change
	OwnerRefs       []OwnerRef `json:"ownerRefs,omitempty"`
	CreatedAt       time.Time  `json:"createdAt"`
	UpdatedAt       time.Time  `json:"updatedAt"`
	ResourceVersion string     `json:"resourceVersion,omitempty"`
	Status          Status     `json:"status"`
	Message         string     `json:"message,omitempty"`
	// Summary holds a small JSON object of kind-specific columns, for
	// example a pod's phase, restarts and node.
	Summary json.RawMessage `json:"summary,omitempty"`
	// Policy is set only on RBAC rows (group RBACGroup).
	Policy *Policy `json:"policy,omitempty"`
}

// Key returns the object's identity.
func (o *Object) Key() Key {
	return Key{Cluster: o.Cluster, Group: o.Group, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}
}
