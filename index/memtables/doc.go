// Package memtables holds index's small tables (clusters, kinds, RBAC rows
// and their revisions) in go-memdb: it implements the index/tables
// contract. Create a Store with index.New(memtables.Open).
//
// It is the only package that imports go-memdb, so that the packages that
// read the fleet through index (graph, authz) do not depend on it. It
// knows nothing of the rows it stores beyond the key each table's
// description computes.
package memtables
