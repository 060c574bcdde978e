package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// richValues turn on everything the chart can render in manager mode.
var richValues = map[string]any{
	"rbac":    map[string]any{"collectThisCluster": true},
	"ingress": map[string]any{"enabled": true, "className": "nginx", "tls": []any{map[string]any{"hosts": []string{"fleetgraph.example.com"}, "secretName": "tls"}}},
	"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
	"auth":    map[string]any{"tokensSecret": "tokens", "adminGroups": []string{"platform"}, "oidc": map[string]any{"issuerURL": "https://issuer.example", "clientID": "fleetgraph"}},
	"edge":    map[string]any{"tokensSecret": "edge-tokens"},
	"sources": map[string]any{
		"names":                   []string{"gitopscluster", "capi", "argocd", "clusterprofile", "secrets", "kubeconfig"},
		"clusterProfileProviders": map[string]any{"providers": []any{map[string]any{"name": "p", "execConfig": map[string]any{"command": "x"}}}},
		"kubeconfigSecret":        "kubeconfig", "clusterLabels": []string{"env=prod"},
	},
	"networkPolicy": map[string]any{"ingressFrom": []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"name": "ingress"}}}}},
}

// TestChartManifestsAccepted renders the chart in every mode and has a real
// API server accept each manifest with a server-side dry run (dryRun=All:
// validated and admitted, not stored).
func TestChartManifestsAccepted(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "chart"})
	ctx := t.Context()
	if err := c.InstallCRDs(ctx, testcluster.MonitoringCRDs); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	for _, ns := range []string{"fleetgraph", "argocd", "istio-system"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dyn := dynamic.NewForConfigOrDie(c.DirectConfig)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(c.DirectConfig)))
	type chartCase struct {
		name   string
		values map[string]any
	}
	var cases []chartCase
	for _, c := range nonHACases { // the renderings without HA
		cases = append(cases, chartCase{strings.TrimSuffix(c.file, ".yaml"), c.values})
	}
	for _, tc := range append(cases, []chartCase{
		{"manager HA", haValues("nats://nats:4222")},
		{"manager HA, hard anti-affinity, own resources", map[string]any{"ha": map[string]any{
			"enabled": true, "nats": map[string]any{"url": "nats://nats:4222"}, "antiAffinity": "hard",
			"query": map[string]any{"replicas": 3, "resources": map[string]any{"requests": map[string]any{"memory": "4Gi"}}},
		}}},
	}...) {
		t.Run(tc.name, func(t *testing.T) {
			objs := mustRender(t, "fleetgraph", "fleetgraph", tc.values)
			kinds := map[string]bool{}
			for _, o := range objs {
				gvk := o.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
				}
				ns := o.GetNamespace()
				if ns == "" && m.Scope.Name() == "namespace" {
					ns = "fleetgraph" // helm install puts them in the release's namespace
				}
				var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
				if m.Scope.Name() == "namespace" {
					ri = dyn.Resource(m.Resource).Namespace(ns)
				}
				if _, err := ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
					t.Errorf("%s %s/%s refused: %v", gvk.Kind, ns, o.GetName(), err)
				}
				kinds[gvk.Kind] = true
			}
			t.Logf("accepted %d objects: %v", len(objs), kinds)
		})
	}
}

// TestChartRBACIsEnoughAndNoMore applies the chart's ServiceAccounts, roles
// and bindings to a real management cluster (manager mode) and to two real
// leaves (leaf mode), runs `fleetgraph serve` with those ServiceAccounts'
// tokens only, and checks that every kind is collected from both leaves,
// that object details work through impersonation, and that the leaves
// refuse fleetgraph anything outside its role (their Secrets).
func TestChartRBACIsEnoughAndNoMore(t *testing.T) {
	cs := testcluster.StartAll(t,
		testcluster.Options{Name: "mgmt"},
		testcluster.Options{Name: "leaf-1", Users: []testcluster.User{{Name: "alice"}}},
		testcluster.Options{Name: "leaf-2"})
	mgmt, leaves := cs[0], cs[1:]
	ctx := t.Context()
	const ns = "fleetgraph"

	// The leaves: every kind's CRDs, objects, istiod's namespace, and the
	// chart's leaf RBAC.
	leafToken := map[string]string{}
	for _, leaf := range leaves {
		if err := leaf.InstallFluxCRDs(ctx); err != nil {
			t.Fatal(err)
		}
		if err := leaf.InstallIstioCRDs(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Seed(ctx, testcluster.SeedOptions{Namespaces: 1, Pods: 2, Services: 1, Flux: true, Istio: true}); err != nil {
			t.Fatal(err)
		}
		createNamespaces(t, leaf, ns, "istio-system")
		applyRBAC(t, leaf, mustRender(t, "fleetgraph", ns, map[string]any{"mode": "leaf", "collect": map[string]any{"istioNamespace": "istio-system"}}))
		tok, err := leaf.ServiceAccountToken(ctx, ns, "fleetgraph", "fleetgraph-token-test")
		if err != nil {
			t.Fatal(err)
		}
		leafToken[leaf.Name] = tok
	}
	// alice may read pods in leaf-1's ns-0, nothing else.
	if _, err := leaves[0].Client().RbacV1().RoleBindings("ns-0").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The management cluster: the chart's manager RBAC for the secrets and
	// capi sources; leaf-1 as a labelled Secret, leaf-2 as a Cluster API
	// Cluster, each with its leaf ServiceAccount's token.
	if err := mgmt.InstallSourceCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	createNamespaces(t, mgmt, ns, "clusters")
	applyRBAC(t, mgmt, mustRender(t, "fleetgraph", ns, map[string]any{"sources": map[string]any{"names": []string{"secrets", "capi"}}}))
	mgmtKube := mgmt.Client()
	kc := func(leaf *testcluster.Cluster) []byte {
		data, err := clientcmd.Write(*leaf.KubeconfigForToken(leafToken[leaf.Name]))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if _, err := mgmtKube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "leaf-1", Labels: map[string]string{"fleetgraph.io/cluster": "true", "env": "prod"}},
		Data:       map[string][]byte{"kubeconfig": kc(leaves[0])},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mgmtKube.CoreV1().Secrets("clusters").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "leaf-2-kubeconfig"},
		Data:       map[string][]byte{"value": kc(leaves[1])},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	capi := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
		"metadata": map[string]any{"name": "leaf-2", "namespace": "clusters", "labels": map[string]any{"env": "staging"}},
		"spec":     map[string]any{},
	}}
	if _, err := dynamic.NewForConfigOrDie(mgmt.DirectConfig).Resource(gvrCAPI).Namespace("clusters").Create(ctx, capi, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mgmtToken, err := mgmt.ServiceAccountToken(ctx, ns, "fleetgraph", "fleetgraph-token-test")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mgmtKubeconfig := filepath.Join(dir, "management")
	if err := clientcmd.WriteToFile(*mgmt.KubeconfigForToken(mgmtToken), mgmtKubeconfig); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte("root-token,root,1,\"admins\"\nalice-token,alice,2\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	f := serveFlags{
		listen: addr, tokensFile: tokens, adminGroups: []string{"admins"}, relist: 30 * time.Second, mgmtKubeconfig: mgmtKubeconfig,
		scopeFlags: scopeFlags{sourceNames: []string{"secrets", "capi"}, secretNamespace: ns, secretSelector: "fleetgraph.io/cluster=true"},
	}
	runServe(t, &f)
	url := "http://" + addr

	// Ready: both sources listed, both leaves synced; every kind collected.
	wantKinds := len(collector.NewRegistry().Adapters())
	deadline := time.Now().Add(90 * time.Second)
	for {
		var r struct {
			Clusters []struct {
				Name   string
				Labels []struct{ Key, Value string }
				Sync   struct {
					Synced     bool
					Kinds      int
					KindErrors []struct{ Kind, Error string }
				}
				Connection struct {
					State     string
					LastError *string
				}
			}
		}
		err := gql(url, "root-token", `{ clusters { name labels { key value } sync { synced kinds kindErrors { kind error } } connection { state lastError } } }`, &r)
		ready := err == nil && len(r.Clusters) == 2
		for _, c := range r.Clusters {
			ready = ready && c.Connection.State == "CONNECTED" && c.Sync.Synced && c.Sync.Kinds == wantKinds && len(c.Sync.KindErrors) == 0
		}
		if ready && httpStatus(t, url+"/readyz") == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leaves were not fully collected with the chart's RBAC (want %d kinds each, no kind errors): %v %+v", wantKinds, err, r.Clusters)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// Object details go through impersonation: alice reads her pod, and the
	// leaf denies her another namespace's.
	var detail struct {
		Object *struct{ Name, ResourceVersion string }
	}
	if err := gql(url, "alice-token", `{ object(cluster: "leaf-1", kind: "Pod", namespace: "ns-0", name: "pod-0") { name resourceVersion } }`, &detail); err != nil || detail.Object == nil || detail.Object.Name != "pod-0" {
		t.Errorf("alice's object detail through impersonation: %+v, %v", detail.Object, err)
	}
	if _, err := leaves[0].Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "private"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = gql(url, "alice-token", `{ object(cluster: "leaf-1", kind: "Namespace", name: "private") { name } }`, &detail)
	if err == nil || !strings.Contains(err.Error(), "FORBIDDEN") {
		t.Errorf("alice read a namespace she may not: %v", err)
	}

	// No more than the role: the leaves refuse fleetgraph's token their
	// Secrets and any write.
	for _, leaf := range leaves {
		kube := kubernetes.NewForConfigOrDie(leaf.TokenConfig(leafToken[leaf.Name]))
		if _, err := kube.CoreV1().Secrets("ns-0").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: listing Secrets with fleetgraph's token: %v, want Forbidden", leaf.Name, err)
		}
		if _, err := kube.CoreV1().Secrets(ns).Get(ctx, "fleetgraph-token-test", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: reading a Secret with fleetgraph's token: %v, want Forbidden", leaf.Name, err)
		}
		if err := kube.CoreV1().Pods("ns-0").Delete(ctx, "pod-0", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: deleting a pod with fleetgraph's token: %v, want Forbidden", leaf.Name, err)
		}
	}
	// In the management cluster the manager reads its sources and writes
	// nothing (the capi source reads Secrets cluster-wide, by design).
	mkube := kubernetes.NewForConfigOrDie(mgmt.TokenConfig(mgmtToken))
	if _, err := mkube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("management: creating a Secret with fleetgraph's token: %v, want Forbidden", err)
	}
	if _, err := mkube.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("management: listing pods with fleetgraph's token (no leaf role there): %v, want Forbidden", err)
	}
}

var gvrCAPI = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters"}

func createNamespaces(t *testing.T, c *testcluster.Cluster, names ...string) {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	for _, n := range names {
		if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// applyRBAC creates the ServiceAccounts, roles and bindings among objs, as
// helm install would, in the release namespace "fleetgraph".
func applyRBAC(t *testing.T, c *testcluster.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(c.DirectConfig)
	n := 0
	for _, o := range objs {
		var res string
		switch o.GetKind() {
		case "ServiceAccount":
			res = "serviceaccounts"
		case "ClusterRole":
			res = "clusterroles"
		case "ClusterRoleBinding":
			res = "clusterrolebindings"
		case "Role":
			res = "roles"
		case "RoleBinding":
			res = "rolebindings"
		default:
			continue
		}
		gvr := schema.GroupVersionResource{Group: o.GroupVersionKind().Group, Version: o.GroupVersionKind().Version, Resource: res}
		var ri dynamic.ResourceInterface = dyn.Resource(gvr)
		if !strings.HasPrefix(o.GetKind(), "Cluster") {
			ns := o.GetNamespace()
			if ns == "" {
				ns = "fleetgraph"
			}
			ri = dyn.Resource(gvr).Namespace(ns)
		}
		if _, err := ri.Create(t.Context(), o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("the chart rendered no RBAC")
	}
}

// gql posts a query and decodes its data into out; GraphQL errors come
// back as an error holding their codes.
func gql(url, token, query string, out any) error {
	body, err := json.Marshal(map[string]string{"query": query})
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, url+"/graphql", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var r struct {
		Data   json.RawMessage
		Errors []struct {
			Message    string
			Extensions map[string]any
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("HTTP %d: %w", resp.StatusCode, err)
	}
	if len(r.Errors) > 0 {
		return fmt.Errorf("%v %s", r.Errors[0].Extensions["code"], r.Errors[0].Message)
	}
	return json.Unmarshal(r.Data, out)
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestReadyzWaitsForSources: /readyz is 503 until every configured source
// has listed once (here, until the Cluster API CRD exists), saying why, and
// a cluster that can only report an error does not hold readiness back.
func TestReadyzWaitsForSources(t *testing.T) {
	mgmt := testcluster.Start(t, testcluster.Options{Name: "ready-mgmt"})
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte("root-token,root,1,\"admins\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	f := serveFlags{
		listen: addr, tokensFile: tokens, adminGroups: []string{"admins"}, relist: 30 * time.Second, mgmtKubeconfig: mgmt.Kubeconfig,
		scopeFlags: scopeFlags{sourceNames: []string{"capi"}},
	}
	runServe(t, &f)
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	waitFor := func(what string, ok func(code int, body string) bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			code, body := readyz()
			if ok(code, body) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz %d %q", what, code, body)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor("unready for want of the CRD", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "source capi") && strings.Contains(body, "install its CRD")
	})
	if err := mgmt.InstallSourceCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
	broken := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
		"metadata": map[string]any{"name": "broken", "namespace": "default"}, "spec": map[string]any{},
	}}
	if _, err := dynamic.NewForConfigOrDie(mgmt.DirectConfig).Resource(gvrCAPI).Namespace("default").Create(t.Context(), broken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("ready once capi listed, with its one cluster in error", func(code int, _ string) bool { return code == http.StatusOK })
	var r struct {
		Clusters []struct {
			Name       string
			Connection struct {
				State     string
				LastError *string
			}
		}
	}
	if err := gql("http://"+addr, "root-token", `{ clusters { name connection { state lastError } } }`, &r); err != nil || len(r.Clusters) != 1 ||
		r.Clusters[0].Connection.State != "DISCONNECTED" || r.Clusters[0].Connection.LastError == nil || !strings.Contains(*r.Clusters[0].Connection.LastError, "broken-kubeconfig") {
		t.Errorf("the broken cluster: %+v, %v", r.Clusters, err)
	}
}

// runServe runs `fleetgraph serve` in-process with f until the test ends.
func runServe(t *testing.T, f *serveFlags) {
	t.Helper()
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(runCtx, f, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
}
