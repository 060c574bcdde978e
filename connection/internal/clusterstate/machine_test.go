package clusterstate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Sink that writes to a real index and keeps every row it was
// given.
type recorder struct {
	store *index.Store
	mu    sync.Mutex
	rows  []index.Cluster
}

func (r *recorder) UpsertCluster(ctx context.Context, c index.Cluster) error {
	r.mu.Lock()
	r.rows = append(r.rows, c)
	r.mu.Unlock()
	return r.store.UpsertCluster(ctx, c)
}

// states returns the state of every row written that changed the state.
func (r *recorder) states() []index.ConnectionState {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []index.ConnectionState
	for _, row := range r.rows {
		if len(out) == 0 || out[len(out)-1] != row.State {
			out = append(out, row.State)
		}
	}
	return out
}

func newMachine(t *testing.T) (*Machine, *recorder) {
	t.Helper()
	rec := &recorder{store: index.New(memtables.Open)}
	var transitions []index.ConnectionState
	m := New(Config{
		Name: "c1", Labels: map[string]string{"env": "prod"}, Mode: index.ModePull, Sink: rec,
		OnTransition: func(s index.ConnectionState) { transitions = append(transitions, s) },
	})
	t.Cleanup(func() {
		if got, want := fmt.Sprint(transitions), fmt.Sprint(rec.states()); got != want {
			t.Errorf("OnTransition saw %s, the index %s", got, want)
		}
	})
	return m, rec
}

// step is one call on a Machine and what the row must say after it.
type step struct {
	do        func(ctx context.Context, m *Machine, gens []uint64) []uint64
	state     index.ConnectionState
	lastError string
	synced    bool
}

func connect(ctx context.Context, m *Machine, gens []uint64) []uint64 {
	return append(gens, m.Connect(ctx, true, nil))
}

// on runs f with the generation of the n-th Connect (counting from 1).
func on(n int, f func(ctx context.Context, m *Machine, gen uint64)) func(context.Context, *Machine, []uint64) []uint64 {
	return func(ctx context.Context, m *Machine, gens []uint64) []uint64 {
		f(ctx, m, gens[n-1])
		return gens
	}
}

func synced(kinds ...KindStatus) func(ctx context.Context, m *Machine, gen uint64) {
	return func(ctx context.Context, m *Machine, gen uint64) {
		m.Report(ctx, gen, Report{Kinds: kinds, Synced: true})
	}
}

func kinds(kinds ...KindStatus) func(ctx context.Context, m *Machine, gen uint64) {
	return func(ctx context.Context, m *Machine, gen uint64) { m.Report(ctx, gen, Report{Kinds: kinds}) }
}

func lost(msg string) func(ctx context.Context, m *Machine, gen uint64) {
	return func(ctx context.Context, m *Machine, gen uint64) { m.Lost(ctx, gen, errors.New(msg)) }
}

func TestTransitions(t *testing.T) {
	const (
		C  = index.StateConnecting
		OK = index.StateConnected
		DG = index.StateDegraded
		DC = index.StateDisconnected
	)
	failA := KindStatus{Kind: "apps/A", Err: "forbidden"}
	failB := KindStatus{Kind: "B", Err: "not served"}
	okA := KindStatus{Kind: "apps/A"}
	cases := []struct {
		name        string
		steps       []step
		transitions []index.ConnectionState
	}{
		{"first connect and sync", []step{
			{do: connect, state: C},
			{do: on(1, synced()), state: OK, synced: true},
		}, []index.ConnectionState{C, OK}},
		{"kind news before the sync is only remembered", []step{
			{do: connect, state: C},
			{do: on(1, kinds(failA)), state: C},
			{do: on(1, synced()), state: DG, lastError: "apps/A: forbidden", synced: true},
			{do: on(1, kinds(okA)), state: OK, synced: true},
		}, []index.ConnectionState{C, DG, OK}},
		{"the first failing kind in kind order is the error", []step{
			{do: connect, state: C},
			{do: on(1, synced(failA, failB)), state: DG, lastError: "B: not served", synced: true},
			{do: on(1, kinds(KindStatus{Kind: "B"})), state: DG, lastError: "apps/A: forbidden", synced: true},
		}, []index.ConnectionState{C, DG}},
		{"a report of all kinds drops failing kinds it does not list", []step{
			{do: connect, state: C},
			{do: on(1, synced(failA)), state: DG, lastError: "apps/A: forbidden", synced: true},
			{do: on(1, func(ctx context.Context, m *Machine, gen uint64) {
				m.Report(ctx, gen, Report{All: true, Synced: true, Kinds: []KindStatus{{Kind: "B"}}})
			}), state: OK, synced: true},
		}, []index.ConnectionState{C, DG, OK}},
		{"one outage is one DISCONNECTED and one CONNECTED, however many attempts fail", []step{
			{do: connect, state: C},
			{do: on(1, synced()), state: OK, synced: true},
			{do: on(1, lost("watch failed")), state: DC, lastError: "watch failed", synced: true},
			{do: on(1, lost("connection refused")), state: DC, lastError: "connection refused", synced: true},
			{do: connect, state: DC, lastError: "connection refused", synced: true},
			{do: on(2, kinds(failA)), state: DC, lastError: "connection refused", synced: true},
			{do: on(2, lost("session ended: oversize")), state: DC, lastError: "session ended: oversize", synced: true},
			{do: connect, state: DC, lastError: "session ended: oversize", synced: true},
			{do: on(3, synced()), state: OK, synced: true},
		}, []index.ConnectionState{C, OK, DC, OK}},
		{"an outage can end DEGRADED", []step{
			{do: connect, state: C},
			{do: on(1, synced()), state: OK, synced: true},
			{do: on(1, lost("gone")), state: DC, lastError: "gone", synced: true},
			{do: connect, state: DC, lastError: "gone", synced: true},
			{do: on(2, synced(failA)), state: DG, lastError: "apps/A: forbidden", synced: true},
		}, []index.ConnectionState{C, OK, DC, DG}},
		{"a first connection that fails", []step{
			{do: connect, state: C},
			{do: on(1, lost("no route to host")), state: DC, lastError: "no route to host"},
			{do: connect, state: DC, lastError: "no route to host"},
			{do: on(2, synced()), state: OK, synced: true},
		}, []index.ConnectionState{C, DC, OK}},
		{"calls from an older connection change nothing", []step{
			{do: connect, state: C},
			{do: connect, state: C},
			{do: on(1, lost("stale probe")), state: C},
			{do: on(1, synced(failA)), state: C},
			{do: on(2, synced()), state: OK, synced: true},
			{do: on(1, lost("stale probe")), state: OK, synced: true},
			{do: on(1, kinds(failA)), state: OK, synced: true},
		}, []index.ConnectionState{C, OK}},
		{"calls from a lost connection change nothing", []step{
			{do: connect, state: C},
			{do: on(1, synced()), state: OK, synced: true},
			{do: on(1, lost("gone")), state: DC, lastError: "gone", synced: true},
			{do: on(1, synced()), state: DC, lastError: "gone", synced: true},
			{do: on(1, kinds(failA)), state: DC, lastError: "gone", synced: true},
		}, []index.ConnectionState{C, OK, DC}},
		{"a connection replacing a live one resyncs as CONNECTING", []step{
			{do: connect, state: C},
			{do: on(1, synced(failA)), state: DG, lastError: "apps/A: forbidden", synced: true},
			{do: connect, state: C, lastError: "apps/A: forbidden", synced: true},
			{do: on(2, synced()), state: OK, synced: true},
		}, []index.ConnectionState{C, DG, C, OK}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			m, rec := newMachine(t)
			var gens []uint64
			for i, s := range tc.steps {
				gens = s.do(ctx, m, gens)
				row, ok := rec.store.GetCluster(nil, "c1")
				if !ok {
					t.Fatalf("step %d: no cluster row", i+1)
				}
				if row.State != s.state || row.LastError != s.lastError || row.Synced != s.synced {
					t.Fatalf("step %d: row %s %q synced=%v, want %s %q synced=%v", i+1, row.State, row.LastError, row.Synced, s.state, s.lastError, s.synced)
				}
				if row.Mode != index.ModePull || row.Labels["env"] != "prod" {
					t.Fatalf("step %d: row lost its mode or labels: %+v", i+1, row)
				}
			}
			if got, want := fmt.Sprint(rec.states()), fmt.Sprint(tc.transitions); got != want {
				t.Errorf("transitions %s, want %s", got, want)
			}
		})
	}
}

// TestTimes runs a connection's life on synctest's fake clock: Since is
// when each state was entered, LastSeen the latest contact, written with
// every other change and on its own at most every SeenEvery.
func TestTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		m, rec := newMachine(t)
		t0 := time.Now()
		row := func() *index.Cluster {
			r, _ := rec.store.GetCluster(nil, "c1")
			return r
		}
		writes := func() int {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return len(rec.rows)
		}

		gen := m.Connect(ctx, false, map[string]string{"kubernetes.version": "v1.35.4"})
		if r := row(); !r.Since.Equal(t0) || !r.LastSeen.IsZero() || r.Metadata["kubernetes.version"] != "v1.35.4" {
			t.Fatalf("after Connect without contact: %+v", r)
		}
		time.Sleep(time.Second)
		m.Report(ctx, gen, Report{Synced: true})
		t1 := time.Now()
		if r := row(); r.State != index.StateConnected || !r.Since.Equal(t1) || !r.LastSeen.Equal(t1) {
			t.Fatalf("after the sync: %+v, want CONNECTED since and seen at %s", r, t1)
		}

		// Contact every second: LastSeen is written every SeenEvery.
		n := writes()
		for range 25 {
			time.Sleep(time.Second)
			m.Seen(ctx, gen)
		}
		if got := writes() - n; got != 2 {
			t.Errorf("%d writes for 25 s of contact once a second, want 2 (every %s)", got, SeenEvery)
		}
		if r := row(); !r.LastSeen.Equal(t1.Add(20*time.Second)) || !r.Since.Equal(t1) {
			t.Errorf("after 25 s of contact: since %s, last seen %s; want since %s, seen %s", r.Since, r.LastSeen, t1, t1.Add(20*time.Second))
		}

		// A loss writes the latest contact at once.
		time.Sleep(time.Second)
		m.Lost(ctx, gen, errors.New("gone"))
		lostAt := time.Now()
		if r := row(); r.State != index.StateDisconnected || !r.Since.Equal(lostAt) || !r.LastSeen.Equal(t1.Add(25*time.Second)) {
			t.Errorf("after the loss: %+v", r)
		}
		// While the outage lasts, failed attempts keep Since; contact
		// at Connect moves LastSeen.
		time.Sleep(5 * time.Second)
		m.Lost(ctx, gen, errors.New("still gone"))
		time.Sleep(5 * time.Second)
		gen = m.Connect(ctx, true, nil)
		back := time.Now()
		if r := row(); r.State != index.StateDisconnected || !r.Since.Equal(lostAt) || !r.LastSeen.Equal(back) || r.LastError != "still gone" {
			t.Errorf("reconnecting: %+v", r)
		}
		m.Report(ctx, gen, Report{Synced: true})
		if r := row(); r.State != index.StateConnected || !r.Since.Equal(back) || r.LastError != "" {
			t.Errorf("reconnected: %+v", r)
		}
	})
}

// TestStaleCallsUnderConcurrency drives cycles of connect, sync and loss
// while other goroutines keep calling with every older generation, as
// probes and sessions that outlive their connection would: the index sees
// exactly one DISCONNECTED and one CONNECTED per cycle.
func TestStaleCallsUnderConcurrency(t *testing.T) {
	const cycles = 200
	ctx := t.Context()
	m, rec := newMachine(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				old := m.Generation() - 1
				m.Seen(ctx, old)
				m.Report(ctx, old, Report{Synced: true, Kinds: []KindStatus{{Kind: "A", Err: "stale"}}})
				m.Lost(ctx, old, errors.New("stale"))
			}
		})
	}
	for range cycles {
		gen := m.Connect(ctx, true, nil)
		m.Report(ctx, gen, Report{Synced: true})
		m.Lost(ctx, gen, errors.New("gone"))
	}
	close(stop)
	wg.Wait()
	count := map[index.ConnectionState]int{}
	for _, s := range rec.states() {
		count[s]++
	}
	if count[index.StateConnected] != cycles || count[index.StateDisconnected] != cycles || count[index.StateDegraded] != 0 || count[index.StateConnecting] != 1 {
		t.Fatalf("%d cycles: transitions %v", cycles, count)
	}
	if r, _ := rec.store.GetCluster(nil, "c1"); r.LastError != "gone" {
		t.Fatalf("last error %q, want the current connection's", r.LastError)
	}
}

// TestSetLabels: new labels are written at once once a row exists, without
// a transition, and kept for the first row when set before it.
func TestSetLabels(t *testing.T) {
	ctx := context.Background()
	m, rec := newMachine(t)
	m.SetLabels(ctx, map[string]string{"env": "staging"})
	if len(rec.rows) != 0 {
		t.Fatalf("labels before the first Connect wrote %d rows", len(rec.rows))
	}
	gen := m.Connect(ctx, true, nil)
	m.Report(ctx, gen, Report{Synced: true})
	row, _ := rec.store.GetCluster(nil, "c1")
	if row.Labels["env"] != "staging" || row.State != index.StateConnected {
		t.Fatalf("row %+v", row)
	}
	n := len(rec.rows)
	m.SetLabels(ctx, map[string]string{"env": "prod", "region": "eu"})
	row, _ = rec.store.GetCluster(nil, "c1")
	if len(rec.rows) != n+1 || row.Labels["region"] != "eu" || row.State != index.StateConnected {
		t.Fatalf("after relabelling: %d rows written (want %d), row %+v", len(rec.rows), n+1, row)
	}
	m.SetLabels(ctx, map[string]string{"env": "prod", "region": "eu"})
	if len(rec.rows) != n+1 {
		t.Error("the same labels again wrote a row")
	}
}

// TestResume: a machine that takes a cluster over from another owner
// continues from the row that owner left. An outage it inherits stays one
// outage (no new DISCONNECTED, Since kept); a live row (a handover) stays
// live, Since kept, while the new owner resyncs; Synced and the metadata
// survive, so the fleet's progress does not count the cluster as
// rebuilding again. A later reconnect is a transition as always.
func TestResume(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		state  index.ConnectionState
		states string // rows written, in order
	}{
		{"inherited outage", index.StateDisconnected, "[DISCONNECTED CONNECTED]"},
		{"live row", index.StateConnected, "[CONNECTED]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{store: index.New(memtables.Open)}
			prev := index.Cluster{
				Name: "c1", Mode: index.ModePull, State: tc.state, Since: since, LastSeen: since,
				LastError: "collector-a stopped", Synced: true, Metadata: map[string]string{"kubernetes.version": "v1.35.4"},
			}
			if err := rec.UpsertCluster(t.Context(), prev); err != nil {
				t.Fatal(err)
			}
			m := New(Config{Name: "c1", Mode: index.ModePull, Sink: rec, Resume: &prev})
			gen := m.Connect(t.Context(), true, nil)
			row, _ := rec.store.GetCluster(nil, "c1")
			if !row.Synced || row.Metadata["kubernetes.version"] != "v1.35.4" {
				t.Fatalf("after Connect: %+v", row)
			}
			if !row.Since.Equal(since) || row.State != tc.state {
				t.Fatalf("a resumed %s row became %s since %s", tc.state, row.State, row.Since)
			}
			m.Report(t.Context(), gen, Report{Synced: true})
			if got := fmt.Sprint(rec.states()); got != tc.states {
				t.Fatalf("rows %s, want %s", got, tc.states)
			}
			m.Connect(t.Context(), true, nil)
			if row, _ := rec.store.GetCluster(nil, "c1"); row.State != index.StateConnecting {
				t.Fatalf("a later connection replacing a live one: %s", row.State)
			}
		})
	}
}
