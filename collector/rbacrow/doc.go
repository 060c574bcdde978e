// Package rbacrow converts Kubernetes RBAC objects (k8s.io/api/rbac/v1)
// to the index's policy rows: the one conversion the collector applies to
// every Role, ClusterRole, RoleBinding and ClusterRoleBinding it reads,
// and the one the RBAC differential test (testenv/rbacdiff) applies to its
// policies, so that the test covers it too.
//
// It imports only the RBAC API types and index, so that testenv can use
// it without the collector's clients.
package rbacrow
