package replication

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetgraph/fleetgraph/index"
)

// natsNode is one server of a JetStream cluster of three, on fixed
// addresses so that it can be restarted as the same member.
type natsNode struct {
	name, dir     string
	port, cluster int
	srv           *server.Server
}

// natsCluster starts three JetStream servers routed to each other.
func natsCluster(t *testing.T) []*natsNode {
	t.Helper()
	var nodes []*natsNode
	for i := range 3 {
		nodes = append(nodes, &natsNode{name: fmt.Sprintf("n%d", i), dir: t.TempDir(), port: freePort(t), cluster: freePort(t)})
	}
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = nodes[i].start(nodes) }()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop()
		}
	})
	for _, err := range errs {
		must(t, err)
	}
	return nodes
}

func (n *natsNode) start(all []*natsNode) error {
	var routes []string
	for _, o := range all {
		if o != n {
			routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", o.cluster))
		}
	}
	s, err := StartEmbedded(EmbeddedOptions{
		Dir: n.dir, Name: n.name, Listen: fmt.Sprintf("127.0.0.1:%d", n.port),
		ClusterName: "test", ClusterListen: fmt.Sprintf("127.0.0.1:%d", n.cluster), Routes: routes,
	})
	n.srv = s
	return err
}

func (n *natsNode) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// connectCluster connects to every server of nodes, reconnecting forever.
func connectCluster(t *testing.T, nodes []*natsNode) *nats.Conn {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", n.port))
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	must(t, err)
	return nc
}

// TestFollowSurvivesNATSNodeKill: two replicas follow a stream of three
// replicas while the server leading it dies, twice; each time
// the replica reads what the owner writes afterwards within seconds.
// On a failure the test writes every goroutine's stack to a file, to see
// where the replica's reader waits.
func TestFollowSurvivesNATSNodeKill(t *testing.T) {
	nodes := natsCluster(t)
	replicas := func(o *Options) { o.Replicas = 3 }
	debug := func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	owner := startNodeConn(t, connectCluster(t, nodes), "collector-a", false, replicas, debug)
	replicaNodes := []*testNode{
		startNodeConn(t, connectCluster(t, nodes), "", true, replicas, debug),
		startNodeConn(t, connectCluster(t, nodes), "", true, replicas, debug),
	}
	// The cluster just formed: the stream may have no leader yet, and
	// Acquire does not wait for one.
	nc := connectCluster(t, nodes)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	must(t, err)
	streamCurrent(t, js, len(nodes))
	acquire(t, owner, "east")
	writeSome(t, owner, "east", 5)
	converged := func(what string) {
		t.Helper()
		start, dumped := time.Now(), false
		deadline := start.Add(30 * time.Second)
		for {
			var err error
			for i, r := range replicaNodes {
				if e := sameCluster(owner.store, r.store, "east"); e != nil {
					info, ierr := owner.stream.Info(context.Background())
					if ierr == nil {
						e = fmt.Errorf("replica %d (read up to %d of %d, owner published up to %d): %w", i, r.followed.Load(), info.State.LastSeq, appliedOf(owner, "east"), e)
					}
					err = e
				}
			}
			if err == nil {
				t.Logf("%s: the replicas read the owner's writes after %v", what, time.Since(start).Round(time.Millisecond))
				return
			}
			if !dumped && time.Since(start) > 2*followIdle {
				dumped = true
				t.Logf("%s: not equal after %v (goroutines in %s): %v", what, 2*followIdle, dumpGoroutines(), err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the replicas did not read the owner's writes within 30s (goroutines in %s): %v", what, dumpGoroutines(), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	converged("before any kill")
	for round := range 2 {
		info, err := owner.stream.Info(context.Background())
		must(t, err)
		var leader *natsNode
		for _, n := range nodes {
			if info.Cluster != nil && n.name == info.Cluster.Leader {
				leader = n
			}
		}
		if leader == nil {
			t.Fatalf("no leader in %+v", info.Cluster)
		}
		leader.stop()
		ctx := context.Background()
		must(t, owner.UpsertCluster(ctx, eastState(round)))
		converged(fmt.Sprintf("round %d, %s down", round, leader.name))
		must(t, leader.start(nodes))
		// The next kill, and the test's end, find every replica of the
		// stream current: a server shut down while it still builds its
		// replica leaves that store's goroutines running (goleak).
		streamCurrent(t, js, len(nodes))
		must(t, owner.UpsertCluster(ctx, eastState(round+10)))
		converged(fmt.Sprintf("round %d, %s back", round, leader.name))
	}
}

// eastState is a row of cluster east that differs for every i.
func eastState(i int) index.Cluster {
	return index.Cluster{Name: "east", Mode: index.ModePull, State: index.StateConnected, Since: time.Now(), LastError: fmt.Sprint("round ", i), Synced: true}
}

// dumpGoroutines writes every goroutine's stack to a file and returns
// its name.
func dumpGoroutines() string {
	f, err := os.CreateTemp("", "natskill-goroutines-*.txt")
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	_ = pprof.Lookup("goroutine").WriteTo(f, 2)
	return f.Name()
}

// appliedOf returns the stream sequence of the last message of cluster
// that n applied or published.
func appliedOf(n *testNode, cluster string) uint64 {
	cl := n.cluster(cluster)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.applied
}

// streamCurrent waits until the stream has a leader and its other
// servers' replicas are current.
func streamCurrent(t *testing.T, js jetstream.JetStream, servers int) {
	t.Helper()
	waitFor(t, "every replica of the stream current", 30*time.Second, func() error {
		st, err := js.Stream(context.Background(), DefaultStream)
		if err != nil {
			return err
		}
		c := st.CachedInfo().Cluster
		if c == nil || c.Leader == "" || len(c.Replicas) != servers-1 {
			return fmt.Errorf("stream cluster %+v", c)
		}
		for _, r := range c.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s: current %v, offline %v", r.Name, r.Current, r.Offline)
			}
		}
		return nil
	})
}
