package collector

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/index"
)

// replaceSink records the rows of each Replace.
type replaceSink struct {
	index.RowSink
	replaced [][]index.Object
}

func (s *replaceSink) Replace(_ context.Context, _ string, _ index.Kind, rows []index.Object) error {
	s.replaced = append(s.replaced, rows)
	return nil
}

func testPod(ns, name, phase string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("u-" + name), ResourceVersion: "7", Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPhase(phase)},
	}
}

// TestReplaceOfTransformedObjects checks that a listing whose objects went
// through the store's transformer (as a WatchList reflector's temporary
// store does) replaces exactly the rows of the same listing untransformed,
// namespace filter included, and that the transformer keeps rows, not the
// objects.
func TestReplaceOfTransformedObjects(t *testing.T) {
	sink := &replaceSink{}
	run := &Run{cfg: Config{Cluster: "c1", Sink: sink, OnEvent: func(Event) {}}, filter: newNamespaceFilter(nil, []string{"kube-system"})}
	pod := podAdapter(t)
	s := &rowStore{ctx: context.Background(), run: run, adapter: pod, kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
	objs := []any{testPod("a", "p1", "Running"), testPod("kube-system", "p2", "Running"), testPod("b", "p3", "Pending")}
	transformed := make([]any, len(objs))
	for i, o := range objs {
		var err error
		if transformed[i], err = s.Transformer()(o); err != nil {
			t.Fatal(err)
		}
		if _, ok := transformed[i].(runtime.Object); ok {
			t.Errorf("the transformer kept the object %T", transformed[i])
		}
		// Transforming twice (a store may) changes nothing.
		if again, err := s.Transformer()(transformed[i]); err != nil || again != transformed[i] {
			t.Errorf("transforming a transformed object: %v, %v", again, err)
		}
	}
	if err := s.Replace(objs, "9"); err != nil {
		t.Fatal(err)
	}
	if err := s.Replace(transformed, "9"); err != nil {
		t.Fatal(err)
	}
	if len(sink.replaced) != 2 || len(sink.replaced[0]) != 2 {
		t.Fatalf("replaced %v, want two listings of 2 rows (kube-system filtered out)", sink.replaced)
	}
	if !reflect.DeepEqual(sink.replaced[0], sink.replaced[1]) {
		t.Errorf("transformed listing replaced\n%+v\nthe plain one\n%+v", sink.replaced[1], sink.replaced[0])
	}
}

// TestWatchListReflectorUsesTheTransformer runs a client-go reflector in
// WatchList mode over a fake stream and checks that the rows reach the sink
// through the transformer.
func TestWatchListReflectorUsesTheTransformer(t *testing.T) {
	sink := &replaceSink{}
	synced := make(chan struct{}, 1)
	run := &Run{cfg: Config{Cluster: "c1", Sink: sink, OnEvent: func(e Event) {
		if e.Type == KindSynced {
			synced <- struct{}{}
		}
	}}}
	pod := podAdapter(t)
	s := &rowStore{ctx: context.Background(), run: run, adapter: pod, kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
	counted := &typesStore{rowStore: s}
	fw := watch.NewFake()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			t.Error("the reflector listed instead of streaming")
			return &corev1.PodList{}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents == nil || !*o.SendInitialEvents {
				t.Errorf("watch without sendInitialEvents: %+v", o)
			}
			return fw, nil
		},
	}
	r := cache.NewReflector(lw, &corev1.Pod{}, counted, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.RunWithContext(ctx) }()
	defer func() { cancel(); <-done }()
	fw.Add(testPod("a", "p1", "Running"))
	fw.Add(testPod("b", "p2", "Running"))
	end := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "8", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	fw.Action(watch.Bookmark, end)
	<-synced
	if len(sink.replaced) != 1 || len(sink.replaced[0]) != 2 {
		t.Errorf("replaced %v, want one listing of 2 rows", sink.replaced)
	}
	for _, typ := range counted.types {
		if typ != "*collector.normalizedObject" {
			t.Errorf("Replace got a %s, want rows from the transformer", typ)
		}
	}
}

// typesStore is a rowStore that records the types of what Replace gets.
type typesStore struct {
	*rowStore
	types []string
}

func (s *typesStore) Replace(list []any, rv string) error {
	for _, o := range list {
		s.types = append(s.types, fmt.Sprintf("%T", o))
	}
	return s.rowStore.Replace(list, rv)
}

// historySink keeps the rows of one kind and records, per pod name, every
// change a subscriber would see: the row's app label, or "-" when the row
// goes away.
type historySink struct {
	index.RowSink
	rows map[index.Key]index.Object
	seen map[string][]string
}

func newHistorySink() *historySink {
	return &historySink{rows: map[index.Key]index.Object{}, seen: map[string][]string{}}
}

func (s *historySink) set(row index.Object) {
	k := row.Key()
	if old, ok := s.rows[k]; !ok || old.Labels.Get("app") != row.Labels.Get("app") || old.UID != row.UID {
		s.seen[row.Name] = append(s.seen[row.Name], row.Labels.Get("app"))
	}
	s.rows[k] = row
}

func (s *historySink) gone(k index.Key) {
	if _, ok := s.rows[k]; ok {
		s.seen[k.Name] = append(s.seen[k.Name], "-")
		delete(s.rows, k)
	}
}

func (s *historySink) Replace(_ context.Context, _ string, _ index.Kind, rows []index.Object) error {
	next := map[index.Key]bool{}
	for _, r := range rows {
		next[r.Key()] = true
		s.set(r)
	}
	for k := range s.rows {
		if !next[k] {
			s.gone(k)
		}
	}
	return nil
}

func (s *historySink) Upsert(_ context.Context, row index.Object) error { s.set(row); return nil }
func (s *historySink) Delete(_ context.Context, k index.Key) error      { s.gone(k); return nil }

// TestRelistOverALaggingWatch plays, on the rows a collector writes, a
// watch that lags behind the anti-entropy relist's listing: the listing is
// taken at resource version 106 while the watch has delivered only up to
// 101, and the watch's events from 102 to 106 arrive after the listing was
// applied. Each row must only ever move forward: pod p goes a, c (the
// listing), d (a later event), never back to b; pod q, deleted and created
// again before the listing, is not deleted and created again after it; pod
// r, which the watch changed while the kind listed (b at 101), takes the
// listing's newer c. What is newer than the listing (t, created at 107)
// still arrives, and a row the server lacks (ghost) goes.
//
// With resource versions that are not numbers nothing can be compared: the
// watch replays, but every row still ends on its latest state.
func TestRelistOverALaggingWatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string // before every resource version
		want   map[string][]string
	}{
		{"numeric resource versions", "", map[string][]string{
			"p": {"a", "c", "d"}, "q": {"old", "new"}, "r": {"a", "b", "c"}, "t": {"t"}, "ghost": {"ghost", "-"},
		}},
		{"opaque resource versions", "x", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := newHistorySink()
			run := &Run{cfg: Config{Cluster: "c1", Sink: sink, OnEvent: func(Event) {}}}
			s := &rowStore{ctx: context.Background(), run: run, adapter: podAdapter(t), kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
			pod := func(name, app, uid string, rv int) *corev1.Pod {
				p := testPod("ns", name, "Running")
				p.Labels = map[string]string{"app": app}
				p.UID = types.UID(uid)
				p.ResourceVersion = fmt.Sprintf("%s%d", tc.prefix, rv)
				return p
			}
			// The reflector's listing, at 100.
			if err := s.Replace([]any{pod("p", "a", "p", 90), pod("q", "old", "q1", 91), pod("r", "a", "r", 92), pod("ghost", "ghost", "g", 93)}, tc.prefix+"100"); err != nil {
				t.Fatal(err)
			}
			// The relist: while the kind lists, the watch delivers 101;
			// the listing is the server's state at 106.
			lw := &cache.ListWatch{ListWithContextFunc: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
				if err := s.Update(pod("r", "b", "r", 101)); err != nil {
					t.Fatal(err)
				}
				list := &corev1.PodList{Items: []corev1.Pod{*pod("p", "c", "p", 104), *pod("q", "new", "q2", 106), *pod("r", "c", "r", 102)}}
				list.ResourceVersion = tc.prefix + "106"
				return list, nil
			}}
			if err := s.reconcile(context.Background(), lw); err != nil {
				t.Fatal(err)
			}
			// The lagging watch catches up, then goes on.
			for _, ev := range []func() error{
				func() error { return s.Update(pod("r", "c", "r", 102)) },
				func() error { return s.Update(pod("p", "b", "p", 103)) },
				func() error { return s.Update(pod("p", "c", "p", 104)) },
				func() error { return s.Delete(pod("q", "old", "q1", 105)) },
				func() error { return s.Add(pod("q", "new", "q2", 106)) },
				func() error { return s.Add(pod("t", "t", "t", 107)) },
				func() error { return s.Update(pod("p", "d", "p", 108)) },
			} {
				if err := ev(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.want != nil && !reflect.DeepEqual(sink.seen, tc.want) {
				t.Errorf("rows went through\n%v\nwant\n%v", sink.seen, tc.want)
			}
			final := map[string]string{}
			for k, r := range sink.rows {
				final[k.Name] = r.Labels.Get("app") + "/" + r.UID
			}
			if want := map[string]string{"p": "d/p", "q": "new/q2", "r": "c/r", "t": "t/t"}; !reflect.DeepEqual(final, want) {
				t.Errorf("rows at the end %v, want %v", final, want)
			}
		})
	}
}

func podAdapter(t *testing.T) *Adapter {
	t.Helper()
	for _, a := range NewRegistry().Adapters() {
		if a.Kind == "Pod" {
			return a
		}
	}
	t.Fatal("no Pod adapter")
	return nil
}

func (s *replaceSink) ReportKindError(context.Context, string, index.Kind, error) error { return nil }

// TestRelistKeepsAKindFailure checks that the anti-entropy relist does not
// replace a kind's rows while its reflector reports it failing (a kind
// that may be listed but not watched lists fine in a relist): the sink's
// Replace and the KindSynced would clear the reported error. A failure
// during the relist's listing drops the listing too, and a relist does not
// even list while the kind fails; the reflector's next Replace lifts it.
func TestRelistKeepsAKindFailure(t *testing.T) {
	sink := &replaceSink{}
	var events []EventType
	run := &Run{cfg: Config{Cluster: "c1", Sink: sink, OnEvent: func(e Event) { events = append(events, e.Type) }}}
	s := &rowStore{ctx: context.Background(), run: run, adapter: podAdapter(t), kind: index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}}
	var duringList func()
	listed := 0
	lw := &cache.ListWatch{ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		listed++
		if duringList != nil {
			duringList()
		}
		return &corev1.PodList{Items: []corev1.Pod{*testPod("a", "p1", "Running")}}, nil
	}}
	forbidden := errors.New("watch is forbidden")
	for _, step := range []struct {
		name       string
		failBefore bool // the reflector failed before the relist
		failDuring bool // the reflector failed while the relist listed
		wantSynced bool // the relist replaced and reported KindSynced
	}{
		{name: "failing before the relist", failBefore: true},
		{name: "failing while the relist lists", failDuring: true},
		{name: "healthy", wantSynced: true},
	} {
		if err := s.Replace(nil, "1"); err != nil { // the reflector's listing
			t.Fatal(err)
		}
		if step.failBefore {
			s.failed(forbidden)
		}
		duringList = nil
		if step.failDuring {
			duringList = func() { s.failed(forbidden) }
		}
		replaced, evs, lists := len(sink.replaced), len(events), listed
		if err := s.reconcile(context.Background(), lw); err != nil {
			t.Fatal(err)
		}
		if step.failBefore && listed != lists {
			t.Errorf("%s: the relist listed the kind, which it cannot use", step.name)
		}
		gotSynced := len(sink.replaced) > replaced || slices.Contains(events[evs:], KindSynced)
		if gotSynced != step.wantSynced {
			t.Errorf("%s: the relist replaced the rows (or reported KindSynced): %v, want %v", step.name, gotSynced, step.wantSynced)
		}
	}
}
