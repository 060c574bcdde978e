package main

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
	"github.com/fleetgraph/fleetgraph/replication"
)

var updateGolden = flag.Bool("update", false, "rewrite the chart's golden renderings in testdata/chart (TestChartWithoutHAUnchanged)")

// nonHACases are the chart's renderings that ha.enabled=false must leave
// as they were before the HA mode existed.
var nonHACases = []struct {
	file   string
	values map[string]any
}{
	{"manager-defaults.yaml", map[string]any{}},
	{"manager-everything.yaml", richValues},
	{"leaf.yaml", map[string]any{"mode": "leaf", "collect": map[string]any{"istioNamespace": "istio-system"}}},
	{"edge.yaml", map[string]any{"mode": "edge", "edge": map[string]any{"managerURL": "https://m/edge", "cluster": "leaf-1", "tokenSecret": "t"}}},
}

// TestChartWithoutHAUnchanged renders the chart without HA (ha left out,
// and ha.enabled=false) and compares the output byte for byte with
// testdata/chart, which was rendered from the chart as it was on main
// before the HA mode (606afe0), since rewritten on purpose: the relist
// default went from 30s to 5m (f3814e3); an edge serves its /metrics on the
// metrics port (edge.yaml, review-s10-rest L7). A change to what the chart renders without
// HA must rewrite them on purpose: go test -run TestChartWithoutHAUnchanged -update.
func TestChartWithoutHAUnchanged(t *testing.T) {
	for _, tc := range nonHACases {
		t.Run(tc.file, func(t *testing.T) {
			golden := filepath.Join("testdata", "chart", tc.file)
			got := renderText(t, "fleetgraph", "fleetgraph", tc.values)
			if *updateGolden {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			off := maps.Clone(tc.values)
			off["ha"] = map[string]any{"enabled": false, "nats": map[string]any{"url": "nats://nats:4222"}}
			for name, out := range map[string][]byte{"without ha": got, "ha.enabled=false": renderText(t, "fleetgraph", "fleetgraph", off)} {
				if !bytes.Equal(out, want) {
					t.Errorf("%s: the rendering differs from %s (rendered before the HA mode):\n%s", name, golden, lineDiff(string(want), string(out)))
				}
			}
		})
	}
}

// renderText runs helm template with values and returns its output.
func renderText(t *testing.T, release, namespace string, values map[string]any) []byte {
	t.Helper()
	out, err := renderRaw(t, release, namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// lineDiff names the first line where got differs from want.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\nwant %q\ngot  %q", i+1, wl, gl)
		}
	}
	return "equal"
}

// haValues turn the HA mode on, on top of everything else the manager can
// render.
func haValues(natsURL string) map[string]any {
	v := maps.Clone(richValues)
	v["ha"] = map[string]any{"enabled": true, "nats": map[string]any{"url": natsURL}}
	return v
}

// workloads returns the rendered Deployments and StatefulSets by
// app.kubernetes.io/component, with their container's arguments.
func workloads(t *testing.T, objs []*unstructured.Unstructured) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "StatefulSet" {
			continue
		}
		component, _, _ := unstructured.NestedString(o.Object, "spec", "template", "metadata", "labels", "app.kubernetes.io/component")
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		var args []string
		for _, a := range containers[0].(map[string]any)["args"].([]any) {
			args = append(args, a.(string))
		}
		if _, dup := out[component]; dup {
			t.Fatalf("two workloads of component %s", component)
		}
		out[component] = args
	}
	return out
}

// TestChartHARoles checks what each HA role is given: the collector its
// sources, edge tokens, NATS and leases in the release's namespace, and
// no authenticator; the query replica NATS and the authenticator, no
// sources, and no API token; and that the non-HA workload is gone.
func TestChartHARoles(t *testing.T) {
	objs := mustRender(t, "fleetgraph", "fleetgraph", haValues("nats://nats-0.nats:4222,nats://nats-1.nats:4222"))
	w := workloads(t, objs)
	if len(w) != 2 || w["collector"] == nil || w["query"] == nil {
		t.Fatalf("HA workloads %v, want a collector and a query one", slices.Sorted(maps.Keys(w)))
	}
	has := func(role string, args []string, want, wantNot []string) {
		t.Helper()
		for _, a := range want {
			if !slices.Contains(args, a) {
				t.Errorf("%s lacks %s: %q", role, a, args)
			}
		}
		for _, p := range wantNot {
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, p) }) {
				t.Errorf("%s has %s: %q", role, p, args)
			}
		}
	}
	nats := "--nats-url=nats://nats-0.nats:4222,nats://nats-1.nats:4222"
	has("collector", w["collector"],
		[]string{
			"--role=collector", nats, "--nats-stream-replicas=3", "--collector-id=$(POD_NAME)", "--lease-namespace=fleetgraph", "--lease-duration=15s",
			"--edge-tokens-file=/etc/fleetgraph/edge/edge-tokens.csv", "--kubeconfig=/etc/fleetgraph/kubeconfig/kubeconfig",
		},
		[]string{"--tokens-file", "--oidc-", "--admin-group"})
	has("query", w["query"],
		[]string{"--role=query", nats, "--tokens-file=/etc/fleetgraph/auth/tokens.csv", "--admin-group=platform", "--oidc-issuer=https://issuer.example"},
		[]string{"--source", "--kubeconfig", "--edge-tokens-file", "--collector-id", "--lease-"})
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()+" "+o.GetName()]++
		if o.GetKind() == "Deployment" && o.GetName() == "fleetgraph-query" {
			if v, _, _ := unstructured.NestedBool(o.Object, "spec", "template", "spec", "automountServiceAccountToken"); v {
				t.Error("the query replicas mount an API token")
			}
		}
	}
	for _, k := range []string{
		"StatefulSet fleetgraph-collector", "Deployment fleetgraph-query", "Service fleetgraph", "Service fleetgraph-collector",
		"PodDisruptionBudget fleetgraph-collector", "PodDisruptionBudget fleetgraph-query", "Role fleetgraph-leases", "RoleBinding fleetgraph-leases",
	} {
		if kinds[k] != 1 {
			t.Errorf("%s rendered %d times, want once", k, kinds[k])
		}
	}
	for _, k := range []string{"Deployment fleetgraph", "PodDisruptionBudget fleetgraph"} {
		if kinds[k] != 0 {
			t.Errorf("HA still renders the single process's %s", k)
		}
	}
}

// TestChartHAProcesses runs the real binary with the arguments the chart
// renders for each HA role, as a pod would get them: a collector with
// only the chart's RBAC in a real management cluster (its ServiceAccount's
// token, which a pod's in-cluster config gives it), and a query replica
// with no Kubernetes credentials at all, on a NATS JetStream server. The
// collector writes its own Lease and the cluster's in the release's
// namespace and collects the cluster its labelled Secret names; the query
// replica is ready from the stream and serves it. A verb missing from the
// chart's lease Role, or an argument the binary reads differently, fails
// here. (TestReplicatedProcesses covers failover and fencing.)
func TestChartHAProcesses(t *testing.T) {
	testcluster.Require(t)
	helmBinary(t)
	mgmt := testcluster.Start(t, testcluster.Options{Name: "ha-mgmt"})
	ctx := t.Context()
	const ns = "fleetgraph"
	dir := t.TempDir()
	createNamespaces(t, mgmt, ns)

	srv, err := replication.StartEmbedded(replication.EmbeddedOptions{Dir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0", Name: "nats-0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	objs := mustRender(t, "fleetgraph", ns, map[string]any{
		"auth": map[string]any{"tokensSecret": "tokens", "adminGroups": []string{"admins"}},
		"ha": map[string]any{
			"enabled": true, "nats": map[string]any{"url": srv.ClientURL(), "streamReplicas": 1},
			"collector": map[string]any{"replicas": 1, "leaseDuration": "5s"},
		},
	})
	applyRBAC(t, mgmt, objs)
	token, err := mgmt.ServiceAccountToken(ctx, ns, "fleetgraph", "fleetgraph-token-test")
	if err != nil {
		t.Fatal(err)
	}
	inCluster := filepath.Join(dir, "in-cluster")
	if err := clientcmd.WriteToFile(*mgmt.KubeconfigForToken(token), inCluster); err != nil {
		t.Fatal(err)
	}
	// The cluster to collect: the management cluster itself, as the
	// secrets source (the chart's default) finds it.
	kc, err := clientcmd.Write(*mgmt.KubeconfigFor(testcluster.AdminUser))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgmt.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "self", Labels: map[string]string{"fleetgraph.io/cluster": "true"}},
		Data:       map[string][]byte{"kubeconfig": kc},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte("root-token,root,1,\"admins\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	bin := buildFleetgraph(t, dir)
	w := workloads(t, objs)
	// run starts a role with the chart's arguments, as the kubelet would
	// (the pod name in $(POD_NAME), the mounted files at their paths),
	// on free loopback ports.
	run := func(role string, extra ...string) string {
		addr := freeAddr(t)
		var args []string
		for _, a := range w[role] {
			switch {
			case a == "--listen=:8080":
				a = "--listen=" + addr
			case strings.HasPrefix(a, "--metrics-listen="):
				a = "--metrics-listen=" + freeAddr(t)
			case a == "--tokens-file=/etc/fleetgraph/auth/tokens.csv":
				a = "--tokens-file=" + tokens
			case strings.HasPrefix(a, "/") || strings.Contains(a, "=/etc/"):
				t.Fatalf("%s: argument %q reads a file this test does not provide", role, a)
			}
			args = append(args, strings.ReplaceAll(a, "$(POD_NAME)", "fleetgraph-collector-0"))
		}
		runBinary(t, bin, []string{"KUBECONFIG=/nonexistent", "HOME=" + dir}, append(args, extra...)...)
		return "http://" + addr
	}
	run("collector", "--management-kubeconfig="+inCluster)
	query := run("query")

	leases := mgmt.Client().CoordinationV1().Leases(ns)
	waitFor(t, "the collector holds its own lease and the cluster's", 90*time.Second, func() error {
		l, err := leases.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var names []string
		for _, x := range l.Items {
			if x.Spec.HolderIdentity != nil && strings.Contains(*x.Spec.HolderIdentity, "fleetgraph-collector-0") {
				names = append(names, x.Name)
			}
		}
		if len(names) < 2 {
			return fmt.Errorf("leases held by fleetgraph-collector-0: %v", names)
		}
		return nil
	})
	waitFor(t, "the query replica is ready and serves the collected cluster", 90*time.Second, func() error {
		if code := httpStatus(t, query+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz %d", code)
		}
		var r struct {
			Clusters []struct {
				Name       string
				Sync       struct{ Synced bool }
				Connection struct{ State string }
			}
		}
		if err := gql(query, "root-token", `{ clusters { name sync { synced } connection { state } } }`, &r); err != nil {
			return err
		}
		if len(r.Clusters) != 1 || r.Clusters[0].Connection.State != "CONNECTED" || !r.Clusters[0].Sync.Synced {
			return fmt.Errorf("clusters %+v", r.Clusters)
		}
		return nil
	})
}
