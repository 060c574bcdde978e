package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// fast keep-alive for tests: a dead link is noticed within 1.5 s.
const (
	testPing     = 300 * time.Millisecond
	testPongWait = 1500 * time.Millisecond
)

// startAgent runs an agent until the test ends (runAgent).
func startAgent(t *testing.T, opts AgentOptions) *Agent {
	t.Helper()
	a, _ := runAgent(t, opts)
	return a
}

// rowDocs renders every row of a cluster as JSON without UpdatedAt (the
// index's own observation time), keyed by identity.
func rowDocs(t *testing.T, store *index.Store, cluster string) map[string]string {
	out := map[string]string{}
	for _, o := range conntest.AllRows(t, store, cluster) {
		r := *o
		r.UpdatedAt = time.Time{}
		data, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		out[r.Key().String()] = string(data)
	}
	return out
}

func diffDocs(want, got map[string]string) error {
	for k, w := range want {
		if g, ok := got[k]; !ok {
			return fmt.Errorf("row %s missing", k)
		} else if g != w {
			return fmt.Errorf("row %s differs:\n got %s\nwant %s", k, g, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			return fmt.Errorf("row %s extra", k)
		}
	}
	return nil
}

func kindNames(kinds []index.Kind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.GroupKind()
	}
	slices.Sort(out)
	return out
}

// pullReference collects the cluster in pull mode into its own index:
// what the edge's manager must hold, row for row.
func pullReference(t *testing.T, c *testcluster.Cluster, cluster string) *index.Store {
	t.Helper()
	store := index.New(memtables.Open)
	clients, err := collector.NewClients(rest.CopyConfig(c.DirectConfig))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, err := collector.Start(ctx, collector.Config{Cluster: cluster, Clients: clients, Sink: store, Registry: collector.NewRegistry()})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); run.Wait() })
	return store
}

func TestEdgeRealCluster(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "edge-real"})
	ctx := t.Context()
	if err := c.InstallFluxCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.InstallIstioCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 4, Pods: 4, Services: 2, Flux: true, Istio: true}); err != nil {
		t.Fatal(err)
	}
	const name = "edge-a"
	h := newHubHarness(t, HubOptions{PingInterval: testPing, PongWait: testPongWait, Grace: 5 * time.Second})
	// The edge reaches the manager through a fault proxy.
	proxy, err := testcluster.NewProxy(strings.TrimPrefix(strings.TrimSuffix(h.url, "/edge"), "ws://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	started := time.Now()
	agent := startAgent(t, AgentOptions{
		Manager: "ws://" + proxy.Addr() + "/edge", Cluster: name, Local: rest.CopyConfig(c.DirectConfig),
		Metadata: map[string]string{"region": "eu-west-1", "environment": "test"},
	})
	at := h.rec.WaitFor(t, name, index.StateConnected, 1, 90*time.Second)
	t.Logf("CONNECTED %s after the agent started (discovery, lists, snapshot)", at.Sub(started).Round(time.Millisecond))

	t.Run("converges", func(t *testing.T) {
		kinds := h.store.Kinds(name)
		if len(kinds) != 24 { // 4 core + 9 Istio + 7 Flux + 4 RBAC
			t.Fatalf("%d kinds recorded, want 24: %v", len(kinds), kindNames(kinds))
		}
		want := conntest.Truth(t, c, kinds)
		conntest.Eventually(t, 5*time.Second, "rows equal the API server's objects", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, name)) })
		// Row for row, the manager holds what a pull collector makes.
		ref := pullReference(t, c, name)
		conntest.Eventually(t, 60*time.Second, "rows equal the pull collector's", func() error {
			if a, b := kindNames(ref.Kinds(name)), kindNames(kinds); !slices.Equal(a, b) {
				return fmt.Errorf("kinds %v vs %v", a, b)
			}
			return diffDocs(rowDocs(t, ref, name), rowDocs(t, h.store, name))
		})
		t.Logf("%d rows of %d kinds equal the cluster", len(want), len(kinds))
		row, _ := h.store.GetCluster(nil, name)
		if row.Mode != index.ModePush || !row.Synced || row.Metadata["region"] != "eu-west-1" ||
			!strings.HasPrefix(row.Metadata["kubernetes.version"], "v1.") {
			t.Errorf("cluster row: %+v", row)
		}
	})

	t.Run("deltas within 2s", func(t *testing.T) {
		conntest.Burst(t, c)
		done := time.Now()
		want := conntest.Truth(t, c, h.store.Kinds(name))
		conntest.Eventually(t, 10*time.Second, "convergence after the burst", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, name)) })
		// The rows came to equal the truth with their last change, however
		// long listing the truth and looking took.
		took := h.rec.LastChange(name).Sub(done)
		t.Logf("converged %s after the burst ended", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("converged %s after the burst, want within 2s", took.Round(time.Millisecond))
		}
		ks, ok := h.store.Get(index.Key{Cluster: name, Group: "kustomize.toolkit.fluxcd.io", Kind: "Kustomization", Namespace: "ns-0", Name: "apps"})
		if !ok || ks.Status != index.StatusUnhealthy || !strings.Contains(ks.Message, "burst broke it") {
			t.Errorf("Kustomization after the burst: %+v", ks)
		}
	})

	t.Run("detail as the viewer", func(t *testing.T) {
		kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
		if _, err := kube.RbacV1().Roles("ns-0").Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.RbacV1().RoleBindings("ns-0").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-reads-pods"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		get := func(user string) (string, error) {
			base, err := h.hub.RESTConfig(name)
			if err != nil {
				return "", err
			}
			cfg := rest.CopyConfig(base) // as graph does
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"viewers"}}
			dyn, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return "", err
			}
			obj, err := dyn.Resource(testcluster.GVRPod).Namespace("ns-0").Get(ctx, "pod-0", metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return obj.GetName() + "/" + string(obj.GetUID()), nil
		}
		want, _ := h.store.Get(index.Key{Cluster: name, Kind: "Pod", Namespace: "ns-0", Name: "pod-0"})
		conntest.Eventually(t, 10*time.Second, "alice reads the pod through the edge (RBAC caches settle)", func() error {
			got, err := get("alice")
			if err != nil {
				return err
			}
			if got != "pod-0/"+want.UID {
				return fmt.Errorf("got %s", got)
			}
			return nil
		})
		if _, err := get("bob"); !apierrors.IsForbidden(err) {
			t.Errorf("bob: %v, want 403 Forbidden from the leaf", err)
		}
		// The tunnel refuses writes and the edge refuses requests that do
		// not impersonate anyone.
		base, err := h.hub.RESTConfig(name)
		if err != nil {
			t.Fatal(err)
		}
		kubeAsManager := kubernetes.NewForConfigOrDie(base)
		if _, err := kubeAsManager.CoreV1().Pods("ns-0").Get(ctx, "pod-0", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("a request without impersonation: %v, want 403 from the edge", err)
		}
		if err := kubeAsManager.CoreV1().Pods("ns-0").Delete(ctx, "pod-0", metav1.DeleteOptions{}); err == nil {
			t.Error("a DELETE went through the tunnel")
		}
		if _, err := h.hub.RESTConfig("no-such-cluster"); err == nil {
			t.Error("RESTConfig of an unknown cluster succeeded")
		}
	})

	t.Run("disconnect and resync", func(t *testing.T) {
		before := h.rec.Count(name, index.StateDisconnected)
		kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
		proxy.BlackHole() // a half-open link: only keep-alives can tell
		lost := time.Now()
		at := h.rec.WaitFor(t, name, index.StateDisconnected, before+1, 10*time.Second)
		t.Logf("DISCONNECTED %s after the link was black-holed", at.Sub(lost).Round(time.Millisecond))
		if d := at.Sub(lost); d > 2*testPongWait+time.Second {
			t.Errorf("DISCONNECTED %s after the black hole, want within %s", d, 2*testPongWait+time.Second)
		}
		page, err := h.store.Query(ctx, index.Query{Filter: index.Filter{Clusters: []string{name}}, First: 1, Access: &index.Access{All: true}})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.StaleClusters) != 1 || len(page.Edges) != 1 || !page.Edges[0].Stale {
			t.Errorf("rows while disconnected: stale clusters %v, %d rows", page.StaleClusters, len(page.Edges))
		}
		// Change the cluster while the edge cannot report it.
		if err := kube.CoreV1().Pods("ns-1").Delete(ctx, "pod-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CoreV1().Pods("ns-1").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "while-away"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // let the edge's collector see it
		if _, ok := h.store.Get(index.Key{Cluster: name, Kind: "Pod", Namespace: "ns-1", Name: "pod-0"}); !ok {
			t.Error("a row went away while disconnected")
		}
		connected := h.rec.Count(name, index.StateConnected)
		proxy.Restore()
		restored := time.Now()
		at = h.rec.WaitFor(t, name, index.StateConnected, connected+1, 20*time.Second)
		t.Logf("CONNECTED %s after the link was restored", at.Sub(restored).Round(time.Millisecond))
		want := conntest.Truth(t, c, h.store.Kinds(name))
		conntest.Eventually(t, 5*time.Second, "resync after reconnect", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, name)) })
		time.Sleep(time.Second)
		if n := h.rec.Count(name, index.StateDisconnected); n != before+1 {
			t.Errorf("%d DISCONNECTED transitions for one outage", n-before)
		}
		if n := h.rec.Count(name, index.StateConnected); n != connected+1 {
			t.Errorf("%d CONNECTED transitions for one recovery", n-connected)
		}
		if s := agent.Stats(); s.Sessions < 2 {
			t.Errorf("agent stats %+v: want a second session", s)
		}
	})

	t.Run("chunked snapshot", func(t *testing.T) {
		// A manager with a 16 KiB message limit: the snapshot needs many
		// parts, and the result must equal the first manager's rows.
		small := newHubHarness(t, HubOptions{MaxMessageBytes: 16 << 10, PingInterval: testPing, PongWait: testPongWait})
		a2 := startAgent(t, AgentOptions{Manager: small.url, Cluster: name, Local: rest.CopyConfig(c.DirectConfig)})
		small.rec.WaitFor(t, name, index.StateConnected, 1, 60*time.Second)
		conntest.Eventually(t, 10*time.Second, "both managers hold the same rows", func() error {
			return diffDocs(rowDocs(t, h.store, name), rowDocs(t, small.store, name))
		})
		s := a2.Stats()
		t.Logf("agent stats with a 16 KiB limit: %+v", s)
		if s.Parts < 2*s.Snapshots || s.TooBig != 0 {
			t.Errorf("snapshots were not chunked: %+v", s)
		}
	})
}
