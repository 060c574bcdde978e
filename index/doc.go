// Package index holds the fleet's state: one normalized row per object of
// every cluster, the clusters themselves, and each cluster's RBAC rows, in an
// in-memory go-memdb database.
//
// It is the only source for queries and subscriptions. Rows enter only
// through the Sink interface (Replace, Upsert, Delete, ReportKindError), so
// that pull collectors, edge sessions and, later, a replicated stream all
// write the same way. Every row is a plain, serializable value.
//
// The package answers list, filter, paginate and facet queries with an
// access hook (Access) computed by authz, and publishes a change feed with a
// global sequence number that subscriptions resume from. Access sets are
// applied before pagination and counting; a query resolves each
// ClusterAccess against the index's dictionaries once (namespace ids,
// kind bitsets) and keeps that on it for later queries, so checking a row
// costs one small map probe (see accessIDs).
//
// Store is the implementation. Object rows live in purpose-built
// structures (a row table, posting lists of small row ids, name-ordered
// sorted runs and pre-aggregated count cells; see objIndex) because
// go-memdb's per-row cost missed the memory and ingest goals; clusters,
// kinds, RBAC rows and their per-cluster revisions are go-memdb tables,
// which give WatchSets for blocking reads (the objects revision of a
// cluster is kept beside the object rows and has its own watch channels).
// Every write is one commit that updates both under one lock and publishes
// its events with consecutive sequence numbers; concurrent Upserts and
// Deletes may share a commit.
//
// It does not talk to Kubernetes, evaluate RBAC rules, or know about
// GraphQL: it imports no Kubernetes client code.
package index
