package memtables

import (
	"errors"
	"testing"

	"github.com/fleetgraph/fleetgraph/index/tables"
)

type row struct{ cluster, name string }

func rowKey(raw any) (string, error) {
	r, ok := raw.(*row)
	if !ok {
		return "", errors.New("not a row")
	}
	if r.name == "" {
		return "", nil
	}
	return r.cluster + "\x00" + r.name + "\x00", nil
}

// TestTables stores rows through the tables contract: reads by key and
// by prefix, watch channels closed by a later commit, refusals of rows
// without a key, of rows of another type and of raw string arguments,
// and a write transaction's changes invisible until Commit and dropped by
// Abort.
func TestTables(t *testing.T) {
	db, err := Open([]tables.Table{{Name: "rows", Key: rowKey}})
	if err != nil {
		t.Fatal(err)
	}
	a, b, other := &row{"c1", "a"}, &row{"c1", "b"}, &row{"c2", "a"}
	w := db.Txn(true)
	for _, r := range []*row{a, b, other} {
		if err := w.Insert("rows", r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Insert("rows", &row{cluster: "c1"}); err == nil {
		t.Error("a row without a key was stored")
	}
	if err := w.Insert("rows", "a string"); err == nil {
		t.Error("a value of another type was stored")
	}
	if got, _ := db.Txn(false).First("rows", tables.IndexID, tables.Key("c1\x00a\x00")); got != nil {
		t.Error("an uncommitted row is visible")
	}
	w.Commit()

	read := db.Txn(false)
	if got, err := read.First("rows", tables.IndexID, tables.Key("c1\x00b\x00")); err != nil || got != b {
		t.Errorf("First = %v, %v; want b", got, err)
	}
	if _, err := read.First("rows", tables.IndexID, "c1\x00b\x00"); err == nil {
		t.Error("a raw string was accepted as a key")
	}
	it, err := read.Get("rows", tables.IndexIDPrefix, tables.Key("c1\x00"))
	if err != nil {
		t.Fatal(err)
	}
	if got := []any{it.Next(), it.Next(), it.Next()}; got[0] != a || got[1] != b || got[2] != nil {
		t.Errorf("prefix c1 read %v; want a, b", got)
	}
	changed, _, err := read.FirstWatch("rows", tables.IndexID, tables.Key("c1\x00a\x00"))
	if err != nil {
		t.Fatal(err)
	}

	w = db.Txn(true)
	if n, err := w.DeleteAll("rows", tables.IndexIDPrefix, tables.Key("c2\x00")); err != nil || n != 1 {
		t.Fatalf("DeleteAll = %d, %v; want 1", n, err)
	}
	w.Abort()
	if got, _ := db.Txn(false).First("rows", tables.IndexID, tables.Key("c2\x00a\x00")); got != other {
		t.Error("an aborted delete took effect")
	}
	select {
	case <-changed:
		t.Error("the watch fired without a commit")
	default:
	}

	w = db.Txn(true)
	if err := w.Delete("rows", a); err != nil {
		t.Fatal(err)
	}
	w.Commit()
	select {
	case <-changed:
	default:
		t.Error("deleting the watched row did not close its watch channel")
	}
}
