package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// Errors of ownership.
var (
	// ErrTakenOver says another owner wrote a cluster's log after this
	// node took it: the node has lost the cluster (it is fenced).
	ErrTakenOver = errors.New("replication: another owner took the cluster over")
	// ErrNotOwner is returned by Release for a cluster the node does not
	// own.
	ErrNotOwner = errors.New("replication: not the owner of the cluster")
)

// maxTakeoverAttempts bounds how often Acquire reads the log again
// because something was written between its read and its snapshot: the
// previous owner still writing. It stops as soon as it notices it lost
// the cluster, so a few attempts suffice.
const maxTakeoverAttempts = 20

// owned is a cluster this node owns: what it has queued for publishing
// and where its messages are in the log. Fields are guarded by the
// clusterLog's mutex, except those only the publishing goroutine uses.
type owned struct {
	epoch uint64
	lease uint64

	outbox  []outItem
	wake    chan struct{} // a write was queued (capacity 1)
	quit    chan struct{} // closed to end the publishing goroutine
	once    sync.Once
	drain   bool          // quit means: publish what is queued, then end
	closing bool          // no more writes are accepted
	done    chan struct{} // closed when the publishing goroutine has ended
	lost    error
	snapDue bool // a snapshot was asked for
	// flushes are Flush calls waiting for the outbox to be published;
	// the publishing goroutine closes them once it finds nothing queued.
	flushes []chan struct{}

	// Used by the publishing goroutine only.
	lastSeq   uint64 // stream sequence of this owner's last message in the log
	counter   uint64 // message ids
	sinceSnap int    // bytes published since the last snapshot
	snapBytes int    // bytes of the last snapshot
}

// outItem is a queued operation, or a snapshot.
type outItem struct {
	op       op
	snapshot bool
	force    bool // a RestoreCluster: every replica applies it
}

// stop ends the publishing goroutine; the first call decides drain.
// Callers hold the cluster's mutex for the first call (publishLoop reads
// drain under it).
func (o *owned) stop(drain bool) {
	o.once.Do(func() {
		o.drain = drain
		close(o.quit)
	})
}

// Takeover describes an Acquire.
type Takeover struct {
	// Epoch is the new owner's epoch.
	Epoch uint64
	// Previous is the owner that wrote the log last ("" for a new
	// cluster), and Row the cluster row as it left it (nil for none).
	Previous string
	Row      *index.Cluster
}

// Acquire makes this node the owner of a cluster. It brings the index's
// state of the cluster up to the end of the cluster's log, then writes a
// snapshot of that state as the new owner, with an epoch above every
// earlier owner's, on the condition that nothing was written to the log
// since it read it (if something was, it reads again). From then on the
// stream refuses the earlier owners' writes, replicas ignore them, and the
// node publishes its own index.Sink calls for the cluster. lease is the
// generation of the lease that gave the cluster to this node (0 without
// leases); it travels in every message, and the epoch is at least it.
func (n *Node) Acquire(ctx context.Context, cluster string, lease uint64) (Takeover, error) {
	if err := n.wait(ctx); err != nil {
		return Takeover{}, err
	}
	if n.opts.Name == "" {
		return Takeover{}, errors.New("replication: a node without a Name cannot own clusters")
	}
	cl := n.cluster(cluster)
	for range maxTakeoverAttempts {
		cl.mu.Lock()
		if o := cl.own; o != nil {
			cl.mu.Unlock()
			if !o.closing {
				return Takeover{Epoch: o.epoch, Previous: n.opts.Name}, nil
			}
			// Being released: wait until it is, then take it again.
			select {
			case <-o.done:
			case <-ctx.Done():
				return Takeover{}, ctx.Err()
			}
			cl.mu.Lock()
			n.finishLocked(cl, o)
		}
		cl.mu.Unlock()
		last, _, err := lastOnSubject(ctx, n.stream, cl.subject)
		if err != nil {
			return Takeover{}, err
		}
		if err := n.catchUp(ctx, cl, last); err != nil {
			return Takeover{}, err
		}
		cl.mu.Lock()
		if cl.own != nil { // another Acquire won meanwhile
			o := cl.own
			cl.mu.Unlock()
			return Takeover{Epoch: o.epoch, Previous: n.opts.Name}, nil
		}
		// A snapshot or operation cut short at the end of the log was
		// left by an owner that died while writing it; what came before
		// it is complete.
		cl.asm, cl.skipping, cl.partial = nil, false, nil
		if cl.dirty {
			n.log.Warn("taking a cluster over whose log had a gap; its collector resyncs it", "cluster", cluster)
		}
		t := Takeover{Epoch: max(lease, cl.epoch+1), Previous: cl.owner}
		snap := n.opts.Store.SnapshotCluster(cluster)
		t.Row = snap.Cluster
		own := &owned{
			epoch: t.Epoch, lease: lease, lastSeq: cl.applied,
			wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
		}
		cl.own, cl.dirty = own, false
		cl.mu.Unlock()

		// The takeover snapshot is the first message of the new owner.
		// Replicas that followed the log skip it; new ones start from it.
		c := newChunker(n.budget)
		c.addSnapshot(&op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows}, false)
		first, size, err := n.publishAll(ctx, cl, own, newEncoder(), c.messages())
		if err != nil {
			cl.mu.Lock()
			cl.own = nil
			cl.mu.Unlock()
			if errors.Is(err, ErrTakenOver) {
				continue // written meanwhile: read again
			}
			return Takeover{}, err
		}
		own.snapBytes = size
		n.purgeBefore(ctx, cl, first)
		n.metrics.snapshots.Inc()
		n.metrics.owned.Inc()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.publishLoop(cl, own)
		}()
		n.log.Info("took a cluster over", "cluster", cluster, "epoch", t.Epoch, "lease", lease, "previous", t.Previous)
		return t, nil
	}
	return Takeover{}, fmt.Errorf("replication: cluster %q: its log kept changing while taking it over (is its previous owner still writing?)", cluster)
}

// catchUp applies the cluster's log to the index up to stream sequence
// last, reading it from where the node is.
func (n *Node) catchUp(ctx context.Context, cl *clusterLog, last uint64) error {
	cl.mu.Lock()
	from := cl.applied + 1
	cl.mu.Unlock()
	if last < from {
		return nil
	}
	reached := false
	err := n.consume(ctx, cl.subject, from, func(d *delivery) bool {
		reached = d.seq >= last
		return !reached
	}, func(_ context.Context, read uint64) bool { return read < last })
	if err == nil && !reached {
		err = ctx.Err()
		if err == nil {
			err = fmt.Errorf("replication: the log of %q ended before %d", cl.name, last)
		}
	}
	return err
}

// Release gives a cluster up: writes are no longer accepted, the queued
// ones are published, and the node stops publishing. The index keeps the
// cluster's state when the node follows the stream, and drops it
// otherwise.
func (n *Node) Release(ctx context.Context, cluster string) error {
	cl := n.cluster(cluster)
	cl.mu.Lock()
	own := cl.own
	if own == nil {
		cl.mu.Unlock()
		return fmt.Errorf("%w %q", ErrNotOwner, cluster)
	}
	own.closing = true
	own.stop(true)
	cl.mu.Unlock()
	select {
	case <-own.done:
	case <-ctx.Done():
		own.stop(false)
		<-own.done
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n.finishLocked(cl, own)
	if own.lost != nil {
		return own.lost
	}
	return ctx.Err()
}

// finishLocked ends a release whose publishing goroutine has ended.
func (n *Node) finishLocked(cl *clusterLog, own *owned) {
	if cl.own != own {
		return // lost meanwhile, or finished by another caller
	}
	cl.own = nil
	n.metrics.owned.Dec()
	n.forgetLocked(cl)
}

// forgetLocked drops the cluster from the index of a node that does not
// follow the stream: it only keeps the clusters it owns.
func (n *Node) forgetLocked(cl *clusterLog) {
	if n.opts.Follow {
		return
	}
	if err := n.opts.Store.RemoveCluster(context.Background(), cl.name); err != nil {
		n.log.Error("dropping a cluster this node no longer owns", "cluster", cl.name, "err", err)
	}
	cl.applied, cl.epoch, cl.owner, cl.dirty = 0, 0, "", false
	cl.asm, cl.skipping, cl.partial = nil, false, nil
}

// loseLocked records that the node lost a cluster to another owner.
func (n *Node) loseLocked(cl *clusterLog, err error) {
	own := cl.own
	if own == nil {
		return
	}
	own.closing, own.lost = true, err
	own.stop(false)
	cl.own = nil
	// Writes this node applied but could not publish are in the index:
	// its state is not the log's until the new owner's snapshot.
	cl.dirty = true
	n.metrics.owned.Dec()
	n.metrics.fenced.Inc()
	n.forgetLocked(cl)
	n.log.Warn("lost a cluster to another owner", "cluster", cl.name, "err", err)
	if n.opts.OnLost != nil {
		go n.opts.OnLost(cl.name, err)
	}
}

// Owned returns the clusters this node owns.
func (n *Node) Owned() []string {
	n.mu.Lock()
	cls := make([]*clusterLog, 0, len(n.clusters))
	for _, cl := range n.clusters {
		cls = append(cls, cl)
	}
	n.mu.Unlock()
	var out []string
	for _, cl := range cls {
		cl.mu.Lock()
		if cl.own != nil && !cl.own.closing {
			out = append(out, cl.name)
		}
		cl.mu.Unlock()
	}
	return out
}

// publishLoop publishes a cluster's queued writes, in order, and its
// snapshots, until the cluster is released or lost or Run ends.
func (n *Node) publishLoop(cl *clusterLog, own *owned) {
	defer close(own.done)
	ctx := n.ctx
	enc := newEncoder()
	for {
		stopping := false
		select {
		case <-own.wake:
		case <-own.quit:
			stopping = true
		case <-ctx.Done():
			// Run ends: publish what is queued, briefly, so the next
			// owner starts from it.
			stopping = true
			cl.mu.Lock()
			own.closing = true
			cl.mu.Unlock()
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
		}
		// drain is written under cl.mu (stop's callers hold it, but for
		// a second stop, which writes nothing); the quit branch above is
		// ordered after it by the channel close, the ctx branch is not.
		cl.mu.Lock()
		drain := own.drain
		cl.mu.Unlock()
		if stopping && !drain && n.ctx.Err() == nil {
			return
		}
		for {
			cl.mu.Lock()
			items := own.outbox
			own.outbox = nil
			if own.snapDue && !own.closing {
				snap := n.opts.Store.SnapshotCluster(cl.name)
				items = append(items, outItem{snapshot: true, op: op{typ: opSnapshot, cluster: snap.Cluster, kinds: snap.Kinds, rows: snap.Rows}})
				own.snapDue = false
			}
			lost := own.lost
			if len(items) == 0 {
				// Everything queued before these Flush calls is in the
				// stream.
				for _, f := range own.flushes {
					close(f)
				}
				own.flushes = nil
			}
			cl.mu.Unlock()
			if lost != nil || len(items) == 0 {
				break
			}
			c := newChunker(n.budget)
			for i := range items {
				if items[i].snapshot {
					c.addSnapshot(&items[i].op, items[i].force)
				} else {
					c.add(&items[i].op, 0)
				}
			}
			if _, _, err := n.publishAll(ctx, cl, own, enc, c.messages()); err != nil {
				if errors.Is(err, ErrTakenOver) {
					cl.mu.Lock()
					if cl.own == own {
						n.loseLocked(cl, err)
					}
					cl.mu.Unlock()
				} else if ctx.Err() == nil {
					n.log.Error("publishing failed", "cluster", cl.name, "err", err)
				}
				return
			}
			if own.sinceSnap > max(n.opts.MinCompactBytes, int(float64(own.snapBytes)*n.opts.CompactRatio)) {
				cl.mu.Lock()
				own.snapDue = true
				cl.mu.Unlock()
			}
		}
		if stopping {
			return
		}
	}
}

// Flush waits until every write the node accepted for its clusters before
// the call is in the stream, and with it any snapshot those writes made
// due. A benchmark or a test uses it to know when what an owner wrote can
// be read back from the stream; collectors never need it. It returns the
// error of a cluster lost meanwhile (its writes will not be published), and
// ctx's error when ctx ends first. A cluster released meanwhile had its
// queue published by Release.
func (n *Node) Flush(ctx context.Context) error {
	n.mu.Lock()
	cls := make([]*clusterLog, 0, len(n.clusters))
	for _, cl := range n.clusters {
		cls = append(cls, cl)
	}
	n.mu.Unlock()
	for _, cl := range cls {
		cl.mu.Lock()
		own := cl.own
		if own == nil || own.closing {
			cl.mu.Unlock()
			continue
		}
		flushed := make(chan struct{})
		own.flushes = append(own.flushes, flushed)
		select {
		case own.wake <- struct{}{}:
		default:
		}
		cl.mu.Unlock()
		select {
		case <-flushed:
		case <-own.done:
			cl.mu.Lock()
			lost := own.lost
			cl.mu.Unlock()
			if lost != nil {
				return lost
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// publishAll publishes messages in order. It returns the sequence number
// of the first and the bytes of the messages. A snapshot's last part
// purges what came before its first.
func (n *Node) publishAll(ctx context.Context, cl *clusterLog, own *owned, enc *encoder, msgs []pending) (first uint64, size int, err error) {
	var snapStart uint64
	snapSize := 0
	for i := range msgs {
		p := &msgs[i]
		seq, sz, err := n.publish(ctx, cl, own, enc, p)
		if err != nil {
			return first, size, err
		}
		if i == 0 {
			first = seq
		}
		size += sz
		if p.flags&flagSnapshot == 0 {
			own.sinceSnap += sz
			continue
		}
		if p.flags&flagFirst != 0 {
			snapStart, snapSize = seq, 0
		}
		snapSize += sz
		if p.flags&flagLast != 0 && snapStart != 0 {
			own.snapBytes, own.sinceSnap = snapSize, 0
			n.purgeBefore(ctx, cl, snapStart)
			n.metrics.snapshots.Inc()
		}
	}
	return first, size, nil
}

// publish writes one message to the cluster's log on the condition that
// the log's last message is this owner's previous one, and retries what
// fails for other reasons (a server or leader change) until ctx ends. A
// retry of a message that did land (its acknowledgement was lost) is
// recognized by its id.
func (n *Node) publish(ctx context.Context, cl *clusterLog, own *owned, enc *encoder, p *pending) (uint64, int, error) {
	head := envelope{cluster: cl.name, epoch: own.epoch, owner: n.opts.Name, lease: own.lease, prev: own.lastSeq}
	data := enc.message(head, p)
	own.counter++
	// JetStream deduplicates ids across the whole stream: the id names
	// the cluster's log, or one cluster's message would be taken for a
	// retry of another's.
	id := n.opts.Name + ":" + cl.subject + ":" + strconv.FormatUint(own.epoch, 10) + ":" + strconv.FormatUint(own.counter, 10)
	backoff := retry.New(retry.Publish, nil)
	for {
		msg := &nats.Msg{Subject: cl.subject, Data: data, Header: nats.Header{msgIDHeader: []string{id}}}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		ack, err := n.js.PublishMsg(pctx, msg, jetstream.WithExpectLastSequencePerSubject(own.lastSeq))
		cancel()
		if err == nil {
			n.published(cl, own, ack.Sequence, len(data))
			return ack.Sequence, len(data), nil
		}
		if wrongLastSequence(err) {
			// Either an earlier attempt of this message landed, or
			// another owner wrote.
			last, lastID, lerr := lastOnSubject(ctx, n.stream, cl.subject)
			if lerr == nil && lastID == id {
				n.published(cl, own, last, len(data))
				return last, len(data), nil
			}
			return 0, 0, fmt.Errorf("%w: the log of %q moved on without this owner (epoch %d): %w", ErrTakenOver, cl.name, own.epoch, err)
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		n.metrics.publishRetries.Inc()
		n.log.Debug("publish failed; retrying", "cluster", cl.name, "err", err)
		if !backoff.Wait(ctx) {
			return 0, 0, ctx.Err()
		}
	}
}

// published records a message of this owner in the log.
func (n *Node) published(cl *clusterLog, own *owned, seq uint64, size int) {
	own.lastSeq = seq
	cl.mu.Lock()
	if seq > cl.applied {
		cl.applied = seq
	}
	cl.mu.Unlock()
	n.metrics.published.Inc()
	n.metrics.publishedBytes.Add(float64(size))
}

// purgeBefore removes the messages of a cluster's log before seq, the
// first part of a complete snapshot. A failure only leaves the log
// longer until the next snapshot.
func (n *Node) purgeBefore(ctx context.Context, cl *clusterLog, seq uint64) {
	if seq <= 1 {
		return
	}
	if err := n.stream.Purge(ctx, jetstream.WithPurgeSubject(cl.subject), jetstream.WithPurgeSequence(seq)); err != nil {
		n.log.Warn("compacting a cluster's log failed", "cluster", cl.name, "err", err)
	}
}

// onResync handles a replica's request for a snapshot of a cluster this
// node owns.
func (n *Node) onResync(m *nats.Msg) {
	name, ok := clusterOfToken(m.Subject[len(n.subj.prefix)+len(".resync."):])
	if !ok {
		return
	}
	n.mu.Lock()
	cl := n.clusters[name]
	n.mu.Unlock()
	if cl == nil {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if own := cl.own; own != nil && !own.closing {
		n.log.Info("a replica asked for a snapshot", "cluster", name)
		own.snapDue = true
		select {
		case own.wake <- struct{}{}:
		default:
		}
	}
}
