package index

import (
	"context"
	"fmt"
	"slices"
)

// Store implements Sink.
var _ Sink = (*Store)(nil)

// policyKinds are the RBAC kinds, as a Kubernetes API server serves
// them: the kinds IsPolicyKind names.
var policyKinds = [...]Kind{
	{Group: RBACGroup, Version: "v1", Kind: KindClusterRole, Resource: "clusterroles"},
	{Group: RBACGroup, Version: "v1", Kind: KindClusterRoleBinding, Resource: "clusterrolebindings"},
	{Group: RBACGroup, Version: "v1", Kind: KindRole, Resource: "roles", Namespaced: true},
	{Group: RBACGroup, Version: "v1", Kind: KindRoleBinding, Resource: "rolebindings", Namespaced: true},
}

// PolicyKinds returns the RBAC kinds (those IsPolicyKind reports), with
// the version, resource and scope an API server serves them with.
func PolicyKinds() []Kind { return slices.Clone(policyKinds[:]) }

// IsPolicyKind reports whether rows of group/kind are RBAC policy rows,
// which fill the RBAC tables and are never listed as objects.
func IsPolicyKind(group, kind string) bool {
	if group != RBACGroup {
		return false
	}
	for i := range policyKinds {
		if policyKinds[i].Kind == kind {
			return true
		}
	}
	return false
}

// Replace implements Sink. It diffs rows against the stored rows of the
// kind in the cluster, writes only what changed, deletes what is missing,
// records the kind as present and clears its error, all in one commit.
func (s *Store) Replace(ctx context.Context, cluster string, kind Kind, rows []Object) error {
	return s.replace(ctx, 0, cluster, kind, rows)
}

// replace is Replace at time at (0 for the clock).
func (s *Store) replace(ctx context.Context, at int64, cluster string, kind Kind, rows []Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: replace %s in %s: %w", kind.GroupKind(), cluster, err)
	}
	for i := range rows {
		o := &rows[i]
		if o.Cluster != cluster || o.Group != kind.Group || o.Kind != kind.Kind {
			return fmt.Errorf("%w: %s: Replace(%s, %s) got a row of another cluster or kind",
				ErrInvalidRow, o.Key(), cluster, kind.GroupKind())
		}
		if err := s.validateRow(o); err != nil {
			return fmt.Errorf("index: replace %s in %s: %w", kind.GroupKind(), cluster, err)
		}
	}
	if cluster == "" || kind.Kind == "" {
		return fmt.Errorf("%w: Replace needs a cluster and a kind", ErrInvalidRow)
	}
	policies, err := policyValues(rows)
	if err != nil {
		return fmt.Errorf("index: replace %s in %s: %w", kind.GroupKind(), cluster, err)
	}
	return s.write(at, func(w *writeTxn) error {
		w.recordKind(cluster, kind, true, "")
		if IsPolicyKind(kind.Group, kind.Kind) {
			w.replacePolicy(cluster, kind.Kind, policies)
			return nil
		}
		w.replaceObjects(cluster, kind, rows)
		return nil
	})
}

// Upsert implements Sink.
func (s *Store) Upsert(ctx context.Context, row Object) error {
	return s.UpsertBatch(ctx, []Object{row})
}

// UpsertBatch adds or changes many rows in one commit; it is what edge
// sessions and the ingest benchmark use for deltas. Rows of policy kinds go
// to the RBAC tables. Invalid rows fail the whole batch before anything is
// written. Concurrent Upserts and Deletes may share a commit (see
// writeGrouped); the rows of one call are always applied together.
func (s *Store) UpsertBatch(ctx context.Context, rows []Object) error {
	return s.upsertBatch(ctx, 0, rows)
}

// upsertBatch is UpsertBatch at time at (0 for the clock).
func (s *Store) upsertBatch(ctx context.Context, at int64, rows []Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: upsert: %w", err)
	}
	for i := range rows {
		if err := s.validateRow(&rows[i]); err != nil {
			return fmt.Errorf("index: upsert: %w", err)
		}
	}
	policies, err := policyValues(rows)
	if err != nil {
		return fmt.Errorf("index: upsert: %w", err)
	}
	s.writeGrouped(at, func(w *writeTxn) {
		if len(policies) == 0 {
			if _, ok := w.upsertBulk(rows, nil); ok {
				return
			}
		}
		for _, pw := range policies {
			w.putPolicy(pw)
		}
		for i := range rows {
			if o := &rows[i]; !IsPolicyKind(o.Group, o.Kind) {
				w.upsertObject(o)
			}
		}
	})
	return nil
}

// Delete implements Sink.
func (s *Store) Delete(ctx context.Context, key Key) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: delete %s: %w", key, err)
	}
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("index: delete: %w", err)
	}
	s.writeGrouped(0, func(w *writeTxn) {
		if IsPolicyKind(key.Group, key.Kind) {
			w.deletePolicy(key)
			return
		}
		if r := w.s.x.lookup(&key); r != nil {
			w.deleteObject(r)
		}
	})
	return nil
}

// upsertObject writes o unless the stored row has the same content.
func (w *writeTxn) upsertObject(o *Object) {
	k := o.Key()
	w.putObject(o, w.s.x.lookup(&k))
}

// putObject writes o over old (nil when the key is not stored) unless both
// have the same content.
func (w *writeTxn) putObject(o *Object, old *objRow) {
	x := w.s.x
	var buf [16]uint32
	var ids []uint32
	if old != nil && x.sameLabels(o.Labels, old) {
		ids = old.labelIDs(buf[:0]) // no interning for unchanged labels
	} else {
		ids = x.internLabels(buf[:0], o.Labels)
	}
	if r := w.putRow(o, old, ids); r != nil {
		x.updateLabels(old, r, x.view())
	}
}

// putRow is putObject with o's sorted label pair ids given, except that it
// leaves the label index to the caller (x.updateLabels). It
// returns the new row, or nil when o equals old. It does not read the
// label dictionary.
func (w *writeTxn) putRow(o *Object, old *objRow, ids []uint32) *objRow {
	x := w.s.x
	if old != nil && old.hasLabels(ids) && sameFields(o, old) {
		return nil
	}
	r := x.buildRow(o, ids)
	if !w.restore {
		r.updated = w.now
	}
	cluster := x.clusters.str(r.cid)
	if old == nil {
		x.insertRow(r)
		w.objectEvent(EventAdded, cluster, r, nil)
	} else {
		x.updateRow(old, r)
		w.objectEvent(EventModified, cluster, r, old)
	}
	w.touch(revisionObjects, cluster)
	return r
}

// bulkMin is the batch size from which UpsertBatch indexes labels on a
// helper goroutine (see upsertBulk), and bulkChunk how many rows the
// helper hands over at a time.
const (
	bulkMin   = 256
	bulkChunk = 64
)

// rowLabels interns the labels of one write's rows: each row's own
// Labels, or a LabelTable's strings and pairs, each the first time a row
// of the write uses it (so that nothing is interned that no row of the
// write carries: see recycler).
type rowLabels struct {
	rows  []Object
	table *LabelTable
	// By table pair, its pair id; by table string, its key and value ids:
	// each plus one, once interned.
	pids, kids, vids []uint32
}

func newRowLabels(rows []Object, table *LabelTable) *rowLabels {
	l := &rowLabels{rows: rows, table: table}
	if table != nil {
		l.pids = make([]uint32, len(table.Pairs))
		l.kids, l.vids = make([]uint32, len(table.Strings)), make([]uint32, len(table.Strings))
	}
	return l
}

// count returns how many labels row i has.
func (l *rowLabels) count(i int) int {
	if l.table == nil {
		return l.rows[i].Labels.Len()
	}
	return len(l.table.Row(i))
}

// intern appends the sorted pair ids of row i's labels to dst.
func (l *rowLabels) intern(x *objIndex, dst []uint32, i int) []uint32 {
	if l.table == nil {
		return x.internLabels(dst, l.rows[i].Labels)
	}
	n := len(dst)
	for _, ref := range l.table.Row(i) {
		if l.pids[ref] == 0 {
			p := l.table.Pairs[ref]
			if l.kids[p.Key] == 0 {
				l.kids[p.Key] = x.labels.keys.intern(l.table.Strings[p.Key]) + 1
			}
			if l.vids[p.Value] == 0 {
				l.vids[p.Value] = x.labels.values.intern(l.table.Strings[p.Value]) + 1
			}
			l.pids[ref] = x.labels.internIDs(l.kids[p.Key]-1, l.vids[p.Value]-1) + 1
		}
		dst = append(dst, l.pids[ref]-1)
	}
	slices.Sort(dst[n:])
	return dst
}

// upsertBulk is upsertObject for each of many object rows, whose labels
// are their own or, when table is not nil, in table (see LabelTable), on
// three goroutines. A new row's labels cost about half of its indexing
// (each label is looked up in a pair map of about 1.7M entries at 1M
// objects, a cache miss, and added to that pair's postings), and they
// touch nothing but the label dictionary and postings. So a helper
// goroutine interns every row's labels while this one looks up, builds
// and indexes the rows a chunk behind it; once every label is interned
// (the dictionary no longer changes), a second helper adds the rows this
// one has stored to the postings of their labels, a chunk behind it, and
// finishes while this one adds the rows to the name order. It returns the
// stored row each row replaced (nil for a new one). It reports false,
// having changed nothing, for fewer than bulkMin rows and when two rows
// may share a key: it looks up every stored row first, so rows must be
// independent. Rows must not be policy rows.
func (w *writeTxn) upsertBulk(rows []Object, table *LabelTable) (olds []*objRow, ok bool) {
	if len(rows) < bulkMin {
		return nil, false
	}
	x := w.s.x
	labels := newRowLabels(rows, table)
	olds = make([]*objRow, len(rows))
	seen := make(map[uint64]struct{}, len(rows))
	nLabels := 0
	for i := range rows {
		key := rows[i].Key()
		h := x.byKey.hash(&key)
		if _, dup := seen[h]; dup {
			return nil, false
		}
		seen[h] = struct{}{}
		olds[i] = x.lookupHashed(h, &key)
		nLabels += labels.count(i)
	}
	// ids[ends[i-1]:ends[i]] are the label pair ids of rows[i]; ready
	// carries how many rows the helper has done, and interned is closed
	// when it has done them all.
	ids, ends := make([]uint32, nLabels), make([]int, len(rows))
	ready := make(chan int, len(rows)/bulkChunk+1)
	interned := make(chan struct{})
	go func() {
		defer close(interned)
		var tmp [16]uint32
		end := 0
		for i := range rows {
			end += copy(ids[end:], labels.intern(x, tmp[:0], i))
			ends[i] = end
			if (i+1)%bulkChunk == 0 || i == len(rows)-1 {
				ready <- i + 1
			}
		}
	}()
	// stored hands the second helper the changes so far, and a view of
	// the row id space for them: x.rows, x.pfx and x.gens are this
	// goroutine's.
	type change struct{ old, new *objRow }
	type handoff struct {
		changes []change
		view    rowView
	}
	changes := make([]change, 0, len(rows)) // never grown: the helper reads it
	stored := make(chan handoff, len(rows)/bulkChunk+2)
	helped := make(chan struct{})
	go func() {
		defer close(helped)
		<-interned
		done := 0
		for h := range stored {
			for _, c := range h.changes[done:] {
				x.updateLabels(c.old, c.new, h.view)
			}
			done = len(h.changes)
		}
	}()
	for i, done, start := 0, 0, 0; i < len(rows); i++ {
		for done <= i {
			done = <-ready
		}
		if r := w.putRow(&rows[i], olds[i], ids[start:ends[i]]); r != nil {
			changes = append(changes, change{olds[i], r})
		}
		start = ends[i]
		if (i+1)%bulkChunk == 0 || i == len(rows)-1 {
			stored <- handoff{changes, x.view()}
		}
	}
	close(stored)
	x.byName.flush()
	<-helped
	return olds, true
}

// deleteObject removes a stored row.
func (w *writeTxn) deleteObject(r *objRow) {
	w.s.x.remove(r)
	cluster := w.s.x.clusters.str(r.cid)
	w.objectEvent(EventDeleted, cluster, r, nil)
	w.touch(revisionObjects, cluster)
}

// replaceObjects makes the stored rows of one kind in one cluster equal to
// rows. It finds the stored rows by key, as Upsert does, and deletes those
// of the kind that rows do not name.
func (w *writeTxn) replaceObjects(cluster string, kind Kind, rows []Object) {
	x := w.s.x
	stale := map[uint32]struct{}{}
	if cid, ok := x.clusters.lookup(cluster); ok && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
		for _, kid := range x.kinds.kidsOfGK[groupKindName{Group: kind.Group, Kind: kind.Kind}] {
			x.byCluster[cid].eachOfKind(kid, func(rid uint32) bool {
				stale[rid] = struct{}{}
				return true
			})
		}
	}
	w.setObjects(stale, rows, nil)
}

// setObjects writes rows, which must be object rows, and deletes the rows
// of stale (row ids) that rows do not name: the stored rows of a scope
// become rows.
func (w *writeTxn) setObjects(stale map[uint32]struct{}, rows []Object, table *LabelTable) {
	x := w.s.x
	olds, ok := w.upsertBulk(rows, table)
	if !ok {
		labels := newRowLabels(rows, table)
		// Later duplicates of a key win, as they would in a sequence of
		// Upserts.
		last := make(map[Key]int, len(rows))
		for i := range rows {
			last[rows[i].Key()] = i
		}
		olds = make([]*objRow, len(rows))
		for i := range rows {
			if last[rows[i].Key()] != i {
				continue
			}
			k := rows[i].Key()
			olds[i] = x.lookup(&k)
			if table == nil {
				w.putObject(&rows[i], olds[i])
				continue
			}
			var ids [16]uint32
			if r := w.putRow(&rows[i], olds[i], labels.intern(x, ids[:0], i)); r != nil {
				x.updateLabels(olds[i], r, x.view())
			}
		}
	}
	for _, old := range olds {
		if old != nil {
			delete(stale, old.rid)
		}
	}
	for rid := range stale {
		w.deleteObject(x.rows[rid])
	}
}

// Get returns the object with key k.
func (s *Store) Get(k Key) (*Object, bool) {
	return s.GetWatch(nil, k)
}

// GetWatch is Get that also adds to w a watch that fires on the next
// change of any object of the key's cluster, for blocking reads.
func (s *Store) GetWatch(w *Watch, k Key) (*Object, bool) {
	if w != nil {
		s.ObjectsRevision(w, k.Cluster)
	}
	if IsPolicyKind(k.Group, k.Kind) {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.x.lookup(&k)
	if r == nil {
		return nil, false
	}
	return s.x.object(r), true
}
