package authz

import (
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// The subject kinds a binding may name.
const (
	SubjectUser           = "User"
	SubjectGroup          = "Group"
	SubjectServiceAccount = "ServiceAccount"
)

// The role reference kinds a binding may name.
const (
	RoleRefRole        = "Role"
	RoleRefClusterRole = "ClusterRole"
)

// The names the Kubernetes authenticators use for ServiceAccounts.
const (
	// ServiceAccountUsernamePrefix starts every ServiceAccount username,
	// which is system:serviceaccount:<namespace>:<name>.
	ServiceAccountUsernamePrefix = "system:serviceaccount:"
	// AllServiceAccountsGroup is the group of every ServiceAccount.
	AllServiceAccountsGroup = "system:serviceaccounts"
	// ServiceAccountGroupPrefix followed by a namespace is the group of
	// the ServiceAccounts in that namespace.
	ServiceAccountGroupPrefix = "system:serviceaccounts:"
)

// ServiceAccountUsername returns the username a ServiceAccount
// authenticates as.
func ServiceAccountUsername(namespace, name string) string {
	return ServiceAccountUsernamePrefix + namespace + ":" + name
}

// serviceAccountMatches reports whether username is exactly
// system:serviceaccount:<namespace>:<name>, without allocating.
func serviceAccountMatches(namespace, name, username string) bool {
	rest, ok := strings.CutPrefix(username, ServiceAccountUsernamePrefix)
	if !ok {
		return false
	}
	rest, ok = strings.CutPrefix(rest, namespace)
	if !ok {
		return false
	}
	rest, ok = strings.CutPrefix(rest, ":")
	return ok && rest == name
}

// SubjectApplies reports whether a binding subject names the user.
// bindingNamespace is the namespace of a RoleBinding, or "" for a
// ClusterRoleBinding; a ServiceAccount subject without a namespace defaults
// to it, and so never applies in a ClusterRoleBinding. Unknown subject
// kinds never apply.
func SubjectApplies(u user.Info, s *index.Subject, bindingNamespace string) bool {
	switch s.Kind {
	case SubjectUser:
		return u.GetName() == s.Name
	case SubjectGroup:
		return slices.Contains(u.GetGroups(), s.Name)
	case SubjectServiceAccount:
		ns := bindingNamespace
		if s.Namespace != "" {
			ns = s.Namespace
		}
		if ns == "" {
			return false
		}
		return serviceAccountMatches(ns, s.Name, u.GetName())
	default:
		return false
	}
}

// appliesTo returns the index of the first subject of b that names the user.
func appliesTo(u user.Info, b *index.Binding) (int, bool) {
	for i := range b.Subjects {
		if SubjectApplies(u, &b.Subjects[i], b.Namespace) {
			return i, true
		}
	}
	return 0, false
}
