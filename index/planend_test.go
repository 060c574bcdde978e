package index

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestPlanEndClearsAStoppedScan: a scan its context stops leaves collect's
// heap half filled and unsorted, and collect returns before it hands the
// heap's slots to the plan; end must still clear them, or a pooled plan
// keeps rows alive (review-s12 L3; TestPlanEndKeepsNothing covers a scan
// that finished).
func TestPlanEndClearsAStoppedScan(t *testing.T) {
	s, _ := newTestStore(t)
	const n = 2 * scanChunk // the scan checks its context after each chunk
	rows := make([]Object, n)
	for i := range rows {
		rows[i] = pod("c0", "ns0", fmt.Sprintf("p-%05d", i), StatusHealthy, nil)
	}
	mustNoErr(t, s.UpsertBatch(ctxb, rows))
	ctx, cancel := context.WithCancel(ctxb)
	cancel()
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, err := s.x.compile(s.db, &Filter{Clusters: []string{"c0"}}, &Access{All: true})
	mustNoErr(t, err)
	p.paced(s, ctx)
	// Not the name order, which may walk instead of collecting.
	_, _, _, err = p.collect(p.bestSource(), Order{Field: OrderCreatedAt}, nil, 5)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("collect: %v, want the scan stopped by its context", err)
	}
	heap := p.coll.h.slots[:cap(p.coll.h.slots)]
	kept := 0
	for i := range heap {
		if heap[i].r != nil {
			kept++
		}
	}
	if kept != 6 {
		t.Fatalf("the stopped scan's heap holds %d rows, want 6 (a page of 5 and one more): the test needs a heap left filled", kept)
	}
	p.end()
	for i := range heap {
		if heap[i].r != nil || heap[i].sk.row != nil || heap[i].sk.str != "" {
			t.Errorf("slot %d keeps a row after the plan ended: %+v", i, heap[i])
		}
	}
}
