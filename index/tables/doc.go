// Package tables is the contract between index and the database that holds
// its small tables (clusters, kinds, RBAC rows and their revisions): the
// table descriptions index gives, and the transactions index runs on them.
//
// It exists so that index, and everything that reads the fleet through
// index (graph, authz), does not depend on the database: index/memtables
// implements it with go-memdb, and whoever creates an index.Store passes
// memtables.Open to index.New.
//
// The shape is go-memdb's, narrowed to what index uses: every table has
// one unique index (IndexID) over a compound key of \x00-terminated parts,
// and its prefix form (IndexIDPrefix) reads every row under a prefix of
// whole parts. A read's watch channel is closed when a later commit
// changes what it read. Reads and writes name keys with Key, so a raw
// string cannot be passed where an encoded key is meant.
//
// It holds no data and imports nothing beyond the standard library.
package tables
