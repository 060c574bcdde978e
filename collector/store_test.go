package collector

import (
	"context"
	"fmt"
	"reflect"
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
	var pod *Adapter
	for _, a := range NewRegistry().Adapters() {
		if a.Kind == "Pod" {
			pod = a
		}
	}
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
	var pod *Adapter
	for _, a := range NewRegistry().Adapters() {
		if a.Kind == "Pod" {
			pod = a
		}
	}
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
