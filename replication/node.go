package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// Defaults for Options.
const (
	// DefaultCompactRatio: an owner writes a new snapshot of a cluster
	// once the operations it published since the last one reach this
	// fraction of that snapshot's size, and purges what came before. A
	// cluster's log then holds at most about 1.5 snapshots, whatever its
	// history.
	DefaultCompactRatio = 0.5
	// DefaultMinCompactBytes keeps small clusters from being snapshotted
	// for every few operations: their log may grow to this before it is
	// compacted.
	DefaultMinCompactBytes = 64 << 10
	// payloadHeadroom is left under the connection's maximum payload for
	// the envelope head, headers and incompressible data.
	payloadHeadroom = 8 << 10
	// resyncEvery limits how often a replica asks a cluster's owner for a
	// snapshot after missing part of its log.
	resyncEvery = 10 * time.Second
	// publishTimeout bounds one publish attempt; a publish that times out
	// is retried (the message id makes a retry harmless).
	publishTimeout = 5 * time.Second
)

// Options configures a Node.
type Options struct {
	// Conn is the NATS connection; required.
	Conn *nats.Conn
	// Stream and Prefix name the stream and its subjects; they default
	// to DefaultStream and DefaultPrefix. Replicas is the stream's
	// replica count when the node creates it (default 1).
	Stream   string
	Prefix   string
	Replicas int
	// Store is the index the node keeps: the whole fleet on a query
	// replica, the clusters it owns on a collector. Required.
	Store *index.Store
	// Name identifies this process as an owner (its collector id and an
	// incarnation that differs on every start). Required to own clusters.
	Name string
	// Follow makes the node apply every cluster's log to Store, as a
	// query replica does. Clusters the node owns are never applied from
	// the log: it wrote them.
	Follow bool
	// CompactRatio and MinCompactBytes pace snapshots (see the
	// defaults). MaxMessageBytes bounds a message; it defaults to the
	// connection's maximum payload.
	CompactRatio    float64
	MinCompactBytes int
	MaxMessageBytes int
	// OnLost is called, on a goroutine of its own, when the node learns
	// that another owner took one of its clusters over (its publish was
	// refused, or it read the new owner's messages): the caller stops
	// collecting the cluster.
	OnLost func(cluster string, err error)
	// Registerer, if set, receives the node's metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Node is one fleetgraph process on the stream: it applies the clusters'
// logs to its index (Follow), owns clusters and publishes their writes
// (Acquire, then the index.Sink calls), or both.
//
// Concurrency: each cluster has a clusterLog whose mutex is held while a
// message of the cluster is applied, while a write is applied to the
// index and queued for publishing, and while ownership changes; so writes
// and messages of one cluster are never interleaved, and clusters do not
// wait for each other. Run starts the follower's two goroutines (reading
// and decoding, applying); Acquire starts one publishing goroutine per
// owned cluster, which Release and the loss of the cluster end. Run
// returns after every goroutine it and Acquire started has ended.
type Node struct {
	opts    Options
	subj    subjects
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	budget  int // set before started is closed

	started chan struct{} // closed once Run has the stream
	stream  jetstream.Stream
	ctx     context.Context // Run's, set before started is closed

	mu       sync.Mutex
	clusters map[string]*clusterLog

	wg       sync.WaitGroup // publishing goroutines
	caughtUp atomic.Bool
	followed atomic.Uint64 // stream sequence the follower has applied
}

// clusterLog is what the node knows about one cluster's log. Its fields
// are guarded by mu.
type clusterLog struct {
	name    string
	subject string

	mu      sync.Mutex
	applied uint64 // stream sequence of the last message of the log applied (or known applied)
	epoch   uint64 // the highest owner epoch seen
	owner   string // the owner that wrote it
	// dirty is set when the index's state of the cluster may differ from
	// the log's: a part of the log was missed, or this node lost the
	// cluster with writes it could not publish. Operations are not
	// applied then; the next snapshot is, whatever its position.
	dirty bool
	// asm is the snapshot being assembled from its parts; skipping is
	// set while the parts of a snapshot the index has already are read.
	asm      *index.ClusterSnapshot
	skipping bool
	// partial is an operation whose parts are being collected.
	partial *op
	// own is set while this node owns the cluster.
	own *owned
	// lastResync is when a snapshot was last requested.
	lastResync time.Time
}

// New returns a Node. It does nothing until Run.
func New(opts Options) (*Node, error) {
	if opts.Conn == nil || opts.Store == nil {
		return nil, errors.New("replication: Options.Conn and Store are required")
	}
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.CompactRatio <= 0 {
		opts.CompactRatio = DefaultCompactRatio
	}
	if opts.MinCompactBytes <= 0 {
		opts.MinCompactBytes = DefaultMinCompactBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	js, err := jetstream.New(opts.Conn)
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	n := &Node{
		opts: opts, subj: subjects{opts.Prefix}, js: js, log: opts.Logger.With("component", "replication"),
		metrics: newMetrics(), started: make(chan struct{}), clusters: map[string]*clusterLog{},
	}
	if opts.MaxMessageBytes > 0 {
		if err := n.setBudget(opts.MaxMessageBytes); err != nil {
			return nil, err
		}
	}
	if opts.Registerer != nil {
		if err := n.metrics.register(opts.Registerer); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// cluster returns the log state of a cluster, creating it.
func (n *Node) cluster(name string) *clusterLog {
	n.mu.Lock()
	defer n.mu.Unlock()
	cl := n.clusters[name]
	if cl == nil {
		cl = &clusterLog{name: name, subject: n.subj.cluster(name)}
		n.clusters[name] = cl
	}
	return cl
}

// Run creates or updates the stream, follows it when Options.Follow is
// set, and serves resync requests for owned clusters, until ctx ends.
// Owned clusters are then released: their queued writes are published
// (for up to a few seconds) so that the next owner starts from them.
func (n *Node) Run(ctx context.Context) error {
	s, err := n.openStream(ctx)
	if err != nil {
		return nil // ctx ended
	}
	if n.budget == 0 {
		// Known once connected: a connection made while NATS was still
		// starting had no server to tell it until now.
		if err := n.setBudget(int(n.opts.Conn.MaxPayload())); err != nil {
			return err
		}
	}
	n.stream, n.ctx = s, ctx
	close(n.started)
	sub, err := n.opts.Conn.Subscribe(n.subj.resyncAll(), n.onResync)
	if err != nil {
		return fmt.Errorf("replication: subscribe %s: %w", n.subj.resyncAll(), err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	statsCtx, stopStats := context.WithCancel(ctx)
	defer stopStats()
	stats := make(chan struct{})
	go func() {
		defer close(stats)
		n.watchStream(statsCtx)
	}()
	if n.opts.Follow {
		err = n.follow(ctx)
	} else {
		n.caughtUp.Store(true)
		<-ctx.Done()
	}
	stopStats() // a failure of follow ends Run, not only ctx
	<-stats
	n.wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// setBudget sets the bound of a message's encoding from the largest
// message NATS takes.
func (n *Node) setBudget(maxBytes int) error {
	if maxBytes-payloadHeadroom < 16<<10 {
		return fmt.Errorf("replication: a maximum message size of %d bytes is too small (at least %d)", maxBytes, 16<<10+payloadHeadroom)
	}
	n.budget = maxBytes - payloadHeadroom
	return nil
}

// openStream creates or updates the stream, retrying until it succeeds or
// ctx ends: a process started along with its NATS cluster waits for the
// cluster's leaders to be elected, and one whose NATS is down for its
// return, not ready meanwhile.
func (n *Node) openStream(ctx context.Context) (jetstream.Stream, error) {
	backoff := retry.New(retry.Stream, nil)
	for {
		s, err := ensureStream(ctx, n.js, n.opts.Stream, n.subj, n.opts.Replicas)
		if err == nil {
			return s, nil
		}
		if ctx.Err() == nil {
			n.log.Warn("the stream cannot be opened yet; retrying", "err", err)
		}
		if !backoff.Wait(ctx) {
			return nil, ctx.Err()
		}
	}
}

// Ready reports whether the node is caught up with the stream: it has
// applied every message that was in the stream when it started reading
// (a node that does not follow is ready once Run has the stream).
func (n *Node) Ready() error {
	select {
	case <-n.started:
	default:
		return errors.New("replication: not connected to the stream yet")
	}
	if !n.caughtUp.Load() {
		return errors.New("replication: catching up with the stream")
	}
	return nil
}

// wait blocks until Run has the stream.
func (n *Node) wait(ctx context.Context) error {
	select {
	case <-n.started:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchStream refreshes the stream-size metrics.
func (n *Node) watchStream(ctx context.Context) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		if info, err := n.stream.Info(ctx); err == nil {
			n.metrics.streamBytes.Set(float64(info.State.Bytes))
			n.metrics.streamMessages.Set(float64(info.State.Msgs))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// StreamSize returns the stream's bytes and messages now.
func (n *Node) StreamSize(ctx context.Context) (bytes, msgs uint64, err error) {
	if err := n.wait(ctx); err != nil {
		return 0, 0, err
	}
	info, err := n.stream.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("replication: stream info: %w", err)
	}
	return info.State.Bytes, info.State.Msgs, nil
}

// Followed returns the stream sequence number up to which the follower
// has applied the stream.
func (n *Node) Followed() uint64 { return n.followed.Load() }
