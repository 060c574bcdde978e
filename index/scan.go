package index

import (
	"context"
	"fmt"
)

// Long reads work in bounded chunks. A read holding the store's read lock
// for a whole scan (a label selector over every row of a 1M-object fleet
// takes seconds) makes every writer wait for it, and every reader that
// arrives after a waiting writer wait for both: one viewer's query stalled
// everyone's. So a scan of more than scanChunk rows checks, after every
// scanChunk rows, whether a writer waits or the query's context has
// ended; if so it copies the candidate row ids left (a few milliseconds
// at 1M rows), then visits them scanChunk at a time and, between chunks,
// releases the read lock (a waiting writer commits, waiting readers run),
// stops if the context has ended, and takes the lock again. A name-order
// walk pauses the same way and resumes after the last row it visited.
// Without a waiting writer a read keeps the lock (see pacer.due).
//
// What a long read returns is therefore not one snapshot: each row is
// read as it was when its chunk ran, a row written during the read may or
// may not be seen, and Seq is the position when the read began (resuming a
// subscription from it may deliver changes the answer already shows).
// Rows are immutable values, so a row kept across a pause stays
// consistent; the plan's dictionary ids stay valid because an id is not
// reused while a paused read that began before it was retired is in
// flight (see recycler; rows of kinds, namespaces or label values
// interned during the read do not match it).

// scanChunk is how many rows a scan visits per hold of the read lock:
// about 1.5 ms for the costliest filter the graph's limits allow (64
// selector terms), a few microseconds for an exact source. A walk visits
// walkChunk rows per hold: resuming re-seeks every run of the name order.
const (
	scanChunk = 1024
	walkChunk = 4 * scanChunk
)

// pacer releases the read lock of a long read between chunks.
type pacer struct {
	s   *Store
	ctx context.Context
	// paused is set after the first pause: row ids read before may now
	// hold other rows, so exact sources must be checked again.
	paused bool
	// epoch is the dictionary epoch the read began in, registered in
	// Store.pausedReads from its first pause until done: the dictionary
	// ids it looked up stay unused until then (see recycler).
	epoch uint64
}

// newPacer returns the pacer of one read, which holds s.mu.RLock; the
// read calls done when it ends.
func (s *Store) newPacer(ctx context.Context) pacer {
	return pacer{s: s, ctx: ctx, epoch: s.dictEpoch}
}

// done ends the read: the ids it holds may be reused.
func (pc *pacer) done() {
	if !pc.paused {
		return
	}
	s := pc.s
	s.pausedMu.Lock()
	if s.pausedReads[pc.epoch]--; s.pausedReads[pc.epoch] == 0 {
		delete(s.pausedReads, pc.epoch)
	}
	s.pausedMu.Unlock()
}

// due reports whether the read should pause: a writer waits for the lock
// (readers arriving after it wait for it too) or the context has ended.
// Without a waiting writer the read keeps the lock: releasing it lets
// nobody in, and a read that never paused still reads one snapshot, so an
// exact source needs no row check (with a pause per chunk, a 14k-row
// label page at 1M objects checked every row and took 4 to 25 times as
// long).
func (pc *pacer) due() bool {
	return pc.s.writersWaiting.Load() > 0 || pc.ctx.Err() != nil
}

// pause, when due, lets writers and other readers in, then resumes the
// read unless its context has ended. It returns with the read lock held
// either way.
func (pc *pacer) pause() error {
	if !pc.due() {
		return nil
	}
	if !pc.paused {
		s := pc.s
		s.pausedMu.Lock()
		if s.pausedReads == nil {
			s.pausedReads = map[uint64]int{}
		}
		s.pausedReads[pc.epoch]++
		s.pausedMu.Unlock()
	}
	pc.s.mu.RUnlock()
	if pc.s.pauseHook != nil {
		pc.s.pauseHook()
	}
	err := pc.ctx.Err()
	pc.s.mu.RLock()
	pc.paused = true
	if err != nil {
		return fmt.Errorf("index: read stopped: %w", err)
	}
	return nil
}

// visitor is what a scan calls for each row id, with whether the row is
// known to match. It is an interface, not a func, so that a visitor kept
// in the plan (the collector) costs no allocation to pass: a func value
// escapes through the sources' func values, and a method value is a
// closure.
type visitor interface {
	visit(rid uint32, exact bool) bool
}

// visitFunc is a func as a visitor.
type visitFunc func(rid uint32, exact bool) bool

func (f visitFunc) visit(rid uint32, exact bool) bool { return f(rid, exact) }

// scan calls v.visit for each row id of src until it returns false; exact
// says whether the row is known to match the plan without a check. A source of
// more than scanChunk rows is visited in chunks (see pacer): the scan
// reads the source itself until a pause is due at a chunk's end, then
// lists the ids left and visits them a chunk at a time, pausing before
// each when due. The error is the context's when the read stopped early.
func (p *plan) scan(src source, v visitor) error {
	pc := p.pace
	paused := pc != nil && pc.paused
	exact, butKinds := src.exact && !paused, src.butKinds && !paused
	if pc == nil || src.est <= scanChunk {
		if kids := src.nsKids(); kids != nil && p.kids != nil && !exact {
			// A namespace's rows, with their kind ids beside them.
			i := 0
			src.list.each(func(rid uint32) bool {
				kid := kids[i]
				i++
				if !p.wantsKind(kid) {
					return true
				}
				return v.visit(rid, butKinds)
			})
			return nil
		}
		if src.list != nil { // no closure escapes: a small page allocates none here
			src.list.each(func(rid uint32) bool { return p.visitRow(v, rid, exact, butKinds) })
			return nil
		}
		src.each(func(rid uint32) bool { return p.visitRow(v, rid, exact, butKinds) })
		return nil
	}
	var rest []uint32
	visited, stopped := 0, false
	src.eachID(func(rid uint32) bool {
		switch {
		case rest != nil:
			rest = append(rest, rid)
		case visited > 0 && visited%scanChunk == 0 && pc.due():
			rest = append(make([]uint32, 0, max(src.est-visited, 1)), rid)
		default:
			visited++
			stopped = !p.visitRow(v, rid, exact, butKinds)
		}
		return !stopped
	})
	for start := 0; start < len(rest); start += scanChunk {
		if err := pc.pause(); err != nil {
			return err
		}
		exact, butKinds := src.exact && !pc.paused, src.butKinds && !pc.paused
		for _, rid := range rest[start:min(start+scanChunk, len(rest))] {
			if p.x.rows[rid] == nil { // deleted during a pause
				continue
			}
			if !p.visitRow(v, rid, exact, butKinds) {
				return nil
			}
		}
	}
	return nil
}

// visitRow calls v.visit for row id rid of a source, unless the plan's
// kinds filter rejects the row's kind id: a row of another kind is
// passed over without being loaded (a cache miss or two). A row of a
// butKinds source whose kind passes is known to match.
func (p *plan) visitRow(v visitor, rid uint32, exact, butKinds bool) bool {
	if exact || p.kids == nil {
		return v.visit(rid, exact)
	}
	if !p.wantsKind(p.x.kidOf[rid]) {
		return true
	}
	return v.visit(rid, butKinds)
}

// wantsKind reports whether the page's kinds filter (p.kids, set) takes
// rows of kind id kid.
func (p *plan) wantsKind(kid uint32) bool { return int(kid) < len(p.kids) && p.kids[kid] }
