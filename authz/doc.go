// Package authz decides what a fleetgraph viewer may see in each cluster, the
// way that cluster's own kube-apiserver would decide it.
//
// It has four parts:
//
//   - An RBAC evaluator (Evaluator, RuleAllows and the matchers) that gives
//     the same answer as k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac
//     for any request: wildcards, "*/subresource" rules, resourceNames,
//     RoleBindings to ClusterRoles, ServiceAccount, User and Group subjects,
//     aggregated ClusterRoles through their stored rules, and missing roles,
//     which deny. A differential test in testenv/rbacdiff checks it against
//     the real authorizer.
//   - Access sets (Authorizer.ClusterAccess, Authorizer.Access): for one
//     identity in one cluster, the *index.ClusterAccess that says which
//     objects are visible under the visibility rule (get by name, or list in
//     the namespace, or list cluster-wide). They are precomputed from a
//     per-cluster compiled policy and cached by the cluster's RBAC revision,
//     so a query never pays for the number of bindings a viewer has. A
//     Named entry with an empty Namespace for a namespaced resource means
//     that name in every namespace (what a ClusterRoleBinding to a rule
//     with resourceNames grants); index.ClusterAccess.Allows, which Allows
//     in this package calls, is the one definition the index's queries,
//     counts, facets and subscriptions follow.
//   - Identity mapping (Mapping): per-cluster username and group prefixes in
//     the style of kube-apiserver's --oidc-username-prefix, plus the groups
//     the Kubernetes authenticators add (system:authenticated and the
//     ServiceAccount groups).
//   - Authenticators (Authenticator, combined by Union): a static token
//     file in the --token-auth-file format (TokenFile, re-read while Run
//     runs; a removed token's identities are revoked, see Revocable), OIDC
//     ID tokens, and request-header authentication behind a proxy whose
//     client certificate chains to a configured CA. Each has its own Naming:
//     OIDC usernames carry the issuer by default, as kube-apiserver's
//     --oidc-username-prefix does, and no authenticator may establish a
//     ServiceAccount or a system: group unless its Naming allows it.
//     Anonymous callers are rejected unless Union.AllowAnonymous is set.
//
// The package reads RBAC rows through small getter interfaces (PolicySource)
// that *index.Store satisfies; it does not import go-memdb or any Kubernetes
// client code, it does not serve HTTP, and it does not talk to clusters.
package authz
