package replication

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// cuttable is a RoundTripper that fails every request while cut: a
// collector cut off from the management cluster.
type cuttable struct {
	next http.RoundTripper
	cut  atomic.Bool
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("test: the management cluster is unreachable")
	}
	return c.next.RoundTrip(r)
}

// testCollector is a collector process: its own index, Node, Manager and
// Collector, with leases in the management cluster.
type testCollector struct {
	store     *index.Store
	node      *Node
	collector *Collector
	mgmt      *cuttable
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan error
	running   int  // goroutines that send to done
	driven    bool // the test calls the Collector's rounds (no Run)
}

func startCollector(t *testing.T, s *server.Server, id string, mgmt *rest.Config, namespace string, leaves []connection.Spec) *testCollector {
	t.Helper()
	tc := newCollector(t, s, id, mgmt, namespace, leaves)
	tc.running, tc.driven = tc.running+1, false
	go func() { tc.done <- tc.collector.Run(tc.ctx) }()
	return tc
}

// newCollector is startCollector without the Collector's Run: the test
// drives its rounds (reconcileLeases).
func newCollector(t *testing.T, s *server.Server, id string, mgmt *rest.Config, namespace string, leaves []connection.Spec) *testCollector {
	t.Helper()
	tc := &testCollector{store: index.New(memtables.Open), done: make(chan error, 3)}
	nc, err := ConnectEmbedded(s)
	must(t, err)
	tc.node, err = New(Options{
		Conn: nc, Store: tc.store, Name: NewIncarnation(id),
		OnLost: func(cluster string, err error) { tc.collector.OnLost(cluster, err) },
	})
	must(t, err)
	manager, err := connection.NewManager(connection.Options{Store: tc.node, Resume: func(name string) (*index.Cluster, bool) { return tc.store.GetCluster(nil, name) }})
	must(t, err)
	cfg := rest.CopyConfig(mgmt)
	tc.mgmt = &cuttable{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		tc.mgmt.next = rt
		return tc.mgmt
	})
	client, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	tc.collector, err = NewCollector(CollectorOptions{
		Node: tc.node, Manager: manager,
		Leases: &LeaseOptions{Client: client, Namespace: namespace, ID: id, Duration: 3 * time.Second},
	})
	must(t, err)
	for _, spec := range leaves {
		must(t, tc.collector.Add(spec))
	}
	tc.ctx, tc.cancel = context.WithCancel(context.Background())
	tc.running, tc.driven = 2, true
	go func() { tc.done <- tc.node.Run(tc.ctx) }()
	go func() { tc.done <- manager.Run(tc.ctx) }()
	t.Cleanup(func() {
		tc.cancel()
		if tc.driven {
			tc.collector.wg.Wait() // what the rounds the test drove started
		}
		for range tc.running {
			if err := <-tc.done; err != nil {
				t.Errorf("collector %s: %v", id, err)
			}
		}
		nc.Close()
	})
	return tc
}

func (tc *testCollector) holds() []string {
	tc.collector.mu.Lock()
	defer tc.collector.mu.Unlock()
	var out []string
	for name := range tc.collector.held {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// TestLeasesShardHandOverAndFailOver runs two collectors and a query
// replica over an embedded JetStream server, with leases in a real
// management cluster (which also serves as the leaf clusters): the first
// collector takes every cluster; once the second has been alive for a
// lease duration, half are handed over to it (no DISCONNECTED: the
// replica's rows stay current); when the first is cut off from the
// management cluster, the second takes its clusters over after the lease
// expires, marks them DISCONNECTED with the reason and resyncs them, and
// the first one's next write is refused by the stream (it is fenced and
// stops collecting them), while the replica holds the second's state.
func TestLeasesShardHandOverAndFailOver(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "mgmt"})
	ctx := t.Context()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	const ns = "fleetgraph-leases"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 1, Pods: 2}); err != nil {
		t.Fatal(err)
	}
	var leaves []connection.Spec
	var names []string
	for i := range 4 {
		name := fmt.Sprintf("leaf-%d", i)
		names = append(names, name)
		leaves = append(leaves, connection.Spec{Name: name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }})
	}
	s := natsServer(t)
	replica := startNode(t, s, "", true)
	a := startCollector(t, s, "a", c.Config, ns, leaves)
	waitFor(t, "collector a holds every cluster", 60*time.Second, func() error {
		if got := a.holds(); !slices.Equal(got, names) {
			return fmt.Errorf("a holds %v", got)
		}
		return nil
	})
	synced := func(want index.ConnectionState) func() error {
		return func() error {
			for _, name := range names {
				row, ok := replica.store.GetCluster(nil, name)
				if !ok || row.State != want || !row.Synced {
					return fmt.Errorf("cluster %s on the replica: %+v", name, row)
				}
			}
			return nil
		}
	}
	waitFor(t, "the replica has every cluster synced", 60*time.Second, synced(index.StateConnected))
	since := map[string]time.Time{}
	for _, name := range names {
		row, _ := replica.store.GetCluster(nil, name)
		since[name] = row.Since
	}

	b := startCollector(t, s, "b", c.Config, ns, leaves)
	waitFor(t, "a hands half the clusters over to b", 30*time.Second, func() error {
		ha, hb := a.holds(), b.holds()
		if len(ha) != 2 || len(hb) != 2 {
			return fmt.Errorf("a holds %v, b holds %v", ha, hb)
		}
		return nil
	})
	handed := b.holds()
	waitFor(t, "b collects what it was handed", 30*time.Second, func() error {
		for _, name := range handed {
			if err := sameCluster(b.store, replica.store, name); err != nil {
				return err
			}
		}
		return synced(index.StateConnected)()
	})
	for _, name := range handed {
		if row, _ := replica.store.GetCluster(nil, name); !row.Since.Equal(since[name]) {
			t.Fatalf("a handover changed the state of %s: %+v (connected since %s)", name, row, since[name])
		}
	}

	// a loses the management cluster: it can no longer renew its lease.
	kept := a.holds()
	rec := conntest.NewRecorder(t, replica.store)
	a.mgmt.cut.Store(true)
	waitFor(t, "b takes a's clusters over", 30*time.Second, func() error {
		if got := b.holds(); !slices.Equal(got, names) {
			return fmt.Errorf("b holds %v", got)
		}
		return nil
	})
	for _, name := range kept {
		rec.WaitFor(t, name, index.StateConnected, 1, 30*time.Second)
		var states []string
		for _, tr := range rec.Of(name) {
			states = append(states, string(tr.State))
			if tr.State == index.StateDisconnected && tr.Err != "collector a stopped renewing its lease; collector b took the cluster over and resyncs it" {
				t.Fatalf("%s: DISCONNECTED with %q", name, tr.Err)
			}
		}
		if got := strings.Join(states, " "); got != "DISCONNECTED CONNECTED" {
			t.Fatalf("%s went through %s, want one DISCONNECTED and one CONNECTED", name, got)
		}
	}
	if n := testutil.ToFloat64(b.collector.metrics.takeovers.WithLabelValues("failover")); n != float64(len(kept)) {
		t.Fatalf("b counted %v failovers, want %d", n, len(kept))
	}

	// a, still collecting (it is cut off from the management cluster
	// only), writes: its cluster rows' LastSeen, and a new pod. The
	// stream refuses its first write after the takeover, and a stops.
	if _, err := kube.CoreV1().Pods("ns-0").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "after-takeover"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}, TerminationGracePeriodSeconds: ptr.To(int64(0))},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a is fenced off every cluster b took", 30*time.Second, func() error {
		if got := a.holds(); len(got) != 0 {
			return fmt.Errorf("a still holds %v", got)
		}
		if n := testutil.ToFloat64(a.collector.metrics.lost); n != float64(len(kept)) {
			return fmt.Errorf("a lost %v clusters, want %d", n, len(kept))
		}
		return nil
	})
	waitFor(t, "the replica holds b's state", 30*time.Second, func() error {
		for _, name := range names {
			if err := sameCluster(b.store, replica.store, name); err != nil {
				return err
			}
			if _, ok := replica.store.Get(index.Key{Cluster: name, Kind: "Pod", Namespace: "ns-0", Name: "after-takeover"}); !ok {
				return fmt.Errorf("%s: the new pod is missing", name)
			}
		}
		return nil
	})
}

// TestReleasedDuringShutdown ends an edge's session (Released) on a
// goroutine of its own, with nothing ordering it before the collector's
// shutdown, as an edge handler does: its lease update must join the
// goroutines Run waits for before Run stops (it raced Run's WaitGroup
// Wait under -race), and once Run has stopped no update starts at all.
// The cluster's lock, held by the test, keeps the update in flight; the
// pauses order the steps without the race detector seeing an order.
func TestReleasedDuringShutdown(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "mgmt"})
	const ns = "fleetgraph-leases"
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tc := startCollector(t, natsServer(t), "a", c.Config, ns, nil)
	col := tc.collector
	waitOwnLease(t, col)

	lk := col.lock("edge-leaf")
	go col.Released("edge-leaf", "vm-1") // its update waits for lk
	time.Sleep(20 * time.Millisecond)
	tc.cancel()
	time.Sleep(100 * time.Millisecond) // Run waits for the update
	lk.Unlock()
	var errs []error
	for range 3 {
		errs = append(errs, <-tc.done)
	}
	for _, err := range errs {
		tc.done <- err // for the cleanup
	}

	lk = col.lock("edge-leaf")
	defer lk.Unlock()
	before := updates() // the first one may still be exiting
	col.Released("edge-leaf", "vm-1")
	for id, g := range updates() {
		if _, ok := before[id]; !ok {
			t.Errorf("Released after Run stopped started an update:\n%s", g)
		}
	}
}

// updates returns the stacks of the goroutines Released started, by
// goroutine header ("goroutine 12").
func updates() map[string]string {
	buf := make([]byte, 1<<20)
	out := map[string]string{}
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "(*Collector).Released.func") {
			id, _, _ := strings.Cut(g, " [")
			out[id] = g
		}
	}
	return out
}

// TestClaimWaitsForOwnLease: an edge that reaches a collector before the
// collector's first lease renewal is asked to retry, and no cluster lease
// is written: one naming a holder without a live collector lease would be
// adopted at once by any other collector (a fresh clone's make test saw
// collector b take an edge's cluster from a the moment a claimed it).
// Once the collector's own lease is written, the same claim succeeds.
func TestClaimWaitsForOwnLease(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "mgmt"})
	const ns = "fleetgraph-leases"
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := natsServer(t)
	nc, err := ConnectEmbedded(s)
	must(t, err)
	t.Cleanup(nc.Close)
	store := index.New(memtables.Open)
	node, err := New(Options{Conn: nc, Store: store, Name: NewIncarnation("a")})
	must(t, err)
	manager, err := connection.NewManager(connection.Options{Store: node})
	must(t, err)
	col, err := NewCollector(CollectorOptions{
		Node: node, Manager: manager,
		Leases: &LeaseOptions{Client: kube, Namespace: ns, ID: "a", Duration: 3 * time.Second},
	})
	must(t, err)

	// Without the rule, this claim writes the lease and then waits for
	// the Node, which is not running yet: the deadline ends that wait.
	early, cancelEarly := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancelEarly()
	err = col.Claim(early, "edge-leaf", "vm-1")
	var reject *edge.Reject
	if !errors.As(err, &reject) || reject.Reason != edge.ReasonGracePeriod || reject.RetryAfterMillis <= 0 {
		t.Fatalf("a claim before the collector's first renewal: %v, want a reject asking to retry", err)
	}
	if _, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), clusterLeaseName("edge-leaf"), metav1.GetOptions{}); err == nil {
		t.Fatal("the refused claim wrote the cluster's lease")
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 3)
	go func() { done <- node.Run(ctx) }()
	go func() { done <- manager.Run(ctx) }()
	go func() { done <- col.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 3 {
			if err := <-done; err != nil {
				t.Errorf("collector: %v", err)
			}
		}
	})
	waitOwnLease(t, col)
	if err := col.Claim(t.Context(), "edge-leaf", "vm-1"); err != nil {
		t.Fatalf("a claim once the collector's lease is live: %v", err)
	}
	l, err := kube.CoordinationV1().Leases(ns).Get(t.Context(), clusterLeaseName("edge-leaf"), metav1.GetOptions{})
	must(t, err)
	if got := ptr.Deref(l.Spec.HolderIdentity, ""); collectorOf(got) != "a" {
		t.Fatalf("the cluster's lease is held by %q, want collector a", got)
	}
}

// waitOwnLease waits until col has written its own lease.
func waitOwnLease(t *testing.T, col *Collector) {
	t.Helper()
	waitFor(t, "the collector holds its own lease", 30*time.Second, func() error {
		col.mu.Lock()
		defer col.mu.Unlock()
		if col.mine == nil {
			return errors.New("not yet")
		}
		return nil
	})
}
