package graph

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/fleetgraph/fleetgraph/index"
)

// hub fans the index change feed out to subscriptions. The index keeps
// subscribers as mere positions in its ring; a thousand subscriptions each
// reading the ring would mean a thousand goroutine wake-ups per commit, so
// the hub reads it once and routes every event only to the subscriptions
// that may care.
//
// Concurrency contract:
//
//   - One goroutine (run) reads the feed through a single
//     index.Subscription and routes each event by appending it to the
//     inboxes of interested subscribers (subscriber.push). It never waits
//     for a subscriber. The slow-client policy: a full inbox marks the
//     subscriber lagging; its pump then reads the index's replay ring at
//     its own pace (catchUp) and rejoins; only a subscriber that falls out
//     of the ring (index.DefaultReplayBuffer events behind) is ended, with
//     SLOW_CONSUMER, and its missed events are counted as dropped. A
//     client that stops reading altogether is disconnected by the
//     websocket write timeout. Publishing in the index never waits for
//     the hub either.
//   - Each subscription has one pump goroutine (subscriptions.go) that owns
//     its output channel: it drains the inbox, applies the viewer's
//     visibility, sends, and closes the channel when it ends.
//   - h.mu guards the routing tables, the running state and every
//     subscriber's routing fields; subscriber.mu guards its inbox. Lock
//     order: h.mu, then subscriber.mu.
//   - run starts with the first subscription and stops when the last one
//     leaves or on close, so an idle handler holds no goroutine. gen tells
//     a stopped run apart from its successor.
type hub struct {
	store *index.Store
	log   *slog.Logger
	m     *metrics

	mu      sync.Mutex
	closed  bool
	drained chan struct{} // closed once closed and every subscriber has left
	running bool
	gen     uint64
	stop    context.CancelFunc
	done    chan struct{} // closed when the current run returns
	pos     uint64        // sequence number of the last event routed

	subs     map[*subscriber]struct{} // every subscriber
	objects  map[*subscriber]struct{} // objectChanges subscribers (policy events)
	watchers map[*subscriber]struct{} // clusterConnection and fleet (cluster events)
	firehose map[*subscriber]struct{} // objectChanges subscribers that get every object event
	routes   map[string]*route        // by cluster
}

// route lists the subscribers of one cluster's object events: those that
// want the whole cluster and those that want some namespaces. Slices, not
// sets: most lists are short, and a subscriber costs a pointer in each.
type route struct {
	whole []*subscriber
	byNS  map[string][]*subscriber
}

// without removes s from list, not keeping the order.
func without(list []*subscriber, s *subscriber) []*subscriber {
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

func newHub(store *index.Store, log *slog.Logger, m *metrics) *hub {
	return &hub{
		store: store, log: log, m: m,
		subs: map[*subscriber]struct{}{}, objects: map[*subscriber]struct{}{},
		watchers: map[*subscriber]struct{}{}, firehose: map[*subscriber]struct{}{},
		routes: map[string]*route{},
	}
}

// subKind is what a subscriber subscribed to.
type subKind uint8

const (
	subObjects subKind = iota + 1
	subClusters
	subFleet
)

func (k subKind) String() string {
	switch k {
	case subObjects:
		return "objectChanges"
	case subClusters:
		return "clusterConnection"
	case subFleet:
		return "fleet"
	}
	return "unknown"
}

// interest is what one objectChanges subscriber wants routed from one
// cluster: everything, or the object events of some namespaces ("" for
// cluster-scoped objects).
type interest struct {
	whole      bool
	namespaces []string
}

// subscriber is one subscription as the hub sees it.
type subscriber struct {
	kind   subKind
	limit  int           // inbox bound before catching up from the ring
	notify chan struct{} // capacity 1: "the inbox changed"

	// Routing state, guarded by hub.mu.
	from      uint64              // route only events after this sequence number
	admin     bool                // sees everything: stays in the firehose
	interests map[string]interest // current routes by cluster
	policySeq map[string]uint64   // last policy event routed, by cluster

	mu      sync.Mutex // guards the fields below
	inbox   []*index.Event
	dirty   bool  // fleet: something changed since the last status
	lagging bool  // the inbox hit limit; the pump catches up from the ring
	endErr  error // set when the hub ends the subscription

	// last is the sequence number of the last event handed to the pump's
	// handler. Only the pump goroutine uses it.
	last uint64
}

func newSubscriber(kind subKind, limit int, admin bool) *subscriber {
	return &subscriber{kind: kind, limit: limit, admin: admin, notify: make(chan struct{}, 1)}
}

// push queues an event without blocking. It runs on the hub goroutine
// under hub.mu. A subscriber whose inbox is full is marked lagging and gets
// no more events until its pump has caught up from the index's replay ring
// (see drain): bursts such as a cluster's full resync never end a
// subscription, and the hub never waits.
func (s *subscriber) push(ev *index.Event) {
	if ev.Seq <= s.from {
		return
	}
	s.mu.Lock()
	switch {
	case s.lagging || s.endErr != nil:
		s.mu.Unlock()
		return
	case s.kind == subFleet:
		// The fleet status is a level, not a stream: coalesce.
		s.dirty = true
	case len(s.inbox) >= s.limit:
		s.lagging = true
		s.inbox = nil
	default:
		s.inbox = append(s.inbox, ev)
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// take swaps out the inbox, reusing spare as the next one. It reports the
// fleet dirty flag, whether the subscriber is lagging, and the error the
// hub ended the subscription with.
func (s *subscriber) take(spare []*index.Event) (batch []*index.Event, dirty, lagging bool, endErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch, s.inbox = s.inbox, spare[:0]
	dirty, s.dirty = s.dirty, false
	return batch, dirty, s.lagging, s.endErr
}

// drain is the loop of a pump: it hands routed events to fn in order,
// catching up from the index's replay ring whenever the subscriber lagged.
// It returns nil when ctx ends or fn returns false, the hub's error when
// the hub ended the subscription, and a SLOW_CONSUMER error when the
// subscriber fell out of the replay ring.
func (h *hub) drain(ctx context.Context, s *subscriber, fn func(*index.Event) bool) error {
	var spare []*index.Event
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.notify:
		}
		batch, _, lagging, endErr := s.take(spare)
		for _, ev := range batch {
			s.last = ev.Seq
			if !fn(ev) {
				return nil
			}
		}
		clear(batch)
		spare = batch
		if endErr != nil {
			return endErr
		}
		if lagging {
			h.m.caughtUp(s.kind)
			if err := h.catchUp(ctx, s, s.last, h.rejoin(s), fn); err != nil {
				if errors.Is(err, index.ErrResyncRequired) {
					h.m.dropped(s.kind, int(h.store.LastSeq()-s.last))
					return newError(CodeSlowConsumer, err, "the client fell too far behind the change feed; query again and resubscribe with the answer's changesCursor")
				}
				return err
			}
		}
	}
}

// rejoin ends a lagging spell: from now on the hub routes the events after
// its current position, which it returns; the pump replays the rest.
func (h *hub) rejoin(s *subscriber) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lagging = false
	s.inbox = s.inbox[:0]
	s.from = max(s.from, h.pos)
	return s.from
}

// catchUp hands fn the events in (after, until] straight from the index's
// replay ring, all of them, in order; fn applies the subscriber's own
// filter. It returns index.ErrResyncRequired (wrapped) when the ring no
// longer holds them, and nil when ctx ends or fn returns false.
func (h *hub) catchUp(ctx context.Context, s *subscriber, after, until uint64, fn func(*index.Event) bool) error {
	if after >= until {
		return nil
	}
	sub, err := h.store.Subscribe(after)
	if err != nil {
		return fmt.Errorf("graph: catching up from %d: %w", after, err)
	}
	defer sub.Close()
	buf := make([]*index.Event, 0, 256)
	for sub.Position() < until {
		evs, err := sub.Next(ctx, buf[:0])
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("graph: catching up from %d: %w", after, err)
		}
		for _, ev := range evs {
			if ev.Seq > until {
				break
			}
			s.last = ev.Seq
			if !fn(ev) {
				return nil
			}
		}
		clear(evs)
	}
	return nil
}

// end makes the subscription's pump stop with err.
func (s *subscriber) end(err error) {
	s.mu.Lock()
	if s.endErr == nil {
		s.endErr = err
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// errHubClosed is the end of every subscription when the handler closes.
var errHubClosed = newError(CodeShuttingDown, nil, "server is shutting down")

// register adds a subscriber that wants the events after sequence number
// after. It returns the position from which the hub routes events to it:
// when that is beyond after, the subscriber must replay the events in
// between from the index itself (see objectsPump). Object subscribers start
// in the firehose until their pump has computed their routes
// (setInterests), so that no event is lost meanwhile.
func (h *hub) register(s *subscriber, after uint64) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, errHubClosed
	}
	if !h.running {
		if err := h.startLocked(); err != nil {
			return 0, err
		}
	}
	s.from = max(after, h.pos)
	h.subs[s] = struct{}{}
	switch s.kind {
	case subObjects:
		h.objects[s] = struct{}{}
		h.firehose[s] = struct{}{}
	case subClusters, subFleet:
		h.watchers[s] = struct{}{}
	}
	h.m.subscribers(len(h.subs))
	return s.from, nil
}

// startLocked starts run at the feed's current position.
func (h *hub) startLocked() error {
	pos := h.store.LastSeq()
	sub, err := h.store.Subscribe(pos)
	if err != nil {
		return fmt.Errorf("graph: subscribing to the change feed: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.gen++
	h.running, h.stop, h.done, h.pos = true, cancel, make(chan struct{}), pos
	go h.run(ctx, sub, h.gen, h.done)
	return nil
}

// unregister removes a subscriber; the last one stops run.
func (h *hub) unregister(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	delete(h.objects, s)
	delete(h.watchers, s)
	delete(h.firehose, s)
	for c := range s.interests {
		h.unrouteLocked(s, c)
	}
	h.m.subscribers(len(h.subs))
	if len(h.subs) == 0 && h.running {
		h.running = false
		h.stop()
	}
	if len(h.subs) == 0 && h.closed {
		closeOnce(h.drained)
	}
}

// closeOnce closes ch unless it is closed already.
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// setInterests replaces the routes of a subscriber that has just computed
// its access, as of sequence number seq, and takes it out of the firehose
// (unless it is an admin). A cluster whose policy changed after seq stays
// wholly routed until the pump has handled that change (setInterest).
func (h *hub) setInterests(s *subscriber, in map[string]interest, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok || s.admin {
		return
	}
	delete(h.firehose, s)
	for c, ps := range s.policySeq {
		if ps > seq {
			in[c] = interest{whole: true}
		}
	}
	for c := range s.interests {
		if _, ok := in[c]; !ok {
			h.unrouteLocked(s, c)
		}
	}
	for c, i := range in {
		h.routeLocked(s, c, i)
	}
}

// setInterest replaces one cluster's route after the pump handled the
// policy event with sequence number seq. A newer policy event, routed
// meanwhile, wins: the pump will handle it next.
func (h *hub) setInterest(s *subscriber, cluster string, in interest, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok || s.admin || s.policySeq[cluster] > seq {
		return
	}
	if _, ok := h.firehose[s]; ok {
		return // setInterests has not run yet; it will read the access anew
	}
	if !in.whole && len(in.namespaces) == 0 {
		h.unrouteLocked(s, cluster)
		return
	}
	h.routeLocked(s, cluster, in)
}

// routeLocked sets s's route for a cluster.
func (h *hub) routeLocked(s *subscriber, cluster string, in interest) {
	h.unrouteLocked(s, cluster)
	if !in.whole && len(in.namespaces) == 0 {
		return
	}
	r := h.routes[cluster]
	if r == nil {
		r = &route{byNS: map[string][]*subscriber{}}
		h.routes[cluster] = r
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
func (h *hub) unrouteLocked(s *subscriber, cluster string) {
	in, ok := s.interests[cluster]
	if !ok {
		return
	}
	delete(s.interests, cluster)
	r := h.routes[cluster]
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
		delete(h.routes, cluster)
	}
}

// run reads the change feed and routes events until ctx ends. When it
// falls out of the feed's replay buffer (the machine could not keep up),
// every subscription ends with RESYNC_REQUIRED: their clients must query
// again, since the events in between are gone.
func (h *hub) run(ctx context.Context, sub *index.Subscription, gen uint64, done chan struct{}) {
	defer close(done)
	defer sub.Close()
	buf := make([]*index.Event, 0, 256)
	for {
		evs, err := sub.Next(ctx, buf[:0])
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			h.log.Error("graph: subscription fan-out fell behind the change feed; ending every subscription", "err", err)
			h.abort(gen, newError(CodeResyncRequired, err, "the server fell behind the change feed; query again and resubscribe"))
			return
		}
		h.mu.Lock()
		if h.gen != gen || !h.running {
			h.mu.Unlock()
			return
		}
		for _, ev := range evs {
			h.routeEventLocked(ev)
		}
		h.pos = evs[len(evs)-1].Seq
		h.mu.Unlock()
		clear(evs)
	}
}

// routeEventLocked hands one event to the subscribers that may care.
func (h *hub) routeEventLocked(ev *index.Event) {
	switch ev.Type {
	case index.EventAdded, index.EventModified, index.EventDeleted:
		for s := range h.firehose {
			s.push(ev)
		}
		r := h.routes[ev.Cluster]
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
	case index.EventPolicy:
		// Access in this cluster may have grown or shrunk. Route the whole
		// cluster to every object subscriber until its pump has computed
		// the new access, so that newly granted objects are never missed.
		for s := range h.objects {
			if s.admin || ev.Seq <= s.from {
				continue
			}
			if s.policySeq == nil {
				s.policySeq = map[string]uint64{}
			}
			s.policySeq[ev.Cluster] = ev.Seq
			if _, ok := h.firehose[s]; !ok {
				h.routeLocked(s, ev.Cluster, interest{whole: true})
			}
			s.push(ev)
		}
		for s := range h.watchers {
			if s.kind == subFleet {
				s.push(ev)
			}
		}
	case index.EventCluster, index.EventClusterRemoved:
		for s := range h.watchers {
			s.push(ev)
		}
	}
}

// abort ends every subscription of run generation gen with err.
func (h *hub) abort(gen uint64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen {
		return
	}
	h.running = false
	h.stop()
	for s := range h.subs {
		s.end(err)
	}
}

// close ends every subscription and waits for run to return. Later
// registrations fail with SHUTTING_DOWN. The returned channel is closed
// once every pump has closed its channel and left, after which the
// websockets may be closed without cutting off the pumps' final errors.
func (h *hub) close() <-chan struct{} {
	h.mu.Lock()
	h.closed = true
	if h.drained == nil {
		h.drained = make(chan struct{})
	}
	if len(h.subs) == 0 {
		closeOnce(h.drained)
	}
	drained := h.drained
	var done chan struct{}
	if h.running {
		h.running = false
		h.stop()
		done = h.done
	}
	for s := range h.subs {
		s.end(errHubClosed)
	}
	h.mu.Unlock()
	if done != nil {
		<-done
	}
	return drained
}
