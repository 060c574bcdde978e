package index

import (
	"fmt"
	"slices"
	"strings"
)

// policyTable returns the RBAC table of a policy kind.
func policyTable(kind string) string {
	switch kind {
	case KindRole:
		return tableRoles
	case KindClusterRole:
		return tableClusterRoles
	case KindRoleBinding:
		return tableRoleBindings
	default:
		return tableClusterRoleBindings
	}
}

// policyKey returns the memdb key of a policy row.
func policyKey(k Key) string {
	switch k.Kind {
	case KindRole, KindRoleBinding:
		return compoundKey(k.Cluster, k.Namespace, k.Name)
	default:
		return compoundKey(k.Cluster, k.Name)
	}
}

// checkPolicyScope checks that an RBAC row is namespaced as its kind is:
// Role and RoleBinding are, ClusterRole and ClusterRoleBinding are not.
func checkPolicyScope(o *Object) error {
	namespaced := o.Kind == KindRole || o.Kind == KindRoleBinding
	if namespaced != (o.Namespace != "") {
		return fmt.Errorf("%w: %s: a %s must %sbe namespaced", ErrInvalidRow, o.Key(), o.Kind, map[bool]string{true: "", false: "not "}[namespaced])
	}
	return nil
}

// policyWrite is one policy row converted for its RBAC table: the stored
// *Role or *Binding and the table that holds it.
type policyWrite struct {
	table string
	value any // *Role or *Binding
}

// policyValue converts a policy row into the stored *Role or *Binding. It
// is the write paths' own check of a policy row, whatever the caller
// validated: a row the RBAC tables cannot hold is an ErrInvalidRow here,
// before the write takes the lock.
func policyValue(o *Object) (policyWrite, error) {
	if err := checkPolicyScope(o); err != nil {
		return policyWrite{}, err
	}
	p := o.Policy
	if p == nil {
		p = &Policy{}
	}
	table := policyTable(o.Kind)
	switch o.Kind {
	case KindRole, KindClusterRole:
		return policyWrite{table, &Role{Cluster: o.Cluster, Namespace: o.Namespace, Name: o.Name, Rules: p.Rules}}, nil
	default:
		return policyWrite{table, &Binding{Cluster: o.Cluster, Namespace: o.Namespace, Name: o.Name, RoleRef: p.RoleRef, Subjects: p.Subjects}}, nil
	}
}

// policyValues converts the policy rows of rows (other rows are skipped),
// in order. Writes call it before they take the lock, so that a policy row
// the tables cannot hold refuses the whole write (the finding of
// TestWriteRefusesWhatValidateRowLetThrough) instead of failing half way
// through it, where objIndex, which is not transactional, may already
// have changed.
func policyValues(rows []Object) ([]policyWrite, error) {
	var out []policyWrite
	for i := range rows {
		if !IsPolicyKind(rows[i].Group, rows[i].Kind) {
			continue
		}
		pw, err := policyValue(&rows[i])
		if err != nil {
			return nil, err
		}
		out = append(out, pw)
	}
	return out, nil
}

// putPolicy stores a converted policy row unless an equal one is stored.
func (w *writeTxn) putPolicy(pw policyWrite) {
	old, err := w.mem().First(pw.table, indexID, memKey(policyRowKey(pw.value)))
	must(err)
	if old != nil && samePolicy(old, pw.value) {
		return
	}
	must(w.mem().Insert(pw.table, pw.value))
	w.policyChanged(policyCluster(pw.value))
}

// policyCluster returns the cluster of a stored *Role or *Binding.
func policyCluster(raw any) string {
	if r, ok := raw.(*Role); ok {
		return r.Cluster
	}
	return raw.(*Binding).Cluster
}

// samePolicy reports whether two stored policy values (*Role or *Binding)
// are equal, so that a resync of unchanged RBAC rows changes no revision.
// A nil and an empty list are equal, as they are to RBAC.
func samePolicy(a, b any) bool {
	switch x := a.(type) {
	case *Role:
		y, ok := b.(*Role)
		return ok && x.Cluster == y.Cluster && x.Namespace == y.Namespace && x.Name == y.Name &&
			slices.EqualFunc(x.Rules, y.Rules, sameRule)
	case *Binding:
		y, ok := b.(*Binding)
		return ok && x.Cluster == y.Cluster && x.Namespace == y.Namespace && x.Name == y.Name &&
			x.RoleRef == y.RoleRef && slices.Equal(x.Subjects, y.Subjects)
	}
	return false
}

func sameRule(a, b PolicyRule) bool {
	return slices.Equal(a.Verbs, b.Verbs) && slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
		slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.NonResourceURLs, b.NonResourceURLs)
}

// deletePolicy removes one policy row if stored.
func (w *writeTxn) deletePolicy(k Key) {
	table := policyTable(k.Kind)
	old, err := w.mem().First(table, indexID, memKey(policyKey(k)))
	must(err)
	if old == nil {
		return
	}
	must(w.mem().Delete(table, old))
	w.policyChanged(k.Cluster)
}

// replacePolicy makes the policy rows of one kind in one cluster equal to
// rows, converted by policyValues before the write: it cannot fail.
func (w *writeTxn) replacePolicy(cluster, kind string, rows []policyWrite) {
	table := policyTable(kind)
	keep := make(map[string]struct{}, len(rows))
	for _, pw := range rows {
		keep[policyRowKey(pw.value)] = struct{}{}
		w.putPolicy(pw)
	}
	it, err := w.mem().Get(table, indexIDPrefix, memKey(compoundKey(cluster)))
	must(err)
	var gone []any
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if _, ok := keep[policyRowKey(raw)]; !ok {
			gone = append(gone, raw)
		}
	}
	for _, raw := range gone {
		must(w.mem().Delete(table, raw))
		w.policyChanged(cluster)
	}
}

// policyRowKey returns the memdb key of a stored *Role or *Binding.
func policyRowKey(raw any) string {
	switch v := raw.(type) {
	case *Role:
		if v.Namespace == "" {
			return compoundKey(v.Cluster, v.Name)
		}
		return compoundKey(v.Cluster, v.Namespace, v.Name)
	case *Binding:
		if v.Namespace == "" {
			return compoundKey(v.Cluster, v.Name)
		}
		return compoundKey(v.Cluster, v.Namespace, v.Name)
	}
	panic(fmt.Sprintf("index: not a policy row: %T", raw))
}

// deleteClusterPolicy removes every policy row of a cluster.
func (w *writeTxn) deleteClusterPolicy(cluster string) {
	for _, table := range []string{tableRoles, tableClusterRoles, tableRoleBindings, tableClusterRoleBindings} {
		n, err := w.mem().DeleteAll(table, indexIDPrefix, memKey(compoundKey(cluster)))
		must(err)
		if n > 0 {
			w.policyChanged(cluster)
		}
	}
}

// GetRole returns a namespaced Role. authz reads RBAC through this and the
// other getters below; values are shared and must not be mutated.
func (s *Store) GetRole(cluster, namespace, name string) (*Role, bool) {
	return firstAs[*Role](s, tableRoles, compoundKey(cluster, namespace, name))
}

// GetClusterRole returns a ClusterRole.
func (s *Store) GetClusterRole(cluster, name string) (*Role, bool) {
	return firstAs[*Role](s, tableClusterRoles, compoundKey(cluster, name))
}

// ListRoleBindings returns the RoleBindings of one namespace of a cluster,
// or of every namespace when namespace is "", in key order.
func (s *Store) ListRoleBindings(cluster, namespace string) []*Binding {
	prefix := compoundKey(cluster)
	if namespace != "" {
		prefix = compoundKey(cluster, namespace)
	}
	return listAs[*Binding](s, nil, tableRoleBindings, prefix)
}

// ListClusterRoleBindings returns the ClusterRoleBindings of a cluster in
// name order.
func (s *Store) ListClusterRoleBindings(cluster string) []*Binding {
	return listAs[*Binding](s, nil, tableClusterRoleBindings, compoundKey(cluster))
}

// PolicyRows returns how many RBAC rows a cluster has, by kind (Role,
// ClusterRole, RoleBinding, ClusterRoleBinding). It walks them, so it
// costs a few microseconds per thousand rows; edge sessions use it to hold
// an edge to its quota.
func (s *Store) PolicyRows(cluster string) map[string]int {
	txn := s.db.Txn(false)
	out := map[string]int{}
	for _, kind := range []string{KindRole, KindClusterRole, KindRoleBinding, KindClusterRoleBinding} {
		it, err := txn.Get(policyTable(kind), indexIDPrefix, memKey(compoundKey(cluster)))
		must(err)
		for raw := it.Next(); raw != nil; raw = it.Next() {
			out[kind]++
		}
	}
	return out
}

// PolicyRevision returns a number that changes whenever an RBAC row or the
// kinds set of the cluster changes, and only then. It is the sequence
// number of the EventPolicy that reported the change (0 before the first,
// and again once RemoveCluster removed the cluster).
func (s *Store) PolicyRevision(cluster string) uint64 {
	return s.revision(revisionPolicy, cluster)
}

// PolicyRevisions is the policy side of the fleet at one moment: what
// authz compiles access from, and when it must compile again.
type PolicyRevisions struct {
	// Clusters maps every cluster whose RBAC rows or kinds the index holds
	// to its PolicyRevision. A cluster enters with its first RBAC row or
	// kind and leaves with RemoveCluster; a cluster that is not listed
	// grants nothing.
	Clusters map[string]uint64
	// Changed is closed when any cluster's policy next changes, including
	// a cluster entering or leaving. It may also close for a change that
	// left Clusters as it was; compare them then. Holding it costs nothing
	// and needs no release.
	Changed <-chan struct{}
}

// WatchPolicies returns the policy revision of every cluster and a channel
// closed at the next change of any of them, read from one snapshot: a
// change racing with the read closes the channel, so a caller that
// compiles from the rows read after it can never hold stale access while
// the channel is open.
func (s *Store) WatchPolicies() PolicyRevisions {
	it, err := s.db.Txn(false).Get(tableRevisions, indexIDPrefix, memKey(compoundKey(revisionPolicy)))
	must(err)
	out := PolicyRevisions{Clusters: map[string]uint64{}, Changed: it.WatchCh()}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		r := raw.(*revisionRow)
		out.Clusters[r.Cluster] = r.Revision
	}
	return out
}

// Kinds returns the kinds recorded for a cluster by successful Replace
// calls, with Resource and Namespaced from discovery, ordered by group and
// kind.
func (s *Store) Kinds(cluster string) []Kind {
	var out []Kind
	for _, k := range listAs[*kindRow](s, nil, tableKinds, compoundKey(cluster)) {
		if k.Present {
			out = append(out, k.Kind)
		}
	}
	slices.SortFunc(out, func(a, b Kind) int {
		if c := strings.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out
}

// firstAs reads one row of type T by full key from a memdb snapshot.
func firstAs[T any](s *Store, table, key string) (T, bool) {
	raw, err := s.db.Txn(false).First(table, indexID, memKey(key))
	must(err)
	v, ok := raw.(T)
	return v, ok
}

// listAs reads the rows of type T under a key prefix from a memdb
// snapshot, adding the iterator's watch channel to ws.
func listAs[T any](s *Store, w *Watch, table, prefix string) []T {
	it, err := s.db.Txn(false).Get(table, indexIDPrefix, memKey(prefix))
	must(err)
	w.add(it.WatchCh())
	var out []T
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(T))
	}
	return out
}
