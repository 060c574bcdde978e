package conntest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// Transition is one recorded state change of a cluster.
type Transition struct {
	Cluster string
	State   index.ConnectionState
	At      time.Time
	Err     string
}

// Recorder follows the index change feed, as a subscriber would, and
// records every cluster state transition and when each cluster's rows last
// changed.
type Recorder struct {
	mu      sync.Mutex
	events  []Transition
	changed map[string]time.Time // cluster -> when its last object event was read
	wake    chan struct{}
}

// NewRecorder starts recording the transitions store publishes from now
// on; it stops when the test ends.
func NewRecorder(t testing.TB, store *index.Store) *Recorder {
	r := &Recorder{changed: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	Follow(t, store, func(e *index.Event) {
		switch e.Type {
		case index.EventAdded, index.EventModified, index.EventDeleted:
			r.mu.Lock()
			r.changed[e.Cluster] = time.Now()
			r.mu.Unlock()
			return
		}
		if e.Type != index.EventCluster || (e.PreviousCluster != nil && e.PreviousCluster.State == e.ClusterRow.State) {
			return
		}
		r.mu.Lock()
		r.events = append(r.events, Transition{e.Cluster, e.ClusterRow.State, time.Now(), e.ClusterRow.LastError})
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	})
	return r
}

// Follow calls fn, on its own goroutine, with every event store publishes
// from now on, in order, until the test ends.
func Follow(t testing.TB, store *index.Store, fn func(e *index.Event)) {
	sub, err := store.Subscribe(store.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sub.Close()
		var buf []*index.Event
		for {
			evs, err := sub.Next(ctx, buf[:0])
			if err != nil {
				return
			}
			buf = evs
			for _, e := range evs {
				fn(e)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// WaitFor waits for the n-th transition of cluster into state (counting
// from 1) and returns when it happened.
func (r *Recorder) WaitFor(t testing.TB, cluster string, state index.ConnectionState, n int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		seen := 0
		for _, e := range r.Of(cluster) {
			if e.State == state {
				if seen++; seen == n {
					return e.At
				}
			}
		}
		select {
		case <-r.wake:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("cluster %s: no %s transition #%d within %s; transitions: %v", cluster, state, n, timeout, r.Of(cluster))
		}
	}
}

// LastChange returns when the recorder read the last object event (a row
// added, changed or deleted) of cluster from the feed: once the rows are
// known to equal the truth, the moment they came to equal it, whenever the
// test happened to look.
func (r *Recorder) LastChange(cluster string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed[cluster]
}

// Count returns how many transitions of cluster into state were seen.
func (r *Recorder) Count(cluster string, state index.ConnectionState) int {
	n := 0
	for _, e := range r.Of(cluster) {
		if e.State == state {
			n++
		}
	}
	return n
}

// Of returns the transitions of one cluster, oldest first.
func (r *Recorder) Of(cluster string) []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Transition
	for _, e := range r.events {
		if e.Cluster == cluster {
			out = append(out, e)
		}
	}
	return out
}
