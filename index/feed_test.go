package index

import (
	"context"
	"errors"
	"fmt"
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
	if now.Status != StatusUnhealthy || before.Status != StatusHealthy || before.Labels["app"] != "x" {
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
