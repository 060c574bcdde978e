package memtables

import (
	"fmt"
	"unsafe"

	"github.com/hashicorp/go-memdb"

	"github.com/fleetgraph/fleetgraph/index/tables"
)

// Open creates a go-memdb database with one table per description, each
// with a unique, non-missing IndexID index over the description's key.
// It implements tables.Open.
func Open(schema []tables.Table) (tables.DB, error) {
	db, err := memdb.NewMemDB(dbSchema(schema))
	if err != nil {
		return nil, fmt.Errorf("memtables: %w", err)
	}
	return database{db}, nil
}

// dbSchema returns the memdb schema of the described tables.
func dbSchema(schema []tables.Table) *memdb.DBSchema {
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, t := range schema {
		s.Tables[t.Name] = &memdb.TableSchema{
			Name: t.Name,
			Indexes: map[string]*memdb.IndexSchema{
				tables.IndexID: {
					Name:         tables.IndexID,
					AllowMissing: false,
					Unique:       true,
					Indexer:      keyIndexer{table: t.Name, key: t.Key},
				},
			},
		}
	}
	return s
}

type database struct{ db *memdb.MemDB }

func (d database) Txn(write bool) tables.Txn { return txn{d.db.Txn(write)} }

// txn is a memdb transaction; only Get needs its result type adapted.
type txn struct{ *memdb.Txn }

func (t txn) Get(table, index string, args ...any) (tables.Iterator, error) {
	return t.Txn.Get(table, index, args...)
}

// keyIndexer indexes a table's rows by the key its description computes
// and is queried with one tables.Key argument: a full key or, in the
// prefix form (memdb's IndexIDPrefix), a prefix of whole parts.
type keyIndexer struct {
	table string
	key   func(any) (string, error)
}

// FromObject implements memdb.SingleIndexer. The returned slice aliases the
// key string without copying: memdb and iradix never write into keys.
func (k keyIndexer) FromObject(raw any) (bool, []byte, error) {
	s, err := k.key(raw)
	if err != nil {
		return false, nil, fmt.Errorf("memtables: table %s: %w", k.table, err)
	}
	if s == "" {
		return false, nil, nil
	}
	return true, unsafe.Slice(unsafe.StringData(s), len(s)), nil
}

// FromArgs implements memdb.Indexer.
func (k keyIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("memtables: want one tables.Key argument, got %d", len(args))
	}
	s, ok := args[0].(tables.Key)
	if !ok {
		return nil, fmt.Errorf("memtables: want a tables.Key argument, got %T", args[0])
	}
	return []byte(s), nil
}

// PrefixFromArgs implements memdb.PrefixIndexer; the prefix is a
// tables.Key of whole parts.
func (k keyIndexer) PrefixFromArgs(args ...any) ([]byte, error) {
	return k.FromArgs(args...)
}
