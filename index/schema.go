package index

import (
	"fmt"
	"unsafe"

	"github.com/hashicorp/go-memdb"
)

// Table names. Every table has exactly one index, "id", over a compact key
// whose parts are terminated by "\x00"; prefix reads ("id_prefix") serve
// every per-cluster and per-namespace scan.
//
// Object rows are not a memdb table: see objIndex for why. memdb holds the
// small, watch-worthy tables (clusters, kinds, RBAC) and the per-cluster
// revisions, whose rows give WatchSets over object changes.
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
	indexID       = "id"
	indexIDPrefix = "id_prefix" // memdb's built-in prefix form of indexID
)

// Revision scopes stored in the revisions table in addition to table names.
const (
	revisionObjects = "objects" // object rows of one cluster
	revisionPolicy  = "policy"  // RBAC rows and kinds of one cluster
)

// dbSchema returns the memdb schema of the index. It panics on an invalid
// schema: the schema is static and covered by TestSchema.
func dbSchema() *memdb.DBSchema {
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	for _, t := range []*memdb.TableSchema{
		clustersTableSchema(),
		kindsTableSchema(),
		rolesTableSchema(),
		clusterRolesTableSchema(),
		roleBindingsTableSchema(),
		clusterRoleBindingsTableSchema(),
		revisionsTableSchema(),
	} {
		s.Tables[t.Name] = t
	}
	if err := s.Validate(); err != nil {
		panic(fmt.Sprintf("index: invalid memdb schema: %v", err))
	}
	return s
}

// clustersTableSchema holds one *Cluster per fleet member, keyed name\x00.
func clustersTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: tableClusters,
		Indexes: map[string]*memdb.IndexSchema{
			indexID: {
				Name:         indexID,
				AllowMissing: false,
				Unique:       true,
				Indexer:      keyIndexer[*Cluster]{key: func(c *Cluster) string { return compoundKey(c.Name) }},
			},
		},
	}
}

// kindsTableSchema holds one *kindRow per (cluster, group, kind): the kinds
// discovered through Replace and the per-kind collection errors, keyed
// cluster\x00group\x00kind\x00.
func kindsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: tableKinds,
		Indexes: map[string]*memdb.IndexSchema{
			indexID: {
				Name:         indexID,
				AllowMissing: false,
				Unique:       true,
				Indexer: keyIndexer[*kindRow]{key: func(k *kindRow) string {
					return compoundKey(k.Cluster, k.Kind.Group, k.Kind.Kind)
				}},
			},
		},
	}
}

// rolesTableSchema holds namespaced Roles as *Role, keyed
// cluster\x00namespace\x00name\x00.
func rolesTableSchema() *memdb.TableSchema {
	return policyTableSchema(tableRoles, func(r *Role) string { return compoundKey(r.Cluster, r.Namespace, r.Name) })
}

// clusterRolesTableSchema holds ClusterRoles as *Role, keyed
// cluster\x00name\x00.
func clusterRolesTableSchema() *memdb.TableSchema {
	return policyTableSchema(tableClusterRoles, func(r *Role) string { return compoundKey(r.Cluster, r.Name) })
}

// roleBindingsTableSchema holds RoleBindings as *Binding, keyed
// cluster\x00namespace\x00name\x00, so that one namespace or a whole cluster
// is a prefix read.
func roleBindingsTableSchema() *memdb.TableSchema {
	return policyTableSchema(tableRoleBindings, func(b *Binding) string { return compoundKey(b.Cluster, b.Namespace, b.Name) })
}

// clusterRoleBindingsTableSchema holds ClusterRoleBindings as *Binding,
// keyed cluster\x00name\x00.
func clusterRoleBindingsTableSchema() *memdb.TableSchema {
	return policyTableSchema(tableClusterRoleBindings, func(b *Binding) string { return compoundKey(b.Cluster, b.Name) })
}

// policyTableSchema is the shape shared by the four RBAC tables.
func policyTableSchema[T any](name string, key func(T) string) *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: name,
		Indexes: map[string]*memdb.IndexSchema{
			indexID: {
				Name:         indexID,
				AllowMissing: false,
				Unique:       true,
				Indexer:      keyIndexer[T]{key: key},
			},
		},
	}
}

// revisionsTableSchema holds one *revisionRow per (scope, cluster): the
// sequence number of the last change of that table (or of the policy scope)
// in that cluster, keyed scope\x00cluster\x00.
func revisionsTableSchema() *memdb.TableSchema {
	return &memdb.TableSchema{
		Name: tableRevisions,
		Indexes: map[string]*memdb.IndexSchema{
			indexID: {
				Name:         indexID,
				AllowMissing: false,
				Unique:       true,
				Indexer:      keyIndexer[*revisionRow]{key: func(r *revisionRow) string { return compoundKey(r.Scope, r.Cluster) }},
			},
		},
	}
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
type memKey string

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

// keyIndexer is a typed indexer over a precomputed key string. It indexes
// values of type T and is queried with one memKey argument, either a full
// key or (in the prefix form) a prefix of whole parts.
type keyIndexer[T any] struct {
	key func(T) string
}

// FromObject implements memdb.SingleIndexer. The returned slice aliases the
// key string without copying: memdb and iradix never write into keys.
func (k keyIndexer[T]) FromObject(raw any) (bool, []byte, error) {
	v, ok := raw.(T)
	if !ok {
		return false, nil, fmt.Errorf("index: indexer got %T, want %T", raw, *new(T))
	}
	s := k.key(v)
	if s == "" {
		return false, nil, nil
	}
	return true, unsafe.Slice(unsafe.StringData(s), len(s)), nil
}

// FromArgs implements memdb.Indexer.
func (k keyIndexer[T]) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("index: want one memKey argument, got %d", len(args))
	}
	s, ok := args[0].(memKey)
	if !ok {
		return nil, fmt.Errorf("index: want a memKey argument, got %T", args[0])
	}
	return []byte(s), nil
}

// PrefixFromArgs implements memdb.PrefixIndexer; the prefix is a memKey of
// whole parts.
func (k keyIndexer[T]) PrefixFromArgs(args ...any) ([]byte, error) {
	return k.FromArgs(args...)
}
