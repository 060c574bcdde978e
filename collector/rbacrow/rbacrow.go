package rbacrow

import (
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/fleetgraph/fleetgraph/index"
)

// Rules converts RBAC rules to index rules.
func Rules(in []rbacv1.PolicyRule) []index.PolicyRule {
	out := make([]index.PolicyRule, len(in))
	for i, r := range in {
		out[i] = index.PolicyRule{
			Verbs: r.Verbs, APIGroups: r.APIGroups, Resources: r.Resources,
			ResourceNames: r.ResourceNames, NonResourceURLs: r.NonResourceURLs,
		}
	}
	return out
}

// RoleRef converts a binding's role reference.
func RoleRef(r rbacv1.RoleRef) index.RoleRef {
	return index.RoleRef{APIGroup: r.APIGroup, Kind: r.Kind, Name: r.Name}
}

// Subjects converts a binding's subjects.
func Subjects(in []rbacv1.Subject) []index.Subject {
	out := make([]index.Subject, len(in))
	for i, s := range in {
		out[i] = index.Subject{Kind: s.Kind, APIGroup: s.APIGroup, Name: s.Name, Namespace: s.Namespace}
	}
	return out
}
