package index

import (
	"testing"

	"github.com/hashicorp/go-memdb"
)

// TestSchema walks every table and index: names match their keys, every
// table has a unique, non-missing id index, and each indexer round-trips a
// sample row through FromObject and FromArgs.
func TestSchema(t *testing.T) {
	s := dbSchema()
	samples := map[string]any{
		tableClusters:            &Cluster{Name: "c"},
		tableKinds:               &kindRow{Cluster: "c", Kind: Kind{Group: "g", Kind: "K"}},
		tableRoles:               &Role{Cluster: "c", Namespace: "n", Name: "r"},
		tableClusterRoles:        &Role{Cluster: "c", Name: "r"},
		tableRoleBindings:        &Binding{Cluster: "c", Namespace: "n", Name: "b"},
		tableClusterRoleBindings: &Binding{Cluster: "c", Name: "b"},
		tableRevisions:           &revisionRow{Scope: "objects", Cluster: "c"},
	}
	if len(s.Tables) != len(samples) {
		t.Fatalf("schema has %d tables, test knows %d", len(s.Tables), len(samples))
	}
	for name, table := range s.Tables {
		t.Run(name, func(t *testing.T) {
			if table.Name != name {
				t.Errorf("table %q registered as %q", table.Name, name)
			}
			id, ok := table.Indexes[indexID]
			if !ok || !id.Unique || id.AllowMissing {
				t.Fatalf("table %q: id index must exist, be unique and not allow missing", name)
			}
			for iname, idx := range table.Indexes {
				if idx.Name != iname {
					t.Errorf("index %q registered as %q", idx.Name, iname)
				}
				single, ok := idx.Indexer.(memdb.SingleIndexer)
				if !ok {
					t.Fatalf("index %q is not a SingleIndexer", iname)
				}
				ok, val, err := single.FromObject(samples[name])
				if err != nil || !ok {
					t.Fatalf("FromObject: %v %v", ok, err)
				}
				if val[len(val)-1] != 0 {
					t.Errorf("key %q is not \\x00-terminated", val)
				}
				arg, err := idx.Indexer.FromArgs(memKey(val))
				if err != nil || string(arg) != string(val) {
					t.Errorf("FromArgs = %q, %v; want %q", arg, err, val)
				}
				if _, err := idx.Indexer.FromArgs("raw string"); err == nil {
					t.Error("FromArgs accepted a raw string")
				}
				if _, _, err := single.FromObject(42); err == nil {
					t.Error("FromObject accepted a wrong type")
				}
			}
		})
	}
	// The schema must be usable.
	if _, err := memdb.NewMemDB(s); err != nil {
		t.Fatal(err)
	}
}
