// Package rbacdiff checks fleetgraph's RBAC evaluator (package authz)
// against the real Kubernetes RBAC authorizer from k8s.io/kubernetes.
//
// It lives in the nested testenv module so that the root fleetgraph module
// never depends on k8s.io/kubernetes. It holds no product code: Policy and
// Store convert a set of rbacv1 objects into both the oracle
// (rbac.New over validation.NewTestRuleResolver) and an authz.PolicySource,
// and the tests generate random policies and requests, seeded with the
// upstream rbac_test.go cases and the bootstrap ClusterRoles, and require
// both sides to agree on every request and on every object's visibility.
//
// The number of random cases is RBACDIFF_CASES: 50,000 by default, which
// is what `make test` runs; `make test-rbac-full` runs 1,000,000.
//
// These tests compare authz's answers; the nested module querypath uses
// the same generator and oracle to check what viewers are actually shown
// through the GraphQL handler (objects, totals, facets, clusters and
// objectChanges).
package rbacdiff
