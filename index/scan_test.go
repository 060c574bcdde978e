package index

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

// scanFleet holds 3 walk chunks of pods in c0 and, last in name order, five
// pods named zz-N; every pod has app=a.
func scanFleet(t *testing.T) *Store {
	t.Helper()
	s, _ := newTestStore(t)
	var rows []Object
	for i := range 3 * walkChunk {
		rows = append(rows, pod("c0", fmt.Sprintf("ns%d", i%10), fmt.Sprintf("p-%05d", i), StatusHealthy, map[string]string{"app": "a"}))
	}
	for i := range 5 {
		rows = append(rows, pod("c0", "ns0", fmt.Sprintf("zz-%d", i), StatusHealthy, map[string]string{"app": "a"}))
	}
	mustNoErr(t, s.Replace(ctxb, "c0", podKind, rows))
	return s
}

// writerWaits makes s's long reads see a writer waiting for the lock
// until the test ends (reads pause only for one).
func writerWaits(t *testing.T, s *Store) {
	s.writersWaiting.Add(1)
	t.Cleanup(func() { s.writersWaiting.Add(-1) })
}

// TestLongReadsPause checks that a read of more rows than a chunk
// releases the read lock between chunks while a writer waits (a writer commits in the pause,
// which the test hook runs without the lock: it would deadlock otherwise),
// that rows and ids written in a pause do not break the read, and that a
// read whose context ends in a pause stops with the context's error.
func TestLongReadsPause(t *testing.T) {
	all := &Access{All: true}
	newKind := Kind{Group: "example.com", Version: "v1", Kind: "Widget", Resource: "widgets", Namespaced: true}

	t.Run("facets", func(t *testing.T) {
		s := scanFleet(t)
		writerWaits(t, s)
		pauses := 0
		s.pauseHook = func() {
			if pauses++; pauses == 1 {
				// New cluster, namespace and kind ids, and a row of the
				// last chunk deleted before it is read.
				w := pod("c-new", "ns-new", "w", StatusHealthy, map[string]string{"app": "a"})
				w.Group, w.Kind, w.Resource = newKind.Group, newKind.Kind, newKind.Resource
				mustNoErr(t, s.Upsert(ctxb, w))
				mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c0", Kind: "Pod", Namespace: "ns0", Name: "zz-4"}))
			}
		}
		// nameContains makes the facets scan every row.
		f, err := s.Facets(ctxb, Filter{NameContains: "-"}, all)
		mustNoErr(t, err)
		if pauses < 2 {
			t.Fatalf("the read paused %d times; want one per chunk after the first", pauses)
		}
		// The new row came after the candidates were listed; the deleted
		// one was skipped.
		if want := 3*walkChunk + 4; f.Total != want {
			t.Errorf("total %d, want %d", f.Total, want)
		}
		if len(f.Clusters) != 1 || f.Clusters[0] != (FacetCount{Value: "c0", Count: f.Total}) {
			t.Errorf("clusters %+v", f.Clusters)
		}
	})

	t.Run("walk", func(t *testing.T) {
		s := scanFleet(t)
		writerWaits(t, s)
		pauses := 0
		s.pauseHook = func() {
			if pauses++; pauses == 1 {
				mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns1", "zz-new", StatusHealthy, nil)))
				mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c0", Kind: "Pod", Namespace: "ns0", Name: "zz-0"}))
			}
		}
		// Only the last names match: the name-order walk visits every row.
		page, err := s.Query(ctxb, Query{Filter: Filter{NameContains: "zz-"}, Access: all, First: 10})
		mustNoErr(t, err)
		if pauses < 2 {
			t.Fatalf("the read paused %d times; want several", pauses)
		}
		var names []string
		for _, e := range page.Edges {
			names = append(names, e.Object.Name)
		}
		// The walk reads each row as its chunk finds it: the first pause
		// comes long before the zz rows, so the row written in it is seen
		// and the row deleted in it is not.
		if want := []string{"zz-1", "zz-2", "zz-3", "zz-4", "zz-new"}; !slices.Equal(names, want) || page.TotalCount != len(want) {
			t.Errorf("page %v (total %d), want %v", names, page.TotalCount, want)
		}
	})

	t.Run("collect", func(t *testing.T) {
		s := scanFleet(t)
		writerWaits(t, s)
		pauses := 0
		s.pauseHook = func() { pauses++ }
		// Ordered by creation time: no walk, a scan of every row.
		page, err := s.Query(ctxb, Query{Filter: Filter{NameContains: "zz-"}, Access: all, Order: Order{Field: OrderCreatedAt}})
		mustNoErr(t, err)
		if pauses < 2 || page.TotalCount != 5 || len(page.Edges) != 5 {
			t.Errorf("%d pauses, total %d, %d edges; want pauses, 5 and 5", pauses, page.TotalCount, len(page.Edges))
		}
	})

	t.Run("context ends", func(t *testing.T) {
		s := scanFleet(t)
		writerWaits(t, s)
		for name, read := range map[string]func(context.Context) error{
			"facets": func(ctx context.Context) error {
				_, err := s.Facets(ctx, Filter{NameContains: "-"}, all)
				return err
			},
			"walk": func(ctx context.Context) error {
				_, err := s.Query(ctx, Query{Filter: Filter{NameContains: "zz-"}, Access: all})
				return err
			},
			"collect": func(ctx context.Context) error {
				_, err := s.Query(ctx, Query{Filter: Filter{NameContains: "zz-"}, Access: all, Order: Order{Field: OrderUpdatedAt}})
				return err
			},
		} {
			ctx, cancel := context.WithCancel(ctxb)
			pauses := 0
			s.pauseHook = func() { pauses++; cancel() }
			if err := read(ctx); !errors.Is(err, context.Canceled) || pauses != 1 {
				t.Errorf("%s: %v after %d pauses; want context.Canceled after the first", name, err, pauses)
			}
			cancel()
		}
	})
}

// TestLongReadsPauseOnlyForWriters checks that a long read keeps the lock
// when no writer waits (a pause would let nobody in, and an exact source
// would lose its exactness: every row checked again), and that a writer
// blocked on the lock is counted as waiting until it has the lock.
func TestLongReadsPauseOnlyForWriters(t *testing.T) {
	all := &Access{All: true}
	s := scanFleet(t)
	pauses := 0
	s.pauseHook = func() { pauses++ }
	for name, read := range map[string]func() error{
		"facets": func() error { _, err := s.Facets(ctxb, Filter{NameContains: "-"}, all); return err },
		"walk": func() error {
			_, err := s.Query(ctxb, Query{Filter: Filter{NameContains: "zz-"}, Access: all, First: 10})
			return err
		},
		"collect": func() error {
			_, err := s.Query(ctxb, Query{Filter: Filter{NameContains: "zz-"}, Access: all, Order: Order{Field: OrderCreatedAt}})
			return err
		},
	} {
		mustNoErr(t, read())
		if pauses != 0 {
			t.Errorf("%s paused %d times with no writer waiting", name, pauses)
		}
	}

	s.mu.RLock() // a read in progress
	done := make(chan error, 1)
	go func() { done <- s.Upsert(ctxb, pod("c0", "ns0", "late", StatusHealthy, nil)) }()
	for deadline := time.Now().Add(10 * time.Second); s.writersWaiting.Load() != 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			s.mu.RUnlock()
			t.Fatalf("a writer blocked on the lock is not counted as waiting")
		}
	}
	s.mu.RUnlock()
	mustNoErr(t, <-done)
	if n := s.writersWaiting.Load(); n != 0 {
		t.Errorf("%d writers waiting after the write", n)
	}
}
