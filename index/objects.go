package index

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-memdb"
)

// Store implements Sink.
var _ Sink = (*Store)(nil)

// isPolicyKind reports whether rows of group/kind are RBAC policy rows.
func isPolicyKind(group, kind string) bool {
	if group != RBACGroup {
		return false
	}
	switch kind {
	case KindRole, KindClusterRole, KindRoleBinding, KindClusterRoleBinding:
		return true
	}
	return false
}

// Replace implements Sink. It diffs rows against the stored rows of the
// kind in the cluster, writes only what changed, deletes what is missing,
// records the kind as present and clears its error, all in one commit.
func (s *Store) Replace(ctx context.Context, cluster string, kind Kind, rows []Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: replace %s in %s: %w", kind.GroupKind(), cluster, err)
	}
	for i := range rows {
		o := &rows[i]
		if o.Cluster != cluster || o.Group != kind.Group || o.Kind != kind.Kind {
			return fmt.Errorf("%w: %s: Replace(%s, %s) got a row of another cluster or kind",
				ErrInvalidRow, o.Key(), cluster, kind.GroupKind())
		}
		if err := validateKey(o.Key()); err != nil {
			return fmt.Errorf("index: replace %s in %s: %w", kind.GroupKind(), cluster, err)
		}
	}
	if cluster == "" || kind.Kind == "" {
		return fmt.Errorf("%w: Replace needs a cluster and a kind", ErrInvalidRow)
	}
	return s.write(func(w *writeTxn) error {
		w.recordKind(cluster, kind, true, "")
		if isPolicyKind(kind.Group, kind.Kind) {
			return w.replacePolicy(cluster, kind.Kind, rows)
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
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: upsert: %w", err)
	}
	for i := range rows {
		if err := validateKey(rows[i].Key()); err != nil {
			return fmt.Errorf("index: upsert: %w", err)
		}
		if isPolicyKind(rows[i].Group, rows[i].Kind) {
			if _, err := policyValue(&rows[i]); err != nil {
				return fmt.Errorf("index: upsert: %w", err)
			}
		}
	}
	s.writeGrouped(func(w *writeTxn) {
		for i := range rows {
			o := &rows[i]
			if isPolicyKind(o.Group, o.Kind) {
				must(w.upsertPolicy(o)) // cannot fail: validated above
				continue
			}
			w.upsertObject(o)
		}
	})
	return nil
}

// Delete implements Sink.
func (s *Store) Delete(ctx context.Context, key Key) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: delete %s: %w", key, err)
	}
	if err := validateKey(key); err != nil {
		return fmt.Errorf("index: delete: %w", err)
	}
	s.writeGrouped(func(w *writeTxn) {
		if isPolicyKind(key.Group, key.Kind) {
			w.deletePolicy(key)
			return
		}
		if r := w.s.x.get(objectKey(key)); r != nil {
			w.deleteObject(r)
		}
	})
	return nil
}

// upsertObject writes o unless the stored row has the same content.
func (w *writeTxn) upsertObject(o *Object) {
	var buf [256]byte
	w.putObject(o, "", w.s.x.lookup(appendObjectKey(buf[:0], o.Key())))
}

// putObject writes o over old (nil when the key is not stored) unless both
// have the same content. key is o's objectKey, or "" to compute it when
// needed.
func (w *writeTxn) putObject(o *Object, key string, old *objRow) {
	x := w.s.x
	var same *objRow // old, if the labels did not change
	if old != nil {
		if x.sameLabels(o.Labels, old) {
			if sameFields(o, old) {
				return
			}
			same = old
		}
		key = old.key // the stored key string; see nameOrder
	} else if key == "" {
		key = objectKey(o.Key())
	}
	r := x.buildRow(o, key, same)
	r.updated = w.now
	cluster := x.clusters.str(r.cid)
	if old == nil {
		x.insert(r)
		w.objectEvent(EventAdded, cluster, r, nil)
	} else {
		x.update(old, r)
		w.objectEvent(EventModified, cluster, r, old)
	}
	w.touch(revisionObjects, cluster)
}

// deleteObject removes a stored row.
func (w *writeTxn) deleteObject(r *objRow) {
	w.s.x.remove(r)
	cluster := w.s.x.clusters.str(r.cid)
	w.objectEvent(EventDeleted, cluster, r, nil)
	w.touch(revisionObjects, cluster)
}

// replaceObjects makes the stored rows of one kind in one cluster equal to
// rows.
func (w *writeTxn) replaceObjects(cluster string, kind Kind, rows []Object) {
	x := w.s.x
	existing := map[string]*objRow{}
	cid, ok1 := x.clusters.lookup(cluster)
	kid, ok2 := x.kinds.kids[groupKindName{Group: kind.Group, Kind: kind.Kind}]
	if ok1 && ok2 && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
		x.byCluster[cid].byKind[kid].each(func(rid uint32) bool {
			r := x.rows[rid]
			existing[r.key] = r
			return true
		})
	}
	// Later duplicates of a key win, as they would in a sequence of Upserts.
	last := make(map[string]int, len(rows))
	keys := make([]string, len(rows))
	for i := range rows {
		keys[i] = objectKey(rows[i].Key())
		last[keys[i]] = i
	}
	for i := range rows {
		if last[keys[i]] != i {
			continue
		}
		old := existing[keys[i]]
		delete(existing, keys[i])
		w.putObject(&rows[i], keys[i], old)
	}
	for _, r := range existing {
		w.deleteObject(r)
	}
}

// Get returns the object with key k.
func (s *Store) Get(k Key) (*Object, bool) {
	return s.GetWatch(nil, k)
}

// GetWatch is Get that also adds to ws a watch that fires on the next
// change of any object of the key's cluster (object rows are not memdb
// rows; the per-cluster objects revision is), for blocking reads.
func (s *Store) GetWatch(ws memdb.WatchSet, k Key) (*Object, bool) {
	if ws != nil {
		s.ObjectsRevision(ws, k.Cluster)
	}
	if isPolicyKind(k.Group, k.Kind) {
		return nil, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	r := s.x.get(objectKey(k))
	if r == nil {
		return nil, false
	}
	return s.x.object(r), true
}
