package connection

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestSlowProbeWhileDataFlows: probes that time out while the cluster's
// watches deliver data do not make the cluster lost (a manager busy with
// its first sync answers probes late, and a reconnect would start every
// list over); once nothing arrives any more, the same timeouts do.
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
	var hang atomic.Bool // /readyz probes hang until they time out
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
		return cfg, nil
	}}
	const probeTimeout, failures = time.Second, 3
	h := newHarness(t, Options{ProbeInterval: 100 * time.Millisecond, ProbeTimeout: probeTimeout, ProbeFailures: failures}, spec)
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)

	// A pod changes every 50 ms, so every probe's second sees watch
	// events arrive; meanwhile probes hang.
	busy, stopBusy := context.WithCancel(ctx)
	changed := make(chan struct{})
	go func() {
		defer close(changed)
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
	hang.Store(true)
	// Twice the probes it takes to lose a cluster, all of them timing out.
	time.Sleep(2 * failures * (probeTimeout + 100*time.Millisecond)) // the span observed, not a synchronisation
	stopBusy()
	<-changed
	if n := h.rec.Count(c.Name, index.StateDisconnected); n != 0 {
		t.Fatalf("the cluster was lost %d times while its watches delivered data: %+v", n, h.rec.Of(c.Name))
	}
	// Nothing arrives any more: the timeouts count again.
	h.rec.WaitFor(t, c.Name, index.StateDisconnected, 1, 60*time.Second)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
