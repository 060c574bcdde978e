package connection

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestSlowProbeWhileDataFlows: probes that time out while the cluster's
// watches deliver data do not make the cluster lost during its sync (a
// manager busy with its first sync answers probes late, and a reconnect
// would start every list over), however many; once nothing arrives any
// more, the same timeouts do, within the probes it takes. After the sync,
// only forgiveAfterSync of them are forgiven (review-fleetlat finding 5:
// bookmarks and viewers' reads keep bytes flowing from a server whose
// storage is gone).
func TestSlowProbeWhileDataFlows(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "slow-probe"})
	ctx := t.Context()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "busy"},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "main", Image: "registry.example/app:1"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod that changes every 50 ms, so that every probe's second sees
	// watch events arrive.
	churn := func() (stop func()) {
		busy, stopBusy := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; busy.Err() == nil; i++ {
				patch := fmt.Appendf(nil, `{"metadata":{"labels":{"n":"%d"}}}`, i)
				if _, err := kube.CoreV1().Pods("default").Patch(busy, "busy", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && busy.Err() == nil {
					t.Errorf("patch: %v", err)
					return
				}
				select {
				case <-busy.Done():
				case <-time.After(50 * time.Millisecond): // the change rate, not a synchronisation
				}
			}
		}()
		return func() { stopBusy(); <-done }
	}
	var hang atomic.Bool // /readyz probes hang until they time out
	held, release := make(chan struct{}), make(chan struct{})
	spec := Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) {
		cfg := rest.CopyConfig(c.Config)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if hang.Load() && strings.HasSuffix(req.URL.Path, "/readyz") {
					<-req.Context().Done()
					return nil, req.Context().Err()
				}
				return rt.RoundTrip(req)
			})
		})
		cfg.Wrap(holdList(isServiceList, held, release)) // the sync cannot end
		return cfg, nil
	}}
	const interval, timeout, failures = 100 * time.Millisecond, time.Second, 2
	// How long losing the cluster may take once n probes in a row count:
	// each takes the timeout and waits up to an interval, and a loaded
	// machine adds its delays. A grace without end never gets there.
	within := func(n int) time.Duration { return time.Duration(n)*(timeout+interval) + 20*time.Second }
	h := newHarness(t, Options{ProbeInterval: interval, ProbeTimeout: timeout, ProbeFailures: failures}, spec)
	forgiven := func() int { return int(testutil.ToFloat64(h.mgr.metrics.forgiven.WithLabelValues(c.Name))) }
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		t.Fatal("the cluster never listed its Services")
	}
	conntest.Eventually(t, 60*time.Second, "the pod's row", func() error {
		if _, ok := h.store.Get(index.Key{Cluster: c.Name, Kind: "Pod", Namespace: "default", Name: "busy"}); !ok {
			return errors.New("not in the index")
		}
		return nil
	})

	// In the sync: more timed-out probes than a synced connection
	// forgives and then loses the cluster over.
	stop := churn()
	hang.Store(true)
	conntest.Eventually(t, 60*time.Second, "timed-out probes forgiven", func() error {
		if n := forgiven(); n <= forgiveAfterSync+failures {
			return fmt.Errorf("%d forgiven", n)
		}
		return nil
	})
	if n := h.rec.Count(c.Name, index.StateDisconnected); n != 0 {
		t.Fatalf("the cluster was lost %d times while its watches delivered data: %+v", n, h.rec.Of(c.Name))
	}
	// Nothing arrives any more: the timeouts count again (one more probe
	// may have seen the last change).
	stop()
	h.rec.WaitFor(t, c.Name, index.StateDisconnected, 1, within(failures+1))

	// Synced, with data flowing and probes timing out: lost after
	// forgiveAfterSync forgiven probes.
	hang.Store(false)
	close(release)
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	stop = churn()
	defer stop()
	before := forgiven()
	hang.Store(true)
	h.rec.WaitFor(t, c.Name, index.StateDisconnected, 2, within(forgiveAfterSync+failures+1))
	if n := forgiven() - before; n > forgiveAfterSync {
		t.Errorf("a synced connection forgave %d timed-out probes in a row, want at most %d", n, forgiveAfterSync)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
