package index

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgraph/fleetgraph/index/tables"
)

// Store is the fleet index: an in-memory database of clusters, kinds and
// RBAC rows (the tables New is given: go-memdb, see index/memtables), the
// object rows and their secondary indexes for queries (objIndex), and a
// change feed.
//
// Concurrency: every write (a Sink call) takes the write lock,
// applies the objIndex changes and, when it touches a memdb table, one
// memdb write transaction, commits, and appends its events to the feed, so
// a change is visible to queries and subscribers at the same sequence
// number. Queries hold the read lock while they use objIndex; lookups that
// only need memdb (RBAC getters, clusters, kinds, their revisions) read a
// lock-free memdb snapshot. Concurrent Upserts and Deletes are combined
// into one commit (see writeGrouped), so that writers are not held to one
// commit per query in progress. The Store starts no long-lived goroutines:
// a large UpsertBatch uses one helper goroutine while it holds the write
// lock (see upsertBulk).
type Store struct {
	db    tables.DB // clusters, kinds, RBAC rows, revisions
	clock func() time.Time
	// validateRow is ValidateRow, the check every write holds its rows
	// to before anything else. It is a field only so that a test can
	// stand in a check that lets more through, as a ValidateRow that
	// drifted from the write paths would: the writes must still refuse
	// what they cannot hold, with an error and no change.
	validateRow func(*Object) error

	mu   sync.RWMutex // guards x, seq and objRev; held for writing across each commit
	x    *objIndex
	seq  uint64 // last sequence number assigned
	feed *feed
	fan  *fanout // routes the feed to streams (ObjectChanges, ...)

	// writersWaiting counts the writers blocked in lock: a long read
	// pauses only for them (see pacer).
	writersWaiting atomic.Int32

	// objRev is the objects revision of each cluster (see
	// ObjectsRevision). It lives here rather than in memdb's revisions
	// table because object writes otherwise never touch memdb: a memdb
	// transaction and commit for one revision row cost about 8 µs, more
	// than the rest of a one-row Upsert.
	objRev map[string]uint64
	// stale holds the names of the clusters whose row is stale
	// (Cluster.Stale), kept where cluster rows are written (putClusterRow,
	// deleteClusterRow) so that a query does not walk every cluster row.
	// A read keeps the map it found past a pause of its read lock, so a
	// change replaces the map rather than mutating it. Guarded by mu.
	stale map[string]bool
	// objWatch holds the channels that ObjectsRevision handed out, closed
	// on the cluster's next object change. Readers add channels under the
	// read lock, so watchMu guards the map.
	watchMu  sync.Mutex
	objWatch map[string]chan struct{}

	// queue holds the changes waiting for a grouped commit, and leading
	// is set while a writer is applying them; see writeGrouped.
	queueMu sync.Mutex
	queue   []*writeReq
	leading bool

	// dictEpoch counts the commits that retired dictionary ids, and
	// pausedReads the long reads that paused, by the epoch they began in:
	// an id retired in epoch e is reused only once every paused read
	// began in e or later (see recycler). dictEpoch is guarded by mu.
	dictEpoch   uint64
	pausedMu    sync.Mutex
	pausedReads map[uint64]int

	// pauseHook, set by tests only, runs in every pause of a long read
	// (see pacer), without the read lock.
	pauseHook func()
}

// Option configures a Store.
type Option func(*options)

type options struct {
	clock        func() time.Time
	replayBuffer int
}

// DefaultReplayBuffer is the number of change events kept for resuming
// subscriptions when WithReplayBuffer is not given: about a minute of heavy
// churn (tens of thousands of changes per second would need more) for a few
// MiB of memory. A larger commit is kept whole for a while (see
// WithReplayBuffer), so it does not bound the size of a commit.
const DefaultReplayBuffer = 1 << 16

// WithClock sets the clock used for UpdatedAt and error times, so tests
// can control time.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.clock = now }
}

// WithReplayBuffer sets how many change events the feed keeps for
// subscribers that resume from an older sequence number. The feed keeps
// whole commits: each until n events have been published after it, so a
// commit larger than n (a big cluster's first Replace) stays readable by
// subscribers that were caught up before it, and memory exceeds n events
// only while such a commit is kept. Subscribers further behind must resync.
func WithReplayBuffer(n int) Option {
	return func(o *options) { o.replayBuffer = n }
}

// New returns an empty Store whose tables (clusters, kinds, RBAC rows and
// their revisions) open creates: memtables.Open in production.
func New(open tables.Open, opts ...Option) *Store {
	o := options{clock: time.Now, replayBuffer: DefaultReplayBuffer}
	for _, f := range opts {
		f(&o)
	}
	if o.replayBuffer < 1 {
		o.replayBuffer = 1
	}
	db, err := open(schema())
	if err != nil {
		panic(fmt.Sprintf("index: creating the tables: %v", err))
	}
	s := &Store{db: db, clock: o.clock, validateRow: ValidateRow, x: newObjIndex(), objRev: map[string]uint64{}, objWatch: map[string]chan struct{}{}}
	s.feed = newFeed(s, o.replayBuffer)
	s.fan = newFanout(s)
	return s
}

// writeTxn is one write in progress: the memdb transaction if it needs
// one, the events it will publish and the revision scopes it touched.
type writeTxn struct {
	s       *Store
	txn     tables.Txn // opened by mem
	now     int64      // the write's time: Unix nanoseconds (see At)
	seq     uint64
	events  []*Event
	slab    []Event             // object events are carved from here; see objectEvent
	slabLen int                 // size of the last slab
	touched []scopeKey          // a handful per write
	policy  map[string]struct{} // clusters whose policy (RBAC or kinds set) changed
	removed string              // the cluster RemoveCluster removed: its revisions go too
	// restore keeps the UpdatedAt rows carry instead of stamping them
	// with now (RestoreCluster).
	restore bool
}

// mem returns the write's memdb transaction, opening it on first use:
// writes of object rows only need none.
func (w *writeTxn) mem() tables.Txn {
	if w.txn == nil {
		w.txn = w.s.db.Txn(true)
	}
	return w.txn
}

// scopeKey names one revision row.
type scopeKey struct{ scope, cluster string }

// lock takes the write lock, counted in writersWaiting until it has it.
func (s *Store) lock() {
	s.writersWaiting.Add(1)
	s.mu.Lock()
	s.writersWaiting.Add(-1)
}

// write runs fn in a write transaction: it takes the write lock, and if fn
// succeeds and changed anything, bumps the touched revisions, commits the
// memdb transaction (if fn opened one) and publishes the events. at is the
// write's time in Unix nanoseconds, 0 for the Store's clock (see At).
//
// fn must validate its input before it changes objIndex: objIndex is not
// transactional, so fn may fail only before its first change.
func (s *Store) write(at int64, fn func(w *writeTxn) error) error {
	s.lock()
	defer s.mu.Unlock()
	w := s.begin()
	if at != 0 {
		w.now = at
	}
	defer w.end()
	if err := fn(w); err != nil {
		return err
	}
	w.commit()
	return nil
}

// writeReq is one change waiting for a grouped commit.
type writeReq struct {
	fn   func(w *writeTxn)
	at   int64     // the change's time, 0 for the commit's (see At)
	done chan bool // true: applied; false: the receiver leads the next commit
}

// maxGroup bounds the changes one grouped commit applies, so that a reader
// waits behind at most about a hundred microseconds of writes (one-row
// Upserts of random rows cost 5–10 µs here, all cache misses): without it,
// 100 writers woken together made one commit of 100 Upserts (about 750 µs),
// and that wait was the p99 of queries under churn.
const maxGroup = 16

// writeGrouped applies fn, which has validated its input and cannot fail,
// in a commit that may also apply other goroutines' changes (group
// commit). Writers that arrive while a write or a query holds the lock
// queue their change, and one of them, the leader, takes the lock and
// applies every queued change in one commit, each change's events still
// consecutive. Without it, each write waits for the query in progress and
// the next query for the write: a busy reader let through about one write
// per query (measured: 2,600 one-row Upserts/s against back-to-back 250 µs
// queries). at is as for write: each change keeps its own time.
func (s *Store) writeGrouped(at int64, fn func(w *writeTxn)) {
	req := &writeReq{fn: fn, at: at, done: make(chan bool, 1)}
	s.queueMu.Lock()
	s.queue = append(s.queue, req)
	lead := !s.leading
	s.leading = true
	s.queueMu.Unlock()
	if !lead && <-req.done {
		return
	}
	var batch []*writeReq
	defer func() {
		// Release the writers whose changes this commit held (even if one
		// panicked, so that none waits forever), then hand the lead to the
		// first writer that queued meanwhile, so that no caller applies
		// others' changes for long.
		for _, r := range batch {
			if r != req {
				r.done <- true
			}
		}
		s.queueMu.Lock()
		if len(s.queue) > 0 {
			s.queue[0].done <- false
		} else {
			s.leading = false
		}
		s.queueMu.Unlock()
	}()
	s.lock()
	defer s.mu.Unlock()
	s.queueMu.Lock()
	n := min(len(s.queue), maxGroup) // the leader's change is s.queue[0]
	batch, s.queue = s.queue[:n:n], s.queue[n:]
	s.queueMu.Unlock()
	w := s.begin()
	defer w.end()
	now := w.now
	for _, r := range batch {
		w.now = now
		if r.at != 0 {
			w.now = r.at
		}
		r.fn(w)
	}
	w.commit()
}

// begin starts a write; the write lock must be held.
func (s *Store) begin() *writeTxn {
	return &writeTxn{s: s, now: unixNano(s.clock()), seq: s.seq}
}

// commit bumps the touched revisions, commits the memdb transaction if one
// was opened and publishes the events, unless nothing changed.
func (w *writeTxn) commit() {
	s := w.s
	for c := range w.policy {
		w.emit(&Event{Type: EventPolicy, Cluster: c})
		ev := w.events[len(w.events)-1]
		ev.PolicyRevision = ev.Seq
		w.touch(revisionPolicy, c)
	}
	if len(w.touched) == 0 {
		return
	}
	for _, k := range w.touched {
		switch {
		case k.scope == revisionObjects:
			s.objectsChanged(k.cluster, w.seq)
		case k.cluster == w.removed:
			_, err := w.mem().DeleteAll(tableRevisions, indexID, memKey(compoundKey(k.scope, k.cluster)))
			must(err)
		default:
			must(w.mem().Insert(tableRevisions, &revisionRow{Scope: k.scope, Cluster: k.cluster, Revision: w.seq}))
		}
	}
	if w.txn != nil {
		w.txn.Commit()
	}
	s.seq = w.seq
	s.feed.publish(w.events)
	// The writer holds mu, and only writers publish, so the feed's
	// position is stable here.
	if s.x.recycle(s.seq, s.dictEpoch+1, s.feed.first, s.oldestPausedRead()) {
		s.dictEpoch++
	}
}

// oldestPausedRead returns the epoch the oldest paused read in flight
// began in, or the largest epoch when none is.
func (s *Store) oldestPausedRead() uint64 {
	s.pausedMu.Lock()
	defer s.pausedMu.Unlock()
	oldest := ^uint64(0)
	for e := range s.pausedReads {
		oldest = min(oldest, e)
	}
	return oldest
}

// end finishes a write, committed or not: it adds the inserted rows to the
// name order and drops an uncommitted memdb transaction.
func (w *writeTxn) end() {
	w.s.x.byName.flush()
	w.s.x.flushLists()
	if w.txn != nil {
		w.txn.Abort() // a no-op after Commit
	}
}

// emit assigns the next sequence number to ev and queues it.
func (w *writeTxn) emit(ev *Event) {
	w.seq++
	ev.Seq = w.seq
	ev.store = w.s
	w.events = append(w.events, ev)
}

// maxEventSlab bounds the events allocated at once for a write. A slab
// stays alive while any of its events is in the feed or a subscriber's
// hands, so slabs are kept well below the feed's size.
const maxEventSlab = 256

// objectEvent emits an object change event. Bulk writes produce one event
// per changed row; taking them from slabs that double up to maxEventSlab
// makes that a few allocations per batch instead of one per row.
func (w *writeTxn) objectEvent(t EventType, cluster string, r, prev *objRow) {
	if len(w.slab) == 0 {
		w.slabLen = min(maxEventSlab, max(1, 2*w.slabLen))
		w.slab = make([]Event, w.slabLen)
	}
	ev := &w.slab[0]
	w.slab = w.slab[1:]
	ev.Type, ev.Cluster, ev.row, ev.prev = t, cluster, r, prev
	w.emit(ev)
}

// touch marks a revision scope of a cluster as changed by this write.
func (w *writeTxn) touch(scope, cluster string) {
	k := scopeKey{scope, cluster}
	if n := len(w.touched); n > 0 && w.touched[n-1] == k {
		return // rows come grouped by cluster: the common case
	}
	if !slices.Contains(w.touched, k) {
		w.touched = append(w.touched, k)
	}
}

// policyChanged records that a cluster's RBAC rows or kinds set changed.
func (w *writeTxn) policyChanged(cluster string) {
	if w.policy == nil {
		w.policy = map[string]struct{}{}
	}
	w.policy[cluster] = struct{}{}
}

// must panics on a memdb error, which can only come from a programming
// error: an unknown table or index, or a value of the wrong type for its
// table (keyedTable). No row's content can cause one: a key is any string,
// and what a row must be to be stored is checked, and the row converted,
// before a write takes the lock (ValidateRow, policyValues,
// LabelTable.validate). A failure half way through a write would leave
// objIndex out of step with memdb, so there is no safe way to go on.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("index: memdb: %v", err))
	}
}

// LastSeq returns the sequence number of the last published change event.
// A query result and LastSeq read under one lock agree: subscribing from
// Page.Seq sees exactly the changes after that page.
func (s *Store) LastSeq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.seq
}

// revision returns the sequence number of the last change of one table
// (tableKinds, ...) or revision scope (revisionPolicy) in one cluster; 0
// when it never changed.
func (s *Store) revision(scope, cluster string) uint64 {
	raw, err := s.db.Txn(false).First(tableRevisions, indexID, memKey(compoundKey(scope, cluster)))
	must(err)
	if raw == nil {
		return 0
	}
	return raw.(*revisionRow).Revision
}

// ObjectsRevision returns the sequence number of the last object change in
// a cluster, and adds to w a watch that fires on the next one.
func (s *Store) ObjectsRevision(w *Watch, cluster string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if w != nil {
		s.watchMu.Lock()
		ch := s.objWatch[cluster]
		if ch == nil {
			ch = make(chan struct{})
			s.objWatch[cluster] = ch
		}
		s.watchMu.Unlock()
		w.add(ch)
	}
	return s.objRev[cluster]
}

// objectsChanged records the objects revision of a cluster and fires its
// watches. It runs with the write lock held.
func (s *Store) objectsChanged(cluster string, seq uint64) {
	s.objRev[cluster] = seq
	s.watchMu.Lock()
	if ch := s.objWatch[cluster]; ch != nil {
		close(ch)
		delete(s.objWatch, cluster)
	}
	s.watchMu.Unlock()
}
