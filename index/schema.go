package index

import (
	"fmt"

	"github.com/fleetgraph/fleetgraph/index/tables"
)

// Table names. Every table has exactly one index, "id", over a compact key
// whose parts are terminated by "\x00"; prefix reads ("id_prefix") serve
// every per-cluster and per-namespace scan.
//
// Object rows are not a table: see objIndex for why. The tables (kept in
// the database index/tables describes, go-memdb in production) hold the
// small, watch-worthy rows (clusters, kinds, RBAC) and the per-cluster
// revisions, whose rows give watches over their changes.
const (
	tableClusters            = "clusters"
	tableKinds               = "kinds"
	tableRoles               = "roles"
	tableClusterRoles        = "clusterroles"
	tableRoleBindings        = "rolebindings"
	tableClusterRoleBindings = "clusterrolebindings"
	tableRevisions           = "revisions"
)

// Index names.
const (
	indexID       = tables.IndexID
	indexIDPrefix = tables.IndexIDPrefix
)

// Revision scopes stored in the revisions table in addition to table names.
const (
	revisionObjects = "objects" // object rows of one cluster
	revisionPolicy  = "policy"  // RBAC rows and kinds of one cluster
)

// schema describes the index's tables to the database that holds them
// (see index/tables).
func schema() []tables.Table {
	return []tables.Table{
		clustersTable(),
		kindsTable(),
		rolesTable(),
		clusterRolesTable(),
		roleBindingsTable(),
		clusterRoleBindingsTable(),
		revisionsTable(),
	}
}

// clustersTable holds one *Cluster per fleet member, keyed name\x00.
func clustersTable() tables.Table {
	return keyedTable(tableClusters, func(c *Cluster) string { return compoundKey(c.Name) })
}

// kindsTable holds one *kindRow per (cluster, group, kind): the kinds
// discovered through Replace and the per-kind collection errors, keyed
// cluster\x00group\x00kind\x00.
func kindsTable() tables.Table {
	return keyedTable(tableKinds, func(k *kindRow) string {
		return compoundKey(k.Cluster, k.Kind.Group, k.Kind.Kind)
	})
}

// rolesTable holds namespaced Roles as *Role, keyed
// cluster\x00namespace\x00name\x00.
func rolesTable() tables.Table {
	return keyedTable(tableRoles, func(r *Role) string { return compoundKey(r.Cluster, r.Namespace, r.Name) })
}

// clusterRolesTable holds ClusterRoles as *Role, keyed cluster\x00name\x00.
func clusterRolesTable() tables.Table {
	return keyedTable(tableClusterRoles, func(r *Role) string { return compoundKey(r.Cluster, r.Name) })
}

// roleBindingsTable holds RoleBindings as *Binding, keyed
// cluster\x00namespace\x00name\x00, so that one namespace or a whole cluster
// is a prefix read.
func roleBindingsTable() tables.Table {
	return keyedTable(tableRoleBindings, func(b *Binding) string { return compoundKey(b.Cluster, b.Namespace, b.Name) })
}

// clusterRoleBindingsTable holds ClusterRoleBindings as *Binding, keyed
// cluster\x00name\x00.
func clusterRoleBindingsTable() tables.Table {
	return keyedTable(tableClusterRoleBindings, func(b *Binding) string { return compoundKey(b.Cluster, b.Name) })
}

// revisionsTable holds one *revisionRow per (scope, cluster): the sequence
// number of the last change of that table (or of the policy scope) in that
// cluster, keyed scope\x00cluster\x00.
func revisionsTable() tables.Table {
	return keyedTable(tableRevisions, func(r *revisionRow) string { return compoundKey(r.Scope, r.Cluster) })
}

// keyedTable describes a table whose rows are of type T, keyed by key.
func keyedTable[T any](name string, key func(T) string) tables.Table {
	return tables.Table{Name: name, Key: func(raw any) (string, error) {
		v, ok := raw.(T)
		if !ok {
			return "", fmt.Errorf("index: table %s got %T, want %T", name, raw, *new(T))
		}
		return key(v), nil
	}}
}

// revisionRow is the last sequence number that changed a scope of a
// cluster.
type revisionRow struct {
	Scope    string
	Cluster  string
	Revision uint64
}

// kindRow records what the index knows about one kind of one cluster.
type kindRow struct {
	Cluster string
	Kind    Kind
	// Present is true once a Replace succeeded for the kind.
	Present bool
	// Err and ErrAt hold the last collection error; empty once a Replace
	// succeeds.
	Err   string
	ErrAt int64
}

// memKey is an already encoded index key ("a\x00b\x00"). Reads pass it as
// the only argument of First, Get and the prefix forms, so callers cannot
// mix raw strings and encoded keys.
type memKey = tables.Key

// compoundKey encodes parts as part\x00part\x00..., the encoding of every
// "id" index. Parts never contain \x00 (validated on write).
func compoundKey(parts ...string) string {
	n := 0
	for _, p := range parts {
		n += len(p) + 1
	}
	return string(appendKey(make([]byte, 0, n), parts...))
}

// appendKey appends the compoundKey of parts to b.
func appendKey(b []byte, parts ...string) []byte {
	for _, p := range parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	return b
}
