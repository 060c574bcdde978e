package edge

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/index"
)

// kindID identifies a kind within one cluster.
type kindID struct{ group, kind string }

func idOf(group, kind string) kindID { return kindID{group, kind} }

func (k kindID) compare(o kindID) int {
	return cmp.Or(cmp.Compare(k.group, o.group), cmp.Compare(k.kind, o.kind))
}

// objName identifies an object within one kind.
type objName struct{ namespace, name string }

// kindRows is the edge's last known state of one kind.
type kindRows struct {
	kind index.Kind
	rows map[objName]index.Object
	// synced: a full list arrived, so rows is complete.
	synced bool
	// err is the kind's current error; failing says it came from a
	// failing list (DEGRADED) rather than a kind the cluster does not
	// serve.
	err     string
	failing bool
}

// buffer is the edge's index.RowSink: the collector writes into it, and the
// session sends what it holds to the manager.
//
// It keeps the latest row of every object of the local cluster (what a
// full snapshot is built from, so a reconnect or a periodic resync costs no
// API calls) and the set of keys changed since they were last sent. A key
// changed many times before the session gets to it is sent once, with its
// latest row: the latest state of an object wins. The changed set is
// bounded by maxDirty; past it the set is dropped and a full snapshot is
// scheduled instead, so a slow or absent manager never makes the edge's
// memory grow beyond the rows of its own cluster. While no session is
// connected nothing is tracked at all: every session starts with a full
// snapshot.
//
// Concurrency: the collector's goroutines call the RowSink methods and
// kindFailed; one session goroutine calls the take methods. Everything is
// guarded by mu; wake (capacity 1, never closed) tells the session that
// something changed.
type buffer struct {
	cluster  string
	maxDirty int
	wake     chan struct{}

	mu         sync.Mutex
	kinds      map[kindID]*kindRows
	expected   []kindID // kinds discovery found; nil until the collector started
	connected  bool
	full       bool                // a full snapshot is due
	dirty      dirtySet            // changed rows' keys, by kind
	dirtyKinds map[kindID]struct{} // kinds whose state (not rows) changed
	changes    int                 // row changes since the last full snapshot
	overflowed bool                // the dirty set overflowed since the last full snapshot

	coalesced atomic.Uint64
	overflows atomic.Uint64
}

var _ index.RowSink = (*buffer)(nil)

func newBuffer(cluster string, maxDirty int) *buffer {
	return &buffer{
		cluster: cluster, maxDirty: maxDirty, wake: make(chan struct{}, 1),
		kinds: map[kindID]*kindRows{}, dirty: dirtySet{byKind: map[kindID]map[index.Key]struct{}{}}, dirtyKinds: map[kindID]struct{}{},
	}
}

func (b *buffer) notify() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *buffer) checkCluster(cluster string) error {
	if cluster != b.cluster {
		return fmt.Errorf("%w: a row of cluster %q given to the edge of %q", index.ErrInvalidRow, cluster, b.cluster)
	}
	return nil
}

// kindFor returns the state of a kind, creating it. mu must be held.
func (b *buffer) kindFor(k index.Kind) *kindRows {
	id := idOf(k.Group, k.Kind)
	kr := b.kinds[id]
	if kr == nil {
		kr = &kindRows{kind: k, rows: map[objName]index.Object{}}
		b.kinds[id] = kr
	}
	if kr.kind.Resource == "" && k.Resource != "" {
		kr.kind = k // discovery knows more than a missing-kind report
	}
	return kr
}

// markRow records that a key changed. mu must be held.
func (b *buffer) markRow(k index.Key) {
	b.changes++
	if !b.connected || b.full {
		return // the next full snapshot carries it
	}
	switch b.dirty.add(k, b.maxDirty) {
	case dirtyHad:
		b.coalesced.Add(1)
	case dirtyFull:
		b.full, b.overflowed = true, true
		b.dirty.clear()
		clear(b.dirtyKinds)
		b.overflows.Add(1)
	}
}

// markKind records that a kind's state changed. mu must be held.
func (b *buffer) markKind(id kindID) {
	if b.connected && !b.full {
		b.dirtyKinds[id] = struct{}{}
	}
}

// sameRow reports whether two rows of one object are the same version.
// Rows are a function of the object, so an equal resource version means an
// equal row.
func sameRow(a, b *index.Object) bool {
	return a.ResourceVersion != "" && a.ResourceVersion == b.ResourceVersion && a.UID == b.UID
}

// Replace implements index.RowSink.
func (b *buffer) Replace(_ context.Context, cluster string, kind index.Kind, rows []index.Object) error {
	if err := b.checkCluster(cluster); err != nil {
		return err
	}
	for i := range rows {
		if rows[i].Cluster != cluster || rows[i].Group != kind.Group || rows[i].Kind != kind.Kind {
			return fmt.Errorf("%w: %s: Replace(%s) got a row of another cluster or kind", index.ErrInvalidRow, rows[i].Key(), kind.GroupKind())
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kr := b.kindFor(kind)
	kr.kind = kind
	next := make(map[objName]index.Object, len(rows))
	for i := range rows {
		r := &rows[i]
		n := objName{r.Namespace, r.Name}
		next[n] = *r
		if old, ok := kr.rows[n]; !ok || !sameRow(&old, r) {
			b.markRow(r.Key())
		}
	}
	for n, old := range kr.rows {
		if _, ok := next[n]; !ok {
			b.markRow(old.Key())
		}
	}
	kr.rows = next
	if !kr.synced || kr.err != "" {
		b.markKind(idOf(kind.Group, kind.Kind))
	}
	kr.synced, kr.err, kr.failing = true, "", false
	b.notify()
	return nil
}

// Upsert implements index.RowSink.
func (b *buffer) Upsert(_ context.Context, row index.Object) error {
	if err := b.checkCluster(row.Cluster); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kr := b.kindFor(index.Kind{Group: row.Group, Version: row.Version, Kind: row.Kind, Resource: row.Resource, Namespaced: row.Namespace != ""})
	n := objName{row.Namespace, row.Name}
	if old, ok := kr.rows[n]; ok && sameRow(&old, &row) {
		return nil
	}
	kr.rows[n] = row
	b.markRow(row.Key())
	b.notify()
	return nil
}

// Delete implements index.RowSink.
func (b *buffer) Delete(_ context.Context, key index.Key) error {
	if err := b.checkCluster(key.Cluster); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if kr := b.kinds[idOf(key.Group, key.Kind)]; kr != nil {
		delete(kr.rows, objName{key.Namespace, key.Name})
	}
	b.markRow(key)
	b.notify()
	return nil
}

// ReportKindError implements index.RowSink.
func (b *buffer) ReportKindError(_ context.Context, cluster string, kind index.Kind, kerr error) error {
	if err := b.checkCluster(cluster); err != nil {
		return err
	}
	msg := "unknown error"
	if kerr != nil {
		msg = kerr.Error()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kr := b.kindFor(kind)
	if kr.err != msg {
		kr.err = msg
		b.markKind(idOf(kind.Group, kind.Kind))
		b.notify()
	}
	return nil
}

// onEvent receives the collector's events: a failed list makes its kind
// failing, which degrades the cluster on the manager.
func (b *buffer) onEvent(e collector.Event) {
	if e.Type != collector.KindFailed {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kr := b.kindFor(e.Kind)
	if !kr.failing {
		kr.failing = true
		if kr.err == "" && e.Err != nil {
			kr.err = e.Err.Error()
		}
		b.markKind(idOf(e.Kind.Group, e.Kind.Kind))
		b.notify()
	}
}

// expect records the kinds discovery found: the first snapshot waits until
// each of them has synced or failed.
func (b *buffer) expect(kinds []index.Kind) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expected = make([]kindID, 0, len(kinds))
	for _, k := range kinds {
		b.expected = append(b.expected, idOf(k.Group, k.Kind))
	}
	b.notify()
}

// ready reports whether every expected kind has synced or failed.
func (b *buffer) ready() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.expected == nil {
		return false
	}
	for _, id := range b.expected {
		kr := b.kinds[id]
		if kr == nil || (!kr.synced && kr.err == "") {
			return false
		}
	}
	return true
}

// setConnected starts or stops tracking changes. Either way the next
// session starts with a full snapshot.
func (b *buffer) setConnected(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.connected, b.full = on, true
	b.dirty.clear()
	clear(b.dirtyKinds)
}

// fullDue reports whether a full snapshot was scheduled.
func (b *buffer) fullDue() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.full
}

// fullSnapshot is what takeFull returns.
type fullSnapshot struct {
	kinds      []KindState
	rows       []index.Object
	changes    int
	overflowed bool
}

// takeFull returns every kind that has synced or failed and the rows of
// the synced ones, and clears what was pending: the snapshot carries it.
// Kinds still on their first list are left out; they follow as kind
// snapshots when they sync.
func (b *buffer) takeFull() fullSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := slices.SortedFunc(maps.Keys(b.kinds), kindID.compare)
	n := 0
	for _, kr := range b.kinds {
		if kr.synced {
			n += len(kr.rows)
		}
	}
	// One allocation of the final size: growing by appends copied every
	// row about twice more, under the lock the collector's events wait on.
	out := fullSnapshot{rows: make([]index.Object, 0, n)}
	for _, id := range ids {
		kr := b.kinds[id]
		if !kr.synced && kr.err == "" {
			continue
		}
		out.kinds = append(out.kinds, kr.state())
		if kr.synced {
			for _, r := range kr.rows {
				out.rows = append(out.rows, r)
			}
		}
	}
	out.changes, out.overflowed = b.changes, b.overflowed
	b.full, b.changes, b.overflowed = false, 0, false
	b.dirty.clear()
	clear(b.dirtyKinds)
	return out
}

func (kr *kindRows) state() KindState {
	return KindState{Kind: kr.kind, Synced: kr.synced, Error: kr.err, Failing: kr.failing && kr.err != ""}
}

// kindSnapshot is one kind whose rows must be replaced on the manager.
type kindSnapshot struct {
	state KindState
	rows  []index.Object
}

// takeKinds returns the kinds whose state changed: those that synced
// without an error as kind snapshots (their dirty keys are dropped, the
// snapshot carries them), and those with a new error as kind states for a
// delta.
func (b *buffer) takeKinds() (snaps []kindSnapshot, errs []KindState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.dirtyKinds) == 0 {
		return nil, nil
	}
	ids := slices.SortedFunc(maps.Keys(b.dirtyKinds), kindID.compare)
	clear(b.dirtyKinds)
	for _, id := range ids {
		kr := b.kinds[id]
		if kr.err != "" {
			errs = append(errs, kr.state())
			continue
		}
		if !kr.synced {
			continue
		}
		snap := kindSnapshot{state: kr.state(), rows: make([]index.Object, 0, len(kr.rows))}
		for _, r := range kr.rows {
			snap.rows = append(snap.rows, r)
		}
		b.dirty.dropKind(id)
		snaps = append(snaps, snap)
	}
	return snaps, errs
}

// takeDelta removes up to max changed keys of the kinds only lists (of
// every kind when only is nil) and returns the latest row of each, or its
// key when the object is gone. Keys of other kinds stay changed, for a
// later call, and cost the call nothing: between a snapshot's parts it runs
// on every change the collector reports, and a walk of every changed key
// of every kind (a kind that just relisted has all its rows changed) held
// the lock the collector waits on (review-s7-edge L1). When fits is set,
// it is asked about each key before the key is taken (with its row, or nil
// for a delete); the first key it refuses ends the take and stays changed.
func (b *buffer) takeDelta(limit int, only map[kindID]bool, fits func(index.Key, *index.Object) bool) (upserts []index.Object, deletes []index.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	take := func(id kindID) bool {
		keys := b.dirty.byKind[id]
		kr := b.kinds[id]
		for k := range keys {
			if len(upserts)+len(deletes) >= limit {
				return false
			}
			var row *index.Object
			if kr != nil {
				if r, ok := kr.rows[objName{k.Namespace, k.Name}]; ok {
					row = &r
				}
			}
			if fits != nil && !fits(k, row) {
				return false
			}
			b.dirty.remove(id, k)
			if row != nil {
				upserts = append(upserts, *row)
			} else {
				deletes = append(deletes, k)
			}
		}
		return true
	}
	if only == nil {
		for id := range b.dirty.byKind {
			if !take(id) {
				break
			}
		}
		return upserts, deletes
	}
	for id, ok := range only {
		if ok && !take(id) {
			break
		}
	}
	return upserts, deletes
}

// dirtySet holds the keys changed since they were last sent, by kind, so
// that a take of some kinds' keys never walks another kind's.
type dirtySet struct {
	byKind map[kindID]map[index.Key]struct{}
	n      int // keys in all kinds
}

// What dirtySet.add did.
const (
	dirtyAdded = iota
	dirtyHad   // k was in the set already: the change coalesced
	dirtyFull  // the set holds most keys: k was not added
)

// add adds k unless the set holds it already or holds most keys, with
// one lookup of k's kind and one of k (review-s9-a L9: has, then add,
// looked both up twice).
func (d *dirtySet) add(k index.Key, most int) int {
	id := idOf(k.Group, k.Kind)
	keys := d.byKind[id]
	if _, ok := keys[k]; ok {
		return dirtyHad
	}
	if d.n >= most {
		return dirtyFull
	}
	if keys == nil {
		keys = map[index.Key]struct{}{}
		d.byKind[id] = keys
	}
	keys[k] = struct{}{}
	d.n++
	return dirtyAdded
}

// remove drops k, of kind id. An emptied kind keeps its (empty) set, so a
// kind that changes one key at a time does not allocate a set per change.
func (d *dirtySet) remove(id kindID, k index.Key) {
	keys := d.byKind[id]
	if _, ok := keys[k]; !ok {
		return
	}
	delete(keys, k)
	d.n--
}

// dropKind drops every key of a kind.
func (d *dirtySet) dropKind(id kindID) {
	d.n -= len(d.byKind[id])
	delete(d.byKind, id)
}

func (d *dirtySet) clear() {
	clear(d.byKind)
	d.n = 0
}
