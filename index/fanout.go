package index

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrSlowConsumer ends a stream whose reader fell so far behind that the
// change feed's replay buffer no longer holds the events it missed. Its
// client must query again and subscribe from the answer's position.
var ErrSlowConsumer = errors.New("index: the subscription fell too far behind the change feed")

// errFanoutBehind ends every stream when the fan-out itself fell out of the
// replay buffer (the machine could not keep up): the events in between are
// gone for everybody.
var errFanoutBehind = fmt.Errorf("%w: the subscription fan-out fell behind the change feed", ErrResyncRequired)

// DefaultStreamBuffer is the default number of routed events that may wait
// for one stream before it stops taking them from the fan-out and catches
// up from the replay buffer at its own pace instead.
const DefaultStreamBuffer = 1024

// StreamKind says what a stream delivers.
type StreamKind uint8

// The stream kinds.
const (
	StreamObjects  StreamKind = iota // ObjectChanges
	StreamClusters                   // ClusterChanges
	StreamFleet                      // FleetChanges
	streamKinds
)

// String names the kind.
func (k StreamKind) String() string {
	switch k {
	case StreamObjects:
		return "objects"
	case StreamClusters:
		return "clusters"
	case StreamFleet:
		return "fleet"
	}
	return fmt.Sprintf("StreamKind(%d)", uint8(k))
}

// StreamStats are counters of the streams, for metrics.
type StreamStats struct {
	// Streams is the number of open streams.
	Streams int
	// CatchUps counts, by kind, the times a stream's buffer filled and it
	// caught up from the replay buffer instead (the slow-reader policy).
	CatchUps [streamKinds]uint64
	// Dropped counts, by kind, the events never delivered because their
	// stream fell out of the replay buffer and ended with ErrSlowConsumer.
	Dropped [streamKinds]uint64
}

// StreamStats returns the stream counters.
func (s *Store) StreamStats() StreamStats {
	f := s.fan
	f.mu.Lock()
	out := StreamStats{Streams: len(f.subs)}
	f.mu.Unlock()
	for k := range streamKinds {
		out.CatchUps[k] = f.catchUps[k].Load()
		out.Dropped[k] = f.dropped[k].Load()
	}
	return out
}

// fanout routes the change feed to streams. The feed keeps subscribers as
// mere positions in its ring; a thousand streams each reading the ring
// would mean a thousand goroutine wake-ups per commit, so the fan-out reads
// it once and hands each event only to the streams it may concern, by
// routing keys: an object event by its cluster and namespace, cluster and
// policy events by kind of stream (the way Nomad's and Consul's event
// streams route by topic and key).
//
// Concurrency contract:
//
//   - One goroutine (run) reads the feed through a single Subscription and
//     routes each event by appending it to the inboxes of interested
//     streams (sub.push). It never waits for a stream. The slow-reader
//     policy: a full inbox marks the stream lagging; its reader then reads
//     the replay ring at its own pace and rejoins; only a stream that
//     falls out of the ring is ended, with ErrSlowConsumer, and its missed
//     events are counted as dropped. Publishing never waits for the
//     fan-out either.
//   - A stream's reader is the one goroutine that calls its Next: it
//     drains the inbox, applies the filter and the viewer's access, and
//     returns changes. A stream starts no goroutine, so its caller's
//     goroutine is the only one that owns whatever it sends the changes to.
//   - f.mu guards the routing tables, the running state and every stream's
//     routing fields; sub.mu guards its inbox. Lock order: f.mu, then
//     sub.mu.
//   - run starts with the first stream and stops when the last one leaves,
//     so an idle Store holds no goroutine. gen tells a stopped run apart
//     from its successor.
type fanout struct {
	s *Store

	mu      sync.Mutex
	running bool
	gen     uint64
	stop    context.CancelFunc
	pos     uint64 // sequence number of the last event routed

	subs     map[*sub]struct{} // every stream
	objects  map[*sub]struct{} // object streams (policy events)
	watchers map[*sub]struct{} // cluster and fleet streams (cluster events)
	firehose map[*sub]struct{} // object streams that get every object event
	routes   map[string]*route // by cluster

	catchUps [streamKinds]atomic.Uint64
	dropped  [streamKinds]atomic.Uint64
}

// route lists the streams of one cluster's object events: those that want
// the whole cluster and those that want some namespaces. Slices, not sets:
// most lists are short, and a stream costs a pointer in each.
type route struct {
	whole []*sub
	byNS  map[string][]*sub
}

func newFanout(s *Store) *fanout {
	return &fanout{
		s: s, subs: map[*sub]struct{}{}, objects: map[*sub]struct{}{},
		watchers: map[*sub]struct{}{}, firehose: map[*sub]struct{}{}, routes: map[string]*route{},
	}
}

// without removes s from list, not keeping the order.
func without(list []*sub, s *sub) []*sub {
	for i, x := range list {
		if x == s {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			return list[:last]
		}
	}
	return list
}

// interest is what one object stream wants routed from one cluster:
// everything, or the object events of some namespaces ("" for
// cluster-scoped objects).
type interest struct {
	whole      bool
	namespaces []string
}

// sub is one stream as the fan-out sees it.
type sub struct {
	f      *fanout
	kind   StreamKind
	limit  int           // inbox bound before catching up from the ring
	notify chan struct{} // capacity 1: "the inbox changed"

	// Routing state, guarded by fanout.mu.
	from      uint64              // route only events after this sequence number
	all       bool                // sees everything: stays in the firehose
	interests map[string]interest // current routes by cluster
	policySeq map[string]uint64   // last policy event routed, by cluster

	mu      sync.Mutex // guards the fields below
	inbox   []*Event
	dirty   bool  // fleet: something changed since the last status
	lagging bool  // the inbox hit limit; the reader catches up from the ring
	endErr  error // set when the stream is ended

	// Reader state: only the goroutine that calls Next uses these.
	last    uint64        // sequence number of the last event handed out
	ring    *Subscription // reads the replay ring while catching up
	until   uint64        // catch up to here
	initial bool          // the catch-up is the gap before the first routed event
	spare   []*Event      // the next inbox
	held    []*Event      // the batch the caller holds until the next call
	ringBuf []*Event
	closed  bool
}

// register adds a stream that wants the events after sequence number
// after, and returns the position from which the fan-out routes events to
// it; when that is beyond after, the reader first replays the events in
// between from the ring. Object streams start in the firehose until their
// routes are set (setInterests), so that no event is lost meanwhile.
func (f *fanout) register(kind StreamKind, limit int, all bool, after uint64) (*sub, error) {
	s := &sub{f: f, kind: kind, limit: limit, all: all, notify: make(chan struct{}, 1), last: after}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running {
		if err := f.startLocked(); err != nil {
			return nil, err
		}
	}
	s.from = max(after, f.pos)
	f.subs[s] = struct{}{}
	switch kind {
	case StreamObjects:
		f.objects[s] = struct{}{}
		f.firehose[s] = struct{}{}
	case StreamClusters, StreamFleet:
		f.watchers[s] = struct{}{}
	}
	if s.from > after {
		s.until, s.initial = s.from, true
	}
	return s, nil
}

// startLocked starts run at the feed's current position.
func (f *fanout) startLocked() error {
	pos := f.s.LastSeq()
	fs, err := f.s.Subscribe(pos)
	if err != nil {
		return fmt.Errorf("index: subscribing the fan-out to the change feed: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.gen++
	f.running, f.stop, f.pos = true, cancel, pos
	go f.run(ctx, fs, f.gen)
	return nil
}

// unregister removes a stream; the last one stops run.
func (f *fanout) unregister(s *sub) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; !ok {
		return
	}
	delete(f.subs, s)
	delete(f.objects, s)
	delete(f.watchers, s)
	delete(f.firehose, s)
	for c := range s.interests {
		f.unrouteLocked(s, c)
	}
	if len(f.subs) == 0 && f.running {
		f.running = false
		f.stop()
	}
}

// setInterests replaces the routes of an object stream that has just
// computed its access, as of sequence number seq, and takes it out of the
// firehose (unless it sees everything). A cluster whose policy changed
// after seq stays wholly routed until the reader has handled that change
// (setInterest).
func (f *fanout) setInterests(s *sub, in map[string]interest, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; !ok || s.all {
		return
	}
	delete(f.firehose, s)
	for c, ps := range s.policySeq {
		if ps > seq {
			in[c] = interest{whole: true}
		}
	}
	for c := range s.interests {
		if _, ok := in[c]; !ok {
			f.unrouteLocked(s, c)
		}
	}
	for c, i := range in {
		f.routeLocked(s, c, i)
	}
}

// setInterest replaces one cluster's route after the reader handled the
// policy event with sequence number seq. A newer policy event, routed
// meanwhile, wins: the reader will handle it next.
func (f *fanout) setInterest(s *sub, cluster string, in interest, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; !ok || s.all || s.policySeq[cluster] > seq {
		return
	}
	if _, ok := f.firehose[s]; ok {
		return // setInterests has not run yet; it reads the access anew
	}
	f.routeLocked(s, cluster, in)
}

// routeLocked sets s's route for a cluster.
func (f *fanout) routeLocked(s *sub, cluster string, in interest) {
	f.unrouteLocked(s, cluster)
	if !in.whole && len(in.namespaces) == 0 {
		return
	}
	r := f.routes[cluster]
	if r == nil {
		r = &route{byNS: map[string][]*sub{}}
		f.routes[cluster] = r
	}
	if in.whole {
		r.whole = append(r.whole, s)
	} else {
		for _, ns := range in.namespaces {
			r.byNS[ns] = append(r.byNS[ns], s)
		}
	}
	if s.interests == nil {
		s.interests = map[string]interest{}
	}
	s.interests[cluster] = in
}

// unrouteLocked removes s's route for a cluster.
func (f *fanout) unrouteLocked(s *sub, cluster string) {
	in, ok := s.interests[cluster]
	if !ok {
		return
	}
	delete(s.interests, cluster)
	r := f.routes[cluster]
	if r == nil {
		return
	}
	if in.whole {
		r.whole = without(r.whole, s)
	}
	for _, ns := range in.namespaces {
		if list := without(r.byNS[ns], s); len(list) > 0 {
			r.byNS[ns] = list
		} else {
			delete(r.byNS, ns)
		}
	}
	if len(r.whole) == 0 && len(r.byNS) == 0 {
		delete(f.routes, cluster)
	}
}

// run reads the change feed and routes events until ctx ends. When it
// falls out of the feed's replay buffer, every stream ends with
// errFanoutBehind: the events in between are gone.
func (f *fanout) run(ctx context.Context, fs *Subscription, gen uint64) {
	defer fs.Close()
	buf := make([]*Event, 0, 256)
	for {
		evs, err := fs.Next(ctx, buf[:0])
		if err != nil {
			if ctx.Err() == nil {
				f.abort(gen)
			}
			return
		}
		f.mu.Lock()
		if f.gen != gen || !f.running {
			f.mu.Unlock()
			return
		}
		for _, ev := range evs {
			f.routeEventLocked(ev)
		}
		f.pos = evs[len(evs)-1].Seq
		f.mu.Unlock()
		clear(evs)
	}
}

// routeEventLocked hands one event to the streams that may care.
func (f *fanout) routeEventLocked(ev *Event) {
	switch ev.Type {
	case EventAdded, EventModified, EventDeleted:
		for s := range f.firehose {
			s.push(ev)
		}
		r := f.routes[ev.Cluster]
		if r == nil {
			return
		}
		for _, s := range r.whole {
			s.push(ev)
		}
		if len(r.byNS) > 0 {
			for _, s := range r.byNS[ev.Object().Namespace] {
				s.push(ev)
			}
		}
	case EventPolicy:
		// Access in this cluster may have grown or shrunk. Route the whole
		// cluster to every object stream until its reader has computed
		// the new access, so that newly granted objects are never missed.
		for s := range f.objects {
			if s.all || ev.Seq <= s.from {
				continue
			}
			if s.policySeq == nil {
				s.policySeq = map[string]uint64{}
			}
			s.policySeq[ev.Cluster] = ev.Seq
			if _, ok := f.firehose[s]; !ok {
				f.routeLocked(s, ev.Cluster, interest{whole: true})
			}
			s.push(ev)
		}
		for s := range f.watchers {
			if s.kind == StreamFleet {
				s.push(ev)
			}
		}
	case EventCluster, EventClusterRemoved:
		for s := range f.watchers {
			s.push(ev)
		}
	}
}

// abort ends every stream of run generation gen with errFanoutBehind.
func (f *fanout) abort(gen uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return
	}
	f.running = false
	f.stop()
	for s := range f.subs {
		s.end(errFanoutBehind)
	}
}

// rejoin ends a lagging spell: from now on the fan-out routes the events
// after its current position, which it returns; the reader replays the
// rest from the ring.
func (f *fanout) rejoin(s *sub) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lagging = false
	s.inbox = s.inbox[:0]
	s.from = max(s.from, f.pos)
	return s.from
}

// push queues an event without blocking. It runs on the fan-out goroutine
// under fanout.mu. A stream whose inbox is full is marked lagging and gets
// no more events until its reader has caught up from the replay ring (see
// next): bursts such as a cluster's full resync never end a stream, and
// the fan-out never waits.
func (s *sub) push(ev *Event) {
	if ev.Seq <= s.from {
		return
	}
	s.mu.Lock()
	switch {
	case s.lagging || s.endErr != nil:
		s.mu.Unlock()
		return
	case s.kind == StreamFleet:
		// The fleet status is a level, not a stream: coalesce.
		s.dirty = true
	case len(s.inbox) >= s.limit:
		s.lagging = true
		s.inbox = nil
	default:
		s.inbox = append(s.inbox, ev)
	}
	s.mu.Unlock()
	s.wake()
}

func (s *sub) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// end makes the stream's Next return err (once it has handed out what it
// holds). It may be called from any goroutine; the first error wins.
func (s *sub) end(err error) {
	s.mu.Lock()
	if s.endErr == nil {
		s.endErr = err
	}
	s.mu.Unlock()
	s.wake()
}

// take swaps out the inbox, reusing spare as the next one. It reports the
// fleet dirty flag, whether the stream is lagging, and the error it was
// ended with.
func (s *sub) take(spare []*Event) (batch []*Event, dirty, lagging bool, endErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch, s.inbox = s.inbox, spare[:0]
	dirty, s.dirty = s.dirty, false
	return batch, dirty, s.lagging, s.endErr
}

// next returns the next events of the stream in order, waiting for them:
// replayed from the ring while the stream catches up, else routed from its
// inbox. The slice is valid until the next call. It returns ctx.Err() when
// ctx ends, the error the stream was ended with, ErrResyncRequired when
// the stream started from a position the ring no longer holds, and
// ErrSlowConsumer when it fell out of the ring.
func (s *sub) next(ctx context.Context) ([]*Event, error) {
	if s.closed {
		return nil, errors.New("index: stream closed")
	}
	if s.held != nil { // the caller is done with the last batch
		clear(s.held)
		s.spare, s.held = s.held[:0], nil
	}
	for {
		if err := s.ended(); err != nil {
			return nil, err
		}
		if s.until > s.last {
			evs, err := s.replay(ctx)
			if err != nil || len(evs) > 0 {
				return evs, err
			}
			continue
		}
		if s.ring != nil {
			s.ring.Close()
			s.ring = nil
		}
		batch, _, lagging, endErr := s.take(s.spare)
		s.spare = nil
		if len(batch) > 0 {
			s.held = batch
			s.last = batch[len(batch)-1].Seq
			return batch, nil
		}
		s.spare = batch
		switch {
		case endErr != nil:
			return nil, endErr
		case lagging:
			s.f.catchUps[s.kind].Add(1)
			s.until, s.initial = s.f.rejoin(s), false
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.notify:
		}
	}
}

// replay returns the next events in (s.last, s.until] from the replay
// ring.
func (s *sub) replay(ctx context.Context) ([]*Event, error) {
	if s.ring == nil {
		r, err := s.f.s.Subscribe(s.last)
		if err != nil {
			return nil, s.fellBehind(err)
		}
		s.ring = r
	}
	if s.ringBuf == nil {
		s.ringBuf = make([]*Event, 0, 256)
	}
	clear(s.ringBuf)
	evs, err := s.ring.Next(ctx, s.ringBuf[:0])
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, s.fellBehind(err)
	}
	for i, ev := range evs {
		if ev.Seq > s.until {
			evs = evs[:i]
			break
		}
	}
	if len(evs) > 0 {
		s.last = evs[len(evs)-1].Seq
	}
	return evs, nil
}

// ended returns the error the stream was ended with, if any.
func (s *sub) ended() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// fellBehind turns a ring error: a gap before the first routed event means
// the stream started from a position that is gone; a later one means it
// read too slowly.
func (s *sub) fellBehind(err error) error {
	if !errors.Is(err, ErrResyncRequired) || s.initial {
		return err
	}
	s.f.dropped[s.kind].Add(s.f.s.LastSeq() - s.last)
	return fmt.Errorf("%w: %w", ErrSlowConsumer, err)
}

// close releases the stream.
func (s *sub) close() {
	if s.closed {
		return
	}
	s.closed = true
	if s.ring != nil {
		s.ring.Close()
		s.ring = nil
	}
	s.f.unregister(s)
}
