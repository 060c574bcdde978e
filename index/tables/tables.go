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
