package index

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFeedReplayAndResync(t *testing.T) {
	s, _ := newTestStore(t, WithReplayBuffer(4))
	for _, n := range []string{"a", "b", "c"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", n, StatusHealthy, nil)))
	}
	// Resume from the middle: replays the rest.
	if got := types(drain(t, s, 1)); len(got) != 2 || got[0] != "ADDED b" || got[1] != "ADDED c" {
		t.Fatalf("replay from 1 = %v", got)
	}
	for _, n := range []string{"d", "e", "f"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", n, StatusHealthy, nil)))
	}
	// Seq 1 and 2 fell out of the 4-event buffer.
	tests := []struct {
		name  string
		after uint64
		err   bool
	}{
		{"too old", 1, true},
		{"oldest retained", 2, false},
		{"now", 6, false},
		{"future", 99, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub, err := s.Subscribe(tt.after)
			if tt.err {
				if !errors.Is(err, ErrResyncRequired) {
					t.Fatalf("err = %v, want ErrResyncRequired", err)
				}
				return
			}
			mustNoErr(t, err)
			sub.Close()
		})
	}
	if st := s.FeedStats(); st.Resyncs != 2 || st.Oldest != 3 || st.Last != 6 || st.Subscribers != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestFeedSlowSubscriberMustResync(t *testing.T) {
	s, _ := newTestStore(t, WithReplayBuffer(2))
	sub, err := s.Subscribe(s.LastSeq())
	mustNoErr(t, err)
	defer sub.Close()
	// Publishing never waits for the subscriber, which falls behind.
	for _, n := range []string{"a", "b", "c"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", n, StatusHealthy, nil)))
	}
	if _, err := sub.Next(ctxb, nil); !errors.Is(err, ErrResyncRequired) {
		t.Fatalf("err = %v, want ErrResyncRequired", err)
	}
}

func TestFeedNextBlocksAndWakes(t *testing.T) {
	s, _ := newTestStore(t)
	sub, err := s.Subscribe(0)
	mustNoErr(t, err)
	defer sub.Close()
	ctx, cancel := context.WithTimeout(ctxb, 20*time.Millisecond)
	_, err = sub.Next(ctx, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next without events = %v", err)
	}
	done := make(chan []*Event)
	go func() {
		evs, _ := sub.Next(ctxb, nil)
		done <- evs
	}()
	mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", "a", StatusHealthy, nil)))
	select {
	case evs := <-done:
		if len(evs) != 1 || evs[0].Type != EventAdded || evs[0].Seq != 1 {
			t.Fatalf("events = %v", types(evs))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("subscriber not woken")
	}
}

func TestQuerySeqLinesUpWithFeed(t *testing.T) {
	s, _ := newTestStore(t)
	mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", "a", StatusHealthy, nil)))
	p, err := s.Query(ctxb, Query{Access: &Access{All: true}})
	mustNoErr(t, err)
	mustNoErr(t, s.Upsert(ctxb, pod("c", "ns", "b", StatusHealthy, nil)))
	if got := types(drain(t, s, p.Seq)); len(got) != 1 || got[0] != "ADDED b" {
		t.Fatalf("events after page = %v", got)
	}
}

func TestMatcherClassify(t *testing.T) {
	s, _ := newTestStore(t)
	m, err := NewMatcher(Filter{Statuses: []Status{StatusUnhealthy}}, &Access{All: true})
	mustNoErr(t, err)
	p := pod("c", "ns", "a", StatusHealthy, nil)
	mustNoErr(t, s.Upsert(ctxb, p)) // not visible
	p.Status = StatusUnhealthy
	mustNoErr(t, s.Upsert(ctxb, p)) // enters: ADDED
	p.Message = "still bad"
	mustNoErr(t, s.Upsert(ctxb, p)) // MODIFIED
	p.Status = StatusHealthy
	mustNoErr(t, s.Upsert(ctxb, p)) // leaves: DELETED
	var got []string
	for _, e := range drain(t, s, 0) {
		if typ, ok := m.Classify(e); ok {
			got = append(got, typ.String())
		}
	}
	if len(got) != 3 || got[0] != "ADDED" || got[1] != "MODIFIED" || got[2] != "DELETED" {
		t.Fatalf("classified = %v", got)
	}
}

// TestEventObjectsShared checks that Object and Previous build their
// Object once and hand every subscriber the same value, also when many
// subscribers ask at once (the fan-out of a MODIFIED event).
func TestEventObjectsShared(t *testing.T) {
	s, _ := newTestStore(t)
	p := pod("c", "ns", "a", StatusHealthy, map[string]string{"app": "x"})
	mustNoErr(t, s.Upsert(ctxb, p))
	p.Status = StatusUnhealthy
	mustNoErr(t, s.Upsert(ctxb, p))
	evs := drain(t, s, 0)
	if len(evs) != 2 || evs[1].Type != EventModified {
		t.Fatalf("events = %v", types(evs))
	}
	added, modified := evs[0], evs[1]
	if added.Previous() != nil {
		t.Error("ADDED has a previous state")
	}
	const subscribers = 8
	var wg sync.WaitGroup
	got := make([][2]*Object, subscribers)
	for i := range subscribers {
		wg.Go(func() { got[i] = [2]*Object{modified.Object(), modified.Previous()} })
	}
	wg.Wait()
	now, before := got[0][0], got[0][1]
	for i, g := range got {
		if g[0] != now || g[1] != before {
			t.Fatalf("subscriber %d got other Objects than subscriber 0", i)
		}
	}
	if now.Status != StatusUnhealthy || before.Status != StatusHealthy || before.Labels.Get("app") != "x" {
		t.Fatalf("Object = %+v, Previous = %+v", now, before)
	}
	if n := testing.AllocsPerRun(100, func() { _ = modified.Previous() }); n != 0 {
		t.Errorf("Previous allocates %v times per call once built", n)
	}
}

// TestGroupedWrites runs Upserts and Deletes from many goroutines while
// queries hold the read lock, and checks that every change was applied and
// published once, in sequence, with each call's events consecutive.
func TestGroupedWrites(t *testing.T) {
	s, _ := newTestStore(t)
	sub, err := s.Subscribe(0)
	mustNoErr(t, err)
	defer sub.Close()
	const writers, perWriter = 8, 50
	ctx, cancel := context.WithCancel(ctxb)
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for ctx.Err() == nil {
			_, err := s.Query(ctx, Query{Access: &Access{All: true}})
			if err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				a := pod("c1", fmt.Sprintf("ns-%d", g), fmt.Sprintf("a-%d", i), StatusHealthy, nil)
				b := pod("c1", fmt.Sprintf("ns-%d", g), fmt.Sprintf("b-%d", i), StatusHealthy, nil)
				if err := s.UpsertBatch(ctxb, []Object{a, b}); err != nil {
					t.Error(err)
					return
				}
				if i%5 == 0 {
					if err := s.Delete(ctxb, a.Key()); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	readers.Wait()
	want := writers * perWriter * 2
	want += writers * perWriter / 5 // deletes
	var events []*Event
	for len(events) < want {
		events, err = sub.Next(ctxb, events)
		mustNoErr(t, err)
	}
	if len(events) != want || s.LastSeq() != uint64(want) {
		t.Fatalf("%d events, last seq %d, want %d", len(events), s.LastSeq(), want)
	}
	for i, e := range events {
		if e.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		// The two rows of one UpsertBatch are published together.
		if e.Type == EventAdded && strings.Contains(e.Key().Name, "a-") {
			next := events[i+1].Key()
			if want := strings.Replace(e.Key().Name, "a-", "b-", 1); next.Name != want || next.Namespace != e.Key().Namespace {
				t.Fatalf("event after %s is %s", e.Key(), next)
			}
		}
	}
	p, err := s.Query(ctxb, Query{Access: &Access{All: true}, First: 1})
	mustNoErr(t, err)
	if p.TotalCount != writers*perWriter*2-writers*perWriter/5 {
		t.Fatalf("%d objects stored", p.TotalCount)
	}
}

// pods returns n pods of one namespace, named from prefix.
func pods(cluster, prefix string, n int) []Object {
	rows := make([]Object, n)
	for i := range rows {
		rows[i] = pod(cluster, "ns", fmt.Sprintf("%s-%06d", prefix, i), StatusHealthy, nil)
	}
	return rows
}

// readAll reads sub up to the store's last event, failing on any error.
func readAll(t *testing.T, s *Store, sub *Subscription) []*Event {
	t.Helper()
	var out []*Event
	buf := make([]*Event, 0, 4096)
	for sub.Position() < s.LastSeq() {
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		evs, err := sub.Next(ctx, buf[:0])
		cancel()
		mustNoErr(t, err)
		out = append(out, evs...)
	}
	return out
}

// TestFeedLargeCommitReadWhole is a big cluster's first sync: one Replace
// of 100,000 pods, more events than the replay buffer, with churn after
// it. Subscribers that were caught up before it read all of it without a
// resync, and so does one that resumes from before it; so does the one
// commit of removing that cluster.
func TestFeedLargeCommitReadWhole(t *testing.T) {
	const n = 100_000
	s, _ := newTestStore(t) // DefaultReplayBuffer
	if n <= DefaultReplayBuffer {
		t.Fatal("the commit must be larger than the replay buffer")
	}
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "ns", "before", StatusHealthy, nil)))
	before := s.LastSeq()
	sub, err := s.Subscribe(before)
	mustNoErr(t, err)
	defer sub.Close()

	mustNoErr(t, s.Replace(ctxb, "c1", podKind, pods("c1", "p", n)))
	for i := range 10 { // churn after the big commit
		mustNoErr(t, s.Upsert(ctxb, pod("c2", "ns", fmt.Sprint("after-", i), StatusHealthy, nil)))
	}
	if st := s.FeedStats(); st.Oldest > before+1 || st.Resyncs != 0 {
		t.Fatalf("stats = %+v: the large commit is not retained from %d", st, before+1)
	}
	resumed, err := s.Subscribe(before)
	mustNoErr(t, err)
	defer resumed.Close()
	for name, sub := range map[string]*Subscription{"caught up": sub, "resumed": resumed} {
		evs := readAll(t, s, sub)
		added, deleted := 0, 0
		for i, e := range evs {
			if e.Seq != before+1+uint64(i) {
				t.Fatalf("%s: event %d has seq %d, want %d", name, i, e.Seq, before+1+uint64(i))
			}
			switch {
			case e.Type == EventAdded && e.Cluster == "c1":
				added++
			case e.Type == EventDeleted:
				deleted++ // "before", which the Replace does not list
			}
		}
		if added != n || deleted != 1 {
			t.Errorf("%s: read %d ADDED and %d DELETED events of the Replace, want %d and 1", name, added, deleted, n)
		}
	}
	// Removing the big cluster is one commit of as many deletions.
	mustNoErr(t, s.RemoveCluster(ctxb, "c1"))
	deleted := 0
	for _, e := range readAll(t, s, sub) {
		if e.Type == EventDeleted {
			deleted++
		}
	}
	if deleted != n {
		t.Errorf("read %d DELETED events of RemoveCluster, want %d", deleted, n)
	}
	if st := s.FeedStats(); st.Resyncs != 0 {
		t.Errorf("resyncs = %d", st.Resyncs)
	}
}

// TestFeedRetention checks which positions stay readable: a commit is kept
// whole until the replay buffer's worth of events followed it, so a
// subscriber keeps its place inside a large commit for that long, and
// memory returns to the buffer's size afterwards (the slow-subscriber
// policy still ends a subscriber that far behind).
func TestFeedRetention(t *testing.T) {
	const capacity = 100
	tests := []struct {
		name       string
		big        int // events of the large commit
		after      int // one-event commits after it
		read       int // events of the large commit the subscriber read first
		wantResync bool
	}{
		{"small commit, then a buffer's worth minus one", 10, capacity - 1, 0, false},
		{"small commit, then a buffer's worth", 10, capacity, 0, true},
		{"large commit alone", 5 * capacity, 0, 0, false},
		{"large commit, then a buffer's worth minus one", 5 * capacity, capacity - 1, 0, false},
		{"large commit, half read, then a buffer's worth minus one", 5 * capacity, capacity - 1, 250, false},
		{"large commit, then a buffer's worth", 5 * capacity, capacity, 0, true},
		{"large commit, half read, then a buffer's worth", 5 * capacity, capacity, 250, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newTestStore(t, WithReplayBuffer(capacity))
			for i := range 3 * capacity { // history to fall out of
				mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns", fmt.Sprint(i), StatusHealthy, nil)))
			}
			sub, err := s.Subscribe(s.LastSeq())
			mustNoErr(t, err)
			defer sub.Close()
			mustNoErr(t, s.UpsertBatch(ctxb, pods("c1", "big", tt.big)))
			if tt.read > 0 {
				evs, err := sub.Next(ctxb, make([]*Event, 0, tt.read))
				mustNoErr(t, err)
				if len(evs) != tt.read {
					t.Fatalf("read %d events, want %d", len(evs), tt.read)
				}
			}
			for i := range tt.after {
				mustNoErr(t, s.Upsert(ctxb, pod("c2", "ns", fmt.Sprint(i), StatusHealthy, nil)))
			}
			_, err = sub.Next(ctxb, nil)
			if got := errors.Is(err, ErrResyncRequired); got != tt.wantResync {
				t.Fatalf("Next = %v, want resync %v", err, tt.wantResync)
			}
			// Memory: at most the buffer's worth of events after the
			// oldest commit, plus that commit.
			st := s.FeedStats()
			oldest := tt.big
			if tt.wantResync {
				oldest = 1
			}
			if retained := int(st.Last - st.Oldest + 1); retained > capacity-1+oldest {
				t.Errorf("retained %d events (%d..%d), want at most %d", retained, st.Oldest, st.Last, capacity-1+oldest)
			}
			s.feed.mu.RLock()
			size := len(s.feed.ring)
			s.feed.mu.RUnlock()
			if tt.wantResync && size > capacity+capacity/4 {
				t.Errorf("the ring still has %d slots after the large commit was dropped", size)
			}
		})
	}
}

// TestFeedRandomCommits publishes commits of random sizes, some larger
// than the buffer, while subscribers with different buffer sizes read at
// different paces, and checks that each reads consecutive events until the
// feed drops its position, and resumes from any retained position.
func TestFeedRandomCommits(t *testing.T) {
	const capacity = 50
	rnd := rand.New(rand.NewPCG(1, 2))
	s, _ := newTestStore(t, WithReplayBuffer(capacity))
	type reader struct {
		sub  *Subscription
		size int
	}
	var readers []*reader
	for _, size := range []int{1, 7, 64, 300} {
		sub, err := s.Subscribe(0)
		mustNoErr(t, err)
		readers = append(readers, &reader{sub, size})
	}
	defer func() {
		for _, r := range readers {
			r.sub.Close()
		}
	}()
	name := 0
	for range 300 {
		rows := pods("c", fmt.Sprint("r", name), 1+rnd.IntN([]int{5, 40, 3 * capacity}[rnd.IntN(3)]))
		name++
		mustNoErr(t, s.UpsertBatch(ctxb, rows))
		for _, r := range readers {
			if rnd.IntN(3) == 0 {
				continue // this reader falls behind for a while
			}
			from := r.sub.Position()
			evs, err := r.sub.Next(ctxb, make([]*Event, 0, r.size))
			if errors.Is(err, ErrResyncRequired) {
				st := s.FeedStats()
				if from+1 >= st.Oldest {
					t.Fatalf("resync at %d with %d..%d retained", from, st.Oldest, st.Last)
				}
				r.sub.Close()
				// Resume from a random retained position.
				r.sub, err = s.Subscribe(st.Oldest - 1 + uint64(rnd.IntN(int(st.Last-st.Oldest+2))))
				mustNoErr(t, err)
				continue
			}
			mustNoErr(t, err)
			for i, e := range evs {
				if e.Seq != from+1+uint64(i) {
					t.Fatalf("reader %d: event %d has seq %d, want %d", r.size, i, e.Seq, from+1+uint64(i))
				}
			}
		}
	}
	if st := s.FeedStats(); st.Resyncs == 0 {
		t.Error("no reader fell behind: the test does not exercise the policy")
	}
}
