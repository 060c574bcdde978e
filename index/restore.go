package index

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ClusterSnapshot is everything the index holds about one cluster: its
// row, what it recorded about each kind, and every object and RBAC row.
// SnapshotCluster reads one and RestoreCluster writes one, so that another
// index (a replica, or a collector taking a cluster over) can be brought to
// the same state without replaying the writes that built it.
//
// Values read from the index share memory with it and must not be
// mutated.
type ClusterSnapshot struct {
	Name string
	// Cluster is the cluster row; nil when the index has none.
	Cluster *Cluster
	// Kinds are the kinds Replace and ReportKindError recorded, ordered by
	// group and kind.
	Kinds []KindState
	// Rows are the cluster's object and RBAC rows in key order. Object
	// rows carry the UpdatedAt the index stamped; RBAC rows carry their
	// identity and Policy only, which is all the index keeps of them.
	Rows []Object
	// Labels, when not nil, holds the labels of Rows, which then have no
	// Labels of their own: each distinct label once, and each row's as
	// indexes into it. SnapshotCluster leaves it nil; a snapshot read
	// from the stream (replication) has one.
	Labels *LabelTable
}

// LabelTable holds the labels of many rows with each distinct string and
// each distinct key=value pair once. The stream carries snapshots so, and
// RestoreCluster interns each string and each pair of the table once
// instead of once for every row that carries it: at 1M objects, interning
// labels row by row was the longest step of a new query replica's warm
// start.
type LabelTable struct {
	// Strings are the label keys and values.
	Strings []string
	// Pairs are the distinct labels, as indexes into Strings.
	Pairs []LabelPair
	// Refs index Pairs: row i's labels are Refs[Ends[i-1]:Ends[i]] (from
	// 0 for the first row).
	Refs []uint32
	Ends []uint32
}

// LabelPair is one key=value label of a LabelTable: the indexes of its
// key and value in the table's Strings.
type LabelPair struct{ Key, Value uint32 }

// Row returns the indexes into t.Pairs of row i's labels.
func (t *LabelTable) Row(i int) []uint32 {
	start := uint32(0)
	if i > 0 {
		start = t.Ends[i-1]
	}
	return t.Refs[start:t.Ends[i]]
}

// Labels returns row i's labels as Object.Labels holds them.
func (t *LabelTable) Labels(i int) Labels {
	refs := t.Row(i)
	if len(refs) == 0 {
		return Labels{}
	}
	kv := make([]labelKV, len(refs))
	for j, r := range refs {
		kv[j] = labelKV{key: t.Strings[t.Pairs[r].Key], value: t.Strings[t.Pairs[r].Value]}
	}
	sortLabels(kv)
	return Labels{kv: kv}
}

// validate checks that t holds the labels of rows: valid indexes, one
// span of them per row, no key twice in a row, and no row with Labels of
// its own.
func (t *LabelTable) validate(rows []Object) error {
	for i, p := range t.Pairs {
		if int(p.Key) >= len(t.Strings) || int(p.Value) >= len(t.Strings) {
			return fmt.Errorf("%w: label pair %d of a table of %d strings names string %d or %d", ErrInvalidRow, i, len(t.Strings), p.Key, p.Value)
		}
	}
	if len(t.Ends) != len(rows) {
		return fmt.Errorf("%w: a label table for %d rows, with %d rows", ErrInvalidRow, len(t.Ends), len(rows))
	}
	start := uint32(0)
	for i, end := range t.Ends {
		if end < start || int(end) > len(t.Refs) {
			return fmt.Errorf("%w: %s: labels %d to %d of a label table of %d", ErrInvalidRow, rows[i].Key(), start, end, len(t.Refs))
		}
		if !rows[i].Labels.IsZero() {
			return fmt.Errorf("%w: %s: labels of its own beside a label table", ErrInvalidRow, rows[i].Key())
		}
		refs := t.Refs[start:end]
		for j, r := range refs {
			if int(r) >= len(t.Pairs) {
				return fmt.Errorf("%w: %s: label %d of a table of %d", ErrInvalidRow, rows[i].Key(), r, len(t.Pairs))
			}
			for _, q := range refs[:j] {
				if k := t.Strings[t.Pairs[r].Key]; t.Strings[t.Pairs[q].Key] == k {
					return fmt.Errorf("%w: %s: label %q twice", ErrInvalidRow, rows[i].Key(), k)
				}
			}
		}
		start = end
	}
	return nil
}

// KindState is what the index recorded about one kind of a cluster.
type KindState struct {
	Kind Kind
	// Present is true once a Replace of the kind succeeded.
	Present bool
	// Error is the kind's current collection error, "" when there is
	// none, and ErrorSince when it was first reported.
	Error      string
	ErrorSince time.Time
}

// SnapshotCluster returns the cluster's state as one consistent read. A
// cluster the index does not know gives a snapshot with only Name set.
func (s *Store) SnapshotCluster(name string) ClusterSnapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	txn := s.db.Txn(false)
	snap := ClusterSnapshot{Name: name}
	raw, err := txn.First(tableClusters, indexID, memKey(compoundKey(name)))
	must(err)
	if c, ok := raw.(*Cluster); ok {
		snap.Cluster = c
	}
	it, err := txn.Get(tableKinds, indexIDPrefix, memKey(compoundKey(name)))
	must(err)
	for raw := it.Next(); raw != nil; raw = it.Next() {
		k := raw.(*kindRow)
		snap.Kinds = append(snap.Kinds, KindState{Kind: k.Kind, Present: k.Present, Error: k.Err, ErrorSince: fromUnixNano(k.ErrAt)})
	}
	x := s.x
	if cid, ok := x.clusters.lookup(name); ok && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
		x.byCluster[cid].rows.each(func(rid uint32) bool {
			var o Object
			x.fillObject(&o, x.rows[rid])
			snap.Rows = append(snap.Rows, o)
			return true
		})
	}
	for _, k := range policyKinds {
		it, err := txn.Get(policyTable(k.Kind), indexIDPrefix, memKey(compoundKey(name)))
		must(err)
		for raw := it.Next(); raw != nil; raw = it.Next() {
			o := Object{Cluster: name, Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource}
			switch v := raw.(type) {
			case *Role:
				o.Namespace, o.Name, o.Policy = v.Namespace, v.Name, &Policy{Rules: v.Rules}
			case *Binding:
				o.Namespace, o.Name, o.Policy = v.Namespace, v.Name, &Policy{RoleRef: v.RoleRef, Subjects: v.Subjects}
			}
			snap.Rows = append(snap.Rows, o)
		}
	}
	sortRowsByKey(snap.Rows)
	return snap
}

// sortRowsByKey orders rows by group, kind, namespace and name, which
// keeps rows of one kind and namespace together.
func sortRowsByKey(rows []Object) {
	type keyed struct {
		key Key
		i   int
	}
	keys := make([]keyed, len(rows))
	for i := range rows {
		keys[i] = keyed{rows[i].Key(), i}
	}
	slices.SortFunc(keys, func(a, b keyed) int { return compareKeys(&a.key, &b.key) })
	out := make([]Object, len(rows))
	for i, k := range keys {
		out[i] = rows[k.i]
	}
	copy(rows, out)
}

// RestoreCluster implements Sink. It makes the index's state of one
// cluster exactly snap, in one commit: rows not in snap are deleted, the
// others written with the UpdatedAt they carry, kinds and their errors set
// as recorded, and the cluster row written (or removed when snap has
// none). As with the other writes, what is already equal produces no
// event, so restoring the state the index has changes nothing.
func (s *Store) RestoreCluster(ctx context.Context, snap ClusterSnapshot) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: restore cluster %q: %w", snap.Name, err)
	}
	name := snap.Name
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return fmt.Errorf("%w: cluster name %q", ErrInvalidRow, name)
	}
	if snap.Cluster != nil && snap.Cluster.Name != name {
		return fmt.Errorf("%w: restore of cluster %q carries the row of cluster %q", ErrInvalidRow, name, snap.Cluster.Name)
	}
	kinds := make(map[groupKindName]*kindRow, len(snap.Kinds))
	for _, k := range snap.Kinds {
		gk := groupKindName{Group: k.Kind.Group, Kind: k.Kind.Kind}
		if k.Kind.Kind == "" || strings.IndexByte(k.Kind.Group+k.Kind.Kind, 0) >= 0 {
			return fmt.Errorf("%w: restore of cluster %q: invalid kind %q", ErrInvalidRow, name, k.Kind.GroupKind())
		}
		if kinds[gk] != nil {
			return fmt.Errorf("%w: restore of cluster %q: kind %s twice", ErrInvalidRow, name, k.Kind.GroupKind())
		}
		kinds[gk] = &kindRow{Cluster: name, Kind: k.Kind, Present: k.Present, Err: k.Error, ErrAt: unixNano(k.ErrorSince)}
	}
	if snap.Labels != nil {
		if err := snap.Labels.validate(snap.Rows); err != nil {
			return fmt.Errorf("index: restore cluster %q: %w", name, err)
		}
	}
	var policies map[string][]policyWrite
	for i := range snap.Rows {
		o := &snap.Rows[i]
		if o.Cluster != name {
			return fmt.Errorf("%w: %s: restore of cluster %q got a row of another cluster", ErrInvalidRow, o.Key(), name)
		}
		if err := s.validateRow(o); err != nil {
			return fmt.Errorf("index: restore cluster %q: %w", name, err)
		}
		if !IsPolicyKind(o.Group, o.Kind) {
			continue
		}
		pw, err := policyValue(o)
		if err != nil {
			return fmt.Errorf("index: restore cluster %q: %w", name, err)
		}
		if policies == nil {
			policies = map[string][]policyWrite{}
		}
		policies[o.Kind] = append(policies[o.Kind], pw)
	}
	// The object rows are read, never written: without RBAC rows they
	// are snap.Rows itself, which saves copying every row (about 300
	// bytes each) of a large cluster.
	objects, labels := snap.Rows, snap.Labels
	if len(policies) > 0 {
		objects = make([]Object, 0, len(snap.Rows))
		if snap.Labels != nil {
			labels = &LabelTable{Strings: snap.Labels.Strings, Pairs: snap.Labels.Pairs, Ends: make([]uint32, 0, len(snap.Rows))}
		}
		for i := range snap.Rows {
			if IsPolicyKind(snap.Rows[i].Group, snap.Rows[i].Kind) {
				continue
			}
			objects = append(objects, snap.Rows[i])
			if labels != nil {
				labels.Refs = append(labels.Refs, snap.Labels.Row(i)...)
				labels.Ends = append(labels.Ends, uint32(len(labels.Refs)))
			}
		}
	}
	return s.write(0, func(w *writeTxn) error {
		w.restore = true
		x := w.s.x
		stale := map[uint32]struct{}{}
		if cid, ok := x.clusters.lookup(name); ok && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
			x.byCluster[cid].rows.each(func(rid uint32) bool {
				stale[rid] = struct{}{}
				return true
			})
		}
		w.setObjects(stale, objects, labels)
		for _, kind := range []string{KindRole, KindClusterRole, KindRoleBinding, KindClusterRoleBinding} {
			w.replacePolicy(name, kind, policies[kind])
		}
		w.restoreKinds(name, kinds)
		w.restoreClusterRow(name, snap.Cluster)
		return nil
	})
}

// restoreKinds makes the kinds rows of a cluster exactly kinds.
func (w *writeTxn) restoreKinds(cluster string, kinds map[groupKindName]*kindRow) {
	it, err := w.mem().Get(tableKinds, indexIDPrefix, memKey(compoundKey(cluster)))
	must(err)
	var gone []*kindRow
	olds := map[groupKindName]*kindRow{}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		k := raw.(*kindRow)
		gk := groupKindName{Group: k.Kind.Group, Kind: k.Kind.Kind}
		if kinds[gk] == nil {
			gone = append(gone, k)
		} else {
			olds[gk] = k
		}
	}
	for _, k := range gone {
		must(w.mem().Delete(tableKinds, k))
		w.touch(tableKinds, cluster)
		if k.Present {
			w.policyChanged(cluster)
		}
	}
	for gk, nr := range kinds {
		w.putKind(olds[gk], nr)
	}
}

// restoreClusterRow writes the cluster row c, or removes the stored one
// when c is nil.
func (w *writeTxn) restoreClusterRow(name string, c *Cluster) {
	raw, err := w.mem().First(tableClusters, indexID, memKey(compoundKey(name)))
	must(err)
	old, _ := raw.(*Cluster)
	switch {
	case c == nil && old != nil:
		w.deleteClusterRow(old)
		w.emit(&Event{Type: EventClusterRemoved, Cluster: name, PreviousCluster: old})
		w.touch(tableClusters, name)
	case c != nil && (old == nil || !equalClusters(old, c)):
		nc := *c
		w.putClusterRow(&nc)
		w.emit(&Event{Type: EventCluster, Cluster: name, ClusterRow: &nc, PreviousCluster: old})
		w.touch(tableClusters, name)
	}
}
