package index

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWatchWait: Wait returns nil as soon as any one of many channels is
// closed (whichever it is), ctx's error when none is, and leaves no
// goroutine behind (TestMain's goleak); a nil or empty Watch waits for ctx.
func TestWatchWait(t *testing.T) {
	for _, n := range []int{1, 2, 100} {
		for _, fire := range []int{-1, 0, n - 1} {
			w := NewWatch()
			chans := make([]chan struct{}, n)
			for i := range chans {
				chans[i] = make(chan struct{})
				w.add(chans[i])
			}
			w.add(chans[0]) // twice: watched once
			w.add(nil)      // ignored
			ctx, cancel := context.WithTimeout(ctxb, 100*time.Millisecond)
			if fire >= 0 {
				time.AfterFunc(10*time.Millisecond, func() { close(chans[fire]) })
			}
			err := w.Wait(ctx)
			cancel()
			switch {
			case fire >= 0 && err != nil:
				t.Errorf("%d channels, #%d closed: Wait = %v, want nil", n, fire, err)
			case fire < 0 && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("%d channels, none closed: Wait = %v, want the deadline", n, err)
			}
			if got := w.Changed(); got != (fire >= 0) {
				t.Errorf("%d channels, #%d closed: Changed = %v", n, fire, got)
			}
		}
	}
	for _, w := range []*Watch{nil, NewWatch()} {
		ctx, cancel := context.WithTimeout(ctxb, 10*time.Millisecond)
		if err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Wait on %v = %v, want the deadline", w, err)
		}
		cancel()
	}
}
