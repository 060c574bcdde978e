// Package edge is fleetgraph's push mode (docs/design.md): an edge Agent runs
// the collector next to one cluster and streams its rows to the manager
// over a websocket, and the manager's Hub writes them into the index
// through the same Sink operations a pull collector uses.
//
// protocol.go is the whole wire protocol: Hello, then Welcome or Reject;
// then snapshots (chunked under the message limit, applied atomically per
// kind) and deltas from the edge, each numbered and acknowledged; detail
// requests from the manager that the edge performs on its own API server
// as the viewer. The Hub enforces one edge per cluster with a grace period
// for the last instance, marks a cluster DISCONNECTED once per outage and
// keeps its rows as stale, and ends sessions that send bad input with a
// reason.
//
// The edge sends no row the manager would refuse (over a per-row quota,
// against the index's rules, not encodable, too large for any message):
// one object costs only itself, not its cluster's sync. In its place it
// sends a placeholder (the key and kind, status Unknown, a message "not
// synced: ..." saying why, no labels, owners or summary), so the object
// stays in inventories and facets and its older state is gone. An RBAC
// row fails closed instead: a snapshot omits it, which drops its older
// state at the manager's commit, and a delta sends a delete of its key, so
// the manager never keeps a grant the cluster revoked; so does a row whose
// placeholder the manager would refuse too (a key over a quota).
// A session the Hub ends over the data its edge sent (refusesData: the
// next session would be refused the same way, so later revocations would
// never arrive) first withholds the cluster's RBAC rows
// (session.withholdPolicy): the cluster grants nothing until a snapshot is
// accepted, and its objects stay, stale, for fleet admins.
//
// It does not normalize objects (collector), store them (index) or answer
// queries (graph).
package edge
