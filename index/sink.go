package index

import "context"

// Sink is the only way rows enter the index. A pull collector writes to the
// index directly; an edge agent writes to a websocket client whose manager
// side replays the same calls into the index. Keeping this the single entry
// point is what lets the index later be fed from a replicated stream.
//
// Policy rows (group RBACGroup, RBAC kinds) go through the same calls and
// land in the RBAC tables instead of the objects table.
type Sink interface {
	// Replace atomically sets the full list of objects of one kind in one
	// cluster: rows not in the list are deleted. Rows equal to the stored
	// ones (ignoring UpdatedAt and ResourceVersion) keep their UpdatedAt
	// and produce no change events. The index sets UpdatedAt of changed
	// rows to the time it observed the change; callers leave it zero. It records the kind as present on the
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
