package index

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrResyncRequired is returned (wrapped) when a subscriber asks for
// changes the replay buffer no longer holds: it resumed from too old a
// sequence number, or fell too far behind. It must list again (a query
// result carries the sequence number to subscribe from) and subscribe anew.
var ErrResyncRequired = errors.New("index: change feed position is no longer available; resync required")

// EventType says what an Event is about.
type EventType uint8

// The event types.
const (
	// EventAdded, EventModified and EventDeleted are object changes.
	EventAdded EventType = iota + 1
	EventModified
	EventDeleted
	// EventCluster reports a new or changed cluster row.
	EventCluster
	// EventClusterRemoved reports a cluster row removed with RemoveCluster
	// (its objects are reported as EventDeleted first).
	EventClusterRemoved
	// EventPolicy reports that a cluster's RBAC rows or kinds set changed;
	// access computed for that cluster is out of date and subscriptions
	// must re-evaluate it. PolicyRevision is the new PolicyRevision.
	EventPolicy
)

// String returns the GraphQL name of object change types and a readable
// name for the others.
func (t EventType) String() string {
	switch t {
	case EventAdded:
		return "ADDED"
	case EventModified:
		return "MODIFIED"
	case EventDeleted:
		return "DELETED"
	case EventCluster:
		return "CLUSTER"
	case EventClusterRemoved:
		return "CLUSTER_REMOVED"
	case EventPolicy:
		return "POLICY"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Event is one change, in commit order. Events are shared by every
// subscriber and immutable; Object and Previous materialize their object
// once, when a subscription first delivers the event (or on first use),
// and share it, so that publishing costs nothing per subscriber and a
// MODIFIED event costs two Objects however many subscribers classify it.
// An event holds rows, whose dictionary ids may be reused once the feed
// has dropped the event (see recycler): Subscription.Next resolves them
// while the feed still holds it.
type Event struct {
	// Seq is the global sequence number; a subscription resumes after it.
	Seq  uint64
	Type EventType
	// pos is Seq minus the Seq of the first event of the event's commit,
	// which the feed needs to keep commits whole; it sits in Type's
	// padding, so it costs no memory.
	pos uint32
	// Cluster is the cluster the event is about.
	Cluster string
	// ClusterRow is the new cluster row (EventCluster) and PreviousCluster
	// the one it replaced (nil for a new cluster, and the removed row for
	// EventClusterRemoved).
	ClusterRow      *Cluster
	PreviousCluster *Cluster
	// PolicyRevision is set on EventPolicy.
	PolicyRevision uint64

	store *Store
	row   *objRow // the new row, or the deleted one
	prev  *objRow // the replaced row of EventModified
	obj   atomic.Pointer[Object]
	prevO atomic.Pointer[Object]
}

// Key returns the object's key for object events.
func (e *Event) Key() Key {
	if e.row == nil {
		return Key{}
	}
	o := e.Object()
	return o.Key()
}

// Object returns the object of an object event (for EventDeleted, its last
// state) and nil for other events. The value is shared; do not mutate it.
func (e *Event) Object() *Object {
	return e.materialize(e.row, &e.obj)
}

// Previous returns the state an EventModified replaced, nil otherwise.
// Subscriptions with a filter use it to tell an object entering or leaving
// their view (see Matcher.Classify), once per subscriber, so the value is
// built once and shared like Object's; do not mutate it.
func (e *Event) Previous() *Object {
	return e.materialize(e.prev, &e.prevO)
}

// materialize returns the Object of r (nil for none), building it on the
// first call and caching it in *cache. Concurrent first calls may each
// build one; the first stored wins, so every caller sees the same value.
func (e *Event) materialize(r *objRow, cache *atomic.Pointer[Object]) *Object {
	if r == nil {
		return nil
	}
	if o := cache.Load(); o != nil {
		return o
	}
	e.store.mu.RLock()
	o := e.store.x.object(r)
	e.store.mu.RUnlock()
	if !cache.CompareAndSwap(nil, o) {
		return cache.Load()
	}
	return o
}

// resolve materializes the event's objects, with the Store's read lock
// held.
func (e *Event) resolve(x *objIndex) {
	for _, c := range [...]struct {
		r     *objRow
		cache *atomic.Pointer[Object]
	}{{e.row, &e.obj}, {e.prev, &e.prevO}} {
		if c.r != nil && c.cache.Load() == nil {
			c.cache.CompareAndSwap(nil, x.object(c.r))
		}
	}
}

// feed is the change feed: a ring of the most recent events and a wake
// channel closed on every publish.
//
// Retention: a commit is kept, whole, until capacity events have been
// published after it. For one-event commits that is the last capacity
// events, the ring's nominal size; a larger commit is never cut, so a
// subscriber that was caught up before it can read all of it, however
// large (the first Replace of a 100,000-pod kind, or RemoveCluster of a
// big cluster, is one commit), and may then fall up to capacity events
// behind its end. The ring therefore holds up to capacity-1 events plus
// its oldest commit: it grows for a large commit and shrinks back once
// capacity events have followed it (see publish), so memory stays about
// capacity events in steady state.
//
// Slow-subscriber policy: publishing never waits for anybody. Subscribers
// are only positions in the ring: publish appends and closes one channel
// (O(1) however many subscribers), and each subscriber copies events out
// when it runs. A subscriber whose position is no longer retained loses
// its place: its next read returns ErrResyncRequired and is counted in
// FeedStats.Resyncs. Holding no per-subscriber buffers is what keeps a
// subscriber to a few hundred bytes.
type feed struct {
	s        *Store
	mu       sync.RWMutex
	capacity uint64   // the replay buffer (WithReplayBuffer)
	ring     []*Event // events first..next-1 at Seq % len(ring); nil elsewhere
	first    uint64   // seq of the oldest retained event, the first of its commit
	next     uint64   // seq of the next event to publish
	wake     chan struct{}

	published atomic.Uint64
	resyncs   atomic.Uint64
	subs      atomic.Int64
}

func newFeed(s *Store, capacity int) *feed {
	return &feed{s: s, capacity: uint64(capacity), ring: make([]*Event, capacity), first: 1, next: 1, wake: make(chan struct{})}
}

// publish appends one commit's events, whose Seq values continue the feed,
// drops the commits that capacity events now follow, and wakes every
// waiting subscriber. It never blocks on subscribers.
func (f *feed) publish(events []*Event) {
	if len(events) == 0 {
		return
	}
	start := events[0].Seq
	for i, ev := range events {
		ev.pos = uint32(i)
	}
	f.mu.Lock()
	next := events[len(events)-1].Seq + 1
	first := f.first
	if next-first > f.capacity {
		// Keep the commit that holds the oldest of the last capacity
		// events, whole, and everything after it.
		if c := next - f.capacity; c >= start {
			first = start
		} else {
			ev := f.ring[c%uint64(len(f.ring))]
			first = ev.Seq - uint64(ev.pos)
		}
	}
	for seq := f.first; seq < first && seq < f.next; seq++ {
		f.ring[seq%uint64(len(f.ring))] = nil // let dropped events go
	}
	f.first = first
	f.resize(next - first)
	n := uint64(len(f.ring))
	for _, ev := range events {
		f.ring[ev.Seq%n] = ev
	}
	f.next = next
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
	f.published.Add(uint64(len(events)))
}

// resize makes the ring hold need events, the retained ones (first to
// f.next-1) and the commit being published: it grows by at least a quarter
// when they do not fit, and shrinks back towards capacity once they take
// less than half of it, so that a large commit costs memory only while it
// is retained and a run of commits around the threshold does not resize
// every time. It runs with f.mu held.
func (f *feed) resize(need uint64) {
	n := uint64(len(f.ring))
	var size uint64
	switch {
	case need > n:
		size = max(need, n+n/4)
	case n > f.capacity && need < n/2:
		size = max(f.capacity, need+need/4)
	default:
		return
	}
	ring := make([]*Event, size)
	for seq := f.first; seq < f.next; seq++ {
		ring[seq%size] = f.ring[seq%n]
	}
	f.ring = ring
}

// FeedStats are counters of the change feed, for metrics.
type FeedStats struct {
	// Published is the number of events published.
	Published uint64
	// Resyncs counts subscribers told to resync because they resumed from
	// or fell behind the replay buffer (the slow-subscriber policy).
	Resyncs uint64
	// Subscribers is the number of open subscriptions.
	Subscribers int64
	// Oldest and Last are the retained sequence numbers range. It spans
	// more than the replay buffer while a larger commit is retained.
	Oldest, Last uint64
}

// FeedStats returns the change feed counters.
func (s *Store) FeedStats() FeedStats {
	f := s.feed
	f.mu.RLock()
	defer f.mu.RUnlock()
	return FeedStats{
		Published: f.published.Load(), Resyncs: f.resyncs.Load(), Subscribers: f.subs.Load(),
		Oldest: f.first, Last: f.next - 1,
	}
}

// Subscription reads the change feed from a position. It holds no buffer
// and no goroutine; Next copies events out of the shared ring. It is meant
// for one goroutine.
type Subscription struct {
	f      *feed
	next   uint64
	closed bool
}

// Subscribe returns a subscription that delivers every event with a
// sequence number greater than after. Use Page.Seq or LastSeq to start
// exactly after a query result, and an event's Seq to resume. It fails with
// ErrResyncRequired when those events are no longer retained.
func (s *Store) Subscribe(after uint64) (*Subscription, error) {
	f := s.feed
	f.mu.RLock()
	defer f.mu.RUnlock()
	if after+1 < f.first || after >= f.next {
		f.resyncs.Add(1)
		return nil, fmt.Errorf("%w: resume after %d, retained %d..%d", ErrResyncRequired, after, f.first, f.next-1)
	}
	f.subs.Add(1)
	return &Subscription{f: f, next: after + 1}, nil
}

// Next waits for events and appends up to cap(buf)-len(buf) of them (at
// least one; 256 when buf has no spare capacity) to buf. It returns
// ErrResyncRequired when the subscriber fell behind the replay buffer, and
// ctx.Err() when ctx ends first. The events come with their objects
// materialized: Next resolves their dictionary ids under the Store's read
// lock while the feed holds them, after which the ids may be reused (see
// recycler).
func (sub *Subscription) Next(ctx context.Context, buf []*Event) ([]*Event, error) {
	if sub.closed {
		return buf, errors.New("index: subscription closed")
	}
	want := cap(buf) - len(buf)
	if want <= 0 {
		want = 256
	}
	f := sub.f
	for {
		// The Store's lock first, as writers take it before publishing.
		f.s.mu.RLock()
		f.mu.RLock()
		if sub.next < f.first {
			first := f.first
			f.mu.RUnlock()
			f.s.mu.RUnlock()
			f.resyncs.Add(1)
			return buf, fmt.Errorf("%w: next %d, oldest retained %d", ErrResyncRequired, sub.next, first)
		}
		if sub.next < f.next {
			n, start := uint64(len(f.ring)), len(buf)
			for ; sub.next < f.next && want > 0; want-- {
				buf = append(buf, f.ring[sub.next%n])
				sub.next++
			}
			f.mu.RUnlock()
			for _, ev := range buf[start:] {
				ev.resolve(f.s.x)
			}
			f.s.mu.RUnlock()
			return buf, nil
		}
		wake := f.wake
		f.mu.RUnlock()
		f.s.mu.RUnlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return buf, ctx.Err()
		}
	}
}

// Position returns the sequence number of the last event delivered.
func (sub *Subscription) Position() uint64 { return sub.next - 1 }

// Close releases the subscription; it only updates the subscriber count.
func (sub *Subscription) Close() {
	if !sub.closed {
		sub.closed = true
		sub.f.subs.Add(-1)
	}
}
