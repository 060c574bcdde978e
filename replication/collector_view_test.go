package replication

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// These tests drive look and confirm (view) by hand: the lease cache is a
// Store the test writes, the API server a stub that answers what the test
// says, and the clock a fake one. They need no kube-apiserver; the
// interleavings they pin down (a pause inside a round, a Claim's view
// between a round's look and its confirm) cannot be timed on a real one.

// stubKube answers the collector leases' reads from items.
type stubKube struct {
	kubernetes.Interface
	leases *stubLeases
}

func (s stubKube) CoordinationV1() coordv1client.CoordinationV1Interface {
	return stubCoord{leases: s.leases}
}

type stubCoord struct {
	coordv1client.CoordinationV1Interface
	leases *stubLeases
}

func (s stubCoord) Leases(string) coordv1client.LeaseInterface { return s.leases }

type stubLeases struct {
	coordv1client.LeaseInterface
	items []coordinationv1.Lease
	err   error // what Get answers, if set
	reads int
	// unbounded counts the reads made without a deadline.
	unbounded int
}

func (s *stubLeases) Get(ctx context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	s.reads++
	if _, ok := ctx.Deadline(); !ok {
		s.unbounded++
	}
	if s.err != nil {
		return nil, s.err
	}
	for i := range s.items {
		if s.items[i].Name == name {
			return s.items[i].DeepCopy(), nil
		}
	}
	return nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), name)
}

// viewTest is collector a (incarnation a/1, renewing) with a lease cache
// that shows what the test puts in it.
type viewTest struct {
	c     *Collector
	clock *clocktesting.FakeClock
	cache cache.Store
	api   *stubLeases
}

const viewTestDuration = 15 * time.Second

func newViewTest() *viewTest {
	vt := &viewTest{
		clock: clocktesting.NewFakeClock(time.Now()),
		cache: cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc),
		api:   &stubLeases{},
	}
	vt.c = &Collector{
		ls:    &leases{client: stubKube{leases: vt.api}, namespace: "ns", duration: viewTestDuration},
		clock: vt.clock, cached: vt.cache, members: map[string]*member{}, metrics: newCollectorMetrics(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), id: "a", incarnation: "a/1",
	}
	vt.c.renewed = vt.clock.Now()
	return vt
}

// newViewTestSuspectingB is a viewTest in which a's cache has shown b's
// lease at version 1, unchanged for a lease duration, while a renewed its
// own: b is a suspect at a's next look.
func newViewTestSuspectingB(t *testing.T) *viewTest {
	t.Helper()
	vt := newViewTest()
	must(t, vt.cache.Add(collectorB("1")))
	vt.c.look()
	vt.clock.Step(viewTestDuration)
	vt.c.renewed = vt.clock.Now()
	return vt
}

// collectorB is collector b's lease (incarnation b/1) at version rv.
func collectorB(rv string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: collectorLeaseName("b"), ResourceVersion: rv,
			Labels: map[string]string{labelLease: leaseCollector}, Annotations: map[string]string{annCollector: "b"},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("b/1")},
	}
}

// A pause (or a slow renew) between a round's start and its cache read
// must not date a renewal the cache shows after it back to the start.
func TestViewDatesRenewalsAfterTheCacheRead(t *testing.T) {
	vt := newViewTest()
	must(t, vt.cache.Add(collectorB("1")))
	vt.c.look()
	// A round starts; renew blocks (SIGSTOP, a slow API server) for 60 s.
	// Meanwhile b renewed (version 2), and the cache shows it when the
	// round reads it.
	vt.clock.Step(60 * time.Second)
	must(t, vt.cache.Update(collectorB("2")))
	vt.c.look()
	// The next round, 1 s later: b's version 2 is 1 s old.
	vt.clock.Step(time.Second)
	vt.c.renewed = vt.clock.Now()
	vt.api.items = []coordinationv1.Lease{*collectorB("2")}
	v, err := vt.c.view(context.Background())
	must(t, err)
	if v.alive["b/1"] == "" {
		t.Errorf("b, which renewed 1 s ago, is judged dead (reads: %d)", vt.api.reads)
	}
}

// A confirm judges the suspect its look returned: when another view (a
// Claim's) sees the cache catch up meanwhile, the confirm must not mark
// the fresh version dead, a verdict that would fire later on the cache's
// word alone, with no read.
func TestViewConfirmJudgesTheSuspectItWasGiven(t *testing.T) {
	vt := newViewTestSuspectingB(t)
	_, suspects := vt.c.look() // reconcile's look: b is a suspect
	if len(suspects) != 1 {
		t.Fatalf("suspects: %v, want b", suspects)
	}
	// The cache catches up (b renewed: version 2); a Claim's view looks
	// meanwhile, and reconcile's confirm reads version 2.
	must(t, vt.cache.Update(collectorB("2")))
	vt.c.look()
	vt.api.items = []coordinationv1.Lease{*collectorB("2")}
	must(t, vt.c.confirm(context.Background(), suspects))
	// The cache stalls now (or this process is paused); b keeps renewing.
	vt.api.items = []coordinationv1.Lease{*collectorB("7")}
	vt.clock.Step(viewTestDuration)
	vt.c.renewed = vt.clock.Now()
	before := vt.api.reads
	v, err := vt.c.view(context.Background())
	must(t, err)
	if v.alive["b/1"] == "" {
		t.Errorf("b (renewing on the API server: version 7) is judged dead; reads: %d", vt.api.reads-before)
	}
}

// A confirming read that fails (a 429, a timeout) leaves the suspects
// alive, and view still returns the cache's view for the round to go on
// with. The read has a deadline: it runs on the goroutine that renews.
func TestViewCountsSuspectsAliveWhenTheReadFails(t *testing.T) {
	vt := newViewTestSuspectingB(t)
	vt.api.err = apierrors.NewTooManyRequests("the server has received too many requests", 1)
	v, err := vt.c.view(context.Background())
	if err == nil || vt.api.reads != 1 {
		t.Fatalf("view: err %v after %d reads, want the read's error after 1", err, vt.api.reads)
	}
	if v == nil || v.alive["b/1"] == "" || v.alive["a/1"] == "" {
		t.Fatalf("view after a failed read: %+v, want a and b (a suspect) alive", v)
	}
	if vt.api.unbounded != 0 {
		t.Errorf("%d confirming reads without a deadline", vt.api.unbounded)
	}
	// The read works again and shows the version the cache showed a
	// lease duration ago: b is dead.
	vt.api.err, vt.api.items = nil, []coordinationv1.Lease{*collectorB("1")}
	v, err = vt.c.view(context.Background())
	must(t, err)
	if v.alive["b/1"] != "" {
		t.Errorf("b, unchanged for a lease duration on the API server, is alive")
	}
}

// What one read of a suspect's lease decides, the cache having shown b's
// version 1 unchanged for a lease duration.
func TestViewJudgesASuspectByItsLease(t *testing.T) {
	otherHolder := collectorB("3")
	otherHolder.Spec.HolderIdentity = ptr.To("b/2")
	for _, tc := range []struct {
		name  string
		read  *coordinationv1.Lease // nil: there is none
		alive bool
	}{
		{"gone", nil, false},
		{"another incarnation", otherHolder, false},
		{"the version the cache showed", collectorB("1"), false},
		{"a version the cache has not shown (renewed)", collectorB("2"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vt := newViewTestSuspectingB(t)
			if tc.read != nil {
				vt.api.items = []coordinationv1.Lease{*tc.read}
			}
			v, err := vt.c.view(context.Background())
			must(t, err)
			if alive := v.alive["b/1"] != ""; alive != tc.alive || vt.api.reads != 1 {
				t.Errorf("b alive: %v after %d reads, want %v after 1", alive, vt.api.reads, tc.alive)
			}
		})
	}
}

// An edge claim judges a cluster's holder with a read of its collector
// lease: a collector judged dead that renewed since (its process resumed
// under the same incarnation) is alive, although this process's cache
// still shows the version it was judged dead on.
func TestClaimJudgesAHolderByItsCollectorLease(t *testing.T) {
	vt := newViewTestSuspectingB(t)
	vt.api.items = []coordinationv1.Lease{*collectorB("1")}
	dead, err := vt.c.isDead(context.Background(), "b/1")
	must(t, err)
	if !dead {
		t.Fatalf("b, unchanged for a lease duration on the API server, is alive")
	}
	vt.api.items = []coordinationv1.Lease{*collectorB("2")} // b resumed and renewed
	dead, err = vt.c.isDead(context.Background(), "b/1")
	must(t, err)
	if dead {
		t.Errorf("b, which renewed after its verdict (version 2), is judged dead")
	}
	if dead, err = vt.c.isDead(context.Background(), "c/1"); err != nil || !dead {
		t.Errorf("c, which has no lease: dead %v, err %v; want dead", dead, err)
	}
}
