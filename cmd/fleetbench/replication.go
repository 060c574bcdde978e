package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
	"github.com/fleetgraph/fleetgraph/replication"
)

// runReplication is fleetbench replication: an owner publishing the
// synthetic fleet over an embedded JetStream server and query replicas
// materializing it, each a replication.Node with its own index and its own
// NATS connection over loopback TCP, as separate processes would have. It
// prints
//
//	replication: objects=N query_replicas=2 lag_p99_ms=.. warm_start_s=.. cold_start_s=.. stream_bytes_per_object=.. stream_bytes_per_change=..
//
// The figures, in the order they are measured:
//
//   - cold_start_s: the stream is empty and the replicas follow it; the
//     owner takes every cluster (Acquire) and writes it as a collector's
//     first sync does (a CONNECTING cluster row, one Replace per kind, a
//     synced CONNECTED row), cluster after cluster. From the first Acquire
//     until every replica holds every cluster synced: the owner's
//     ingest, encoding and publishing, and the replicas' reading and
//     applying, with no leaf cluster involved.
//   - stream_bytes_per_object: the stream's bytes (JetStream's stream info,
//     storage overhead included) once the owner has published everything
//     (Node.Flush), divided by the objects.
//   - lag_p99_ms: the owner applies -rate real changes per second (new
//     versions that differ in status, message or labels, so that each one
//     is published; no no-op updates) from -writers goroutines, each for
//     its share of the clusters, as single-row Upserts. A change's lag is from its commit at the owner
//     (the UpdatedAt the owner's index stamped, which the replicas replay)
//     to its event in a replica's change feed, that is, visible in the
//     replica's index; the p99 is over every change on every replica.
//   - stream_bytes_per_change: what the stream grew by during the churn,
//     divided by the changes.
//   - warm_start_s: with the stream already there (snapshots and what came
//     after them), a new replica with an empty index starts: from its
//     connection to Ready (caught up with the stream).
//
// Each phase ends with a check of what it timed: every replica's index
// equals the owner's, cluster by cluster (the cluster row, its kinds and
// every row, UpdatedAt included), and the owner holds the whole fleet.
func runReplication(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replication", flag.ContinueOnError)
	o := replOptions{fleet: indextest.DefaultFleet()}
	fs.IntVar(&o.fleet.Clusters, "clusters", o.fleet.Clusters, "clusters in the synthetic fleet")
	fs.IntVar(&o.fleet.Namespaces, "namespaces", o.fleet.Namespaces, "namespaces per cluster")
	fs.IntVar(&o.fleet.PerNamespace, "per-namespace", o.fleet.PerNamespace, "objects per namespace")
	fs.IntVar(&o.replicas, "replicas", 2, "query replicas following the stream")
	fs.IntVar(&o.rate, "rate", 1000, "changes per second during the lag measurement")
	fs.DurationVar(&o.churnFor, "churn-duration", 30*time.Second, "how long to measure the lag")
	fs.IntVar(&o.writers, "writers", 10, "goroutines writing the changes, each for its share of the clusters")
	verbose := fs.Bool("v", false, "print details to stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (owner, replicas and NATS server) to this file")
	fs.StringVar(&o.warmProfile, "warmcpuprofile", "", "write a CPU profile of the warm start to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	o.logf = func(format string, a ...any) {
		if *verbose {
			fmt.Fprintf(os.Stderr, format+"\n", a...)
		}
	}
	dir, err := os.MkdirTemp("", "fleetbench-replication-")
	if err != nil {
		return err
	}
	o.dir = dir
	r, err := replicationBench(ctx, o)
	if rerr := os.RemoveAll(dir); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	fmt.Println(r.line())
	return nil
}

// replOptions configures replicationBench.
type replOptions struct {
	fleet    indextest.Fleet
	replicas int
	rate     int
	churnFor time.Duration
	writers  int
	// warmProfile is where to write a CPU profile of the warm start.
	warmProfile string
	// dir holds JetStream's files.
	dir  string
	logf func(string, ...any)
}

// replResult is what replicationBench measured.
type replResult struct {
	objects, replicas int
	cold, warm        time.Duration
	lagP50, lagP99    time.Duration
	changes           int
	changesPerSec     float64
	bytesPerObject    float64
	bytesPerChange    float64
}

func (r replResult) line() string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	return fmt.Sprintf("replication: objects=%d query_replicas=%d lag_p99_ms=%.1f warm_start_s=%.2f cold_start_s=%.2f stream_bytes_per_object=%.1f stream_bytes_per_change=%.1f",
		r.objects, r.replicas, ms(r.lagP99), r.warm.Seconds(), r.cold.Seconds(), r.bytesPerObject, r.bytesPerChange)
}

// replPoll is how often the benchmark looks at a replica's progress (its
// synced clusters, its position in the stream, Ready). It bounds the
// precision of cold_start_s and warm_start_s from above.
const replPoll = 2 * time.Millisecond

// replPhaseTimeout bounds each wait of the benchmark, so that a replica
// that never catches up fails the run instead of hanging it.
const replPhaseTimeout = 10 * time.Minute

func replicationBench(ctx context.Context, o replOptions) (res replResult, err error) {
	logf := o.logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	srv, err := replication.StartEmbedded(replication.EmbeddedOptions{Dir: o.dir, Listen: "127.0.0.1:0"})
	if err != nil {
		return res, err
	}
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	url := srv.ClientURL()
	var nodes []*benchNode
	defer func() {
		for _, n := range nodes {
			err = errors.Join(err, n.stop())
		}
	}()
	start := func(name string, follow bool) (*benchNode, error) {
		n, err := startBenchNode(ctx, url, name, follow)
		if err == nil {
			nodes = append(nodes, n)
		}
		return n, err
	}
	owner, err := start("owner", false)
	if err != nil {
		return res, err
	}
	replicas := make([]*benchNode, o.replicas)
	for i := range replicas {
		if replicas[i], err = start("", true); err != nil {
			return res, err
		}
	}
	for _, n := range nodes {
		if err := n.waitReady(ctx); err != nil {
			return res, err
		}
	}
	js, err := jetstream.New(owner.conn)
	if err != nil {
		return res, err
	}
	stream, err := js.Stream(ctx, replication.DefaultStream)
	if err != nil {
		return res, err
	}
	fleet := o.fleet
	res.objects, res.replicas = fleet.Size(), o.replicas
	clusters := make([]string, fleet.Clusters)
	for c := range clusters {
		clusters[c] = indextest.ClusterName(c)
	}

	// Cold start.
	t0, cpu0 := time.Now(), measure.CPUTime()
	for c, name := range clusters {
		if err := loadCluster(ctx, owner, fleet, c); err != nil {
			return res, fmt.Errorf("cluster %s: %w", name, err)
		}
	}
	written := time.Since(t0)
	for i, r := range replicas {
		err := waitUntil(ctx, fmt.Sprintf("replica %d syncs every cluster", i), func() error {
			if f := r.store.Fleet(&index.Access{All: true}); f.ClustersSynced != len(clusters) {
				return fmt.Errorf("%d of %d clusters synced", f.ClustersSynced, len(clusters))
			}
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	res.cold = time.Since(t0)
	logf("cold start: the owner wrote %d objects in %v; every replica held them after %v; process CPU time %v",
		fleet.Size(), written.Round(time.Millisecond), res.cold.Round(time.Millisecond), (measure.CPUTime() - cpu0).Round(time.Millisecond))
	loaded, err := settle(ctx, owner, replicas, stream)
	if err != nil {
		return res, err
	}
	if err := checkReplicas(owner, replicas, clusters, fleet.Size()); err != nil {
		return res, fmt.Errorf("after the cold start: %w", err)
	}
	res.bytesPerObject = float64(loaded.Bytes) / float64(fleet.Size())
	logf("stream after the load: %d messages, %d bytes", loaded.Msgs, loaded.Bytes)

	// Lag under churn.
	if err := churnLag(ctx, o, owner, replicas, &res, logf); err != nil {
		return res, fmt.Errorf("churn: %w", err)
	}
	churned, err := settle(ctx, owner, replicas, stream)
	if err != nil {
		return res, err
	}
	if err := checkReplicas(owner, replicas, clusters, fleet.Size()); err != nil {
		return res, fmt.Errorf("after the churn: %w", err)
	}
	res.bytesPerChange = (float64(churned.Bytes) - float64(loaded.Bytes)) / float64(res.changes)
	if churned.Msgs-loaded.Msgs != churned.LastSeq-loaded.LastSeq {
		// A snapshot purged part of a log meanwhile: the growth is net of
		// what it removed.
		fmt.Fprintf(os.Stderr, "fleetbench: the owner compacted logs during the churn (%d messages written, the stream holds %d more); stream_bytes_per_change is net of what was purged\n",
			churned.LastSeq-loaded.LastSeq, churned.Msgs-loaded.Msgs)
	}
	logf("stream after the churn: %d messages, %d bytes", churned.Msgs, churned.Bytes)

	// Warm start.
	stopProfile, err := startCPUProfile(o.warmProfile)
	if err != nil {
		return res, err
	}
	t0, cpu0 = time.Now(), measure.CPUTime()
	warm, err := start("", true)
	if err == nil {
		err = warm.waitReady(ctx)
	}
	stopProfile()
	if err != nil {
		return res, fmt.Errorf("warm start: %w", err)
	}
	res.warm = time.Since(t0)
	logf("warm start: process CPU time %v (the new replica and the NATS server; the others are idle)", (measure.CPUTime() - cpu0).Round(time.Millisecond))
	if err := checkReplicas(owner, []*benchNode{warm}, clusters, fleet.Size()); err != nil {
		return res, fmt.Errorf("after the warm start: %w", err)
	}
	logf("warm start: a new replica ready in %v", res.warm.Round(time.Millisecond))
	if err := owner.lostErr(); err != nil {
		return res, err
	}
	return res, nil
}

// loadCluster writes cluster c of the fleet through the owner as a
// collector's first sync does.
func loadCluster(ctx context.Context, owner *benchNode, fleet indextest.Fleet, c int) error {
	name := indextest.ClusterName(c)
	if _, err := owner.Acquire(ctx, name, 0); err != nil {
		return err
	}
	row := index.Cluster{Name: name, Mode: index.ModePull, State: index.StateConnecting, Since: time.Now()}
	if err := owner.UpsertCluster(ctx, row); err != nil {
		return err
	}
	if err := fleet.ReplaceCluster(ctx, owner, c); err != nil {
		return err
	}
	row.State, row.Since, row.Synced = index.StateConnected, time.Now(), true
	return owner.UpsertCluster(ctx, row)
}

// settle waits until the owner has published every write and every
// replica has applied the stream up to its end, and returns the stream's
// state then.
func settle(ctx context.Context, owner *benchNode, replicas []*benchNode, stream jetstream.Stream) (jetstream.StreamState, error) {
	if err := owner.Flush(ctx); err != nil {
		return jetstream.StreamState{}, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	for i, r := range replicas {
		err := waitUntil(ctx, fmt.Sprintf("replica %d reaches the end of the stream", i), func() error {
			if got := r.Followed(); got < info.State.LastSeq {
				return fmt.Errorf("at %d of %d", got, info.State.LastSeq)
			}
			return nil
		})
		if err != nil {
			return info.State, err
		}
	}
	return info.State, nil
}

// churnLag applies o.rate changes per second through the owner for
// o.churnFor and measures each change's lag on every replica.
func churnLag(ctx context.Context, o replOptions, owner *benchNode, replicas []*benchNode, res *replResult, logf func(string, ...any)) error {
	fleet := o.fleet
	// Generated before the clock starts. Each writer wakes every
	// millisecond: one per cluster would cost 100,000 wake-ups a second
	// at 100 clusters, on the cores the replicas need.
	// More than the duration needs: the writers stop when it ends.
	perWriter := churnByWriter(fleet, int(float64(o.rate)*o.churnFor.Seconds()*1.5)+100, max(1, min(o.writers, fleet.Clusters)))
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	watchers := make([]*lagWatcher, len(replicas))
	for i, r := range replicas {
		w, err := watchLag(watchCtx, r.store)
		if err != nil {
			return err
		}
		watchers[i] = w
	}
	published := owner.store.FeedStats().Published
	var applied atomic.Int64
	churnCtx, stopChurn := context.WithTimeout(ctx, o.churnFor)
	defer stopChurn()
	t0 := time.Now()
	err := pace(churnCtx, o.rate, perWriter, func(ctx context.Context, u index.Object) error {
		err := owner.Upsert(ctx, u)
		if err == nil {
			applied.Add(1)
		}
		return err
	})()
	took := time.Since(t0)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	res.changes = int(applied.Load())
	res.changesPerSec = float64(res.changes) / took.Seconds()
	// Only changes count: every update must have been one at the owner.
	if changes := owner.store.FeedStats().Published - published; changes != uint64(res.changes) {
		return fmt.Errorf("%d updates applied but %d changes at the owner: the churn counted no-ops", res.changes, changes)
	}
	if res.changesPerSec < 0.9*float64(o.rate) {
		fmt.Fprintf(os.Stderr, "fleetbench: the churn reached only %.0f changes/s of %d\n", res.changesPerSec, o.rate)
	}
	var lags []time.Duration
	for i, w := range watchers {
		err := waitUntil(ctx, fmt.Sprintf("replica %d sees every change", i), func() error {
			if got := w.seen.Load(); got != int64(res.changes) {
				return fmt.Errorf("%d changes of %d", got, res.changes)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	stopWatching()
	for i, w := range watchers {
		if err := w.wait(); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
		if w.other > 0 {
			return fmt.Errorf("replica %d: %d object events other than the churn's changes", i, w.other)
		}
		lags = append(lags, w.lags...)
	}
	slices.Sort(lags)
	res.lagP50, res.lagP99 = lags[len(lags)/2], lags[len(lags)*99/100]
	logf("churn: %d changes in %v (%.0f/s); lag over %d replicas p50 %v p99 %v max %v",
		res.changes, took.Round(time.Millisecond), res.changesPerSec, len(replicas), res.lagP50, res.lagP99, lags[len(lags)-1])
	return nil
}

// lagWatcher reads a replica's change feed and records, for each object
// change, how long after the owner's commit it became visible.
type lagWatcher struct {
	seen atomic.Int64 // changes seen, read while it runs
	done chan error
	// Set by the watcher; read after done.
	lags  []time.Duration
	other int // object events that are not changes (ADDED, DELETED)
}

func watchLag(ctx context.Context, s *index.Store) (*lagWatcher, error) {
	sub, err := s.Subscribe(s.LastSeq())
	if err != nil {
		return nil, err
	}
	w := &lagWatcher{done: make(chan error, 1)}
	go func() {
		defer sub.Close()
		buf := make([]*index.Event, 0, 256)
		for {
			evs, err := sub.Next(ctx, buf[:0])
			if err != nil {
				if ctx.Err() != nil {
					err = nil
				}
				w.done <- err
				return
			}
			now := time.Now()
			for _, ev := range evs {
				switch ev.Type {
				case index.EventModified:
					w.lags = append(w.lags, now.Sub(ev.Object().UpdatedAt))
					w.seen.Add(1)
				case index.EventAdded, index.EventDeleted:
					w.other++
				}
			}
		}
	}()
	return w, nil
}

func (w *lagWatcher) wait() error { return <-w.done }

// checkReplicas checks that the owner holds objects rows and that every
// replica's index equals the owner's.
func checkReplicas(owner *benchNode, replicas []*benchNode, clusters []string, objects int) error {
	rows := 0
	for _, name := range clusters {
		rows += len(owner.store.SnapshotCluster(name).Rows)
	}
	if rows != objects {
		return fmt.Errorf("the owner holds %d rows of the fleet's %d", rows, objects)
	}
	for i, r := range replicas {
		if err := sameFleet(owner.store, r.store, clusters); err != nil {
			return fmt.Errorf("replica %d: %w", i, err)
		}
	}
	return nil
}

// sameFleet compares a replica's index with the owner's, cluster by
// cluster: the cluster row, its kinds and every row, UpdatedAt included.
func sameFleet(owner, replica *index.Store, clusters []string) error {
	for _, name := range clusters {
		a, b := owner.SnapshotCluster(name), replica.SnapshotCluster(name)
		switch {
		case len(a.Rows) != len(b.Rows):
			return fmt.Errorf("cluster %s: %d rows, the owner has %d", name, len(b.Rows), len(a.Rows))
		case !reflect.DeepEqual(a.Cluster, b.Cluster):
			return fmt.Errorf("cluster %s: the cluster row is %+v, the owner's %+v", name, b.Cluster, a.Cluster)
		case !reflect.DeepEqual(a.Kinds, b.Kinds):
			return fmt.Errorf("cluster %s: kinds %+v, the owner's %+v", name, b.Kinds, a.Kinds)
		}
		for j := range a.Rows {
			if !reflect.DeepEqual(a.Rows[j], b.Rows[j]) {
				return fmt.Errorf("cluster %s: row %s is %+v, the owner's %+v", name, b.Rows[j].Key(), b.Rows[j], a.Rows[j])
			}
		}
	}
	return nil
}

// waitUntil polls cond every replPoll until it returns nil, for up to
// replPhaseTimeout.
func waitUntil(ctx context.Context, what string, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, replPhaseTimeout)
	defer cancel()
	t := time.NewTicker(replPoll)
	defer t.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (%w)", what, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// benchNode is a replication.Node with its own NATS connection, index and
// Run goroutine.
type benchNode struct {
	*replication.Node
	store  *index.Store
	conn   *nats.Conn
	cancel context.CancelFunc
	done   chan error
	lost   atomic.Pointer[error]
}

func startBenchNode(ctx context.Context, url, name string, follow bool) (*benchNode, error) {
	nc, err := nats.Connect(url, nats.Name("fleetbench"))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	b := &benchNode{store: index.New(memtables.Open), conn: nc, done: make(chan error, 1)}
	b.Node, err = replication.New(replication.Options{
		Conn: nc, Store: b.store, Name: name, Follow: follow,
		// Warnings and errors only: every Acquire logs at info.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		OnLost: func(cluster string, err error) {
			err = fmt.Errorf("the owner lost %s: %w", cluster, err)
			b.lost.CompareAndSwap(nil, &err)
		},
	})
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, b.cancel = context.WithCancel(ctx)
	go func() { b.done <- b.Run(ctx) }()
	return b, nil
}

// waitReady waits until the node is caught up with the stream.
func (b *benchNode) waitReady(ctx context.Context) error {
	return waitUntil(ctx, "ready", b.Ready)
}

func (b *benchNode) lostErr() error {
	if err := b.lost.Load(); err != nil {
		return *err
	}
	return nil
}

// stop ends the node's Run and closes its connection.
func (b *benchNode) stop() error {
	b.cancel()
	err := <-b.done
	b.conn.Close()
	return err
}
