package index

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"
)

// UpsertCluster adds or changes a cluster row. The connection package calls
// it on every state transition; an unchanged row publishes nothing, a
// changed one publishes EventCluster with the previous row.
func (s *Store) UpsertCluster(ctx context.Context, c Cluster) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: upsert cluster %q: %w", c.Name, err)
	}
	if c.Name == "" || strings.IndexByte(c.Name, 0) >= 0 {
		return fmt.Errorf("%w: cluster name %q", ErrInvalidRow, c.Name)
	}
	return s.write(0, func(w *writeTxn) error {
		raw, err := w.mem().First(tableClusters, indexID, memKey(compoundKey(c.Name)))
		must(err)
		old, _ := raw.(*Cluster)
		if old != nil && equalClusters(old, &c) {
			return nil
		}
		nc := c
		w.putClusterRow(&nc)
		w.emit(&Event{Type: EventCluster, Cluster: c.Name, ClusterRow: &nc, PreviousCluster: old})
		w.touch(tableClusters, c.Name)
		return nil
	})
}

// putClusterRow inserts or replaces a cluster row.
func (w *writeTxn) putClusterRow(c *Cluster) {
	must(w.mem().Insert(tableClusters, c))
	w.s.setStale(c.Name, c.Stale())
}

// deleteClusterRow deletes a stored cluster row.
func (w *writeTxn) deleteClusterRow(c *Cluster) {
	must(w.mem().Delete(tableClusters, c))
	w.s.setStale(c.Name, false)
}

// setStale records whether a cluster is stale in s.stale, replacing the
// map when that changes (see Store.stale). Cluster rows change state
// rarely, so copying the map is cheap next to a walk per query.
func (s *Store) setStale(name string, stale bool) {
	if s.stale[name] == stale {
		return
	}
	next := make(map[string]bool, len(s.stale)+1)
	for n := range s.stale {
		next[n] = true
	}
	if stale {
		next[name] = true
	} else {
		delete(next, name)
	}
	s.stale = next
}

func equalClusters(a, b *Cluster) bool {
	return a.Name == b.Name && a.Mode == b.Mode && a.State == b.State && a.Since.Equal(b.Since) &&
		a.LastSeen.Equal(b.LastSeen) && a.LastError == b.LastError && a.Synced == b.Synced &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Metadata, b.Metadata)
}

// RemoveCluster removes a cluster: its row, every object (published as
// EventDeleted), its RBAC rows and kinds (published as one EventPolicy), and
// then EventClusterRemoved; its revisions start again from 0 (it leaves
// WatchPolicies). Removing an unknown cluster is not an error.
func (s *Store) RemoveCluster(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: remove cluster %q: %w", name, err)
	}
	return s.write(0, func(w *writeTxn) error {
		w.removed = name
		x := w.s.x
		if cid, ok := x.clusters.lookup(name); ok && int(cid) < len(x.byCluster) && x.byCluster[cid] != nil {
			var rows []*objRow
			x.byCluster[cid].rows.each(func(rid uint32) bool {
				rows = append(rows, x.rows[rid])
				return true
			})
			for _, r := range rows {
				w.deleteObject(r)
			}
			if len(rows) > 0 {
				x.labels.cache.dropObjects()
			}
		}
		w.deleteClusterPolicy(name)
		n, err := w.mem().DeleteAll(tableKinds, indexIDPrefix, memKey(compoundKey(name)))
		must(err)
		if n > 0 {
			w.policyChanged(name)
			w.touch(tableKinds, name)
		}
		raw, err := w.mem().First(tableClusters, indexID, memKey(compoundKey(name)))
		must(err)
		if raw != nil {
			w.deleteClusterRow(raw.(*Cluster))
			w.emit(&Event{Type: EventClusterRemoved, Cluster: name, PreviousCluster: raw.(*Cluster)})
			w.touch(tableClusters, name)
		}
		return nil
	})
}

// GetCluster returns a cluster row and adds to w a watch on it. The row is
// shared and must not be mutated.
func (s *Store) GetCluster(w *Watch, name string) (*Cluster, bool) {
	c, ch := s.clusterWatch(name)
	w.add(ch)
	return c, c != nil
}

// clusterWatch returns a cluster's row (nil for none) and a channel that
// is closed when the row changes, appears or goes.
func (s *Store) clusterWatch(name string) (*Cluster, <-chan struct{}) {
	ch, raw, err := s.db.Txn(false).FirstWatch(tableClusters, indexID, memKey(compoundKey(name)))
	must(err)
	c, _ := raw.(*Cluster)
	return c, ch
}

// ListClusters returns every cluster row in name order and adds to w a
// watch on the table.
func (s *Store) ListClusters(w *Watch) []*Cluster {
	return listAs[*Cluster](s, w, tableClusters, "")
}

// KindError is a kind of a cluster that cannot be collected.
type KindError struct {
	Kind  Kind
	Error string
	Since time.Time
}

// ReportKindError implements Sink. It records the error on the kind; the
// kind's rows stay as last known.
func (s *Store) ReportKindError(ctx context.Context, cluster string, kind Kind, kerr error) error {
	return s.reportKindError(ctx, 0, cluster, kind, kerr)
}

// reportKindError is ReportKindError at time at (0 for the clock).
func (s *Store) reportKindError(ctx context.Context, at int64, cluster string, kind Kind, kerr error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("index: report kind error: %w", err)
	}
	if cluster == "" || kind.Kind == "" || strings.IndexByte(cluster+kind.Group+kind.Kind, 0) >= 0 {
		return fmt.Errorf("%w: ReportKindError needs a cluster and a kind", ErrInvalidRow)
	}
	msg := "unknown error"
	if kerr != nil {
		msg = kerr.Error()
	}
	return s.write(at, func(w *writeTxn) error {
		w.recordKind(cluster, kind, false, msg)
		return nil
	})
}

// recordKind updates the kinds row of (cluster, kind). present records a
// successful Replace (which also clears the error); otherwise errMsg is the
// new error and Present is kept.
func (w *writeTxn) recordKind(cluster string, kind Kind, present bool, errMsg string) {
	raw, err := w.mem().First(tableKinds, indexID, memKey(compoundKey(cluster, kind.Group, kind.Kind)))
	must(err)
	old, _ := raw.(*kindRow)
	nr := &kindRow{Cluster: cluster, Kind: kind, Present: present, Err: errMsg}
	if old != nil {
		if !present {
			nr.Kind, nr.Present = old.Kind, old.Present
			if old.Err == errMsg {
				nr.ErrAt = old.ErrAt
			}
		}
	}
	if errMsg != "" && nr.ErrAt == 0 {
		nr.ErrAt = w.now
	}
	w.putKind(old, nr)
}

// putKind stores the kinds row nr over old (nil when there is none) unless
// they are equal. A kind entering or leaving the kinds set (Present) is a
// policy change: authz maps the cluster's resources from it.
func (w *writeTxn) putKind(old, nr *kindRow) {
	if old != nil && *old == *nr {
		return
	}
	must(w.mem().Insert(tableKinds, nr))
	w.touch(tableKinds, nr.Cluster)
	if old == nil || old.Present != nr.Present || old.Kind != nr.Kind {
		if nr.Present || (old != nil && old.Present) {
			w.policyChanged(nr.Cluster)
		}
	}
}

// KindErrors returns the kinds of a cluster that currently fail, ordered by
// group and kind, and adds to w a watch on the kinds of the cluster.
func (s *Store) KindErrors(w *Watch, cluster string) []KindError {
	var out []KindError
	for _, k := range listAs[*kindRow](s, w, tableKinds, compoundKey(cluster)) {
		if k.Err != "" {
			out = append(out, KindError{Kind: k.Kind, Error: k.Err, Since: fromUnixNano(k.ErrAt)})
		}
	}
	return out
}
