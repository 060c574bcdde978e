package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// leaseTest is a management cluster with a lease namespace, and leaf
// clusters that are the management cluster again.
type leaseTest struct {
	cluster *testcluster.Cluster
	kube    kubernetes.Interface
	ns      string
}

func startLeaseTest(t *testing.T) *leaseTest {
	t.Helper()
	c := testcluster.Start(t, testcluster.Options{Name: "mgmt"})
	lt := &leaseTest{cluster: c, kube: kubernetes.NewForConfigOrDie(c.DirectConfig), ns: "fleetgraph-leases"}
	_, err := lt.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lt.ns}}, metav1.CreateOptions{})
	must(t, err)
	return lt
}

func (lt *leaseTest) leaf(name string) connection.Spec {
	return connection.Spec{Name: name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(lt.cluster.Config), nil }}
}

// clusterLease reads a cluster's lease from the API server.
func (lt *leaseTest) clusterLease(t *testing.T, cluster string) *clusterLease {
	t.Helper()
	l, err := lt.kube.CoordinationV1().Leases(lt.ns).Get(t.Context(), clusterLeaseName(cluster), metav1.GetOptions{})
	must(t, err)
	cl, ok := parseClusterLease(l)
	if !ok {
		t.Fatalf("lease %s is not a cluster lease", l.Name)
	}
	return cl
}

// snapshot is the leases as they are now, in a store that never changes:
// the cache of a collector whose watch delivers nothing more (it was
// paused, or its watch stalled).
func (lt *leaseTest) snapshot(t *testing.T) cache.Store {
	t.Helper()
	list, err := lt.kube.CoordinationV1().Leases(lt.ns).List(t.Context(), metav1.ListOptions{LabelSelector: labelLease})
	must(t, err)
	st := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	for i := range list.Items {
		must(t, st.Add(&list.Items[i]))
	}
	return st
}

// freeze gives a driven collector a fake clock and, as its lease cache, a
// snapshot of the leases that never changes.
func (lt *leaseTest) freeze(t *testing.T, tc *testCollector) (*clocktesting.FakeClock, cache.Store) {
	t.Helper()
	clock := clocktesting.NewFakeClock(time.Now())
	frozen := lt.snapshot(t)
	tc.collector.mu.Lock()
	tc.collector.clock, tc.collector.cached = clock, frozen
	tc.collector.mu.Unlock()
	return clock, frozen
}

// waitRenewed waits until collector id has renewed its lease since the
// frozen cache was taken.
func (lt *leaseTest) waitRenewed(t *testing.T, frozen cache.Store, id string) {
	t.Helper()
	obj, ok, err := frozen.GetByKey(lt.ns + "/" + collectorLeaseName(id))
	if err != nil || !ok {
		t.Fatalf("the lease of %s is not in the frozen cache: %v", id, err)
	}
	seen := obj.(metav1.Object).GetResourceVersion()
	waitFor(t, id+" renews its lease", 30*time.Second, func() error {
		l, err := lt.kube.CoordinationV1().Leases(lt.ns).Get(t.Context(), collectorLeaseName(id), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.ResourceVersion == seen {
			return errors.New("not yet")
		}
		return nil
	})
}

// round is one reconcile round of a collector the test drives, and the
// take-over or release it started for cluster.
func round(tc *testCollector, cluster string) {
	tc.collector.reconcileLeases(tc.ctx)
	tc.collector.lock(cluster).Unlock()
}

// TestStaleCacheJudgesNobodyDead: a collector whose lease cache is behind
// (its process was paused past the lease duration, or its watch stalled)
// sees the other collector's lease unchanged for longer than the lease
// duration. It must not take that collector's cluster while the API
// server shows the lease renewed, and must still take it over once the
// collector really stopped renewing, although its cache never catches up.
// Collector a's cache is a snapshot that never changes and its clock is
// fake: a step of the clock past the lease is the pause. (Without the
// confirming read, a took b's cluster the moment it resumed, which
// TestReplicatedProcesses saw about one run in five.)
func TestStaleCacheJudgesNobodyDead(t *testing.T) {
	lt := startLeaseTest(t)
	// A cluster the assignment gives to b while both are alive.
	cluster := clusterAssignedToB()
	leaves := []connection.Spec{lt.leaf(cluster)}
	s := natsServer(t)
	b := startCollector(t, s, "b", lt.cluster.Config, lt.ns, leaves)
	waitFor(t, "b holds the cluster", 60*time.Second, func() error {
		if got := b.holds(); !slices.Equal(got, []string{cluster}) {
			return fmt.Errorf("b holds %v", got)
		}
		return nil
	})

	a := newCollector(t, s, "a", lt.cluster.Config, lt.ns, leaves)
	clock, frozen := lt.freeze(t, a)
	round(a, cluster)
	if got := a.holds(); len(got) != 0 {
		t.Fatalf("a took %v while b is alive", got)
	}
	lt.waitRenewed(t, frozen, "b")

	// a resumes: by its clock, two lease durations have passed since its
	// cache last showed b's lease change.
	duration := a.collector.ls.duration
	clock.Step(2 * duration)
	round(a, cluster)
	if got := a.holds(); len(got) != 0 {
		t.Fatalf("after its pause, a took %v from the live collector b", got)
	}
	if l := lt.clusterLease(t, cluster); l.holder != b.collector.incarnation {
		t.Fatalf("the cluster's lease names %q, want b (%s)", l.holder, b.collector.incarnation)
	}
	if got := b.holds(); !slices.Equal(got, []string{cluster}) {
		t.Fatalf("b holds %v", got)
	}
	if n := testutil.ToFloat64(a.collector.metrics.checks.WithLabelValues("alive")); n != 1 {
		t.Fatalf("a counted %v checks that found a live collector, want 1", n)
	}

	// b stops renewing (cut off from the management cluster); a's cache
	// still never changes. Reads a lease duration apart show b's lease
	// unchanged: a takes the cluster over.
	b.mgmt.cut.Store(true)
	waitFor(t, "a takes the cluster over from b, which stopped renewing", 30*time.Second, func() error {
		clock.Step(2 * duration)
		round(a, cluster)
		if got := a.holds(); !slices.Equal(got, []string{cluster}) {
			return fmt.Errorf("a holds %v", got)
		}
		return nil
	})
	if l := lt.clusterLease(t, cluster); l.holder != a.collector.incarnation {
		t.Fatalf("the cluster's lease names %q, want a (%s)", l.holder, a.collector.incarnation)
	}
	if n := testutil.ToFloat64(a.collector.metrics.takeovers.WithLabelValues("failover")); n != 1 {
		t.Fatalf("a counted %v failovers, want 1", n)
	}
	if n := testutil.ToFloat64(a.collector.metrics.checks.WithLabelValues("dead")); n != 1 {
		t.Fatalf("a counted %v checks that found a dead collector, want 1", n)
	}
}

// TestLostClusterIsCollectedAgain: a collector fenced off a cluster
// through the stream (another owner wrote the cluster's log) while the
// cluster's lease still names it must not leave the cluster uncollected:
// no other collector takes a cluster whose lease names a live collector,
// so it takes the cluster again, under a new lease generation.
func TestLostClusterIsCollectedAgain(t *testing.T) {
	lt := startLeaseTest(t)
	if _, err := lt.cluster.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 1, Pods: 1}); err != nil {
		t.Fatal(err)
	}
	const cluster = "leaf-0"
	s := natsServer(t)
	a := startCollector(t, s, "a", lt.cluster.Config, lt.ns, []connection.Spec{lt.leaf(cluster)})
	waitFor(t, "a holds the cluster", 60*time.Second, func() error {
		if got := a.holds(); !slices.Equal(got, []string{cluster}) {
			return fmt.Errorf("a holds %v", got)
		}
		return nil
	})
	before := lt.clusterLease(t, cluster).generation

	// Another node writes the cluster's log with a newer epoch, and a
	// change in the leaf makes a write: the stream refuses it.
	intruder := startNode(t, s, NewIncarnation("intruder"), false)
	acquire(t, intruder, cluster)
	if _, err := lt.kube.CoreV1().Pods("ns-0").Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after-intruder"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}, TerminationGracePeriodSeconds: ptr.To(int64(0))},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a is fenced off the cluster", 30*time.Second, func() error {
		if n := testutil.ToFloat64(a.collector.metrics.lost); n != 1 {
			return fmt.Errorf("a lost %v clusters", n)
		}
		return nil
	})
	waitFor(t, "a takes the cluster again", 30*time.Second, func() error {
		a.collector.mu.Lock()
		h := a.collector.held[cluster]
		a.collector.mu.Unlock()
		if h == nil {
			return errors.New("a does not hold the cluster")
		}
		if h.generation <= before {
			return fmt.Errorf("a holds the cluster under lease generation %d, as before", h.generation)
		}
		return nil
	})
	if l := lt.clusterLease(t, cluster); l.holder != a.collector.incarnation || l.generation <= before {
		t.Fatalf("the cluster's lease: holder %q generation %d, want a (%s) above %d", l.holder, l.generation, a.collector.incarnation, before)
	}
}

// TestLostClusterAssignedElsewhereIsReleased: a collector whose lease
// names it for a cluster it does not hold, and which the assignment gives
// to another collector, releases the lease, so that the other one takes
// the cluster (which waits for a live holder to hand it over otherwise).
// The test writes the lease to name a as a takeover by a that did not
// get as far as collecting would leave it.
func TestLostClusterAssignedElsewhereIsReleased(t *testing.T) {
	lt := startLeaseTest(t)
	cluster := clusterAssignedToB()
	leaves := []connection.Spec{lt.leaf(cluster)}
	s := natsServer(t)
	a := startCollector(t, s, "a", lt.cluster.Config, lt.ns, leaves)
	b := startCollector(t, s, "b", lt.cluster.Config, lt.ns, leaves)
	waitFor(t, "b holds the cluster, a nothing", 60*time.Second, func() error {
		if got := b.holds(); !slices.Equal(got, []string{cluster}) {
			return fmt.Errorf("b holds %v", got)
		}
		if got := a.holds(); len(got) != 0 {
			return fmt.Errorf("a holds %v", got)
		}
		return nil
	})
	// a must see b alive, or it would take the cluster itself.
	waitOwnLease(t, a.collector)
	forged, err := a.collector.ls.acquireCluster(t.Context(), cluster, a.collector.incarnation, lt.clusterLease(t, cluster).obj,
		func(ann map[string]string) { ann[annMode] = modePull })
	must(t, err)
	waitFor(t, "b collects the cluster again under a newer lease", 30*time.Second, func() error {
		l := lt.clusterLease(t, cluster)
		if l.holder != b.collector.incarnation || l.generation <= forged.generation {
			return fmt.Errorf("the lease names %q, generation %d (forged: %d)", l.holder, l.generation, forged.generation)
		}
		if got := b.holds(); !slices.Equal(got, []string{cluster}) {
			return fmt.Errorf("b holds %v", got)
		}
		return nil
	})
	if got := a.holds(); len(got) != 0 {
		t.Fatalf("a holds %v", got)
	}
}

// TestStaleCacheRefusesToAdoptAnEdge is TestStaleCacheJudgesNobodyDead for
// a push cluster: after its pause, collector a neither adopts the cluster
// whose edge is connected to the live collector b (as an orphan) nor lets
// another edge instance claim it (as if b had died).
func TestStaleCacheRefusesToAdoptAnEdge(t *testing.T) {
	lt := startLeaseTest(t)
	const cluster = "edge-leaf"
	s := natsServer(t)
	b := startCollector(t, s, "b", lt.cluster.Config, lt.ns, nil)
	waitOwnLease(t, b.collector)
	must(t, b.collector.Claim(t.Context(), cluster, "vm-1"))

	a := newCollector(t, s, "a", lt.cluster.Config, lt.ns, nil)
	clock, frozen := lt.freeze(t, a)
	round(a, cluster)
	lt.waitRenewed(t, frozen, "b")

	clock.Step(2 * a.collector.ls.duration)
	round(a, cluster)
	if got := a.holds(); len(got) != 0 {
		t.Fatalf("after its pause, a adopted %v from the live collector b", got)
	}
	err := a.collector.Claim(t.Context(), cluster, "vm-2")
	var reject *edge.Reject
	if !errors.As(err, &reject) || reject.Reason != edge.ReasonAlreadyClaimed {
		t.Fatalf("another edge's claim at a after its pause: %v, want already claimed (at b)", err)
	}
	if l := lt.clusterLease(t, cluster); l.holder != b.collector.incarnation || l.instance != "vm-1" {
		t.Fatalf("the cluster's lease names %q for edge %q, want b (%s) for vm-1", l.holder, l.instance, b.collector.incarnation)
	}
}

// clusterAssignedToB returns the first leaf-N that the assignment gives to
// collector b of the two collectors a and b.
func clusterAssignedToB() string {
	for i := 0; ; i++ {
		if name := fmt.Sprintf("leaf-%d", i); assign([]string{name}, []string{"a", "b"})[name] == "b" {
			return name
		}
	}
}
