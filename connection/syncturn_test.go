package connection

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// isServiceList reports whether req lists every namespace's Services: a
// reflector's initial list of the kind, as a list or as a watch that
// sends the initial events (WatchList).
func isServiceList(req *http.Request) bool {
	q := req.URL.Query()
	return req.Method == http.MethodGet && req.URL.Path == "/api/v1/services" &&
		(q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true")
}

// holdList returns a transport wrapper that holds requests matching list
// until release is closed (or the request ends), and says on held when
// the first one is held.
func holdList(list func(*http.Request) bool, held chan<- struct{}, release <-chan struct{}) func(http.RoundTripper) http.RoundTripper {
	var once sync.Once
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if list(req) {
				select {
				case <-release:
				default:
					once.Do(func() { close(held) })
					select {
					case <-release:
					case <-req.Context().Done():
						return nil, req.Context().Err()
					}
				}
			}
			return rt.RoundTrip(req)
		})
	}
}

// TestConcurrentSyncsAreBounded: with MaxConcurrentSyncs 1, a cluster
// whose first sync hangs on a list keeps the others waiting, CONNECTING,
// without a request to their servers and without being reported lost;
// each starts only once no other cluster is syncing, and all sync once the
// list goes through.
func TestConcurrentSyncsAreBounded(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "turns"})
	h := newHarness(t, Options{MaxConcurrentSyncs: 1})

	var mu sync.Mutex
	started := map[string]bool{} // clusters that sent a request
	spec := func(name string, wrap func(http.RoundTripper) http.RoundTripper) Spec {
		return Spec{Name: name, Config: func(context.Context) (*rest.Config, error) {
			cfg := rest.CopyConfig(c.Config)
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
				return roundTripFunc(func(req *http.Request) (*http.Response, error) {
					mu.Lock()
					if !started[name] {
						started[name] = true
						for other := range started {
							if cl, ok := h.store.GetCluster(nil, other); other != name && (!ok || cl.Stale()) {
								t.Errorf("%s started its sync while %s was in its own: %+v", name, other, cl)
							}
						}
					}
					mu.Unlock()
					return rt.RoundTrip(req)
				})
			})
			if wrap != nil {
				cfg.Wrap(wrap)
			}
			return cfg, nil
		}}
	}
	held, release := make(chan struct{}), make(chan struct{})
	if err := h.mgr.Add(spec("turns-a", holdList(isServiceList, held, release))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("turns-a never listed its Services")
	}
	for _, name := range []string{"turns-b", "turns-c"} {
		if err := h.mgr.Add(spec(name, nil)); err != nil {
			t.Fatal(err)
		}
	}
	conntest.Eventually(t, 30*time.Second, "two clusters waiting for their turn", func() error {
		if n := testutil.ToFloat64(h.mgr.metrics.waitingToSync); n != 2 {
			return fmt.Errorf("%v waiting", n)
		}
		return nil
	})
	mu.Lock()
	if started["turns-b"] || started["turns-c"] {
		t.Errorf("a waiting cluster sent requests: %v", started)
	}
	mu.Unlock()
	for _, name := range []string{"turns-b", "turns-c"} {
		if cl, ok := h.store.GetCluster(nil, name); !ok || cl.State != index.StateConnecting {
			t.Errorf("%s waits as %+v, want CONNECTING", name, cl)
		}
	}

	close(release)
	for _, name := range []string{"turns-a", "turns-b", "turns-c"} {
		h.rec.WaitFor(t, name, index.StateConnected, 1, 60*time.Second)
		if n := h.rec.Count(name, index.StateDisconnected); n != 0 {
			t.Errorf("%s was lost %d times: %v", name, n, h.rec.Of(name))
		}
	}
	// A cluster reports itself synced before it gives its turn back
	// (cluster.session: Report, then doneSyncing), so the gauge may lag
	// the Connected state the recorder saw: wait for it, do not read it
	// once.
	conntest.Eventually(t, 30*time.Second, "no cluster counts as syncing", func() error {
		if n := testutil.ToFloat64(h.mgr.metrics.syncing); n != 0 {
			return fmt.Errorf("%v clusters still count as syncing", n)
		}
		return nil
	})
}
