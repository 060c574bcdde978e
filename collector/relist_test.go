package collector

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestRelistKeepsTheWatchRunning holds the anti-entropy relist of pods of
// a real API server after the server answered it (so its listing is older
// than what follows), and checks that meanwhile a pod's change, a new pod
// and a deleted pod reach the index through the watch; then, once the
// relist's older listing is applied, that none of them is undone, and
// that it repaired what the watch had no word on: a row that drifted from
// the server and a row of a pod the server does not have, while a pod
// nobody touched keeps its row.
//
// Both halves fail without the property: a relist that stops the watch and
// lists afresh (a reflector restart, as before) holds every change until
// it is released, and a relist that replaces the rows with its listing as
// it is brings back the old label and the deleted pod and drops the new
// pod.
func TestRelistKeepsTheWatchRunning(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "relist"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	const ns = "relist"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"changed", "deleted", "kept"} {
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, relistPod(name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	gate := &listGate{held: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := rest.CopyConfig(c.Config)
	cfg.WrapTransport = gate.wrap
	clients, err := NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry()
	if err := reg.Restrict([]string{"Pod"}); err != nil {
		t.Fatal(err)
	}
	store := index.New(memtables.Open)
	var podSyncs atomic.Int64
	podSynced := make(chan struct{}, 1)
	runCtx, stop := context.WithCancel(ctx)
	run, err := Start(runCtx, Config{
		Cluster: "c", Clients: clients, Sink: store, Registry: reg, Relist: 300 * time.Millisecond,
		OnEvent: func(e Event) {
			if e.Type == KindSynced && e.Kind.Kind == "Pod" {
				podSyncs.Add(1)
				select {
				case podSynced <- struct{}{}:
				default:
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		gate.open()
		stop()
		run.Wait()
	}()
	key := func(name string) index.Key { return index.Key{Cluster: "c", Kind: "Pod", Namespace: ns, Name: name} }
	waitRow(ctx, t, store, "the first sync", key("deleted"), func(_ *index.Object, ok bool) bool { return ok })

	gate.arm()
	select {
	case <-gate.held:
	case <-ctx.Done():
		t.Fatal("the anti-entropy relist never listed pods")
	}
	patch := []byte(`{"metadata":{"labels":{"app":"after"}}}`)
	if _, err := kube.CoreV1().Pods(ns).Patch(ctx, "changed", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, relistPod("created"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.CoreV1().Pods(ns).Delete(ctx, "deleted", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	changed := func(o *index.Object, ok bool) bool { return ok && o.Labels.Get("app") == "after" }
	created := func(_ *index.Object, ok bool) bool { return ok }
	deleted := func(_ *index.Object, ok bool) bool { return !ok }
	waitRow(ctx, t, store, "the change while the relist is held", key("changed"), changed)
	waitRow(ctx, t, store, "the new pod while the relist is held", key("created"), created)
	waitRow(ctx, t, store, "the deletion while the relist is held", key("deleted"), deleted)

	// Rows the watch has no word on are the relist's to repair: a row
	// that drifted from the server (kept, with a label the server never
	// had) and a row of a pod the server does not have (ghost). They are
	// written under the collector's feet, so nothing marks them recent.
	drifted, ok := store.Get(key("kept"))
	if !ok {
		t.Fatal("pod kept is not in the index")
	}
	corrupt := *drifted
	corrupt.Labels = index.LabelsOf(map[string]string{"app": "drifted"})
	ghost := *drifted
	ghost.Name = "ghost"
	if err := store.UpsertBatch(ctx, []index.Object{corrupt, ghost}); err != nil {
		t.Fatal(err)
	}

	// Let the held listing through and wait for its Replace (the next
	// sync of pods: the watch never restarted, so no other).
	synced := podSyncs.Load()
	gate.open()
	for podSyncs.Load() == synced {
		select {
		case <-ctx.Done():
			t.Fatal("the released relist never replaced the pods")
		case <-podSynced:
		}
	}
	for _, tc := range []struct {
		name string
		want func(*index.Object, bool) bool
	}{{"changed", changed}, {"created", created}, {"deleted", deleted}} {
		o, ok := store.Get(key(tc.name))
		if !tc.want(o, ok) {
			t.Errorf("after the older listing was applied, pod %s is %+v (present %v): the relist undid the watch's word", tc.name, o, ok)
		}
	}
	if o, ok := store.Get(key("kept")); !ok || o.Labels.Get("app") != "before" {
		t.Errorf("after the relist, pod kept is %+v (present %v), want the server's labels (app=before): the relist did not repair a drifted row, or dropped a row nobody touched", o, ok)
	}
	if o, ok := store.Get(key("ghost")); ok {
		t.Errorf("after the relist, pod ghost, which the server does not have, is still indexed: %+v", o)
	}
}

func relistPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "before"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1"}}},
	}
}

// waitRow waits until want holds for the row of k.
func waitRow(ctx context.Context, t *testing.T, store *index.Store, what string, k index.Key, want func(*index.Object, bool) bool) {
	t.Helper()
	for {
		w := index.NewWatch()
		if o, ok := store.GetWatch(w, k); want(o, ok) {
			return
		}
		if err := w.Wait(ctx); err != nil {
			t.Fatalf("%s: %s never reached the index: %v", what, k, err)
		}
	}
}

// listGate, once armed, holds every listing of pods until open: a plain
// list is sent and its whole answer read (so the listing is the server's
// state at that moment) before it is held, a watch that streams the
// initial state (a reflector relisting) is held before it is sent. held
// signals the first.
type listGate struct {
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *listGate) arm()  { g.armed.Store(true) }
func (g *listGate) open() { g.once.Do(func() { close(g.release) }) }

func (g *listGate) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		isPods := req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/pods")
		initial := q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true"
		if !isPods || (q.Get("watch") != "" && !initial) || !g.armed.Load() {
			return rt.RoundTrip(req)
		}
		if initial {
			g.hold(req.Context())
			return rt.RoundTrip(req)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		g.hold(req.Context())
		return resp, nil
	})
}

func (g *listGate) hold(ctx context.Context) {
	select {
	case g.held <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
