package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestMain lets the test binary be the fleet benchmark's load generator
// (fleetOnce starts its own executable with fleet-server) and compare's
// process per size (compare starts its own executable with compare
// -size-result).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "fleet-server" || os.Args[1] == "compare") {
		main()
		return
	}
	os.Exit(m.Run())
}

// fleetTestServer serves a small simulated fleet in process.
func fleetTestServer(t *testing.T, shape fleetShape, clusters int) (*fleetServer, *httptest.Server) {
	t.Helper()
	s, err := newFleetServer(shape, clusters, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return s, srv
}

// simConfig returns a client config for one simulated cluster, with
// protobuf for built-in kinds as the collector's clients use it.
func simConfig(srv *httptest.Server, cluster int, proto bool) *rest.Config {
	cfg := &rest.Config{Host: srv.URL + "/clusters/" + simClusterName(cluster), Transport: srv.Client().Transport}
	if proto {
		cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
		cfg.ContentType = "application/vnd.kubernetes.protobuf"
	}
	return cfg
}

// noWatchList makes a reflector list and then watch, as client-go does when
// the WatchListClient feature is off.
type noWatchList struct{ cache.ListerWatcher }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// TestFleetServerProtocol checks the load generator against client-go
// itself: discovery, reflectors with WatchList streaming and with list then
// watch, for protobuf, JSON and dynamic clients, each seeing every object
// and then every change; pages; 410 for a resource version the ring no
// longer holds; and bookmarks.
func TestFleetServerProtocol(t *testing.T) {
	shape := fleetShape{Namespaces: 3, Pods: 6, Services: 2}
	s, srv := fleetTestServer(t, shape, 2)
	s.bookmarkEvery = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("discovery", func(t *testing.T) {
		kube := kubernetes.NewForConfigOrDie(simConfig(srv, 1, false))
		_, lists, err := kube.Discovery().ServerGroupsAndResources()
		if err != nil {
			t.Fatal(err)
		}
		found := map[schema.GroupVersionKind]bool{}
		for _, l := range lists {
			for _, r := range l.APIResources {
				gv, _ := schema.ParseGroupVersion(l.GroupVersion)
				found[gv.WithKind(r.Kind)] = true
			}
		}
		for _, k := range simKinds {
			if !found[k.gvk()] {
				t.Errorf("discovery lacks %s", k.gvk())
			}
		}
		if v, err := kube.Discovery().ServerVersion(); err != nil || v.Minor != "35" {
			t.Errorf("version: %v %v", v, err)
		}
	})

	pods := simKinds[simKindIndex("Pod")]
	ks := simKinds[simKindIndex("Kustomization")]
	type lwCase struct {
		name string
		kind simKind
		lw   func(cfg *rest.Config) cache.ListerWatcher
		obj  runtime.Object
		cfg  *rest.Config
	}
	typedPods := func(cfg *rest.Config) cache.ListerWatcher {
		p := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(metav1.NamespaceAll)
		return &cache.ListWatch{
			ListWithContextFunc:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return p.List(ctx, o) },
			WatchFuncWithContext: p.Watch,
		}
	}
	dynamicKS := func(cfg *rest.Config) cache.ListerWatcher {
		r := dynamic.NewForConfigOrDie(cfg).Resource(schema.GroupVersionResource{Group: ks.Group, Version: ks.Version, Resource: ks.Resource})
		return &cache.ListWatch{
			ListWithContextFunc:  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.List(ctx, o) },
			WatchFuncWithContext: r.Watch,
		}
	}
	cases := []lwCase{
		{"pods-protobuf", pods, typedPods, &corev1.Pod{}, simConfig(srv, 1, true)},
		{"pods-json", pods, typedPods, &corev1.Pod{}, simConfig(srv, 1, false)},
		{"kustomizations-dynamic", ks, dynamicKS, &unstructured.Unstructured{}, simConfig(srv, 1, false)},
	}
	c1 := s.clusters[1]
	for _, mode := range []string{"watchlist", "list-then-watch"} {
		for _, tc := range cases {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				lists, initial := s.lists.Load(), s.initialWatches.Load()
				lw := tc.lw(tc.cfg)
				if mode == "list-then-watch" {
					lw = noWatchList{lw}
				}
				store := cache.NewStore(cache.MetaNamespaceKeyFunc)
				r := cache.NewReflector(lw, tc.obj, store, 0)
				rctx, stop := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); r.RunWithContext(rctx) }()
				defer func() { stop(); <-done }()
				sr := c1.resources[simKindIndex(tc.kind.Kind.Kind)]
				waitStore(ctx, t, store, s, c1, sr)
				if mode == "watchlist" && (s.initialWatches.Load() == initial || s.lists.Load() != lists) {
					t.Errorf("the reflector did not stream its initial list (watch lists %d, lists %d)", s.initialWatches.Load()-initial, s.lists.Load()-lists)
				}
				if mode == "list-then-watch" && s.lists.Load() == lists {
					t.Error("the reflector did not list")
				}
				if tc.kind.Kind.Kind == "Pod" {
					// Changes arrive through the watch.
					for i := range 5 {
						if err := s.change(c1, i*3); err != nil {
							t.Fatal(err)
						}
					}
					waitStore(ctx, t, store, s, c1, sr)
				}
			})
		}
	}

	t.Run("pages", func(t *testing.T) {
		p := kubernetes.NewForConfigOrDie(simConfig(srv, 0, true)).CoreV1().Pods(metav1.NamespaceAll)
		var names []string
		opts := metav1.ListOptions{Limit: 5}
		for pages := 0; ; pages++ {
			l, err := p.List(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range l.Items {
				names = append(names, it.Namespace+"/"+it.Name)
			}
			if opts.Continue = l.Continue; opts.Continue == "" {
				if pages == 0 {
					t.Error("one page for a limit of 5")
				}
				break
			}
			if l.RemainingItemCount == nil || *l.RemainingItemCount != int64(shape.count(pods)-len(names)) {
				t.Errorf("remaining %v after %d", l.RemainingItemCount, len(names))
			}
		}
		slices.Sort(names)
		if len(names) != shape.count(pods) || len(slices.Compact(names)) != shape.count(pods) {
			t.Errorf("pages held %d distinct pods, want %d", len(names), shape.count(pods))
		}
	})

	t.Run("expired", func(t *testing.T) {
		p := kubernetes.NewForConfigOrDie(simConfig(srv, 0, true)).CoreV1().Pods(metav1.NamespaceAll)
		l, err := p.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c0 := s.clusters[0]
		for i := range watchRing + 1 {
			if err := s.change(c0, i%shape.count(pods)); err != nil {
				t.Fatal(err)
			}
		}
		_, err = p.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
		if !apierrors.IsResourceExpired(err) {
			t.Fatalf("watch from a resource version the ring dropped: %v, want 410 Expired", err)
		}
		// From a version the ring still holds: the events after it.
		c0.mu.Lock()
		sr := c0.resources[simKindIndex("Pod")]
		from := sr.ring[(sr.start+sr.n-3)%len(sr.ring)].obj.rv
		c0.mu.Unlock()
		w, err := p.Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatUint(from, 10)})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		for range 2 {
			ev := <-w.ResultChan()
			if rv, _ := strconv.ParseUint(ev.Object.(*corev1.Pod).ResourceVersion, 10, 64); ev.Type != watch.Modified || rv <= from {
				t.Errorf("event %s at %d after %d", ev.Type, rv, from)
			}
		}
	})

	t.Run("bookmarks", func(t *testing.T) {
		p := kubernetes.NewForConfigOrDie(simConfig(srv, 0, true)).CoreV1().Services(metav1.NamespaceAll)
		w, err := p.Watch(ctx, metav1.ListOptions{AllowWatchBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		select {
		case ev := <-w.ResultChan():
			if ev.Type != watch.Bookmark || ev.Object.(*corev1.Service).ResourceVersion == "" {
				t.Errorf("got %s %v, want a bookmark", ev.Type, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Error("no bookmark")
		}
	})
}

// waitStore waits until a reflector's store holds exactly the resource's
// objects at their current resource versions.
func waitStore(ctx context.Context, t *testing.T, store cache.Store, s *fleetServer, c *simCluster, sr *simResource) {
	t.Helper()
	for {
		c.mu.Lock()
		want := map[string]string{}
		for i, o := range sr.objs {
			ns, name := s.shape.namespaceAndName(sr.kind, i)
			want[ns+"/"+name] = strconv.FormatUint(o.rv, 10)
		}
		c.mu.Unlock()
		got := map[string]string{}
		for _, obj := range store.List() {
			m, err := meta.Accessor(obj)
			if err != nil {
				t.Fatal(err)
			}
			got[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
		}
		if len(got) == len(want) && equalMaps(got, want) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the reflector holds %d objects, the server %d (or versions differ)", len(got), len(want))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestFleetSmall runs fleetbench fleet end to end on three small clusters:
// the generator as a child process, the real collector, counts checked
// after the first sync and every change checked at the end (both inside
// fleetOnce); then no generator process is left.
func TestFleetSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the fleet benchmark")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	startedMu.Lock()
	before := len(started)
	startedMu.Unlock()
	o := fleetOptions{shape: fleetShape{Namespaces: 4, Pods: 12, Services: 3}, rate: 200, warmup: 500 * time.Millisecond, window: 2 * time.Second}
	r, err := fleetOnce(ctx, 3, o)
	if err != nil {
		t.Fatal(err)
	}
	listed, rbac := o.shape.objects()
	if r.objects != 3*(listed+rbac) || r.firstSync <= 0 || r.steadyCores <= 0 || r.rssBytes <= 0 || r.changeP99 <= 0 {
		t.Errorf("result %+v", r)
	}
	// 200 changes/s for 2 s: most reach the index within the window.
	if r.changes < 200 {
		t.Errorf("%d changes reached the index during the window, want about 400", r.changes)
	}
	if line := r.String(); !strings.HasPrefix(line, "fleet: clusters=3 objects=") {
		t.Errorf("line %q", line)
	}
	startedMu.Lock()
	pids := slices.Clone(started[before:])
	startedMu.Unlock()
	if len(pids) != 1 {
		t.Fatalf("started %d generators, want 1", len(pids))
	}
	if err := syscall.Kill(-pids[0], 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("generator process group %d is still there (%v)", pids[0], err)
	}
}
