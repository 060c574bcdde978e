package index

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/index/memtables"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a settable clock for UpdatedAt and error times.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testOrderMin is the list size from which test stores keep a list's name
// order (cellOrderMin and labelOrderMin in production): the small fleets
// of the tests then have lists with and without one, and lists that gain
// and lose theirs.
const testOrderMin = 4

func newTestStore(t testing.TB, opts ...Option) (*Store, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	s := New(memtables.Open, append([]Option{WithClock(clk.Now)}, opts...)...)
	s.x.cellOrders.min, s.x.labelOrders.min = testOrderMin, testOrderMin
	return s, clk
}

var podKind = Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}

func pod(cluster, ns, name string, status Status, labels map[string]string) Object {
	return Object{
		Cluster: cluster, Namespace: ns, Version: "v1", Kind: "Pod", Resource: "pods", Name: name,
		UID: "uid-" + name, Labels: LabelsOf(labels), Status: status, CreatedAt: time.Unix(1000, 0).UTC(),
	}
}

var ctxb = context.Background()

func mustNoErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// watchFired reports whether any watch of w fired within a short time,
// through Wait, and checks that Changed agrees.
func watchFired(t testing.TB, w *Watch) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxb, 50*time.Millisecond)
	defer cancel()
	fired := w.Wait(ctx) == nil
	if w.Changed() != fired {
		t.Errorf("Watch.Changed() = %v, Wait fired %v", w.Changed(), fired)
	}
	return fired
}
