package collector

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"

	"github.com/fleetgraph/fleetgraph/index"
)

// rowStore is the reflector's store: it normalizes each object into a row
// and writes it straight into the sink. It keeps nothing, so full objects
// live only while one is being decoded and normalized.
//
// It is also a cache.TransformingStore. A reflector using WatchList (the
// default since client-go 0.35) collects a full listing in a temporary
// store before calling Replace, and passes each object through the
// transformer first: the temporary store then holds rows, not the decoded
// objects. Measured with fleetbench fleet (50 simulated clusters of 5,560
// objects syncing at once), holding the decoded objects took the
// collector's RSS past 2.5 GiB, and its garbage collector kept the process
// so busy that HTTP/2 pings went unanswered and connections were dropped.
//
// Its writes come from two goroutines: the reflector's (Add, Update,
// Delete, Replace) and the kind's anti-entropy relist (reconcile). mu
// serializes them, so that a relist's Replace and the watch's writes
// reach the sink in one order.
type rowStore struct {
	ctx     context.Context
	run     *Run
	adapter *Adapter
	kind    index.Kind

	mu sync.Mutex
	// synced is set by the reflector's first Replace: a relist before it
	// would race the first listing.
	synced bool
	// lists counts the reflector's Replaces: a relist that saw one land
	// while it listed is older than it, and is dropped.
	lists uint64
	// failing is set when the reflector's list and watch failed and the
	// kind's error was reported, until the reflector's next Replace. A
	// relist does not replace meanwhile: the sink's Replace (and the
	// KindSynced it reports) would clear the error the reflector still
	// has, and show the kind healthy until the reflector's next retry
	// (a kind that may be listed but not watched, for one).
	failing bool
	// recent, while a relist is in flight, holds what the watch wrote
	// since it started, by key.
	recent map[index.Key]watchWord
	// floor is the resource version of the last relist's listing, once
	// applied: what the watch delivers at or below it is older than (or
	// the same as) what the listing applied, and is dropped. The watch
	// can lag behind a listing (a busy manager, a slow stream); without
	// the floor it would replay older states over the newer listing:
	// subscribers would see c, b, c, and a subject removed from a
	// RoleBinding would be granted again for a moment. Zero means no
	// floor: before any relist, after the reflector's own Replace (its
	// watch starts from its own listing), or when resource versions are
	// not numbers.
	floor uint64
}

// watchWord is what the watch last wrote for a key while a relist listed:
// the row, or nil for a delete, and the object's resource version (zero
// when it is not a number).
type watchWord struct {
	row *index.Object
	rv  uint64
}

// parseRV reads a resource version as etcd writes them, a uint64 that
// grows with every write of the cluster; zero means it is not one (other
// API servers may use opaque strings), and then nothing is compared.
func parseRV(rv string) uint64 {
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// belowFloor reports whether the watch's write at rv is older than the
// last relist's listing, which is already applied.
func (s *rowStore) belowFloor(rv uint64) bool {
	return s.floor != 0 && rv != 0 && rv <= s.floor
}

var _ cache.TransformingStore = (*rowStore)(nil)

// normalizedObject is an object already turned into its row by the
// transformer; keep is false for objects the namespace filter drops.
type normalizedObject struct {
	row  index.Object
	keep bool
}

// Transformer normalizes objects as the reflector's temporary store
// receives them.
func (s *rowStore) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, ok := obj.(*normalizedObject); ok {
			return obj, nil
		}
		row, keep, err := s.row(obj)
		if err != nil {
			return nil, err
		}
		return &normalizedObject{row: row, keep: keep}, nil
	}
}

func (s *rowStore) Add(obj any) error    { return s.upsert(obj) }
func (s *rowStore) Update(obj any) error { return s.upsert(obj) }
func (s *rowStore) Resync() error        { return nil }

func (s *rowStore) upsert(obj any) error {
	row, ok, err := s.row(obj)
	if err != nil || !ok {
		return err
	}
	rv := parseRV(row.ResourceVersion)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.belowFloor(rv) {
		return nil
	}
	if s.recent != nil {
		s.recent[row.Key()] = watchWord{row: &row, rv: rv}
	}
	return s.run.cfg.Sink.Upsert(s.ctx, row)
}

func (s *rowStore) Delete(obj any) error {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	acc, err := meta.Accessor(obj)
	if err != nil {
		return fmt.Errorf("delete %s: %w", s.kind.GroupKind(), err)
	}
	key := index.Key{
		Cluster: s.run.cfg.Cluster, Group: s.kind.Group, Kind: s.kind.Kind,
		Namespace: acc.GetNamespace(), Name: acc.GetName(),
	}
	rv := parseRV(acc.GetResourceVersion())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.belowFloor(rv) {
		return nil
	}
	if s.recent != nil {
		s.recent[key] = watchWord{rv: rv}
	}
	return s.run.cfg.Sink.Delete(s.ctx, key)
}

// Replace is the reflector's full list: it replaces every row of the kind.
func (s *rowStore) Replace(list []any, _ string) error {
	rows := make([]index.Object, 0, len(list))
	for _, obj := range list {
		row, ok, err := s.row(obj)
		if err != nil {
			return err
		}
		if ok {
			rows = append(rows, row)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = true
	s.lists++
	s.recent = nil
	s.floor = 0
	s.failing = false
	return s.replace(rows)
}

// replace replaces every row of the kind with rows. mu must be held.
func (s *rowStore) replace(rows []index.Object) error {
	if err := s.run.cfg.Sink.Replace(s.ctx, s.run.cfg.Cluster, s.kind, rows); err != nil {
		return err
	}
	s.run.cfg.OnEvent(Event{Type: KindSynced, Kind: s.kind})
	return nil
}

// reconcile is the anti-entropy relist: it lists the kind (a consistent
// read, a page at a time, at one resource version L) while the watch keeps
// writing, then replaces the kind's rows with the listing, so that a change
// the watch missed is repaired. Resource versions order the listing and
// the watch's writes, key by key:
//   - where the watch wrote while the kind listed, the newer word stands:
//     the watch's (its row, or no row where it deleted) if it is newer
//     than L, the listing's otherwise;
//   - after the Replace, the watch drops what it delivers at or below L
//     (see floor): a lagging watch cannot replay states older than the
//     listing's.
//
// When resource versions are not numbers (nothing to compare), the
// watch's word always stands over the listing's and nothing is dropped: a
// lagging watch can then replay older states for a moment after a relist,
// and its last event for each key still leaves the row right.
//
// The watch waits only while the sink replaces, not while the kind lists.
// It does nothing before the reflector's first listing or while the kind is
// failing, and drops its listing when the reflector listed again meanwhile
// (that one is newer) or the kind failed meanwhile.
func (s *rowStore) reconcile(ctx context.Context, lw cache.ListerWatcher) error {
	s.mu.Lock()
	if !s.synced || s.failing {
		s.mu.Unlock()
		return nil
	}
	lists := s.lists
	s.recent = map[index.Key]watchWord{}
	s.mu.Unlock()

	rows, rv, err := s.list(ctx, lw)

	s.mu.Lock()
	defer s.mu.Unlock()
	recent := s.recent
	s.recent = nil
	if err != nil {
		return fmt.Errorf("relist %s: %w", s.kind.GroupKind(), err)
	}
	if s.lists != lists || s.failing {
		return nil
	}
	listed := parseRV(rv)
	if err := s.replace(withRecent(rows, recent, listed)); err != nil {
		return err
	}
	s.floor = listed
	return nil
}

// failed reports that the reflector's list and watch of the kind failed:
// the kind's error goes to the sink and a KindFailed to the owner, and
// relists stop replacing until the reflector's next Replace clears it.
func (s *rowStore) failed(err error) {
	s.mu.Lock()
	s.failing = true
	s.mu.Unlock()
	cfg := s.run.cfg
	if rerr := cfg.Sink.ReportKindError(s.ctx, cfg.Cluster, s.kind, describeListError(s.kind, err)); rerr != nil && s.ctx.Err() == nil {
		cfg.Logger.Error("reporting kind error failed", "cluster", cfg.Cluster, "kind", s.kind.GroupKind(), "err", rerr)
	}
	cfg.OnEvent(Event{Type: KindFailed, Kind: s.kind, Err: err})
}

// list lists every row of the kind through the pager (pages of 500), and
// returns the listing's resource version (its first page's: the pager
// reads every page at it).
func (s *rowStore) list(ctx context.Context, lw cache.ListerWatcher) ([]index.Object, string, error) {
	lwc := cache.ToListerWatcherWithContext(lw)
	var rv string
	p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
		page, err := lwc.ListWithContext(ctx, opts)
		if err == nil && opts.Continue == "" {
			if l, lerr := meta.ListAccessor(page); lerr == nil {
				rv = l.GetResourceVersion()
			}
		}
		return page, err
	}))
	var rows []index.Object
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		row, ok, err := s.row(obj)
		if ok {
			rows = append(rows, row)
		}
		return err
	})
	return rows, rv, err
}

// withRecent returns a listing taken at resource version listed with the
// watch's word in place of the listing's on every key in recent where the
// watch's word is the newer one (or the two cannot be compared): the
// watch's row instead of the listed one (added if the listing lacks it),
// and no row where the watch deleted. Where the watch wrote at or below
// listed, the listing already holds that write or a later one.
func withRecent(rows []index.Object, recent map[index.Key]watchWord, listed uint64) []index.Object {
	if len(recent) == 0 {
		return rows
	}
	listingIsNewer := func(w watchWord) bool { return listed != 0 && w.rv != 0 && w.rv <= listed }
	out := rows[:0]
	for _, row := range rows {
		k := row.Key()
		w, ok := recent[k]
		switch {
		case !ok || listingIsNewer(w):
			out = append(out, row)
		case w.row != nil:
			out = append(out, *w.row)
		}
		delete(recent, k)
	}
	for _, w := range recent {
		if w.row != nil && !listingIsNewer(w) {
			out = append(out, *w.row)
		}
	}
	return out
}

// row normalizes an object. It returns false for objects the namespace
// filter drops.
func (s *rowStore) row(obj any) (index.Object, bool, error) {
	if n, ok := obj.(*normalizedObject); ok {
		return n.row, n.keep, nil
	}
	ro, ok := obj.(runtime.Object)
	if !ok {
		return index.Object{}, false, fmt.Errorf("%s: unexpected %T", s.kind.GroupKind(), obj)
	}
	acc, err := meta.Accessor(ro)
	if err != nil {
		return index.Object{}, false, fmt.Errorf("%s: %w", s.kind.GroupKind(), err)
	}
	if s.kind.Group != index.RBACGroup && !s.run.filter.allows(s.kind, acc) {
		return index.Object{}, false, nil
	}
	row, err := toRow(s.run.cfg.Cluster, s.kind, s.adapter, ro, acc)
	return row, err == nil, err
}

// Row normalizes one object of kind into the row a reflector writes for it
// (the namespace filter aside): the same status, message, summary, and the
// policy of RBAC kinds. kind is the kind as discovery reports it in the
// cluster (its resource and scope); its group and kind must be in the
// registry. Tests outside the package use it to feed an index.Store the
// rows the collector would write, without a cluster.
func (r *Registry) Row(cluster string, kind index.Kind, obj runtime.Object) (index.Object, error) {
	for _, a := range r.adapters {
		if a.Group != kind.Group || a.Kind != kind.Kind {
			continue
		}
		acc, err := meta.Accessor(obj)
		if err != nil {
			return index.Object{}, fmt.Errorf("%s: %w", kind.GroupKind(), err)
		}
		return toRow(cluster, kind, a, obj, acc)
	}
	return index.Object{}, fmt.Errorf("%s is not in the registry", kind.GroupKind())
}

// toRow normalizes ro with the adapter.
func toRow(cluster string, kind index.Kind, a *Adapter, ro runtime.Object, acc metav1.Object) (index.Object, error) {
	n := a.normalize(ro)
	row := index.Object{
		Cluster:         cluster,
		Namespace:       acc.GetNamespace(),
		Group:           kind.Group,
		Version:         kind.Version,
		Kind:            kind.Kind,
		Resource:        kind.Resource,
		Name:            acc.GetName(),
		UID:             string(acc.GetUID()),
		Labels:          index.LabelsOf(acc.GetLabels()),
		CreatedAt:       acc.GetCreationTimestamp().Time,
		ResourceVersion: acc.GetResourceVersion(),
		Status:          n.Status,
		Message:         truncate(n.Message, maxMessage),
		Policy:          n.Policy,
	}
	for _, o := range acc.GetOwnerReferences() {
		row.OwnerRefs = append(row.OwnerRefs, index.OwnerRef{Kind: o.Kind, Name: o.Name})
	}
	if len(n.Summary) > 0 {
		var err error
		row.Summary, err = json.Marshal(n.Summary)
		if err != nil {
			return index.Object{}, fmt.Errorf("%s %s: summary: %w", kind.GroupKind(), acc.GetName(), err)
		}
	}
	return row, nil
}

// maxMessage caps a row's message: a list column, not a log.
const maxMessage = 512

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// namespaceFilter applies the include and exclude lists.
type namespaceFilter struct {
	include map[string]bool
	exclude map[string]bool
}

func newNamespaceFilter(include, exclude []string) namespaceFilter {
	f := namespaceFilter{}
	if len(include) > 0 {
		f.include = map[string]bool{}
		for _, n := range include {
			f.include[n] = true
		}
	}
	if len(exclude) > 0 {
		f.exclude = map[string]bool{}
		for _, n := range exclude {
			f.exclude[n] = true
		}
	}
	return f
}

// allows reports whether an object passes the namespace filter. A
// Namespace object is filtered by its own name; other cluster-scoped
// objects always pass.
func (f namespaceFilter) allows(kind index.Kind, obj metav1.Object) bool {
	ns := obj.GetNamespace()
	if kind.Group == "" && kind.Kind == "Namespace" {
		ns = obj.GetName()
	}
	if ns == "" {
		return true
	}
	if f.include != nil && !f.include[ns] {
		return false
	}
	return !f.exclude[ns]
}

// signallingListWatch reports every failed watch request and every watch
// stream that ends without being stopped: the first sign of a lost
// connection, long before a list would fail.
type signallingListWatch struct {
	inner  cache.ListerWatcher
	report func(error)
}

// errWatchClosed is reported when a watch stream ends on its own.
var errWatchClosed = errors.New("watch stream closed by the server or the network")

func (l *signallingListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *signallingListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return cache.ToListerWatcherWithContext(l.inner).ListWithContext(ctx, opts)
}

func (l *signallingListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

func (l *signallingListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := cache.ToListerWatcherWithContext(l.inner).WatchWithContext(ctx, opts)
	if err != nil {
		if ctx.Err() == nil {
			l.report(err)
		}
		return nil, err
	}
	return newSignallingWatch(ctx, w, l.report), nil
}

// signallingWatch forwards a watch's events and reports when the stream
// ends unless it was stopped or its context ended.
type signallingWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	stopOnce sync.Once
	stopped  chan struct{}
}

func newSignallingWatch(ctx context.Context, inner watch.Interface, report func(error)) *signallingWatch {
	w := &signallingWatch{inner: inner, out: make(chan watch.Event), stopped: make(chan struct{})}
	go func() {
		defer close(w.out)
		for {
			select {
			case ev, ok := <-inner.ResultChan():
				if !ok {
					select {
					case <-w.stopped:
					default:
						if ctx.Err() == nil {
							report(errWatchClosed)
						}
					}
					return
				}
				select {
				case w.out <- ev:
				case <-w.stopped:
					return
				}
			case <-w.stopped:
				return
			}
		}
	}()
	return w
}

func (w *signallingWatch) Stop() {
	w.stopOnce.Do(func() {
		close(w.stopped)
		w.inner.Stop()
	})
}

func (w *signallingWatch) ResultChan() <-chan watch.Event { return w.out }
