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
//   - Access (Authorizer.Access): for one identity, the fleet-wide
//     *index.Access that says which objects are visible in each cluster
//     under the visibility rule (get by name, or list in the namespace, or
//     list cluster-wide), checked against each cluster's own kinds and
//     resource names. The Authorizer owns fleetgraph's one cache of
//     access: one answer per identity, valid until the index reports a
//     policy change in any cluster (index.Store.WatchPolicies: RBAC rows,
//     kinds, a cluster entering or leaving); then only the clusters whose
//     policy moved are compiled and evaluated again. Each cluster's policy
//     is compiled once per revision, so a query never pays for the number
//     of bindings a viewer has. The shape of the answer is index.Access:
//     resource sets are shared index.Resources values, one per distinct set
//     of a policy, and a Named entry with an empty Namespace for a
//     namespaced resource means that name in every namespace (what a
//     ClusterRoleBinding to a rule with resourceNames grants);
//     index.ClusterAccess.Allows, which Allows in this package calls, is
//     the one definition the index's queries, counts, facets and
//     subscriptions follow.
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
// The package reads RBAC rows, kinds and policy revisions through small
// interfaces (PolicySource) that *index.Store satisfies; it does not import
// go-memdb or any Kubernetes client code, it does not serve HTTP, it does
// not talk to clusters, and it does not decide who is a fleet admin (graph
// does, from its AdminGroups).
package authz
