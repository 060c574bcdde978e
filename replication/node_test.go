package replication

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// natsServer starts a single embedded JetStream server for a test.
func natsServer(t *testing.T) *server.Server {
	t.Helper()
	s, err := StartEmbedded(EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// testNode is a Node with its own connection, index and Run goroutine.
type testNode struct {
	*Node
	store  *index.Store
	cancel context.CancelFunc
	done   chan error
	lost   chan string
}

func startNode(t *testing.T, s *server.Server, name string, follow bool, tweak ...func(*Options)) *testNode {
	t.Helper()
	nc, err := ConnectEmbedded(s)
	if err != nil {
		t.Fatal(err)
	}
	return startNodeConn(t, nc, name, follow, tweak...)
}

// startNodeConn is startNode on a connection of the caller's, which the
// node's cleanup closes.
func startNodeConn(t *testing.T, nc *nats.Conn, name string, follow bool, tweak ...func(*Options)) *testNode {
	t.Helper()
	var err error
	tn := &testNode{store: index.New(memtables.Open), done: make(chan error, 1), lost: make(chan string, 16)}
	opts := Options{
		Conn: nc, Store: tn.store, Name: name, Follow: follow,
		OnLost: func(cluster string, _ error) { tn.lost <- cluster },
	}
	for _, f := range tweak {
		f(&opts)
	}
	tn.Node, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn.cancel = cancel
	go func() { tn.done <- tn.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-tn.done; err != nil {
				t.Errorf("node %s: Run: %v", name, err)
			}
			nc.Close()
		})
	}
	t.Cleanup(stop)
	return tn
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sameCluster compares two indexes' state of a cluster.
func sameCluster(a, b *index.Store, cluster string) error {
	sa, sb := a.SnapshotCluster(cluster), b.SnapshotCluster(cluster)
	if !reflect.DeepEqual(sa, sb) {
		return fmt.Errorf("cluster %s differs:\n%s\n%s", cluster, describe(sa), describe(sb))
	}
	return nil
}

func describe(s index.ClusterSnapshot) string {
	out := fmt.Sprintf("row %+v, kinds %+v, %d rows", s.Cluster, s.Kinds, len(s.Rows))
	for i, r := range s.Rows {
		if i == 5 {
			out += " ..."
			break
		}
		out += fmt.Sprintf("\n  %s %s %s", r.Key(), r.Status, r.UpdatedAt.Format(time.RFC3339Nano))
	}
	return out
}

// writeSome performs writes of every kind on cluster through sink.
func writeSome(t *testing.T, sink index.Sink, cluster string, rows int) {
	t.Helper()
	ctx := context.Background()
	var pods []index.Object
	for i := range rows {
		pods = append(pods, testPod(cluster, fmt.Sprintf("ns-%d", i%5), fmt.Sprintf("web-%d", i), i))
	}
	must(t, sink.UpsertCluster(ctx, index.Cluster{Name: cluster, Mode: index.ModePull, State: index.StateConnecting, Since: time.Now()}))
	must(t, sink.Replace(ctx, cluster, podKind, pods))
	p := pods[0]
	p.Status, p.Message = index.StatusUnhealthy, "CrashLoopBackOff"
	must(t, sink.Upsert(ctx, p))
	must(t, sink.Delete(ctx, pods[1].Key()))
	role := index.Object{
		Cluster: cluster, Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles", Name: "view",
		Policy: &index.Policy{Rules: []index.PolicyRule{{Verbs: []string{"get", "list"}, Resources: []string{"pods"}}}},
	}
	must(t, sink.Replace(ctx, cluster, index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}, []index.Object{role}))
	hr := index.Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	must(t, sink.ReportKindError(ctx, cluster, hr, errors.New("forbidden")))
	must(t, sink.UpsertCluster(ctx, index.Cluster{Name: cluster, Mode: index.ModePull, State: index.StateDegraded, Since: time.Now(), LastError: "HelmRelease: forbidden", Synced: true}))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func acquire(t *testing.T, n *testNode, cluster string) Takeover {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tk, err := n.Acquire(ctx, cluster, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestReplicaEqualsOwner: what an owner writes, a following replica holds
// exactly, UpdatedAt and error times included; writes that change nothing
// publish nothing; and a replica started later loads the same from the
// stream.
func TestReplicaEqualsOwner(t *testing.T) {
	s := natsServer(t)
	owner := startNode(t, s, "collector-a", false)
	replica := startNode(t, s, "", true)
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 50)
	waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })
	if replica.Ready() != nil {
		t.Fatalf("replica not ready: %v", replica.Ready())
	}

	// Writes that change nothing are not published. The replica holds
	// the owner's last message before the owner has counted it (that
	// waits for the stream's ack): Flush waits for the count, before the
	// baseline and after the writes.
	must(t, owner.Flush(context.Background()))
	before := testutil.ToFloat64(owner.metrics.published)
	snap := owner.store.SnapshotCluster("east")
	var pods []index.Object
	for _, r := range snap.Rows {
		if r.Kind == "Pod" {
			r.UpdatedAt = time.Time{}
			pods = append(pods, r)
		}
	}
	must(t, owner.Replace(context.Background(), "east", podKind, pods))
	must(t, owner.Upsert(context.Background(), pods[0]))
	must(t, owner.Flush(context.Background()))
	if after := testutil.ToFloat64(owner.metrics.published); after != before {
		t.Fatalf("unchanged writes published %v messages", after-before)
	}

	// A write for a cluster the node does not own is dropped.
	west := testPod("west", "a", "x", 1)
	must(t, owner.Upsert(context.Background(), west))
	if _, ok := owner.store.Get(west.Key()); ok {
		t.Fatal("a write for an unowned cluster reached the index")
	}

	late := startNode(t, s, "", true)
	waitFor(t, "late replica ready", 10*time.Second, late.Ready)
	if err := sameCluster(owner.store, late.store, "east"); err != nil {
		t.Fatal(err)
	}
}

// TestFlush: once Flush returns, everything the owner wrote is in the
// stream: nothing more is published after it, and a replica started then
// holds all of it as soon as it is ready. Two clusters, so that Flush
// waits for each of them. (Checked to fail with a Flush that returns at
// once: the stream grew by the writes still being published.)
func TestFlush(t *testing.T) {
	s := natsServer(t)
	owner := startNode(t, s, "collector-a", false)
	names := []string{"east", "west"}
	for _, name := range names {
		acquire(t, owner, name)
	}
	ctx := context.Background()
	// Batches large enough that publishing runs well behind the writer
	// when Flush is called.
	for b := range 8 {
		for _, name := range names {
			var rows []index.Object
			for i := range 300 {
				rows = append(rows, testPod(name, fmt.Sprintf("ns-%d", b), fmt.Sprintf("web-%d", i), b*300+i))
			}
			must(t, owner.UpsertBatch(ctx, rows))
		}
	}
	must(t, owner.Flush(ctx))
	info, err := owner.stream.Info(ctx)
	must(t, err)
	late := startNode(t, s, "", true)
	waitFor(t, "late replica ready", 10*time.Second, late.Ready)
	for _, name := range names {
		if err := sameCluster(owner.store, late.store, name); err != nil {
			t.Fatal(err)
		}
	}
	after, err := owner.stream.Info(ctx)
	must(t, err)
	if after.State.LastSeq != info.State.LastSeq {
		t.Fatalf("the stream's last message was %d when Flush returned and is %d now", info.State.LastSeq, after.State.LastSeq)
	}
}

// TestOwnerOfSeveralClusters: one owner's logs are independent: messages
// of different clusters are never taken for duplicates of one another (a
// message id that did not name its cluster's log made every cluster but
// the first lose its takeover snapshot and its owner).
func TestOwnerOfSeveralClusters(t *testing.T) {
	s := natsServer(t)
	owner := startNode(t, s, "collector-a", false)
	replica := startNode(t, s, "", true)
	names := []string{"east", "west", "north"}
	for _, name := range names {
		acquire(t, owner, name)
	}
	for _, name := range names {
		writeSome(t, owner, name, 10)
	}
	for _, name := range names {
		waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, name) })
	}
	select {
	case name := <-owner.lost:
		t.Fatalf("the owner lost %s", name)
	default:
	}
	if got := owner.Owned(); len(got) != len(names) {
		t.Fatalf("the owner owns %v", got)
	}
}

// TestApplySnapshotReplicates: an edge snapshot applied through an owner
// (several kinds in one commit, retiring the kinds it does not list)
// reaches replicas as the owner's resulting state; an unchanged one
// publishes nothing.
func TestApplySnapshotReplicates(t *testing.T) {
	s := natsServer(t)
	owner := startNode(t, s, "collector-a", false)
	replica := startNode(t, s, "", true)
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 20)
	ctx := context.Background()
	svc := index.Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
	var pods []index.Object
	for i := range 5 {
		pods = append(pods, testPod("east", "edge", fmt.Sprintf("p-%d", i), i))
	}
	svcRow := index.Object{Cluster: "east", Version: "v1", Kind: "Service", Resource: "services", Namespace: "edge", Name: "api"}
	kinds := []index.KindSnapshot{
		{Kind: podKind, Synced: true, Rows: pods},
		{Kind: svc, Synced: true, Rows: []index.Object{svcRow}},
	}
	must(t, owner.ApplySnapshot(ctx, "east", kinds, true))
	if got := owner.store.Kinds("east"); len(got) != 2 {
		t.Fatalf("the owner holds kinds %v after a retiring snapshot of two", got)
	}
	waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })

	must(t, owner.Flush(ctx)) // the last message is counted once acked (see TestReplicaEqualsOwner)
	before := testutil.ToFloat64(owner.metrics.published)
	must(t, owner.ApplySnapshot(ctx, "east", kinds, true))
	must(t, owner.Flush(ctx))
	if after := testutil.ToFloat64(owner.metrics.published); after != before {
		t.Fatalf("an unchanged snapshot published %v messages", after-before)
	}
}

// TestCompaction: a log rewritten many times stays within a snapshot and
// a half (plus the minimum), and a replica started after compactions loads
// it.
func TestCompaction(t *testing.T) {
	s := natsServer(t)
	const minCompact = 4 << 10
	owner := startNode(t, s, "collector-a", false, func(o *Options) { o.MinCompactBytes = minCompact })
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 200)
	ctx := context.Background()
	for round := range 200 {
		for i := range 20 {
			p := testPod("east", fmt.Sprintf("ns-%d", i%5), fmt.Sprintf("web-%d", i+2), i+2)
			p.Message = fmt.Sprintf("round %d", round)
			must(t, owner.Upsert(ctx, p))
		}
	}
	replica := startNode(t, s, "", true)
	waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })
	// A replica holding the owner's state says nothing of a compaction
	// the last batch made due: its snapshot and purge may still be on
	// their way. Flush waits for them, and for the last message's count.
	must(t, owner.Flush(ctx))
	bytes, msgs, err := owner.StreamSize(ctx)
	must(t, err)
	snap := owner.store.SnapshotCluster("east")
	_, _, snapBytes := roundTrip(t, nil, &op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows}, owner.budget)
	published := testutil.ToFloat64(owner.metrics.publishedBytes)
	// The owner snapshots once a published batch takes the bytes since the
	// last snapshot past the threshold, so the log may hold that whole last
	// batch beyond it: the bound counts the largest delta in the log (the
	// log starts with its snapshot; a fresh clone's make test failed the
	// bound without it by 72 bytes, with a big last batch).
	info, err := owner.stream.Info(ctx)
	must(t, err)
	largest := 0
	for seq := info.State.FirstSeq + 1; seq <= info.State.LastSeq; seq++ {
		m, err := owner.stream.GetMsg(ctx, seq)
		if err != nil {
			continue // purged
		}
		largest = max(largest, len(m.Data))
	}
	bound := float64(snapBytes)*(1+DefaultCompactRatio) + minCompact + float64(largest) + 200*float64(msgs) // JetStream's per-message overhead
	t.Logf("stream: %d bytes in %d messages (largest %d); snapshot %d bytes; %.0f bytes published in all; bound %.0f", bytes, msgs, largest, snapBytes, published, bound)
	if float64(bytes) > bound {
		t.Fatalf("the stream holds %d bytes, over %.0f", bytes, bound)
	}
	if published < 2*bound { // without compaction the log would hold about what was published
		t.Fatalf("only %.0f bytes published: the test does not show compaction", published)
	}
}

// TestTakeoverFencesTheOldOwner: a second node takes a cluster over while
// the first still owns it. The first one's next write is refused by the
// stream and it learns it lost the cluster; replicas hold the new owner's
// state and never the old one's later writes.
func TestTakeoverFencesTheOldOwner(t *testing.T) {
	s := natsServer(t)
	a := startNode(t, s, "collector-a", false)
	b := startNode(t, s, "collector-b", false)
	replica := startNode(t, s, "", true)
	ta := acquire(t, a, "east")
	writeSome(t, a, "east", 20)
	waitFor(t, "replica has a's writes", 10*time.Second, func() error { return sameCluster(a.store, replica.store, "east") })

	tb := acquire(t, b, "east")
	if tb.Epoch <= ta.Epoch || tb.Previous != "collector-a" || tb.Row == nil || tb.Row.State != index.StateDegraded {
		t.Fatalf("takeover %+v after %+v", tb, ta)
	}
	if err := sameCluster(a.store, b.store, "east"); err != nil {
		t.Fatalf("the new owner did not load the cluster: %v", err)
	}
	ctx := context.Background()
	stale := testPod("east", "ns-0", "from-the-old-owner", 999)
	must(t, a.Upsert(ctx, stale))
	select {
	case c := <-a.lost:
		if c != "east" {
			t.Fatalf("lost %q", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old owner was not told it lost the cluster")
	}
	if len(a.Owned()) != 0 {
		t.Fatalf("a still owns %v", a.Owned())
	}
	fresh := testPod("east", "ns-0", "from-the-new-owner", 1000)
	must(t, b.Upsert(ctx, fresh))
	waitFor(t, "replica follows b", 10*time.Second, func() error { return sameCluster(b.store, replica.store, "east") })
	if _, ok := replica.store.Get(stale.Key()); ok {
		t.Fatal("the fenced owner's write reached the replica")
	}
	// A message of the old owner that reaches the stream anyway (here
	// published without the stream's check, as a forged or very late
	// one) is ignored by replicas: its epoch is older.
	nc, err := ConnectEmbedded(s)
	must(t, err)
	defer nc.Close()
	last, _, err := lastOnSubject(ctx, replica.stream, replica.subj.cluster("east"))
	must(t, err)
	c := newChunker(1 << 20)
	c.add(&op{typ: opUpsert, at: time.Now(), rows: []index.Object{stale}}, 0)
	msgs := c.messages()
	must(t, nc.Publish(replica.subj.cluster("east"), newEncoder().message(envelope{cluster: "east", epoch: ta.Epoch, owner: "collector-a", prev: last}, &msgs[0])))
	must(t, nc.Flush())
	waitFor(t, "the replica ignored the old owner", 10*time.Second, func() error {
		if testutil.ToFloat64(replica.metrics.ignored.WithLabelValues("stale_owner")) == 0 {
			return errors.New("not counted")
		}
		return nil
	})
	if _, ok := replica.store.Get(stale.Key()); ok {
		t.Fatal("the replica applied a write of the old owner")
	}
	if testutil.ToFloat64(a.metrics.fenced) != 1 {
		t.Fatalf("fenced = %v", testutil.ToFloat64(a.metrics.fenced))
	}
	// a no longer keeps the cluster it does not own.
	if got := a.store.SnapshotCluster("east"); got.Cluster != nil || len(got.Rows) != 0 {
		t.Fatalf("the old owner kept %s", describe(got))
	}
}

// TestReleaseAndTakeBack: a released cluster is taken by another node
// without any change events on a replica that followed it.
func TestReleaseAndTakeBack(t *testing.T) {
	s := natsServer(t)
	a := startNode(t, s, "collector-a", false)
	b := startNode(t, s, "collector-b", false)
	replica := startNode(t, s, "", true)
	acquire(t, a, "east")
	writeSome(t, a, "east", 30)
	waitFor(t, "replica has a's writes", 10*time.Second, func() error { return sameCluster(a.store, replica.store, "east") })
	seq := replica.store.LastSeq()
	ctx := context.Background()
	must(t, a.Release(ctx, "east"))
	if err := a.Release(ctx, "east"); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("second Release: %v", err)
	}
	acquire(t, b, "east")
	must(t, b.Upsert(ctx, testPod("east", "ns-9", "after", 77)))
	waitFor(t, "replica follows b", 10*time.Second, func() error { return sameCluster(b.store, replica.store, "east") })
	// The one change is b's write: the takeover snapshot was skipped.
	if got := replica.store.LastSeq() - seq; got != 1 {
		t.Fatalf("%d change events on the replica for one write", got)
	}
	must(t, b.Release(ctx, "east"))
	acquire(t, a, "east")
	if err := sameCluster(b.store, a.store, "east"); err == nil {
		t.Fatal("b kept the cluster it released") // b does not follow: it dropped it
	}
	if err := sameCluster(replica.store, a.store, "east"); err != nil {
		t.Fatal(err)
	}
}

// TestLargeOperationsAreSplit: operations larger than a message travel in
// parts and are applied whole.
func TestLargeOperationsAreSplit(t *testing.T) {
	s := natsServer(t)
	small := func(o *Options) { o.MaxMessageBytes = 24 << 10 }
	owner := startNode(t, s, "collector-a", false, small)
	replica := startNode(t, s, "", true, small)
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 3000)
	waitFor(t, "replica equals owner", 20*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })
	must(t, owner.Flush(context.Background())) // the last message is counted once acked
	if n := testutil.ToFloat64(owner.metrics.published); n < 10 {
		t.Fatalf("3,000 rows in %v messages of 24 KiB", n)
	}
	late := startNode(t, s, "", true, small)
	waitFor(t, "late replica ready", 20*time.Second, late.Ready)
	must(t, sameCluster(owner.store, late.store, "east"))
}

// TestGapIsRepaired: a replica that finds a hole in a cluster's log (here
// a message that claims to follow one it never saw) stops applying the
// cluster, asks the owner for a snapshot, and is whole again from it.
func TestGapIsRepaired(t *testing.T) {
	s := natsServer(t)
	owner := startNode(t, s, "collector-a", false)
	replica := startNode(t, s, "", true)
	tk := acquire(t, owner, "east")
	writeSome(t, owner, "east", 10)
	waitFor(t, "replica equals owner", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })

	// Forge a message of the owner that skips a sequence number, as if
	// the replica had missed one. (Without the expected-sequence header:
	// the stream takes it.)
	nc, err := ConnectEmbedded(s)
	must(t, err)
	defer nc.Close()
	c := newChunker(1 << 20)
	ghost := testPod("east", "ns-0", "ghost", 5)
	c.add(&op{typ: opUpsert, at: time.Now(), rows: []index.Object{ghost}}, 0)
	msgs := c.messages()
	data := newEncoder().message(envelope{cluster: "east", epoch: tk.Epoch, owner: "collector-a", prev: 1}, &msgs[0])
	must(t, nc.Publish(owner.subj.cluster("east"), data))
	must(t, nc.Flush())
	waitFor(t, "the replica saw the gap", 10*time.Second, func() error {
		if testutil.ToFloat64(replica.metrics.ignored.WithLabelValues("gap")) == 0 {
			return errors.New("no gap counted")
		}
		return nil
	})
	// The owner's next write lands after the forged message, so its own
	// publish is refused: from the stream's view someone else wrote. That
	// is the fencing working on a forgery; the owner gives the cluster up.
	must(t, owner.Upsert(context.Background(), testPod("east", "ns-0", "next", 6)))
	select {
	case <-owner.lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the owner did not notice the foreign message")
	}
	// Taking it again writes a snapshot, which the replica loads.
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 10)
	waitFor(t, "the replica repaired the cluster", 10*time.Second, func() error { return sameCluster(owner.store, replica.store, "east") })
	if _, ok := replica.store.Get(ghost.Key()); ok {
		t.Fatal("the forged row stayed")
	}
}
