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

// Index names: the one index of every table and its prefix form.
const (
	IndexID       = "id"
	IndexIDPrefix = "id_prefix"
)

// Key is an encoded key (or, for IndexIDPrefix, a prefix of whole parts),
// the only argument of a read.
type Key string

// Table describes one table. Key returns the key of a row ("" for none,
// which the table refuses), or an error for a value that is not a row of
// the table.
type Table struct {
	Name string
	Key  func(row any) (string, error)
}

// Open creates an empty database with the given tables.
type Open func(schema []Table) (DB, error)

// DB is a database of tables. Any number of read transactions may run at
// once, each on a snapshot; write transactions run one at a time.
type DB interface {
	Txn(write bool) Txn
}

// Txn is one transaction. A write transaction's changes become visible
// at Commit; Abort drops them (and is a no-op after Commit).
type Txn interface {
	First(table, index string, args ...any) (any, error)
	FirstWatch(table, index string, args ...any) (<-chan struct{}, any, error)
	Get(table, index string, args ...any) (Iterator, error)
	Insert(table string, row any) error
	Delete(table string, row any) error
	DeleteAll(table, index string, args ...any) (int, error)
	Commit()
	Abort()
}

// Iterator walks the rows of a Get in key order; Next returns nil after
// the last. WatchCh is closed when a later commit changes the rows under
// the Get's key or prefix.
type Iterator interface {
	Next() any
	WatchCh() <-chan struct{}
}
