package graph

// idleWaiter lets goroutines wait, without polling, until something its
// owner counts (operations, streams) drops to zero. The owner calls its
// methods with its own lock held.
type idleWaiter struct{ ch chan struct{} }

// channel returns a channel that is closed when the owner next calls wake,
// or nil when the owner is idle now.
func (w *idleWaiter) channel(idle bool) <-chan struct{} {
	if idle {
		return nil
	}
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// wake wakes the waiters; the owner calls it when its count reaches zero.
func (w *idleWaiter) wake() {
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}
