package connection

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func seeded(t *testing.T, c *testcluster.Cluster, flux, istio bool, namespaces int) {
	t.Helper()
	ctx := t.Context()
	if flux {
		if err := c.InstallFluxCRDs(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if istio {
		if err := c.InstallIstioCRDs(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: namespaces, Pods: 4, Services: 2, Flux: flux, Istio: istio}); err != nil {
		t.Fatal(err)
	}
}

func TestConvergence(t *testing.T) {
	cs := startClusters(t, testcluster.Options{Name: "conv-a"}, testcluster.Options{Name: "conv-b"}, testcluster.Options{Name: "conv-c"})
	for _, c := range cs {
		seeded(t, c, true, true, 4)
	}
	h := newHarness(t, Options{}, specFor(cs[0]), specFor(cs[1]), specFor(cs[2]))
	for _, c := range cs {
		h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	}

	// 4 core + 9 Istio + 7 Flux + 4 RBAC kinds.
	for _, c := range cs {
		if n := len(h.store.Kinds(c.Name)); n != 24 {
			t.Fatalf("cluster %s: %d kinds recorded, want 24: %v", c.Name, n, h.store.Kinds(c.Name))
		}
	}
	for _, c := range cs {
		want := conntest.Truth(t, c, h.store.Kinds(c.Name))
		conntest.Eventually(t, 5*time.Second, "initial sync of "+c.Name, func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, c.Name)) })
	}

	t.Run("statuses", func(t *testing.T) {
		get := func(kind, ns, name string) *index.Object {
			for _, g := range []string{"", "kustomize.toolkit.fluxcd.io"} {
				if o, ok := h.store.Get(index.Key{Cluster: "conv-a", Group: g, Kind: kind, Namespace: ns, Name: name}); ok {
					return o
				}
			}
			t.Fatalf("%s %s/%s not in the index", kind, ns, name)
			return nil
		}
		cases := []struct {
			kind, ns, name string
			want           index.Status
			message        string
		}{
			{"Pod", "ns-0", "pod-0", index.StatusHealthy, ""},
			{"Pod", "ns-2", "pod-0", index.StatusProgressing, "Unschedulable"},  // the 9th pod: pending
			{"Pod", "ns-2", "pod-1", index.StatusUnhealthy, "CrashLoopBackOff"}, // the 10th: crash-looping
			{"Kustomization", "ns-0", "apps", index.StatusHealthy, "Applied revision"},
			{"Namespace", "", "ns-0", index.StatusHealthy, ""},
		}
		for _, tc := range cases {
			o := get(tc.kind, tc.ns, tc.name)
			if o.Status != tc.want || !strings.Contains(o.Message, tc.message) {
				t.Errorf("%s %s/%s: %s %q, want %s containing %q", tc.kind, tc.ns, tc.name, o.Status, o.Message, tc.want, tc.message)
			}
		}
	})

	// A burst of creates, updates and deletes on every cluster at once,
	// then the index must equal the truth within 2 s.
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conntest.Burst(t, c)
		}()
	}
	wg.Wait()
	burstDone := time.Now()
	wants := map[string]map[string]string{}
	for _, c := range cs {
		wants[c.Name] = conntest.Truth(t, c, h.store.Kinds(c.Name))
	}
	conntest.Eventually(t, 10*time.Second, "convergence after the burst", func() error {
		for _, c := range cs {
			if err := conntest.DiffKeys(wants[c.Name], conntest.RowVersions(t, h.store, c.Name)); err != nil {
				return fmt.Errorf("%s: %w", c.Name, err)
			}
		}
		return nil
	})
	// Each cluster's rows came to equal its truth with their last change
	// (which may come before the other clusters' bursts ended).
	took := -time.Hour
	for _, c := range cs {
		took = max(took, h.rec.LastChange(c.Name).Sub(burstDone))
	}
	t.Logf("3 clusters converged %s after the burst ended", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("converged %s after the burst, want within 2s", took)
	}
	ks, ok := h.store.Get(index.Key{Cluster: "conv-b", Group: "kustomize.toolkit.fluxcd.io", Kind: "Kustomization", Namespace: "ns-0", Name: "apps"})
	if !ok || ks.Status != index.StatusUnhealthy || !strings.Contains(ks.Message, "burst broke it") {
		t.Errorf("Kustomization after the burst: %+v", ks)
	}
}

func TestStopDetectionAndRecovery(t *testing.T) {
	cs := startClusters(t, testcluster.Options{Name: "kill-a"}, testcluster.Options{Name: "kill-b"})
	a, b := cs[0], cs[1]
	seeded(t, a, false, false, 2)
	h := newHarness(t, Options{}, specFor(a), specFor(b))
	h.rec.WaitFor(t, a.Name, index.StateConnected, 1, 60*time.Second)
	h.rec.WaitFor(t, b.Name, index.StateConnected, 1, 60*time.Second)
	before := conntest.RowVersions(t, h.store, a.Name)

	stopped := time.Now()
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	at := h.rec.WaitFor(t, a.Name, index.StateDisconnected, 1, 10*time.Second)
	t.Logf("DISCONNECTED %s after Stop", at.Sub(stopped).Round(time.Millisecond))
	if d := at.Sub(stopped); d > 2*time.Second {
		t.Errorf("DISCONNECTED %s after Stop, want within 2s", d)
	}

	// Rows stay queryable and are marked stale; the other cluster is
	// untouched.
	if err := conntest.DiffKeys(before, conntest.RowVersions(t, h.store, a.Name)); err != nil {
		t.Errorf("rows changed while disconnected: %v", err)
	}
	page, err := h.store.Query(t.Context(), index.Query{Filter: index.Filter{Clusters: []string{a.Name, b.Name}}, Access: &index.Access{All: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.StaleClusters) != 1 || page.StaleClusters[0] != a.Name {
		t.Errorf("stale clusters %v, want [%s]", page.StaleClusters, a.Name)
	}
	for _, e := range page.Edges {
		if e.Stale != (e.Object.Cluster == a.Name) {
			t.Errorf("row %s stale=%v", e.Object.Key(), e.Stale)
		}
	}
	row, _ := h.store.GetCluster(nil, a.Name)
	if row.LastError == "" || row.LastSeen.IsZero() || row.Since.Before(stopped) {
		t.Errorf("cluster row while down: %+v", row)
	}

	if err := a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ready := time.Now()
	at = h.rec.WaitFor(t, a.Name, index.StateConnected, 2, 20*time.Second)
	t.Logf("CONNECTED %s after the API server was ready", at.Sub(ready).Round(time.Millisecond))
	if d := at.Sub(ready); d > 5*time.Second {
		t.Errorf("CONNECTED %s after the API server was ready, want within 5s", d)
	}
	if n := h.rec.Count(b.Name, index.StateDisconnected); n != 0 {
		t.Errorf("the other cluster saw %d disconnections", n)
	}
	if n := h.rec.Count(a.Name, index.StateDisconnected); n != 1 {
		t.Errorf("%d DISCONNECTED events for one outage", n)
	}
}

// outage runs a fault that the API server survives (freeze, black hole),
// changes objects behind fleetgraph's back through the direct connection,
// ends the fault, and checks detection, recovery and resync.
func outage(t *testing.T, name string, start func(c *testcluster.Cluster) error, end func(c *testcluster.Cluster) (time.Time, error)) {
	c := startClusters(t, testcluster.Options{Name: name})[0]
	seeded(t, c, false, false, 2)
	h := newHarness(t, Options{}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)

	began := time.Now()
	if err := start(c); err != nil {
		t.Fatal(err)
	}
	at := h.rec.WaitFor(t, c.Name, index.StateDisconnected, 1, 20*time.Second)
	t.Logf("DISCONNECTED %s after the fault", at.Sub(began).Round(time.Millisecond))
	if d := at.Sub(began); d > 6*time.Second {
		t.Errorf("DISCONNECTED %s after the fault, want within 6s", d)
	}

	ended, err := end(c)
	if err != nil {
		t.Fatal(err)
	}
	at = h.rec.WaitFor(t, c.Name, index.StateConnected, 2, 20*time.Second)
	t.Logf("CONNECTED %s after the fault ended", at.Sub(ended).Round(time.Millisecond))
	if d := at.Sub(ended); d > 5*time.Second {
		t.Errorf("CONNECTED %s after the fault ended, want within 5s", d)
	}
	want := conntest.Truth(t, c, h.store.Kinds(c.Name))
	conntest.Eventually(t, 2*time.Second, "resync", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, c.Name)) })
	if n := h.rec.Count(c.Name, index.StateDisconnected); n != 1 {
		t.Errorf("%d DISCONNECTED events for one outage", n)
	}
}

// changeBehindTheBack creates, modifies and deletes objects through the
// direct connection.
func changeBehindTheBack(c *testcluster.Cluster) error {
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.CoreV1().Pods("ns-0").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "during-outage"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := kube.CoreV1().Services("ns-1").Delete(ctx, "svc-1", metav1.DeleteOptions{}); err != nil {
		return err
	}
	pod, err := kube.CoreV1().Pods("ns-1").Get(ctx, "pod-0", metav1.GetOptions{})
	if err != nil {
		return err
	}
	pod.Labels["changed"] = "during-outage"
	_, err = kube.CoreV1().Pods("ns-1").Update(ctx, pod, metav1.UpdateOptions{})
	return err
}

func TestBlackHoleDetectionAndResync(t *testing.T) {
	t.Parallel()
	outage(t, "blackhole",
		func(c *testcluster.Cluster) error { c.Proxy.BlackHole(); return nil },
		func(c *testcluster.Cluster) (time.Time, error) {
			// The API server still works: change it while fleetgraph
			// cannot see, then heal the network.
			if err := changeBehindTheBack(c); err != nil {
				return time.Time{}, err
			}
			c.Proxy.Restore()
			return time.Now(), nil
		})
}

func TestFreezeDetectionAndResync(t *testing.T) {
	t.Parallel()
	outage(t, "freeze",
		func(c *testcluster.Cluster) error { return c.Freeze() },
		func(c *testcluster.Cluster) (time.Time, error) {
			// Nothing answers while frozen, so change objects right
			// after the thaw, racing fleetgraph's resync.
			if err := c.Thaw(); err != nil {
				return time.Time{}, err
			}
			thawed := time.Now()
			return thawed, changeBehindTheBack(c)
		})
}

func TestFlapping(t *testing.T) {
	const cycles = 20
	c := startClusters(t, testcluster.Options{Name: "flap"})[0]
	h := newHarness(t, Options{}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	for i := 1; i <= cycles; i++ {
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		h.rec.WaitFor(t, c.Name, index.StateDisconnected, i, 10*time.Second)
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		h.rec.WaitFor(t, c.Name, index.StateConnected, i+1, 20*time.Second)
	}
	// Let any spurious reconnect show itself.
	time.Sleep(3 * time.Second)
	if d, cn := h.rec.Count(c.Name, index.StateDisconnected), h.rec.Count(c.Name, index.StateConnected); d != cycles || cn != cycles+1 {
		t.Fatalf("%d cycles: %d DISCONNECTED and %d CONNECTED (want %d and %d, counting the first connect): %v",
			cycles, d, cn, cycles, cycles+1, h.rec.Of(c.Name))
	}
	stale := testutil.ToFloat64(h.mgr.metrics.staleSignals.WithLabelValues(c.Name))
	t.Logf("%d cycles: signals from older connections ignored: %v", cycles, stale)
}

func TestPartialDataWithoutFlux(t *testing.T) {
	t.Parallel()
	c := startClusters(t, testcluster.Options{Name: "noflux"})[0]
	seeded(t, c, false, true, 2)
	installIstiod(t, c)
	h := newHarness(t, Options{}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)

	row, _ := h.store.GetCluster(nil, c.Name)
	if row.Metadata["istio.revisions"] != "canary" || row.Metadata["istio.versions"] != "1.31.1" ||
		row.Metadata["istio.trustDomain"] != "example.org" || !strings.HasPrefix(row.Metadata["kubernetes.version"], "v1.35") {
		t.Errorf("cluster metadata %v", row.Metadata)
	}

	errs := h.store.KindErrors(nil, c.Name)
	flux := map[string]bool{}
	for _, e := range errs {
		if !strings.Contains(e.Kind.Group, "fluxcd.io") {
			t.Errorf("unexpected kind error %s: %s", e.Kind.GroupKind(), e.Error)
		}
		flux[e.Kind.Kind] = true
		if !strings.Contains(e.Error, "not served") {
			t.Errorf("kind error of %s does not say why: %q", e.Kind.Kind, e.Error)
		}
	}
	if len(flux) != 7 {
		t.Errorf("%d Flux kinds reported missing, want 7: %v", len(flux), errs)
	}
	want := conntest.Truth(t, c, h.store.Kinds(c.Name))
	conntest.Eventually(t, 5*time.Second, "sync", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, c.Name)) })
}

// installIstiod creates what an Istio control plane leaves in
// istio-system: an istiod deployment of revision "canary" and its mesh
// config.
func installIstiod(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	ctx := t.Context()
	kube := c.Client()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "istiod", "istio.io/rev": "canary"}
	if _, err := kube.AppsV1().Deployments("istio-system").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "istiod-canary", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "discovery", Image: "docker.io/istio/pilot:1.31.1"}}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps("istio-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-canary"},
		Data:       map[string]string{"mesh": "trustDomain: example.org\nrootNamespace: istio-system\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestHTTP2HealthCheckDetectsHalfOpen turns the probe loop off (a probe an
// hour) so that only the HTTP/2 health check can notice a black hole: it
// closes the silent connection, the watches on it fail, and their failure
// triggers the probe that confirms the loss.
func TestHTTP2HealthCheckDetectsHalfOpen(t *testing.T) {
	t.Parallel()
	c := startClusters(t, testcluster.Options{Name: "halfopen"})[0]
	h := newHarness(t, Options{ProbeInterval: time.Hour, HTTP2ReadIdle: time.Second, HTTP2PingTimeout: time.Second}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	began := time.Now()
	c.Proxy.BlackHole()
	at := h.rec.WaitFor(t, c.Name, index.StateDisconnected, 1, 20*time.Second)
	t.Logf("DISCONNECTED %s after the black hole, by HTTP/2 health check", at.Sub(began).Round(time.Millisecond))
	c.Proxy.Restore()
	h.rec.WaitFor(t, c.Name, index.StateConnected, 2, 20*time.Second)
}

func TestBadSourcesDoNotStopOthers(t *testing.T) {
	t.Parallel()
	good := startClusters(t, testcluster.Options{Name: "good"})[0]
	dir := t.TempDir()

	// One kubeconfig: a good context, a context naming a missing user, and
	// one pointing at a closed port.
	cfg := good.KubeconfigFor(testcluster.AdminUser)
	cfg.Contexts["no-user"] = &clientcmdapi.Context{Cluster: good.Name, AuthInfo: "nobody"}
	cfg.Clusters["closed"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", CertificateAuthorityData: good.CAData()}
	cfg.Contexts["unreachable"] = &clientcmdapi.Context{Cluster: "closed", AuthInfo: good.Name + "-" + testcluster.AdminUser}
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	specs, err := KubeconfigSpecs(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, Options{ExcludeNamespaces: []string{"kube-system"}}, specs...)
	h.rec.WaitFor(t, good.Name, index.StateConnected, 1, 60*time.Second)
	for key := range conntest.RowVersions(t, h.store, good.Name) {
		if strings.Contains(key, "/kube-system/") || strings.HasSuffix(key, "/kube-system") {
			t.Errorf("excluded namespace collected: %s", key)
		}
	}
	if _, ok := h.store.Get(index.Key{Cluster: good.Name, Kind: "Namespace", Name: "default"}); !ok {
		t.Error("namespace default missing")
	}
	h.rec.WaitFor(t, "unreachable", index.StateDisconnected, 1, 20*time.Second)
	h.rec.WaitFor(t, "no-user", index.StateDisconnected, 1, 20*time.Second)
	for name, want := range map[string]string{"unreachable": "connection refused", "no-user": `names user "nobody"`} {
		row, _ := h.store.GetCluster(nil, name)
		if !strings.Contains(row.LastError, want) {
			t.Errorf("cluster %s: lastError %q does not mention %q", name, row.LastError, want)
		}
	}

	// A kubeconfig that does not parse is a clear error at start.
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("{not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := KubeconfigSpecs(bad, nil); err == nil {
		t.Error("a broken kubeconfig was accepted")
	}
	if _, err := KubeconfigSpecs(path, []string{"missing"}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing context: %v", err)
	}
}
