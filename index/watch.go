package index

import (
	"context"
	"sync"
)

// Watch collects what a caller read, so that it can wait until any of it
// changes: pass one Watch to GetCluster, ListClusters, KindErrors,
// GetWatch or ObjectsRevision, then call Wait or Changed. It is the
// index's blocking-read API, so that no other package depends on the
// database the index keeps its tables in. A nil *Watch is accepted by
// every read and watches nothing. A Watch is for one goroutine.
type Watch struct {
	chans map[<-chan struct{}]struct{} // closed when what was read changes
}

// NewWatch returns an empty Watch.
func NewWatch() *Watch { return &Watch{} }

// add watches ch; a nil w ignores it.
func (w *Watch) add(ch <-chan struct{}) {
	if w == nil || ch == nil {
		return
	}
	if w.chans == nil {
		w.chans = map[<-chan struct{}]struct{}{}
	}
	w.chans[ch] = struct{}{}
}

// Changed reports, without waiting, whether something watched changed.
func (w *Watch) Changed() bool {
	if w == nil {
		return false
	}
	for ch := range w.chans {
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
//
// With more than one channel it waits on each in a goroutine of its own,
// all of which have ended when it returns.
func (w *Watch) Wait(ctx context.Context) error {
	if w == nil || len(w.chans) == 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	if len(w.chans) == 1 {
		for ch := range w.chans {
			select {
			case <-ch:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	stop, cancel := context.WithCancel(ctx)
	changed := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for ch := range w.chans {
		wg.Go(func() {
			select {
			case <-ch:
				select {
				case changed <- struct{}{}:
				default: // another channel has said it
				}
			case <-stop.Done():
			}
		})
	}
	var err error
	select {
	case <-changed:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	wg.Wait()
	return err
}
