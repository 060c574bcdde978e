package index

import (
	"context"

	"github.com/hashicorp/go-memdb"
)

// Watch collects what a caller read, so that it can wait until any of it
// changes: pass one Watch to GetCluster, ListClusters, KindErrors,
// GetWatch or ObjectsRevision, then call Wait or Changed. It is the
// index's blocking-read API, so that no other package depends on the
// database the index keeps its tables in. A nil *Watch is accepted by
// every read and watches nothing. A Watch is for one goroutine.
type Watch struct {
	ws memdb.WatchSet
}

// NewWatch returns an empty Watch.
func NewWatch() *Watch { return &Watch{ws: memdb.NewWatchSet()} }

// add watches ch; a nil w ignores it.
func (w *Watch) add(ch <-chan struct{}) {
	if w == nil || ch == nil {
		return
	}
	if w.ws == nil {
		w.ws = memdb.NewWatchSet()
	}
	w.ws.Add(ch)
}

// Changed reports, without waiting, whether something watched changed.
func (w *Watch) Changed() bool {
	if w == nil {
		return false
	}
	for ch := range w.ws {
		select {
		case <-ch:
			return true
		default:
		}
	}
	return false
}

// Wait blocks until something watched changes, and then returns nil, or
// until ctx ends, and then returns ctx.Err(). A change may be reported
// for a row next to one that was read; read again to see what changed.
func (w *Watch) Wait(ctx context.Context) error {
	if w == nil || len(w.ws) == 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	return w.ws.WatchCtx(ctx)
}
