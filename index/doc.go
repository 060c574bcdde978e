// Package index holds the fleet's state in memory: one normalized row per
// object of every cluster, the clusters themselves, their kinds, and each
// cluster's RBAC rows.
//
// It is the only source for queries and subscriptions. Everything that
// changes it goes through the Sink interface (rows with Replace, Upsert,
// UpsertBatch and Delete; kind errors with ReportKindError; cluster rows
// with UpsertCluster and RemoveCluster; a whole cluster with
// RestoreCluster), so that pull collectors, edge sessions and the
// replicated stream (package replication) all write the same way. Every
// row is a plain, serializable value. For replicas, SnapshotCluster reads
// a cluster's whole state for RestoreCluster to write elsewhere, and At
// replays another index's writes at the times that index stamped them.
//
// The package answers list, filter, paginate and facet queries and the
// fleet's rebuild progress (Fleet: "Rebuilding indices... 35/100
// clusters", counted over the clusters a viewer may see) with an
// access hook (Access) computed and cached by authz, and publishes a change
// feed with a global sequence number that subscriptions resume from. Access
// sets are applied before pagination and counting, and each row is checked
// against the resource its own cluster reported for its kind (a kind id is
// a (group, kind, resource); see kindDict), so that no cluster's kinds
// change what another cluster's rows show. A query resolves each
// ClusterAccess against the index's dictionaries once (namespace ids, kind
// bitsets, each shared Resources once) and keeps that derived form on it
// for later queries, so checking a row costs one small map probe (see
// accessIDs).
//
// Streams (ObjectChanges, ClusterChanges, FleetChanges) are the
// subscription API: one fan-out goroutine reads the change feed and routes
// each event by cluster and namespace to the streams it may concern, and
// each stream applies its filter and its viewer's access (a function it
// calls again after every policy change, so revocations reach open
// streams), resumes from a sequence number, and catches up from the replay
// buffer when its reader is slow; no writer and no fan-out ever waits for
// a reader (see fanout).
//
// Blocking reads and revisions have a plain API of their own (Watch,
// WatchPolicies, PolicyRevision), so that no other package reads the
// database: authz keeps its access cache valid by polling the one channel
// of WatchPolicies.
//
// Store is the implementation. Object rows live in purpose-built
// structures (a row table, posting lists of small row ids, name-ordered
// sorted runs of every row and of large lists, and pre-aggregated count
// cells; see objIndex) because
// go-memdb's per-row cost missed the memory and ingest goals; clusters,
// kinds, RBAC rows and their per-cluster revisions are tables of the
// database that New is given (the index/tables contract; index/memtables
// implements it with go-memdb), whose watch channels back Watch (the
// objects revision of a cluster is kept beside the object rows and has
// its own watch channels). The package does not import go-memdb, so that
// graph and authz, which read the fleet through it, do not depend on it.
// Every write is one commit that updates both under one lock and publishes
// its events with consecutive sequence numbers; concurrent Upserts and
// Deletes may share a commit.
//
// It does not talk to Kubernetes, evaluate RBAC rules, or know about
// GraphQL: it imports no Kubernetes client code.
package index
