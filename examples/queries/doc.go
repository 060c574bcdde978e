// Package queries holds GraphQL documents, one per file, for the questions
// platform engineers ask fleetgraph most:
//
//	unhealthy-kustomizations.graphql        which Flux Kustomizations fail, and why
//	recent-changes.graphql                  what changed in namespace X in the last minute
//	stale-clusters.graphql                  which clusters are stale, since when, and why
//	failing-pods.graphql                    which pods fail, with reason, restarts and node
//	problems-by-cluster.graphql             unhealthy objects counted by cluster, kind, namespace
//	where-does-it-run.graphql               an application's pods everywhere, by label selector
//	cluster-health.graphql                  connection, sync, kind errors and versions per cluster
//	unhealthy-in-clusters-labelled.graphql  what is broken in the clusters labelled env=prod
//	why-can-i-see.graphql                   the binding and role rule that show you an object
//	live-manifest.graphql                   the live object, read as you from its cluster
//	my-view.graphql                         who you are and what you can see, by cluster and namespace
//
// Each file says what it answers and which variables it takes. Paste one
// into GraphiQL (/graphiql), or post it with curl and jq:
//
//	jq -n --rawfile q examples/queries/stale-clusters.graphql '{query: $q}' |
//	  curl -s -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
//	  http://127.0.0.1:8080/graphql -d @-
//
// Every answer is filtered through the RBAC of each object's own cluster,
// so the same document answers differently for different people. The
// package's test runs every document against fleetgraph serving real
// clusters and checks each answer against what the clusters themselves
// hold.
package queries
