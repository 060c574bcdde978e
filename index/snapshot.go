package index

import (
	"context"
	"fmt"
	"strings"
)

// KindSnapshot is one kind of a cluster as a snapshot states it: every row
// of the kind (Synced), or why the kind cannot be collected now (Err; its
// rows stay as last known). A kind that is neither is only recorded.
type KindSnapshot struct {
	Kind   Kind
	Synced bool
	Rows   []Object
	Err    string
}

// ApplySnapshot applies several kinds of one cluster in one commit, so no
// reader ever sees some kinds of a snapshot applied and others not: each
// synced kind as Replace would, each kind error as ReportKindError would.
// With retire (a snapshot of every kind of the cluster), the kinds the
// cluster has that the snapshot does not list lose their rows and their
// record: a CRD that was removed, a kind the collector no longer collects.
//
// Every row and kind is validated before anything is written; an invalid
// one (ErrInvalidRow) fails the whole call and changes nothing.
func (s *Store) ApplySnapshot(ctx context.Context, cluster string, kinds []KindSnapshot, retire bool) error {
	return s.applySnapshot(ctx, 0, cluster, kinds, retire)
}

// applySnapshot is ApplySnapshot at time at (0 for the clock).
func (s *Store) applySnapshot(ctx context.Context, at int64, cluster string, kinds []KindSnapshot, retire bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: apply snapshot of %s: %w", cluster, err)
	}
	if cluster == "" || strings.IndexByte(cluster, 0) >= 0 {
		return fmt.Errorf("%w: ApplySnapshot needs a cluster", ErrInvalidRow)
	}
	listed := make(map[groupKindName]bool, len(kinds))
	policies := make([][]policyWrite, len(kinds))
	for i := range kinds {
		ks := &kinds[i]
		gk := groupKindName{Group: ks.Kind.Group, Kind: ks.Kind.Kind}
		if ks.Kind.Kind == "" || strings.IndexByte(ks.Kind.Group+ks.Kind.Kind, 0) >= 0 {
			return fmt.Errorf("%w: ApplySnapshot of %s: a kind without a name", ErrInvalidRow, cluster)
		}
		if listed[gk] {
			return fmt.Errorf("%w: ApplySnapshot of %s lists kind %s twice", ErrInvalidRow, cluster, ks.Kind.GroupKind())
		}
		listed[gk] = true
		if !ks.Synced && len(ks.Rows) > 0 {
			return fmt.Errorf("%w: ApplySnapshot of %s: rows of kind %s, which is not synced", ErrInvalidRow, cluster, ks.Kind.GroupKind())
		}
		for j := range ks.Rows {
			o := &ks.Rows[j]
			if o.Cluster != cluster || o.Group != ks.Kind.Group || o.Kind != ks.Kind.Kind {
				return fmt.Errorf("%w: %s: ApplySnapshot(%s) got it among the rows of %s", ErrInvalidRow, o.Key(), cluster, ks.Kind.GroupKind())
			}
			if err := s.validateRow(o); err != nil {
				return fmt.Errorf("index: apply snapshot of %s: %w", cluster, err)
			}
		}
		var err error
		if policies[i], err = policyValues(ks.Rows); err != nil {
			return fmt.Errorf("index: apply snapshot of %s: %w", cluster, err)
		}
	}
	return s.write(at, func(w *writeTxn) error {
		for i := range kinds {
			ks := &kinds[i]
			switch {
			case ks.Synced:
				w.recordKind(cluster, ks.Kind, true, "")
				if IsPolicyKind(ks.Kind.Group, ks.Kind.Kind) {
					w.replacePolicy(cluster, ks.Kind.Kind, policies[i])
				} else {
					w.replaceObjects(cluster, ks.Kind, ks.Rows)
				}
				if ks.Err != "" {
					w.recordKind(cluster, ks.Kind, false, ks.Err)
				}
			case ks.Err != "":
				w.recordKind(cluster, ks.Kind, false, ks.Err)
			}
		}
		if retire {
			w.retireKinds(cluster, listed)
		}
		return nil
	})
}

// retireKinds removes the kinds of a cluster that keep does not list:
// their rows (objects or policy) and their record. Kinds are found both by
// their records and by the rows the cluster has, since rows upserted one
// by one leave no record.
func (w *writeTxn) retireKinds(cluster string, keep map[groupKindName]bool) {
	it, err := w.mem().Get(tableKinds, indexIDPrefix, memKey(compoundKey(cluster)))
	must(err)
	var records []*kindRow
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if k := raw.(*kindRow); !keep[groupKindName{Group: k.Kind.Group, Kind: k.Kind.Kind}] {
			records = append(records, k)
		}
	}
	gone := map[groupKindName]bool{}
	for _, k := range records {
		gone[groupKindName{Group: k.Kind.Group, Kind: k.Kind.Kind}] = true
	}
	x := w.s.x
	if cid, ok := x.clusters.lookup(cluster); ok && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
		for key, rows := range x.byCluster[cid].byCell {
			if gk := x.kinds.byKid[key>>3]; rows.len() > 0 && !keep[gk] {
				gone[gk] = true
			}
		}
	}
	for _, policy := range []string{KindRole, KindClusterRole, KindRoleBinding, KindClusterRoleBinding} {
		if gk := (groupKindName{Group: RBACGroup, Kind: policy}); !keep[gk] {
			gone[gk] = true
		}
	}
	for gk := range gone {
		if IsPolicyKind(gk.Group, gk.Kind) {
			w.replacePolicy(cluster, gk.Kind, nil)
		} else {
			w.replaceObjects(cluster, Kind{Group: gk.Group, Kind: gk.Kind}, nil)
		}
	}
	for _, k := range records {
		must(w.mem().Delete(tableKinds, k))
		w.touch(tableKinds, cluster)
		if k.Present {
			w.policyChanged(cluster)
		}
	}
}
