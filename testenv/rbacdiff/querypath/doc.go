// Package querypath checks fleetgraph's query path against the Kubernetes
// RBAC authorizer: random policies, converted by the collector, and random
// objects go into an index.Store served by graph's real handler, and for
// random viewers every page of objects, totalCount, facets, clusters and
// an objectChanges subscription must show exactly what the authorizer
// lets the viewer read (see TestQueryPathDifferential).
//
// It is a module of its own: it needs both the root module's graph and
// collector packages and k8s.io/kubernetes, and importing the former into
// the testenv module would move the versions kube-testenv is built with.
// It holds tests only.
package querypath
