package replication

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// Node is the index.Sink of an owner: pull collectors and edge sessions
// write to it as they would to the index. Each write is applied to the
// node's index at a time the node picks, and, if it changed anything,
// queued for publishing with that time, so that every replica applying it
// gets the same rows. A write for a cluster the node does not own (any
// more) is dropped: that is the fencing of a collector that lost its
// lease, on the writing side.
var _ index.Sink = (*Node)(nil)

// write applies one write of a cluster the node owns and queues o if
// apply reports a change.
func (n *Node) write(cluster string, o op, apply func(sink index.Sink) (changed bool, err error)) error {
	cl := n.cluster(cluster)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	own := cl.own
	if own == nil || own.closing {
		n.metrics.dropped.Inc()
		return nil
	}
	o.at = time.Now()
	changed, err := apply(n.opts.Store.At(o.at))
	if err != nil || !changed {
		return err
	}
	n.queueLocked(own, outItem{op: o})
	return nil
}

func (n *Node) queueLocked(own *owned, it outItem) {
	own.outbox = append(own.outbox, it)
	select {
	case own.wake <- struct{}{}:
	default:
	}
}

// revisions are the index's revisions of one cluster that any write of
// rows changes.
type revisions struct{ objects, policy uint64 }

func (n *Node) revisions(cluster string) revisions {
	return revisions{n.opts.Store.ObjectsRevision(nil, cluster), n.opts.Store.PolicyRevision(cluster)}
}

// Replace implements index.Sink.
func (n *Node) Replace(ctx context.Context, cluster string, kind index.Kind, rows []index.Object) error {
	return n.write(cluster, op{typ: opReplace, kind: kind, rows: rows}, func(sink index.Sink) (bool, error) {
		before, had := n.revisions(cluster), n.kindState(cluster, kind)
		if err := sink.Replace(ctx, cluster, kind, rows); err != nil {
			return false, err
		}
		// A Replace also records the kind and clears its error.
		return before != n.revisions(cluster) || had != n.kindState(cluster, kind), nil
	})
}

// Upsert implements index.Sink.
func (n *Node) Upsert(ctx context.Context, row index.Object) error {
	return n.UpsertBatch(ctx, []index.Object{row})
}

// UpsertBatch implements index.Sink. Rows of several clusters (which no
// collector writes) are written and published per cluster.
func (n *Node) UpsertBatch(ctx context.Context, rows []index.Object) error {
	for len(rows) > 0 {
		cluster, batch := rows[0].Cluster, rows
		for i := range rows {
			if rows[i].Cluster != cluster {
				batch = rows[:i]
				break
			}
		}
		rows = rows[len(batch):]
		err := n.write(cluster, op{typ: opUpsert, rows: batch}, func(sink index.Sink) (bool, error) {
			before := n.revisions(cluster)
			if err := sink.UpsertBatch(ctx, batch); err != nil {
				return false, err
			}
			return before != n.revisions(cluster), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Delete implements index.Sink.
func (n *Node) Delete(ctx context.Context, key index.Key) error {
	return n.write(key.Cluster, op{typ: opDelete, key: key}, func(sink index.Sink) (bool, error) {
		before := n.revisions(key.Cluster)
		if err := sink.Delete(ctx, key); err != nil {
			return false, err
		}
		return before != n.revisions(key.Cluster), nil
	})
}

// ReportKindError implements index.Sink.
func (n *Node) ReportKindError(ctx context.Context, cluster string, kind index.Kind, kerr error) error {
	msg := "unknown error"
	if kerr != nil {
		msg = kerr.Error()
	}
	return n.write(cluster, op{typ: opKindError, kind: kind, err: msg}, func(sink index.Sink) (bool, error) {
		before := n.kindState(cluster, kind)
		if err := sink.ReportKindError(ctx, cluster, kind, kerr); err != nil {
			return false, err
		}
		return before != n.kindState(cluster, kind), nil
	})
}

// UpsertCluster implements index.Sink.
func (n *Node) UpsertCluster(ctx context.Context, c index.Cluster) error {
	// The row as every replica decodes it: times in UTC without a
	// monotonic reading, so that the owner's index holds what theirs do.
	row := c
	row.Labels, row.Metadata = maps.Clone(c.Labels), maps.Clone(c.Metadata)
	row.Since, row.LastSeen = wireTime(c.Since), wireTime(c.LastSeen)
	return n.write(c.Name, op{typ: opCluster, cluster: &row}, func(sink index.Sink) (bool, error) {
		before, _ := n.opts.Store.GetCluster(nil, c.Name)
		if err := sink.UpsertCluster(ctx, row); err != nil {
			return false, err
		}
		after, _ := n.opts.Store.GetCluster(nil, c.Name)
		return before != after, nil // the index stores a new row only on a change
	})
}

// RemoveCluster implements index.Sink. The node stays the cluster's owner
// until it releases it.
func (n *Node) RemoveCluster(ctx context.Context, name string) error {
	return n.write(name, op{typ: opRemoveCluster}, func(sink index.Sink) (bool, error) {
		return true, sink.RemoveCluster(ctx, name)
	})
}

// RestoreCluster implements index.Sink: the snapshot is published as one
// that every replica applies, whatever it holds.
func (n *Node) RestoreCluster(ctx context.Context, snap index.ClusterSnapshot) error {
	cl := n.cluster(snap.Name)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	own := cl.own
	if own == nil || own.closing {
		n.metrics.dropped.Inc()
		return nil
	}
	if err := n.opts.Store.RestoreCluster(ctx, snap); err != nil {
		return err
	}
	n.queueLocked(own, outItem{snapshot: true, force: true, op: op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows, labels: snap.Labels}})
	return nil
}

// ApplySnapshot implements index.Sink. The node applies it to its index
// and, if that changed anything, publishes the cluster's resulting state
// as a snapshot every replica applies: that carries the call's atomicity
// across kinds and its retiring of kinds the stream's other operations
// cannot express, at the cost of one snapshot of the cluster per changed
// edge snapshot (an unchanged one publishes nothing).
func (n *Node) ApplySnapshot(ctx context.Context, cluster string, kinds []index.KindSnapshot, retire bool) error {
	cl := n.cluster(cluster)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	own := cl.own
	if own == nil || own.closing {
		n.metrics.dropped.Inc()
		return nil
	}
	before := n.snapshotState(cluster)
	if err := n.opts.Store.At(time.Now()).ApplySnapshot(ctx, cluster, kinds, retire); err != nil {
		return err
	}
	if n.snapshotState(cluster) == before {
		return nil
	}
	snap := n.opts.Store.SnapshotCluster(cluster)
	n.queueLocked(own, outItem{snapshot: true, force: true, op: op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows}})
	return nil
}

// snapshotState is what an ApplySnapshot can change of a cluster: its
// rows' revisions and its kinds' records.
type snapshotState struct {
	rows  revisions
	kinds string
}

func (n *Node) snapshotState(cluster string) snapshotState {
	var b strings.Builder
	for _, k := range n.opts.Store.Kinds(cluster) {
		fmt.Fprintf(&b, "%+v\n", k)
	}
	for _, e := range n.opts.Store.KindErrors(nil, cluster) {
		fmt.Fprintf(&b, "!%s/%s %d %s\n", e.Kind.Group, e.Kind.Kind, e.Since.UnixNano(), e.Error)
	}
	return snapshotState{rows: n.revisions(cluster), kinds: b.String()}
}

// kindState is what the index recorded about one kind: whether it is
// present as exactly kind, and its error.
type kindState struct {
	present    bool
	err        string
	errorSince time.Time
}

func (n *Node) kindState(cluster string, kind index.Kind) kindState {
	var s kindState
	for _, k := range n.opts.Store.Kinds(cluster) {
		if k == kind {
			s.present = true
		}
	}
	for _, e := range n.opts.Store.KindErrors(nil, cluster) {
		if e.Kind.Group == kind.Group && e.Kind.Kind == kind.Kind {
			s.err, s.errorSince = e.Error, e.Since
		}
	}
	return s
}

// wireTime is t as the stream carries it: Unix nanoseconds in UTC.
func wireTime(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.Unix(0, t.UnixNano()).UTC()
}
