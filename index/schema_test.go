package index

import (
	"testing"

	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/index/tables"
)

// TestSchema walks every table: names are distinct, each key function
// gives a sample row a \x00-terminated key and refuses a value of another
// type, and the schema opens in memtables and stores and reads back the
// samples by key and by their cluster's prefix.
func TestSchema(t *testing.T) {
	s := schema()
	samples := map[string]any{
		tableClusters:            &Cluster{Name: "c"},
		tableKinds:               &kindRow{Cluster: "c", Kind: Kind{Group: "g", Kind: "K"}},
		tableRoles:               &Role{Cluster: "c", Namespace: "n", Name: "r"},
		tableClusterRoles:        &Role{Cluster: "c", Name: "r"},
		tableRoleBindings:        &Binding{Cluster: "c", Namespace: "n", Name: "b"},
		tableClusterRoleBindings: &Binding{Cluster: "c", Name: "b"},
		tableRevisions:           &revisionRow{Scope: "objects", Cluster: "c"},
	}
	if len(s) != len(samples) {
		t.Fatalf("schema has %d tables, test knows %d", len(s), len(samples))
	}
	seen := map[string]bool{}
	for _, table := range s {
		if seen[table.Name] {
			t.Fatalf("table %q described twice", table.Name)
		}
		seen[table.Name] = true
		sample, ok := samples[table.Name]
		if !ok {
			t.Fatalf("table %q has no sample", table.Name)
		}
		key, err := table.Key(sample)
		if err != nil || key == "" || key[len(key)-1] != 0 {
			t.Errorf("table %q: key of its sample = %q, %v; want a \\x00-terminated key", table.Name, key, err)
		}
		if _, err := table.Key(42); err == nil {
			t.Errorf("table %q: Key accepted a wrong type", table.Name)
		}
	}
	db, err := memtables.Open(s)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.Txn(true)
	for _, table := range s {
		if err := txn.Insert(table.Name, samples[table.Name]); err != nil {
			t.Fatalf("insert into %q: %v", table.Name, err)
		}
	}
	txn.Commit()
	read := db.Txn(false)
	for _, table := range s {
		key, _ := table.Key(samples[table.Name])
		if got, err := read.First(table.Name, indexID, memKey(key)); err != nil || got != samples[table.Name] {
			t.Errorf("table %q: First(%q) = %v, %v; want the sample", table.Name, key, got, err)
		}
		prefix := compoundKey("c")
		if table.Name == tableRevisions {
			prefix = compoundKey("objects")
		}
		it, err := read.Get(table.Name, tables.IndexIDPrefix, memKey(prefix))
		if err != nil {
			t.Fatal(err)
		}
		if got := it.Next(); got != samples[table.Name] || it.Next() != nil {
			t.Errorf("table %q: prefix %q did not read exactly the sample", table.Name, prefix)
		}
	}
}
