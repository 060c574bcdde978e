package authz

import (
	"context"
	"errors"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// The verbs that make an object visible.
const (
	verbGet  = "get"
	verbList = "list"
)

// isNamespaces reports whether gr is the core "namespaces" resource, whose
// requests carry the namespace's own name as their namespace attribute, so
// that a RoleBinding in namespace foo can grant access to Namespace foo.
func isNamespaces(gr index.GroupResource) bool {
	return gr.Group == "" && gr.Resource == "namespaces"
}

// VisibilityAttributes returns the requests that decide whether one object
// is visible: it is visible when any of them is allowed. They are the
// visibility rule of docs/design.md spelled out as Kubernetes requests:
//
//   - get of the object by name, with the object's namespace as the
//     namespace attribute (for a Namespace object, its own name, which is
//     what the apiserver sets for namespaces/<name>);
//   - list of the resource in the object's namespace (namespaced objects
//     only: a list in a namespace cannot return a cluster-scoped object);
//   - list of the resource cluster-wide.
//
// The access sets of Authorizer are exactly this rule, precomputed; the
// differential test checks both against the Kubernetes authorizer.
func VisibilityAttributes(u user.Info, gr index.GroupResource, namespaced bool, namespace, name string) []Attributes {
	get := Attributes{User: u, Verb: verbGet, APIGroup: gr.Group, Resource: gr.Resource, Name: name, ResourceRequest: true}
	list := Attributes{User: u, Verb: verbList, APIGroup: gr.Group, Resource: gr.Resource, ResourceRequest: true}
	switch {
	case namespaced:
		get.Namespace = namespace
		listNS := list
		listNS.Namespace = namespace
		return []Attributes{get, listNS, list}
	case isNamespaces(gr):
		get.Namespace = name
		return []Attributes{get, list}
	default:
		return []Attributes{get, list}
	}
}

// ObjectVisible decides the visibility rule for one object by asking the
// evaluator each request of VisibilityAttributes. It is the slow reference
// that access sets must agree with; queries use access sets instead.
func (e *Evaluator) ObjectVisible(ctx context.Context, cluster string, u user.Info, gr index.GroupResource, namespaced bool, namespace, name string) (bool, error) {
	var errs []error
	for _, attrs := range VisibilityAttributes(u, gr, namespaced, namespace, name) {
		d, err := e.Authorize(ctx, cluster, &attrs)
		if d.Allowed {
			return true, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return false, errors.Join(errs...)
}

// Allows reports whether an access set makes the object visible. It is
// (*index.ClusterAccess).Allows, the one definition of an access set, which
// includes the convention authz relies on: a Named entry with an empty
// Namespace for a namespaced resource stands for that name in every
// namespace (what a ClusterRoleBinding to a rule with resourceNames
// grants). It stays as a function for callers that check access sets
// beside the evaluator, such as the differential tests.
func Allows(ca *index.ClusterAccess, gr index.GroupResource, namespace, name string) bool {
	return ca.Allows(gr, namespace, name)
}
