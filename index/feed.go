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
// once, on first use, and share it, so that publishing costs nothing per
// subscriber and a MODIFIED event costs two Objects however many
// subscribers classify it.
type Event struct {
	// Seq is the global sequence number; a subscription resumes after it.
	Seq  uint64
	Type EventType
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

// feed is the change feed: a ring of the most recent events and a wake
// channel closed on every publish.
//
// Slow-subscriber policy: publishing never waits for anybody. Subscribers
// are only positions in the ring: publish appends and closes one channel
// (O(1) however many subscribers), and each subscriber copies events out
// when it runs. A subscriber that falls more than the ring's capacity
// behind loses its place: its next read returns ErrResyncRequired and is
// counted in FeedStats.Resyncs. Holding no per-subscriber buffers is what
// keeps a subscriber to a few hundred bytes.
type feed struct {
	mu    sync.RWMutex
	ring  []*Event
	first uint64 // seq of the oldest retained event
	next  uint64 // seq of the next event to publish
	wake  chan struct{}

	published atomic.Uint64
	resyncs   atomic.Uint64
	subs      atomic.Int64
}

func newFeed(_ *Store, capacity int) *feed {
	return &feed{ring: make([]*Event, capacity), first: 1, next: 1, wake: make(chan struct{})}
}

// publish appends events, whose Seq values continue the feed, and wakes
// every waiting subscriber. It never blocks on subscribers.
func (f *feed) publish(events []*Event) {
	if len(events) == 0 {
		return
	}
	f.mu.Lock()
	n := uint64(len(f.ring))
	for _, ev := range events {
		f.ring[ev.Seq%n] = ev
	}
	f.next = events[len(events)-1].Seq + 1
	if f.next-f.first > n {
		f.first = f.next - n
	}
	close(f.wake)
	f.wake = make(chan struct{})
	f.mu.Unlock()
	f.published.Add(uint64(len(events)))
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
	// Oldest and Last are the retained sequence numbers range.
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
// ctx.Err() when ctx ends first.
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
		f.mu.RLock()
		if sub.next < f.first {
			first := f.first
			f.mu.RUnlock()
			f.resyncs.Add(1)
			return buf, fmt.Errorf("%w: next %d, oldest retained %d", ErrResyncRequired, sub.next, first)
		}
		if sub.next < f.next {
			n := uint64(len(f.ring))
			for ; sub.next < f.next && want > 0; want-- {
				buf = append(buf, f.ring[sub.next%n])
				sub.next++
			}
			f.mu.RUnlock()
			return buf, nil
		}
		wake := f.wake
		f.mu.RUnlock()
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
