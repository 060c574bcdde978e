package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// agentSession is one welcomed connection of an edge.
//
// Concurrency: run (the Agent's connect goroutine) sends snapshots and
// deltas; readLoop handles acks, detail requests and rejects; pingLoop
// pings; each detail request runs on its own goroutine (at most
// maxDetailWorkers). Every send takes a window token first, which acks give
// back, so the manager never holds more than its window of this edge's
// messages. Sends are serialized by writeMu, which also numbers them.
// fail records the first error and closes done; run then closes the
// connection and waits for every other goroutine before returning.
type agentSession struct {
	a       *Agent
	conn    *conn
	ctx     context.Context // ends with the session; detail requests use it
	maxMsg  int
	window  chan struct{} // tokens: full when nothing is unacknowledged
	done    chan struct{}
	failMu  sync.Once
	err     error
	workers sync.WaitGroup
	sem     chan struct{}

	writeMu sync.Mutex
	seq     uint64        // last sequence number sent; guarded by writeMu
	sent    atomic.Uint64 // the same, for the reader's ack checks
	snapID  uint64        // owned by run
	// acked is the last sequence number the manager acknowledged: only
	// readLoop stores it, and run reads it to pace a resync's parts;
	// acks (capacity 1) tells run that it grew.
	acked atomic.Uint64
	acks  chan struct{}
	// ackedAt is when acked was last stored, as time since began (stored
	// by readLoop before acked, so it is never older than acked's ack).
	ackedAt atomic.Int64
	began   time.Time
	// parts paces a resync's parts; owned by run.
	parts *partWindow
	// deltasInSnapshot: the manager's Welcome lists
	// FeatureDeltasInSnapshot, so deltas go between a snapshot's parts.
	deltasInSnapshot bool
	// deltaAllowance is what the manager keeps at most of the deltas
	// between one snapshot's parts (Welcome.MaxSnapshotDeltaBytes); each
	// snapshot's deltaBudget is half of it.
	deltaAllowance int
	// quotas are the manager's per-row quotas (Welcome.MaxLabelsPerRow,
	// MaxStringBytes; the defaults when it announces none): rows over
	// them are not sent (overQuota).
	quotas Quotas
}

func newAgentSession(a *Agent, conn *conn, w *Welcome) *agentSession {
	s := &agentSession{
		a: a, conn: conn, maxMsg: w.MaxMessageBytes,
		window: make(chan struct{}, w.Window), done: make(chan struct{}), sem: make(chan struct{}, maxDetailWorkers), acks: make(chan struct{}, 1),
		seq:   1, // the Hello was 1, and the Welcome acknowledged it
		began: time.Now(), parts: newPartWindow(w.Window, a.opts.MaxResyncParts),
		deltasInSnapshot: slices.Contains(w.Features, FeatureDeltasInSnapshot),
		deltaAllowance:   w.MaxSnapshotDeltaBytes,
		quotas:           rowQuotas(w),
	}
	if s.deltaAllowance <= 0 {
		s.deltaAllowance = LegacyMaxSnapshotDeltaBytes
	}
	s.sent.Store(1)
	s.acked.Store(1)
	for range w.Window {
		s.window <- struct{}{}
	}
	return s
}

func (s *agentSession) fail(err error) {
	s.failMu.Do(func() {
		s.err = err
		close(s.done)
	})
}

// run streams until the session fails or ctx ends.
func (s *agentSession) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.ctx = ctx
	buf := s.a.buf
	buf.setConnected(true)
	defer buf.setConnected(false)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		s.readLoop()
	}()
	var bg sync.WaitGroup
	bg.Go(func() { s.pingLoop(ctx) })

	err := s.stream(ctx)
	if err == nil || ctx.Err() != nil {
		err = ctx.Err()
	}
	s.fail(err)
	var rej *Reject // nil: close normally
	if r := asReject(s.err); r != nil && peerReject(s.err) == nil {
		rej = r
		s.writeReject(rej) // our complaint about the manager
	}
	s.conn.closeWith(rej) // best effort: the manager may be gone
	<-readDone
	cancel()
	bg.Wait()
	s.workers.Wait()
	return s.err
}

func (s *agentSession) writeReject(r *Reject) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.seq++
	if _, err := s.conn.write(&Message{Type: TypeReject, Seq: s.seq, Time: time.Now(), Reject: r}); err != nil {
		s.a.log.Debug("writing reject failed", "err", err)
	}
}

// stream sends the first full snapshot once the local collection is ready,
// then kind snapshots, deltas and periodic full resyncs. It returns when
// the session fails or ctx ends.
func (s *agentSession) stream(ctx context.Context) error {
	buf := s.a.buf
	for !buf.ready() {
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return s.err
		case <-buf.wake:
		case <-time.After(time.Second): // the collector may start without a change to report
		}
	}
	resync := s.a.opts.Resync
	interval := resync.Interval
	timer := time.NewTimer(interval)
	defer timer.Stop()
	due, first := true, true
	for {
		if due || buf.fullDue() {
			full := buf.takeFull()
			kind := resyncSnapshot
			if first {
				kind = firstSnapshot
			}
			if err := s.sendSnapshot(ctx, kind, full.kinds, full.rows, s.a.currentMetadata()); err != nil {
				return err
			}
			// The session's first snapshot carries the first listing (or
			// what piled up while disconnected): its rows count as
			// changes but say nothing of churn. Adapting to them halved
			// every session's first interval.
			if !first {
				interval = resync.next(interval, full.changes, len(full.rows), full.overflowed)
			}
			timer.Reset(interval)
			due, first = false, false
		}
		snaps, errs := buf.takeKinds()
		for _, ks := range snaps {
			if err := s.sendSnapshot(ctx, oneKindSnapshot, []KindState{ks.state}, ks.rows, nil); err != nil {
				return err
			}
		}
		if _, err := s.sendChanges(ctx, errs, nil, nil); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return s.err
		case <-buf.wake:
		case <-timer.C:
			due = true
		}
	}
}

// sendChanges sends every changed key of the kinds only lists (of every
// kind when only is nil) as deltas of at most maxDeltaKeys keys, and kind
// states with the first; it returns how many deltas it sent (none when
// there is nothing to send). Between a snapshot's parts, budget bounds
// what the deltas make the manager keep: once a key does not fit, it and
// every change after it wait for the snapshot's end.
func (s *agentSession) sendChanges(ctx context.Context, kinds []KindState, only map[kindID]bool, budget *deltaBudget) (int, error) {
	var fits func(index.Key, *index.Object) bool
	if budget != nil {
		fits = budget.fits
	}
	for n := 0; ; n++ {
		if budget != nil && budget.spent() {
			return n, nil
		}
		ups, dels := s.a.buf.takeDelta(maxDeltaKeys, only, fits)
		if len(ups)+len(dels)+len(kinds) == 0 {
			return n, nil
		}
		if err := s.sendDelta(ctx, ups, dels, kinds); err != nil {
			return n, err
		}
		kinds = nil
	}
}

// deltaBudgetShare: an edge lets the deltas between a snapshot's parts
// make the manager keep at most 1/deltaBudgetShare of its allowance
// (Welcome.MaxSnapshotDeltaBytes; review-s7-edge M3). Both sides count
// with rowCost, and the edge counts its strings as the manager will decode
// them (jsonLen: invalid UTF-8 grows threefold through JSON, review-s9-a
// L2), so the counts agree but for a Summary, which encoding compacts and
// the manager so counts smaller. The other half is not a correction of
// the count: it keeps an honest edge clear of the limit should the two
// sides' counting ever drift apart (an edge and a manager of different
// builds), at the cost of changes waiting for the snapshot's end a little
// sooner.
const deltaBudgetShare = 2

// deltaBudget keeps the deltas between one snapshot's parts within what
// the manager allows (review-s7-edge M3). The manager keeps, until the
// final part, the last write of each distinct key (writeCost each) and
// ends the session with ReasonOversize past its allowance; a large
// cluster that changes fast during a long (paced) resync would reach it
// and reconnect into the same failure. The edge counts the same costs
// and, once a key does not fit, sends nothing more between the parts:
// those changes wait for the snapshot's end, as every change did before
// FeatureDeltasInSnapshot. Owned by the session's run goroutine (fits is
// called under the buffer's lock, from takeDelta).
type deltaBudget struct {
	limit int
	used  int
	keys  map[index.Key]int // what each key written during the snapshot costs the manager
	full  bool              // a key did not fit
}

func newDeltaBudget(allowance int) *deltaBudget {
	return &deltaBudget{limit: allowance / deltaBudgetShare, keys: map[index.Key]int{}}
}

// fits reports whether writing k (row, or nil for a delete) keeps the
// manager within the budget, and counts it if so. A key written again
// replaces its cost, as on the manager. Once one key does not fit, none
// does.
func (b *deltaBudget) fits(k index.Key, row *index.Object) bool {
	if b.full {
		return false
	}
	rowBytes := 0
	if row != nil {
		rowBytes, _, _ = rowCost(row, math.MaxInt)
	}
	cost := writeCost(k, row, rowBytes)
	old := b.keys[k]
	if b.used-old+cost > b.limit {
		b.full = true
		return false
	}
	b.used += cost - old
	b.keys[k] = cost
	return true
}

// spent reports whether a key did not fit: nothing more goes between the
// snapshot's parts.
func (b *deltaBudget) spent() bool { return b.full }

// since returns the session's time: what partWindow measures in.
func (s *agentSession) since() time.Duration { return time.Since(s.began) }

// paceParts waits until s.parts lets another part of a resync go,
// sending the changes of the kinds only lists as they come meanwhile,
// within budget: a change does not wait for the next part to leave.
func (s *agentSession) paceParts(ctx context.Context, only map[kindID]bool, budget *deltaBudget) error {
	for {
		acked := s.acked.Load() // before ackedAt, which is then no older than its ack
		s.parts.acked(acked, time.Duration(s.ackedAt.Load()))
		if !s.parts.full() {
			return nil
		}
		select {
		case <-s.acks:
		case <-s.a.buf.wake:
			n, err := s.sendChanges(ctx, nil, only, budget)
			s.a.stats.deltasInSnapshot.Add(uint64(n))
			if err != nil {
				return err
			}
		case <-s.done:
			return s.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// send numbers and writes one message once the window allows it.
func (s *agentSession) send(ctx context.Context, m *Message) error {
	select {
	case <-s.window:
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return ctx.Err()
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.seq++
	m.Seq, m.Time = s.seq, time.Now()
	s.sent.Store(s.seq)
	n, err := s.conn.write(m)
	if err != nil {
		s.fail(err)
		return err
	}
	s.a.stats.messages.Add(1)
	s.a.stats.bytes.Add(uint64(n))
	return nil
}

// overhead is the encoded size of m with no rows, plus slack.
func overhead(m *Message) (int, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", m.Type, err)
	}
	return len(data) + envelopeSlack, nil
}

// sendSnapshot sends rows of the given kinds as one snapshot, in as many
// parts as the manager's message limit needs. Rows are encoded one at a
// time as the parts fill, so only one part is held encoded.
//
// When the manager takes deltas between the parts (deltasInSnapshot), the
// parts are at most partBytes and the changes since the snapshot's rows
// were taken follow each part but the last, so a change waits for one
// part rather than for the whole snapshot. Only changes of the kinds the
// snapshot syncs go between its parts: those are newer than its rows, so
// the manager lets them win at the commit. A change of another kind waits
// for the snapshot's end, because the snapshot or the next one would undo
// it: a later kind snapshot of the same takeKinds carries rows older than
// the change, and a full snapshot retires a kind it does not list (one
// that finished its first list while the snapshot went out). A periodic
// full resync is paced (see snapshotKind): s.parts bounds the parts
// unacknowledged at a time, so a change of a synced kind also queues on
// the manager behind about two parts (partWindow).
func (s *agentSession) sendSnapshot(ctx context.Context, kind snapshotKind, kinds []KindState, rows []index.Object, md map[string]string) error {
	synced := syncedKinds(kinds)
	full := kind != oneKindSnapshot
	paced := kind == resyncSnapshot && s.deltasInSnapshot
	deltas := newDeltaBudget(s.deltaAllowance)
	if paced {
		s.parts.start()
	}
	s.snapID++
	sn := &Snapshot{ID: s.snapID, Full: full, Kinds: kinds, Metadata: md, Rows: []json.RawMessage{}}
	budget0, err := overhead(&Message{Type: TypeSnapshot, Seq: s.sent.Load(), Snapshot: sn})
	if err != nil {
		return err
	}
	limit := s.maxMsg
	if s.deltasInSnapshot {
		limit = min(limit, partBytes)
	}
	budget := limit - budget0
	size := 0
	flush := func(final bool) error {
		sn.Final = final
		if paced {
			if err := s.paceParts(ctx, synced, deltas); err != nil {
				return err
			}
		}
		m := &Message{Type: TypeSnapshot, Snapshot: sn}
		if err := s.send(ctx, m); err != nil {
			return err
		}
		if paced {
			// m.Time is stamped before the part is encoded and written:
			// a send time read after the write can come after the ack
			// (review-s10 M1). A sample then carries the part's encode
			// too, so it errs on the large side, toward a smaller window.
			s.parts.sent(m.Seq, m.Time.Sub(s.began))
			s.a.stats.notePartsInFlight(len(s.parts.unacked))
		}
		s.a.stats.parts.Add(1)
		s.a.stats.rows.Add(uint64(len(sn.Rows)))
		// Later parts carry no kinds or metadata: they get more room.
		sn = &Snapshot{ID: sn.ID, Part: sn.Part + 1, Full: full, Rows: sn.Rows[:0]}
		budget, size = limit-budget0+kindsSize(kinds, md), 0
		if final || !s.deltasInSnapshot {
			return nil
		}
		n, err := s.sendChanges(ctx, nil, synced, deltas)
		s.a.stats.deltasInSnapshot.Add(uint64(n))
		return err
	}
	for i := range rows {
		// A row held back goes as its placeholder (encodeRow); one left
		// out (an RBAC row) is dropped by the manager at the commit: the
		// snapshot replaces every kind it syncs (a full or a kind one).
		raw := s.encodeRow(&rows[i], s.maxMsg-budget0)
		if raw == nil {
			continue
		}
		n := len(raw) + 1
		if size+n > budget && len(sn.Rows) > 0 {
			if err := flush(false); err != nil {
				return err
			}
		}
		sn.Rows = append(sn.Rows, raw)
		size += n
	}
	if err := flush(true); err != nil {
		return err
	}
	s.a.stats.snapshots.Add(1)
	if deltas.spent() {
		s.a.stats.deltaBudgetSpent.Add(1)
	}
	if s.deltasInSnapshot {
		s.a.noteDeltaBudget(deltas.spent(), sn.ID, s.deltaAllowance)
	}
	return nil
}

// snapshotKind says why a snapshot is sent, which decides whether it is
// full and whether its parts are paced.
type snapshotKind int

const (
	// firstSnapshot is a session's first full snapshot. Not paced: how
	// soon it is applied is what a new cluster waits for.
	firstSnapshot snapshotKind = iota
	// resyncSnapshot is a periodic full resync: rows the manager mostly
	// has, sent in the background, so its parts are paced.
	resyncSnapshot
	// oneKindSnapshot syncs one kind (its first listing, or a kind
	// recovering). Not paced: every other kind's changes wait for its end.
	oneKindSnapshot
)

// syncedKinds returns the kinds kinds lists as synced: those a snapshot
// replaces, whose changes may go between its parts. It is never nil, which
// takeDelta would read as every kind.
func syncedKinds(kinds []KindState) map[kindID]bool {
	out := make(map[kindID]bool, len(kinds))
	for _, ks := range kinds {
		if ks.Synced {
			out[idOf(ks.Kind.Group, ks.Kind.Kind)] = true
		}
	}
	return out
}

// kindsSize is what part 0 spends on kinds and metadata.
func kindsSize(kinds []KindState, md map[string]string) int {
	data, err := json.Marshal(struct {
		K []KindState       `json:"kinds"`
		M map[string]string `json:"metadata"`
	}{kinds, md})
	if err != nil {
		return 0
	}
	return len(data)
}

// sendDelta sends changes, split over messages as the limit needs. Kind
// errors go with the first message. A row the edge holds back (encodeRow:
// over one of the manager's per-row quotas or the index's rules, not
// encodable, or too large for any message) goes as its placeholder, so
// the object stays visible, not synced (review-s11 D1); one with no
// placeholder (an RBAC row, or a key over a quota) is sent as a delete of
// its key instead (leftOutDelete): the manager must not keep its older
// state, which for an RBAC row could grant what the cluster no longer does
// (review-s10-edge M-E1); a snapshot omits it the same way. A delete of a
// key the index refuses is not sent: the manager holds no row of it, and
// the index would end the session over it.
func (s *agentSession) sendDelta(ctx context.Context, ups []index.Object, dels []index.Key, kinds []KindState) error {
	d := &Delta{Kinds: kinds}
	base, err := overhead(&Message{Type: TypeDelta, Seq: s.sent.Load(), Delta: d})
	if err != nil {
		return err
	}
	empty, err := overhead(&Message{Type: TypeDelta, Seq: s.sent.Load(), Delta: &Delta{}})
	if err != nil {
		return err
	}
	// Only the first message carries the kind errors: a row has the room
	// of a message without them, and goes in a later one when the first
	// has no room for it (review-s11 E2).
	room := s.maxMsg - empty
	budget, size := s.maxMsg-base, 0
	flush := func() error {
		if err := s.send(ctx, &Message{Type: TypeDelta, Delta: d}); err != nil {
			return err
		}
		d, size, budget = &Delta{}, 0, room
		return nil
	}
	for i := range ups {
		raw := s.encodeRow(&ups[i], room)
		if raw == nil {
			if k, ok := leftOutDelete(&ups[i]); ok {
				dels = append(dels, k)
			}
			continue
		}
		if size+len(raw)+1 > budget {
			if err := flush(); err != nil {
				return err
			}
		}
		d.Upserts = append(d.Upserts, raw)
		size += len(raw) + 1
	}
	for _, k := range dels {
		if index.ValidateKey(k) != nil {
			continue
		}
		raw, err := json.Marshal(k)
		if err != nil {
			return fmt.Errorf("encode delete of %s: %w", k, err)
		}
		// Measured as encoded: a name's control characters and invalid
		// UTF-8 take up to 6 bytes each in JSON, so its raw bytes let a
		// delta pass the manager's limit (review-s11 E3).
		n := len(raw) + 1
		if size+n > budget {
			if err := flush(); err != nil {
				return err
			}
		}
		d.Deletes = append(d.Deletes, k)
		size += n
	}
	return flush()
}

// encodeRow returns row as a snapshot or delta carries it, with room
// bytes for it in a message; or, when the edge holds the row back, the
// placeholder it sends instead (placeholder), or nil when it sends none.
// The edge holds a row back when it is
//   - over one of the manager's per-row quotas, or against a rule of the
//     index (Quotas.checkRow, the manager's own check): sent, it would end
//     the session, and every session after it, so one object would keep
//     its whole cluster off the manager (review-s10 H1). Counted in
//     AgentStats.OverQuota, logged once per kind and quota
//     (Agent.noteOverQuota);
//   - not encodable (a Summary that is not JSON), for the same reason:
//     the session ended with the encoding error, and the next one again.
//     Counted and logged the same way, as the quota "encoding";
//   - too large for any message. Counted in AgentStats.TooBig.
//
// Each placeholder returned is counted in AgentStats.Placeholders, when
// encoded, whether or not its message is then sent.
//
// No row is cut to fit: a cut RBAC subject or rule string could grant
// access to someone else, and any other cut row would show the manager a
// state the object never had. A caller that gets nil sends a delete of
// the row's key in a delta (leftOutDelete); a snapshot drops it by
// omission.
func (s *agentSession) encodeRow(row *index.Object, room int) []byte {
	raw, over := encodeWithin(&s.quotas, row, room)
	if over == nil {
		return raw
	}
	if over.quota == quotaMessageSize {
		s.a.stats.tooBig.Add(1)
		s.a.log.Error("row too large for any message; not sent, the manager shows a placeholder of it (an RBAC row: drops it)", "row", row.Key(), "bytes", len(raw))
	} else {
		s.a.noteOverQuota(row, over)
	}
	p, ok := placeholder(row, over)
	if !ok {
		return nil
	}
	raw, over = encodeWithin(&s.quotas, &p, room)
	if over != nil {
		return nil
	}
	s.a.stats.placeholders.Add(1)
	return raw
}

// The quotas of a rowOverQuota that are not per-row quotas of the
// manager's: the index's rules (Quotas.checkRow), a row that does not
// encode, and one too large for any message (encodeWithin).
const (
	quotaIndex       = "index"
	quotaEncoding    = "encoding"
	quotaMessageSize = "message size"
)

// encodeWithin returns row as JSON, or why the edge may not send it: over
// a quota of q or against the index's rules, not encodable, or (with the
// encoding, quota quotaMessageSize) over room bytes.
func encodeWithin(q *Quotas, row *index.Object, room int) ([]byte, *rowOverQuota) {
	if _, over := q.checkRow(row); over != nil {
		return nil, over
	}
	raw, err := json.Marshal(row)
	if err != nil {
		return nil, &rowOverQuota{quota: quotaEncoding, reject: rejectf(ReasonMalformed, "row %s does not encode: %v", row.Key(), err)}
	}
	if len(raw)+1 > room {
		return raw, &rowOverQuota{quota: quotaMessageSize, reject: rejectf(ReasonOversize, "row %s is %d bytes; a message has room for %d", row.Key(), len(raw), room-1)}
	}
	return raw, nil
}

// placeholder returns the row the edge sends in place of a row it holds
// back (over says why), so that the object stays in the manager's
// inventories and facets rather than vanishing (review-s11 D1: anyone who
// may edit an object could hide it fleet-wide with a 20 KiB owner
// reference): its key, kind, uid, times and resource version, status
// Unknown with a message saying it is not synced and why, and no labels,
// owners or summary, so none of the held-back content reaches the
// manager. False for an RBAC row: a placeholder of a binding or role
// would still be a policy row, so those fail closed (leftOutDelete) and
// grant nothing. The caller holds the placeholder to the manager's checks
// too (encodeWithin): a key over a string quota makes it fail as well.
func placeholder(row *index.Object, over *rowOverQuota) (index.Object, bool) {
	if index.IsPolicyKind(row.Group, row.Kind) {
		return index.Object{}, false
	}
	return index.Object{
		Cluster: row.Cluster, Namespace: row.Namespace, Group: row.Group, Version: row.Version,
		Kind: row.Kind, Resource: row.Resource, Name: row.Name, UID: row.UID,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, ResourceVersion: row.ResourceVersion,
		Status: index.StatusUnknown, Message: notSynced(over.quota),
	}, true
}

// notSynced is the message of a placeholder: why its object is not
// synced, by the quota (or rule) the object's row is over.
func notSynced(quota string) string {
	switch quota {
	case quotaIndex:
		return "not synced: refused by the manager's index rules"
	case quotaEncoding:
		return "not synced: the object's row does not encode"
	case quotaMessageSize:
		return "not synced: too large for a message to the manager"
	}
	return "not synced: over the manager's quota for " + quota
}

// leftOutDelete returns the delete a delta sends for a row it leaves out
// (encodeRow returned nil: an RBAC row, or one whose placeholder the
// manager would refuse too), so that the manager drops the row's older
// state whatever kept the new one from being sent; and false when the
// index refuses the key itself (ValidateKey), whose row the manager can
// never have held.
func leftOutDelete(row *index.Object) (index.Key, bool) {
	k := row.Key()
	return k, index.ValidateKey(k) == nil
}

// readLoop handles what the manager sends until the connection fails.
func (s *agentSession) readLoop() {
	expect := uint64(2) // the Welcome was 1
	for {
		m, _, err := s.conn.read(DefaultMaxMessageBytes, s.a.opts.PongWait)
		if err != nil {
			if rej, ok := closeReason(err); ok {
				err = rej
			}
			s.fail(err)
			return
		}
		if m.Seq != expect {
			s.fail(rejectf(ReasonSequenceGap, "expected seq %d from the manager, got %d", expect, m.Seq))
			return
		}
		expect++
		switch m.Type {
		case TypeAck:
			if err := s.ack(m.Ack.Seq); err != nil {
				s.fail(err)
				return
			}
		case TypeDetailRequest:
			s.startDetail(m.DetailRequest)
		case TypeReject:
			s.fail(m.Reject)
			return
		default:
			s.fail(rejectf(ReasonInvalid, "a manager may not send %s messages in a session", m.Type))
			return
		}
	}
}

// ack returns window tokens for every message up to seq.
func (s *agentSession) ack(seq uint64) error {
	acked := s.acked.Load()
	if seq <= acked || seq > s.sent.Load() {
		return rejectf(ReasonInvalid, "ack of seq %d, but %d was acked and %d is the last sent", seq, acked, s.sent.Load())
	}
	for ; acked < seq; acked++ {
		select {
		case s.window <- struct{}{}:
		default: // cannot happen: tokens taken equal messages unacked
		}
	}
	s.ackedAt.Store(int64(s.since()))
	s.acked.Store(seq)
	select {
	case s.acks <- struct{}{}:
	default: // run has a wake-up pending already
	}
	return nil
}

// startDetail performs a detail request on its own goroutine. Requests
// over the worker bound are dropped; the manager times them out.
func (s *agentSession) startDetail(req *DetailRequest) {
	select {
	case s.sem <- struct{}{}:
	default:
		s.a.log.Warn("too many detail requests in flight; dropped one", "path", req.Path)
		return
	}
	s.workers.Go(func() {
		defer func() { <-s.sem }()
		var resp *DetailResponse
		if s.a.detail == nil {
			resp = &DetailResponse{ID: req.ID, Error: "this edge does not serve detail requests"}
		} else {
			resp = s.a.detail.perform(s.ctx, req)
		}
		if err := s.send(s.ctx, &Message{Type: TypeDetailResponse, DetailResponse: resp}); err != nil {
			s.a.log.Debug("sending a detail response failed", "err", err)
		}
	})
}

// pingLoop pings the manager every interval until ctx ends or the
// session is done; the reader says why a session's connection ended.
func (s *agentSession) pingLoop(ctx context.Context) {
	pingEvery(ctx, s.done, s.conn, s.a.opts.PingInterval)
}
