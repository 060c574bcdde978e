package collector

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestWatchEndingAtOnceBacksOff runs a kind's list and watch, on a fake
// clock, against a server whose watches end with an error: at once, or
// after running longer than watchLasted. A watch that ends at once must
// not make the kind list back to back: the lists back off (1 s, 2 s, 4 s
// and so on, ±50%). One that lasted is an ordinary end: the kind lists
// again at once.
func TestWatchEndingAtOnceBacksOff(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lasts time.Duration // how long each watch runs before it fails
		// check judges the fake clock's times of the lists.
		check func(t *testing.T, lists []time.Time, ends []time.Time)
	}{
		{"watch ends at once", 0, func(t *testing.T, lists, _ []time.Time) {
			// Six waits of at least 0.5, 1, 2, 4, 8 and 16 s.
			if took := lists[len(lists)-1].Sub(lists[0]); took < 31*time.Second {
				t.Errorf("%d lists took %v: the kind lists in a tight loop when its watch ends at once", len(lists), took)
			}
		}},
		{"watch lasted", watchLasted + time.Second, func(t *testing.T, lists, ends []time.Time) {
			for i, end := range ends {
				if i+1 < len(lists) && lists[i+1].Sub(end) > 0 {
					t.Errorf("list %d came %v after a watch that lasted ended, want at once", i+2, lists[i+1].Sub(end))
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				var mu sync.Mutex
				var lists, ends []time.Time
				lw := &cache.ListWatch{
					ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
						mu.Lock()
						defer mu.Unlock()
						lists = append(lists, time.Now())
						if len(lists) == 7 {
							cancel()
						}
						return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
					},
					WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
						if o.SendInitialEvents != nil && *o.SendInitialEvents {
							return nil, errors.New("no streaming lists here")
						}
						ch := make(chan watch.Event)
						w := watch.NewProxyWatcher(ch)
						go func() {
							select {
							case <-time.After(tc.lasts):
							case <-w.StopChan():
								return
							}
							mu.Lock()
							ends = append(ends, time.Now())
							mu.Unlock()
							forbidden := &metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden}
							select {
							case ch <- watch.Event{Type: watch.Error, Object: forbidden}:
							case <-w.StopChan():
							}
						}()
						return w, nil
					},
				}
				run := &Run{cfg: Config{Cluster: "c1", Sink: &replaceSink{}, OnEvent: func(Event) {}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
				s := &rowStore{ctx: ctx, run: run, adapter: podAdapter(t), kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
				run.listAndWatch(ctx, lw, s, &corev1.Pod{})
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				tc.check(t, lists, ends)
			})
		})
	}
}

// TestRelistFailuresAreReported runs a kind's anti-entropy relist on a fake
// clock against a server whose lists fail three times, succeed, fail and
// succeed: every failure is a RelistFailed event, and is logged as a
// warning from the relistFailuresWarn-th failure in a row on; a success
// starts the count again.
func TestRelistFailuresAreReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		results := []bool{false, false, false, true, false, true} // list succeeds?
		lists := 0
		lw := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			ok := results[lists]
			lists++
			if lists == len(results) {
				cancel()
			}
			if !ok {
				return nil, errors.New("continue token expired")
			}
			return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "9"}}, nil
		}}
		logs := &levelRecorder{}
		var failed int
		run := &Run{cfg: Config{Cluster: "c1", Sink: &replaceSink{}, Relist: time.Minute, Logger: slog.New(logs), OnEvent: func(e Event) {
			if e.Type == RelistFailed {
				failed++
			}
		}}}
		s := &rowStore{ctx: ctx, run: run, adapter: podAdapter(t), kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
		if err := s.Replace(nil, "1"); err != nil { // the reflector's listing
			t.Fatal(err)
		}
		run.antiEntropy(ctx, lw, s)
		if want := 4; failed != want {
			t.Errorf("%d RelistFailed events, want %d", failed, want)
		}
		want := []slog.Level{slog.LevelDebug, slog.LevelDebug, slog.LevelWarn, slog.LevelDebug}
		if !slices.Equal(logs.levels, want) {
			t.Errorf("relist failures logged at %v, want %v", logs.levels, want)
		}
	})
}

// levelRecorder is a slog handler that records the level of each record.
type levelRecorder struct {
	mu     sync.Mutex
	levels []slog.Level
}

func (h *levelRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *levelRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.levels = append(h.levels, r.Level)
	return nil
}
func (h *levelRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levelRecorder) WithGroup(string) slog.Handler      { return h }
