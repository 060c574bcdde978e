package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// delivery is one message read from the stream.
type delivery struct {
	seq     uint64
	stamp   time.Time // when the stream stored it
	pending uint64    // messages of the filter after it
	subject string
	env     *envelope
	err     error
}

// followBuffer is how many decoded messages wait for the applying
// goroutine: decoding (decompression) of the next messages overlaps with
// applying this one.
const followBuffer = 32

// followIdle is how long a reader waits for a message before it checks
// that the stream has none for it (errStalled).
const followIdle = 5 * time.Second

// errStalled: the stream holds messages a consumer does not deliver.
var errStalled = errors.New("replication: the stream's consumer stalled")

// errOutOfOrder: a consumer delivered a message after a gap in its own
// sequence.
var errOutOfOrder = errors.New("replication: the stream's consumer skipped a message")

// consumerInactive is how long the server keeps a consumer nobody pulls
// from (one consume could not delete).
const consumerInactive = time.Minute

// followMaxBytes bounds what the consumer has in flight from the server.
const followMaxBytes = 32 << 20

// follow applies every cluster's log to the index until ctx ends. It
// reads the stream from its start (snapshots and what came after them:
// compaction purged the rest) with consume; when reading fails or stalls
// (a NATS node died, the consumer's pull went with it), a new consumer
// resumes after the last message applied: a replica never stops
// following while it runs.
func (n *Node) follow(ctx context.Context) error {
	backoff := retry.New(retry.Stream, nil)
	info, err := n.stream.Info(ctx)
	for err != nil { // a NATS node or the stream's leader is changing
		n.log.Warn("reading the stream's state failed; retrying", "err", err)
		if !backoff.Wait(ctx) {
			return nil
		}
		info, err = n.stream.Info(ctx)
	}
	if info.State.Msgs == 0 {
		n.caughtUp.Store(true)
		n.metrics.caughtUp.Set(1)
	}
	applied := func(d *delivery) bool {
		n.followed.Store(d.seq)
		n.metrics.pending.Set(float64(d.pending))
		if d.pending == 0 && !n.caughtUp.Load() {
			n.caughtUp.Store(true)
			n.metrics.caughtUp.Set(1)
			n.log.Info("caught up with the stream", "seq", d.seq)
		}
		return true
	}
	for {
		err := n.consume(ctx, n.subj.all(), n.followed.Load()+1, applied, func(ctx context.Context, read uint64) bool {
			info, err := n.stream.Info(ctx)
			return err == nil && info.State.LastSeq > read
		})
		if ctx.Err() != nil {
			return nil
		}
		n.log.Warn("following the stream stopped; resuming after the last message applied", "seq", n.followed.Load(), "err", err)
		if !backoff.Wait(ctx) {
			return nil
		}
	}
}

// consume reads the messages of filter from stream sequence from with a
// consumer of its own, decodes them on one goroutine and delivers them
// on another (this one), calling after for each; it stops when after
// returns false or ctx ends, and returns an error when reading fails,
// for the caller to read again with a new consumer after the last
// message it applied.
//
// The consumer is a plain pull consumer, not nats.go's ordered one,
// whose Next recreates its consumer after a server failure inside the
// call, retrying forever while it holds the lock that its Stop takes
// too: a replica then waited in Next with no error and no timeout for
// as long as the recreation failed. consume does what the ordered
// consumer does itself (a message out of the consumer's sequence, a
// missed heartbeat or any error of the pull ends it), so that each
// Next returns within followIdle.
//
// While nothing comes for followIdle, behind is asked whether the stream
// holds messages after the last one read: then the consumer is stalled
// (its NATS node died and the pull went with it, which nats.go reports
// by no error at all) and consume returns errStalled.
func (n *Node) consume(ctx context.Context, filter string, from uint64, after func(*delivery) bool, behind func(ctx context.Context, read uint64) bool) error {
	cfg := jetstream.ConsumerConfig{
		FilterSubject: filter, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: consumerInactive,
	}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	create, cancelCreate := context.WithTimeout(ctx, followIdle)
	cons, err := n.stream.CreateConsumer(create, cfg)
	cancelCreate()
	if err != nil {
		return fmt.Errorf("replication: create a consumer: %w", err)
	}
	defer n.deleteConsumer(ctx, cons.CachedInfo().Name)
	it, err := cons.Messages(jetstream.PullMaxBytes(followMaxBytes), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return fmt.Errorf("replication: read stream: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, it.Stop) // Next does not watch ctx
	defer stop()
	out := make(chan *delivery, followBuffer)
	readErr := make(chan error, 1)
	go func() {
		defer close(out)
		readErr <- n.read(ctx, it, from-1, out, behind)
	}()
	defer func() {
		it.Stop()
		cancel()
		for range out { // let the reader end
		}
	}()
	for d := range out {
		n.deliver(d)
		if !after(d) {
			return nil
		}
	}
	if err := <-readErr; err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// deleteConsumer deletes a consumer consume is done with, if the server
// answers at once; otherwise the server drops it after consumerInactive.
func (n *Node) deleteConsumer(ctx context.Context, name string) {
	if ctx.Err() != nil {
		return // shutting down: no wait for a server that may be gone
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = n.stream.DeleteConsumer(ctx, name)
}

// read decodes messages after stream sequence last until the iterator
// stops. A message whose
// consumer sequence is not the next one (the server sent one the client
// lost, as across a reconnect) ends it with errOutOfOrder.
func (n *Node) read(ctx context.Context, it jetstream.MessagesContext, last uint64, out chan<- *delivery, behind func(context.Context, uint64) bool) error {
	dec := newDecoder()
	var delivered uint64
	for {
		m, err := it.Next(jetstream.NextMaxWait(followIdle))
		if errors.Is(err, nats.ErrTimeout) {
			if ctx.Err() == nil && behind(ctx, last) {
				return fmt.Errorf("%w: nothing came for %s after message %d", errStalled, followIdle, last)
			}
			continue
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("replication: read stream: %w", err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("replication: message metadata: %w", err)
		}
		if meta.Sequence.Consumer != delivered+1 {
			return fmt.Errorf("%w: message %d of the consumer came after %d (stream sequence %d, last read %d)", errOutOfOrder, meta.Sequence.Consumer, delivered, meta.Sequence.Stream, last)
		}
		delivered = meta.Sequence.Consumer
		d := &delivery{seq: meta.Sequence.Stream, stamp: meta.Timestamp, pending: meta.NumPending, subject: m.Subject()}
		last = d.seq
		d.env, d.err = dec.decode(m.Data())
		select {
		case out <- d:
		case <-ctx.Done():
			return nil
		}
	}
}

// deliver applies one message to its cluster's state.
func (n *Node) deliver(d *delivery) {
	n.metrics.applied.Inc()
	if d.err != nil {
		// Without a readable envelope the cluster is still known from
		// the subject: it missed a message.
		n.metrics.ignored.WithLabelValues("undecodable").Inc()
		n.log.Error("cannot read a message of the stream", "subject", d.subject, "seq", d.seq, "err", d.err)
		if name, ok := clusterOfSubject(n.subj, d.subject); ok {
			cl := n.cluster(name)
			cl.mu.Lock()
			if d.seq > cl.applied && cl.own == nil {
				cl.applied = d.seq
				n.gapLocked(cl, "an unreadable message")
			}
			cl.mu.Unlock()
		}
		return
	}
	if d.subject != n.subj.cluster(d.env.cluster) {
		n.metrics.ignored.WithLabelValues("wrong_subject").Inc()
		n.log.Error("a message names another cluster than its subject", "subject", d.subject, "cluster", d.env.cluster, "seq", d.seq)
		return
	}
	cl := n.cluster(d.env.cluster)
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n.deliverLocked(cl, d)
}

// deliverLocked applies one message of cl, whose mutex is held.
func (n *Node) deliverLocked(cl *clusterLog, d *delivery) {
	env := d.env
	if d.seq <= cl.applied {
		return // read before, by another reader of the cluster's log
	}
	if o := cl.own; o != nil {
		if env.epoch == o.epoch && env.owner == n.opts.Name {
			cl.applied = d.seq // ours: the index has it
			return
		}
		if env.epoch < o.epoch {
			// Written before this node's takeover snapshot landed, which
			// will then fail and read the log again from cl.applied; or
			// a fenced owner's. Either way not applied now.
			return
		}
		// Another owner wrote after this node took the cluster: it has
		// lost it. From here on the node follows the new owner.
		n.loseLocked(cl, fmt.Errorf("%w: %s wrote with epoch %d", ErrTakenOver, env.owner, env.epoch))
	}
	if env.epoch < cl.epoch {
		// Fenced: an owner that lost the cluster. The stream refuses its
		// writes once a newer owner has written, so this is only a
		// message from before the takeover read late.
		n.metrics.ignored.WithLabelValues("stale_owner").Inc()
		cl.applied = d.seq
		return
	}
	cl.epoch, cl.owner = env.epoch, env.owner
	if env.snapshot() {
		n.snapshotPartLocked(cl, d)
	} else {
		n.operationsLocked(cl, d)
	}
	cl.applied = d.seq
}

// snapshotPartLocked handles one part of a snapshot.
func (n *Node) snapshotPartLocked(cl *clusterLog, d *delivery) {
	env := d.env
	switch {
	case env.flags&flagFirst != 0:
		cl.partial = nil
		if env.prev == cl.applied && cl.applied != 0 && !cl.dirty && env.flags&flagForce == 0 {
			cl.asm, cl.skipping = nil, true // the index has this state already
		} else {
			cl.asm, cl.skipping = &index.ClusterSnapshot{Name: cl.name}, false
		}
	case env.prev != cl.applied || (cl.asm == nil && !cl.skipping):
		cl.asm, cl.skipping = nil, false
		n.gapLocked(cl, "a snapshot part is missing")
		return
	}
	if cl.asm != nil {
		for _, o := range env.ops {
			if o.typ != opSnapshot {
				cl.asm = nil
				n.invalidLocked(cl, d, fmt.Errorf("a %s operation in a snapshot", o.typ))
				return
			}
			if o.cluster != nil {
				cl.asm.Cluster = o.cluster
			}
			cl.asm.Kinds = append(cl.asm.Kinds, o.kinds...)
			appendSnapshotRows(cl.asm, &o)
		}
	}
	if env.flags&flagLast == 0 {
		return
	}
	if cl.asm != nil {
		if err := n.opts.Store.RestoreCluster(n.ctx, *cl.asm); err != nil {
			n.invalidLocked(cl, d, err)
		} else {
			cl.dirty = false
			n.metrics.restores.Inc()
		}
	}
	cl.asm, cl.skipping = nil, false
}

// appendSnapshotRows adds the rows of a snapshot part, and their label
// table, to the snapshot asm assembles.
func appendSnapshotRows(asm *index.ClusterSnapshot, o *op) {
	if asm.Rows == nil && asm.Labels == nil {
		asm.Rows, asm.Labels = o.rows, o.labels // most snapshots are one part: no copy
		return
	}
	if o.labels != nil || asm.Labels != nil {
		if asm.Labels == nil { // the rows so far have no labels
			asm.Labels = &index.LabelTable{Ends: make([]uint32, len(asm.Rows))}
		}
		t := asm.Labels
		strs, pairs, refs := uint32(len(t.Strings)), uint32(len(t.Pairs)), uint32(len(t.Refs))
		if o.labels == nil {
			for range o.rows {
				t.Ends = append(t.Ends, refs)
			}
		} else {
			t.Strings = append(t.Strings, o.labels.Strings...)
			for _, p := range o.labels.Pairs {
				t.Pairs = append(t.Pairs, index.LabelPair{Key: strs + p.Key, Value: strs + p.Value})
			}
			for _, r := range o.labels.Refs {
				t.Refs = append(t.Refs, pairs+r)
			}
			for _, e := range o.labels.Ends {
				t.Ends = append(t.Ends, refs+e)
			}
		}
	}
	asm.Rows = append(asm.Rows, o.rows...)
}

// operationsLocked applies the operations of one message.
func (n *Node) operationsLocked(cl *clusterLog, d *delivery) {
	env := d.env
	if env.prev != cl.applied || cl.asm != nil || cl.skipping {
		cl.asm, cl.skipping, cl.partial = nil, false, nil
		n.gapLocked(cl, fmt.Sprintf("message %d follows %d, not %d", d.seq, env.prev, cl.applied))
	}
	if cl.dirty {
		n.metrics.ignored.WithLabelValues("awaiting_snapshot").Inc()
		return
	}
	for i := range env.ops {
		o := env.ops[i]
		if p := cl.partial; p != nil {
			if o.typ != p.typ {
				cl.partial = nil
				n.invalidLocked(cl, d, fmt.Errorf("a %s part follows an unfinished %s", o.typ, p.typ))
				return
			}
			p.rows = append(p.rows, o.rows...)
			p.more = o.more
			o = *p
		}
		if o.more {
			cl.partial = &o
			continue
		}
		cl.partial = nil
		if err := n.apply(cl.name, &o); err != nil {
			n.invalidLocked(cl, d, err)
			return
		}
		if n.caughtUp.Load() && !o.at.IsZero() {
			n.metrics.lag.Observe(time.Since(o.at).Seconds())
		}
	}
}

// apply performs one operation on the index, at the time the owner
// performed it.
func (n *Node) apply(cluster string, o *op) error {
	sink := n.opts.Store.At(o.at)
	ctx := n.ctx
	switch o.typ {
	case opReplace:
		return sink.Replace(ctx, cluster, o.kind, o.rows)
	case opUpsert:
		return sink.UpsertBatch(ctx, o.rows)
	case opDelete:
		return sink.Delete(ctx, o.key)
	case opKindError:
		return sink.ReportKindError(ctx, cluster, o.kind, errors.New(o.err))
	case opCluster:
		if o.cluster == nil || o.cluster.Name != cluster {
			return fmt.Errorf("%w: a cluster row that is not the row of %q", errDecode, cluster)
		}
		return sink.UpsertCluster(ctx, *o.cluster)
	case opRemoveCluster:
		return sink.RemoveCluster(ctx, cluster)
	}
	return fmt.Errorf("%w: a %s operation outside a snapshot", errDecode, o.typ)
}

// gapLocked records that the node missed part of a cluster's log: its
// state of the cluster waits for the next snapshot, which it asks the
// owner for.
func (n *Node) gapLocked(cl *clusterLog, why string) {
	n.metrics.ignored.WithLabelValues("gap").Inc()
	if !cl.dirty {
		n.log.Warn("missed part of a cluster's log; waiting for a snapshot", "cluster", cl.name, "why", why)
	}
	cl.dirty = true
	n.requestResyncLocked(cl)
}

// invalidLocked records a message the index refused. The owner's index
// took the same operation, so this node's state of the cluster is no
// longer the owner's: like a gap, it waits for a snapshot.
func (n *Node) invalidLocked(cl *clusterLog, d *delivery, err error) {
	n.metrics.ignored.WithLabelValues("invalid").Inc()
	n.log.Error("cannot apply a message of the stream", "cluster", cl.name, "seq", d.seq, "owner", d.env.owner, "err", err)
	cl.dirty = true
	n.requestResyncLocked(cl)
}

// requestResyncLocked asks the cluster's owner for a snapshot, at most
// every resyncEvery.
func (n *Node) requestResyncLocked(cl *clusterLog) {
	if time.Since(cl.lastResync) < resyncEvery {
		return
	}
	cl.lastResync = time.Now()
	if err := n.opts.Conn.Publish(n.subj.resync(cl.name), nil); err != nil {
		n.log.Warn("asking for a snapshot failed", "cluster", cl.name, "err", err)
	}
}

// clusterOfSubject returns the cluster whose log a subject is.
func clusterOfSubject(s subjects, subject string) (string, bool) {
	prefix := s.prefix + ".c."
	if len(subject) <= len(prefix) || subject[:len(prefix)] != prefix {
		return "", false
	}
	return clusterOfToken(subject[len(prefix):])
}

// clusterOfToken inverts subjectToken.
func clusterOfToken(tok string) (string, bool) {
	b := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		if tok[i] != '~' {
			b = append(b, tok[i])
			continue
		}
		if i+2 >= len(tok) {
			return "", false
		}
		v, ok := unhex(tok[i+1], tok[i+2])
		if !ok {
			return "", false
		}
		b = append(b, v)
		i += 2
	}
	return string(b), len(b) > 0
}

func unhex(a, b byte) (byte, bool) {
	h := func(c byte) (byte, bool) {
		switch {
		case c >= '0' && c <= '9':
			return c - '0', true
		case c >= 'a' && c <= 'f':
			return c - 'a' + 10, true
		}
		return 0, false
	}
	x, ok1 := h(a)
	y, ok2 := h(b)
	return x<<4 | y, ok1 && ok2
}
