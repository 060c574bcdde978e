package index

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// staticAccess is an AccessFunc for an access that never changes.
func staticAccess(a *Access) AccessFunc { return func() *Access { return a } }

// position returns the sequence number of the last event the fan-out
// routed.
func (f *fanout) position() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pos
}

// collect reads an object stream until it has handed out every change up
// to upTo: until a read times out after the fan-out had routed upTo, so
// that nothing routed to the stream is left in its inbox.
func collect(t *testing.T, s *Store, st *ObjectStream, upTo uint64) []ObjectChange {
	t.Helper()
	var out []ObjectChange
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		routed := s.fan.position() >= upTo
		ctx, cancel := context.WithTimeout(ctxb, 20*time.Millisecond)
		c, err := st.Next(ctx)
		cancel()
		switch {
		case err == nil:
			out = append(out, c)
		case errors.Is(err, context.DeadlineExceeded):
			if routed {
				return out
			}
		default:
			t.Fatalf("Next: %v", err)
		}
	}
	t.Fatalf("stream did not reach %d in time", upTo)
	return nil
}

// nextObjectChange returns the stream's next change, failing the test
// after 5 s.
func nextObjectChange(t *testing.T, st *ObjectStream) ObjectChange {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
	defer cancel()
	c, err := st.Next(ctx)
	mustNoErr(t, err)
	return c
}

// visibleKeys pages through a query and returns the keys it shows and the
// sequence number of its first page.
func visibleKeys(t *testing.T, s *Store, f Filter, a *Access) (map[Key]bool, uint64) {
	t.Helper()
	out := map[Key]bool{}
	var seq uint64
	after := ""
	for page := 0; ; page++ {
		p, err := s.Query(ctxb, Query{Filter: f, Access: a, First: MaxPageSize, After: after})
		mustNoErr(t, err)
		if page == 0 {
			seq = p.Seq
		}
		for _, e := range p.Edges {
			out[e.Object.Key()] = true
		}
		if !p.HasNextPage {
			return out, seq
		}
		after = p.Edges[len(p.Edges)-1].Cursor
	}
}

// TestObjectStreamsAgreeWithQueries opens streams for random filters and
// access sets (named grants in any namespace included) right after a
// query, churns the index, and checks that each stream's changes, applied
// to the query's answer, give exactly what the same query answers at the
// end: no change is lost, invented or delivered twice, whatever routes the
// fan-out chose.
func TestObjectStreamsAgreeWithQueries(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 5))
	s, clk := newTestStore(t)
	for range 300 {
		mustNoErr(t, s.Upsert(ctxb, randomObject(rnd)))
	}
	type watcher struct {
		f     Filter
		a     *Access
		start map[Key]bool
		st    *ObjectStream
	}
	var ws []*watcher
	for range 60 {
		w := &watcher{f: randomFilter(rnd), a: randomAccess(rnd)}
		if rnd.IntN(3) == 0 { // a name in any namespace
			w.a = &Access{Clusters: map[string]*ClusterAccess{"c1": {Named: map[NamedObject]struct{}{
				{GroupResource: podsGR, Name: fmt.Sprintf("obj-%02d", rnd.IntN(40))}: {},
			}}}}
		}
		var seq uint64
		w.start, seq = visibleKeys(t, s, w.f, w.a)
		// Half of the streams have buffers larger than the whole churn, so
		// that only routing decides what they get; the others fill theirs
		// and catch up from the replay buffer.
		buffer := 1 << 20
		if len(ws)%2 == 1 {
			buffer = 1 + rnd.IntN(64)
		}
		st, err := s.ObjectChanges(ObjectChangesRequest{Filter: w.f, After: seq, Access: staticAccess(w.a), Buffer: buffer})
		mustNoErr(t, err)
		t.Cleanup(st.Close)
		w.st = st
		ws = append(ws, w)
		mustNoErr(t, s.Upsert(ctxb, randomObject(rnd))) // streams start at different positions
	}
	for i := range 600 {
		clk.Advance(time.Second)
		switch rnd.IntN(10) {
		case 0:
			objs := drainObjects(t, s)
			if len(objs) > 0 {
				mustNoErr(t, s.Delete(ctxb, objs[rnd.IntN(len(objs))].Key()))
			}
		case 1:
			var rows []Object
			for range 20 {
				if o := randomObject(rnd); o.Cluster == "c2" && o.Kind == "Pod" {
					rows = append(rows, o)
				}
			}
			mustNoErr(t, s.Replace(ctxb, "c2", podKind, rows))
		case 2:
			var batch []Object
			for range 30 {
				batch = append(batch, randomObject(rnd))
			}
			mustNoErr(t, s.UpsertBatch(ctxb, uniqueKeys(batch)))
		default:
			mustNoErr(t, s.Upsert(ctxb, randomObject(rnd)))
		}
		if i == 300 {
			mustNoErr(t, s.RemoveCluster(ctxb, "c0"))
		}
	}
	last := s.LastSeq()
	var wg sync.WaitGroup
	changes := make([][]ObjectChange, len(ws))
	for i, w := range ws {
		wg.Go(func() { changes[i] = collect(t, s, w.st, last) })
	}
	wg.Wait()
	for i, w := range ws {
		got := maps.Clone(w.start)
		var prev uint64
		for _, c := range changes[i] {
			k := c.Object.Key()
			if c.Seq <= prev {
				t.Fatalf("watcher %d: change %d after %d", i, c.Seq, prev)
			}
			prev = c.Seq
			switch c.Type {
			case EventAdded:
				if got[k] {
					t.Fatalf("watcher %d (%+v): ADDED %s, which it already sees", i, w.f, k)
				}
				got[k] = true
			case EventModified:
				if !got[k] {
					t.Fatalf("watcher %d (%+v): MODIFIED %s, which it does not see", i, w.f, k)
				}
			case EventDeleted:
				if !got[k] {
					t.Fatalf("watcher %d (%+v): DELETED %s, which it does not see", i, w.f, k)
				}
				delete(got, k)
			}
		}
		want, _ := visibleKeys(t, s, w.f, w.a)

		if !maps.Equal(got, want) {
			t.Errorf("watcher %d (filter %+v, access %v): changes lead to %d objects, the query shows %d", i, w.f, w.a, len(got), len(want))
		}
	}
}

// uniqueKeys keeps the last row of each key, as a batch must.
func uniqueKeys(rows []Object) []Object {
	last := map[Key]int{}
	for i := range rows {
		last[rows[i].Key()] = i
	}
	var out []Object
	for i := range rows {
		if last[rows[i].Key()] == i {
			out = append(out, rows[i])
		}
	}
	return out
}

// TestObjectStreamFollowsAccess changes what the access function returns
// and reports the change as a policy event: granted objects start
// streaming, revoked ones stop, from the next change on.
func TestObjectStreamFollowsAccess(t *testing.T) {
	s, _ := newTestStore(t)
	var mu sync.Mutex
	acc := &Access{Clusters: map[string]*ClusterAccess{"c1": {Namespaces: map[string]*Resources{"a": NewResources(podsGR)}}}}
	access := func() *Access { mu.Lock(); defer mu.Unlock(); return acc }
	st, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq(), Access: access})
	mustNoErr(t, err)
	defer st.Close()
	next := func() string {
		t.Helper()
		c := nextObjectChange(t, st)
		return c.Type.String() + " " + c.Object.Namespace + "/" + c.Object.Name
	}
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "b", "hidden", StatusHealthy, nil)))
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", "seen", StatusHealthy, nil)))
	if got := next(); got != "ADDED a/seen" {
		t.Fatalf("got %s", got)
	}
	// Grant namespace b. The policy row is what makes the index publish
	// the policy event the stream re-reads its access on.
	mu.Lock()
	acc = &Access{Clusters: map[string]*ClusterAccess{"c1": {Namespaces: map[string]*Resources{"a": NewResources(podsGR), "b": NewResources(podsGR)}}}}
	mu.Unlock()
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRole, "", "grant", nil)))
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "b", "granted", StatusHealthy, nil)))
	if got := next(); got != "ADDED b/granted" {
		t.Fatalf("after the grant got %s", got)
	}
	// Revoke everything.
	mu.Lock()
	acc = &Access{}
	mu.Unlock()
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRole, "", "revoke", nil)))
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", "revoked", StatusHealthy, nil)))
	mustNoErr(t, s.Upsert(ctxb, pod("c1", "b", "revoked", StatusHealthy, nil)))
	ctx, cancel := context.WithTimeout(ctxb, 100*time.Millisecond)
	defer cancel()
	if c, err := st.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the revocation got %+v, %v", c, err)
	}
}

// TestStreamSlowReaders checks the slow-reader policy: a burst larger than
// the buffer is caught up from the replay buffer, in order; a reader that
// falls out of the replay buffer ends with ErrSlowConsumer and its missed
// events are counted; a start position the buffer no longer holds fails
// with ErrResyncRequired. The writer never waits for any of them.
func TestStreamSlowReaders(t *testing.T) {
	s, _ := newTestStore(t, WithReplayBuffer(256))
	all := staticAccess(&Access{All: true})
	burst, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq(), Access: all, Buffer: 4})
	mustNoErr(t, err)
	defer burst.Close()
	for i := range 100 {
		mustNoErr(t, s.Upsert(ctxb, pod("c1", "a", fmt.Sprintf("p%03d", i), StatusHealthy, nil)))
	}
	for i := range 100 {
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		c, err := burst.Next(ctx)
		cancel()
		mustNoErr(t, err)
		if want := fmt.Sprintf("p%03d", i); c.Object.Name != want {
			t.Fatalf("change %d is %s, want %s", i, c.Object.Name, want)
		}
	}
	if n := s.StreamStats().CatchUps[StreamObjects]; n == 0 {
		t.Error("the burst was not caught up from the replay buffer")
	}

	slow, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq(), Access: all, Buffer: 4})
	mustNoErr(t, err)
	defer slow.Close()
	// Commits of 50, each routed before the next, so that the fan-out
	// (which is not the subject) keeps up on a loaded machine too.
	for i := range 20 {
		var rows []Object
		for j := range 50 {
			rows = append(rows, pod("c1", "b", fmt.Sprintf("p%03d", i*50+j), StatusHealthy, nil))
		}
		mustNoErr(t, s.UpsertBatch(ctxb, rows))
		for s.fan.position() < s.LastSeq() {
			time.Sleep(time.Millisecond)
		}
	}
	var endErr error
	for range 1001 {
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		_, endErr = slow.Next(ctx)
		cancel()
		if endErr != nil {
			break
		}
	}
	if !errors.Is(endErr, ErrSlowConsumer) {
		t.Fatalf("a reader 1000 events behind a buffer of 256 ended with %v", endErr)
	}
	if n := s.StreamStats().Dropped[StreamObjects]; n == 0 {
		t.Error("no dropped events counted")
	}

	if _, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq() + 1, Access: all}); !errors.Is(err, ErrInvalidQuery) {
		t.Errorf("a position ahead of the feed: %v", err)
	}
	old, err := s.ObjectChanges(ObjectChangesRequest{After: 1, Access: all})
	mustNoErr(t, err)
	defer old.Close()
	if _, err := old.Next(ctxb); !errors.Is(err, ErrResyncRequired) || errors.Is(err, ErrSlowConsumer) {
		t.Errorf("a start position the buffer no longer holds: %v", err)
	}
}

// TestStreamEndAndIdle checks that End makes a waiting Next return at once,
// and that the fan-out goroutine stops with the last stream (goleak checks
// that nothing is left at the end of the package).
func TestStreamEndAndIdle(t *testing.T) {
	s, _ := newTestStore(t)
	st, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq(), Access: staticAccess(&Access{All: true})})
	mustNoErr(t, err)
	stop := errors.New("stop")
	done := make(chan error)
	go func() {
		_, err := st.Next(ctxb)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	st.End(stop)
	select {
	case err := <-done:
		if !errors.Is(err, stop) {
			t.Fatalf("Next returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("End did not wake Next")
	}
	st.Close()
	s.fan.mu.Lock()
	running := s.fan.running
	s.fan.mu.Unlock()
	if running || s.StreamStats().Streams != 0 {
		t.Error("the fan-out still runs without streams")
	}
}

// TestClusterAndFleetStreams checks the connection transitions a viewer is
// told about (state changes and new clusters of the clusters it sees, as
// of each event) and the fleet status levels.
func TestClusterAndFleetStreams(t *testing.T) {
	s, clk := newTestStore(t)
	var mu sync.Mutex
	acc := &Access{Clusters: map[string]*ClusterAccess{"c1": {All: true}}}
	access := func() *Access { mu.Lock(); defer mu.Unlock(); return acc }
	cs, err := s.ClusterChanges(ClusterChangesRequest{Access: access})
	mustNoErr(t, err)
	defer cs.Close()
	only2, err := s.ClusterChanges(ClusterChangesRequest{Clusters: []string{"c2"}, Access: staticAccess(&Access{All: true})})
	mustNoErr(t, err)
	defer only2.Close()
	fs, err := s.FleetChanges(FleetChangesRequest{Access: access})
	mustNoErr(t, err)
	defer fs.Close()
	nextFleet := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		defer cancel()
		f, err := fs.Next(ctx)
		mustNoErr(t, err)
		return f.Message
	}
	if m := nextFleet(); m != "No clusters" {
		t.Fatalf("first status %q", m)
	}
	set := func(name string, st ConnectionState, synced bool) {
		clk.Advance(time.Second)
		mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: name, State: st, Synced: synced, Since: clk.Now(), LastSeen: clk.Now()}))
	}
	set("c1", "", false)               // new, not probed yet
	set("c1", StateConnecting, false)  // the same state: no transition
	set("c2", StateConnected, true)    // not c1's viewer's
	set("c1", StateConnected, true)    // transition
	set("c1", StateConnected, true)    // lastSeen only
	set("c2", StateDisconnected, true) // transition, not visible to the first stream
	var got []string
	for range 2 {
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		c, err := cs.Next(ctx)
		cancel()
		mustNoErr(t, err)
		prev := "<nil>"
		if c.Previous != nil {
			prev = string(c.Previous.ConnectionState())
		}
		got = append(got, c.Cluster.Name+" "+prev+"->"+string(c.Cluster.ConnectionState()))
	}
	if want := []string{"c1 <nil>->CONNECTING", "c1 CONNECTING->CONNECTED"}; !slices.Equal(got, want) {
		t.Errorf("transitions %v, want %v", got, want)
	}
	for _, want := range []ConnectionState{StateConnected, StateDisconnected} {
		ctx, cancel := context.WithTimeout(ctxb, 5*time.Second)
		c, err := only2.Next(ctx)
		cancel()
		mustNoErr(t, err)
		if c.Cluster.Name != "c2" || c.Cluster.State != want {
			t.Errorf("c2's stream got %s %s, want %s", c.Cluster.Name, c.Cluster.State, want)
		}
	}
	// The fleet stream coalesces: the latest level, only c1 counted.
	if m := nextFleet(); m != "All 1 clusters synced" {
		t.Errorf("fleet status %q", m)
	}
	mu.Lock()
	acc = &Access{All: true}
	mu.Unlock()
	mustNoErr(t, s.Upsert(ctxb, policyRow(KindClusterRole, "", "grant", nil))) // a policy event wakes the fleet stream
	if m := nextFleet(); m != "All 2 clusters synced (1 disconnected, showing last known state)" {
		t.Errorf("fleet status after the grant %q", m)
	}
}

// TestObjectStreamStaleness: each change carries its cluster's staleness
// as of the change's delivery, however often the cluster's row changes
// between changes (the stream keeps the rows it read until they change).
func TestObjectStreamStaleness(t *testing.T) {
	s, clk := newTestStore(t)
	st, err := s.ObjectChanges(ObjectChangesRequest{After: s.LastSeq(), Access: staticAccess(&Access{All: true})})
	mustNoErr(t, err)
	defer st.Close()
	for i, state := range []ConnectionState{StateConnected, StateDisconnected, StateDisconnected, StateDegraded, StateConnecting, StateConnected} {
		mustNoErr(t, s.UpsertCluster(ctxb, Cluster{Name: "c1", Mode: ModePull, State: state, Since: clk.Now().Add(time.Duration(i) * time.Second)}))
		mustNoErr(t, s.Upsert(ctxb, pod("c1", "ns", fmt.Sprintf("p%d", i), StatusHealthy, nil)))
		mustNoErr(t, s.Upsert(ctxb, pod("c2", "ns", fmt.Sprintf("p%d", i), StatusHealthy, nil))) // c2 has no row
		want := Cluster{State: state}
		if c := nextObjectChange(t, st); c.Object.Cluster != "c1" || c.Stale != want.Stale() {
			t.Fatalf("change %d in c1 (%s): stale %v, want %v", i, state, c.Stale, want.Stale())
		}
		if c := nextObjectChange(t, st); c.Object.Cluster != "c2" || c.Stale {
			t.Fatalf("change %d in c2, which has no row: stale %v", i, c.Stale)
		}
	}
}
