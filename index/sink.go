package index

import "context"

// Sink is every write to the index, and the only way anything enters or
// leaves it: a pull collector's rows and the cluster rows of its lifecycle
// go straight to the Store; an edge's rows travel over a websocket and the
// hub replays the same calls into the Store. Because the calls below are
// the whole of what changes the index, a stream of them is enough to build
// another copy of it, which is how the index is later fed from a
// replicated stream.
//
// Each call is applied atomically, in one commit with its change events,
// and is idempotent: applying the same call again changes nothing and
// publishes nothing. The index stamps UpdatedAt of changed rows with the
// time it observed the change; callers leave it zero. (A replica replaying
// another index's calls writes through Store.At, with the time the other
// index stamped, so that both end with the same rows.)
//
// Policy rows (group RBACGroup, RBAC kinds) go through the same row calls
// and land in the RBAC tables instead of the objects table.
type Sink interface {
	RowSink
	// UpsertBatch adds or changes many rows in one commit, as Upsert does
	// each one. An invalid row fails the whole batch before anything is
	// written. Edge deltas arrive this way.
	UpsertBatch(ctx context.Context, rows []Object) error
	// UpsertCluster adds or changes a cluster row (its connection state,
	// labels and metadata). connection.Manager and edge.Hub write it on
	// every state transition; a row equal to the stored one publishes
	// nothing.
	UpsertCluster(ctx context.Context, c Cluster) error
	// RemoveCluster removes a cluster: its row, every object and policy
	// row, and its kinds. Removing an unknown cluster is not an error.
	RemoveCluster(ctx context.Context, name string) error
	// ApplySnapshot replaces several kinds of one cluster and records
	// their errors in one commit, and with retire removes the cluster's
	// kinds it does not list. Edge snapshots arrive this way, so that a
	// snapshot is applied all or nothing across its kinds.
	ApplySnapshot(ctx context.Context, cluster string, kinds []KindSnapshot, retire bool) error
	// RestoreCluster makes the index's state of one cluster exactly a
	// snapshot another index took (Store.SnapshotCluster): rows keep the
	// UpdatedAt they carry. It is how a replica loads a cluster without
	// replaying its history.
	RestoreCluster(ctx context.Context, snap ClusterSnapshot) error
}

// RowSink is the part of Sink that carries one cluster's collected kinds:
// rows and kind errors. It is what a collector writes, and what an edge's
// buffer implements to carry a collector's writes to the manager.
type RowSink interface {
	// Replace atomically sets the full list of objects of one kind in one
	// cluster: rows not in the list are deleted. Rows equal to the stored
	// ones (ignoring UpdatedAt and ResourceVersion) keep their UpdatedAt
	// and produce no change events. It records the kind as present on the
	// cluster and clears any error reported for it.
	Replace(ctx context.Context, cluster string, kind Kind, rows []Object) error
	// Upsert adds or changes one row. As with Replace, an unchanged row
	// produces no event.
	Upsert(ctx context.Context, row Object) error
	// Delete removes one row. Deleting a missing row is not an error.
	Delete(ctx context.Context, key Key) error
	// ReportKindError records that one kind of one cluster cannot be
	// collected (a missing CRD, a 403, a failing watch). The kind's rows
	// are kept as last known. A later successful Replace clears it.
	ReportKindError(ctx context.Context, cluster string, kind Kind, err error) error
}

var _ Sink = (*Store)(nil)
