package index

import (
	"context"
	"time"
)

// At returns a Sink whose writes happened at t instead of now: UpdatedAt of
// the rows a write changes and the time of a new kind error are t, not the
// Store's clock. It is for replaying writes another index made (package
// replication): the writer's index stamped them when it applied them, and
// every copy replaying the same calls at the same times ends with the same
// rows. A zero t means the Store's clock.
func (s *Store) At(t time.Time) Sink { return atSink{s: s, at: unixNano(t)} }

// atSink is the Sink of At.
type atSink struct {
	s  *Store
	at int64
}

func (a atSink) Replace(ctx context.Context, cluster string, kind Kind, rows []Object) error {
	return a.s.replace(ctx, a.at, cluster, kind, rows)
}

func (a atSink) Upsert(ctx context.Context, row Object) error {
	return a.s.upsertBatch(ctx, a.at, []Object{row})
}

func (a atSink) UpsertBatch(ctx context.Context, rows []Object) error {
	return a.s.upsertBatch(ctx, a.at, rows)
}

func (a atSink) Delete(ctx context.Context, key Key) error { return a.s.Delete(ctx, key) }

func (a atSink) ReportKindError(ctx context.Context, cluster string, kind Kind, err error) error {
	return a.s.reportKindError(ctx, a.at, cluster, kind, err)
}

// The cluster-row writes carry their own times.

func (a atSink) UpsertCluster(ctx context.Context, c Cluster) error { return a.s.UpsertCluster(ctx, c) }

func (a atSink) RemoveCluster(ctx context.Context, name string) error {
	return a.s.RemoveCluster(ctx, name)
}

func (a atSink) ApplySnapshot(ctx context.Context, cluster string, kinds []KindSnapshot, retire bool) error {
	return a.s.applySnapshot(ctx, a.at, cluster, kinds, retire)
}

func (a atSink) RestoreCluster(ctx context.Context, snap ClusterSnapshot) error {
	return a.s.RestoreCluster(ctx, snap)
}
