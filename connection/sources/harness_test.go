package sources_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/sources"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// execPluginEnv, when set, makes the test binary a client-go exec
// credential plugin (see execPlugin): the Argo CD and ClusterProfile tests
// get their leaf tokens through it, as real exec providers would.
const execPluginEnv = "FLEETGRAPH_TEST_EXEC_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(execPluginEnv) != "" {
		os.Exit(execPlugin(os.Args[1:]))
	}
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// execPlugin prints an ExecCredential holding the token of a file, read on
// every call so that tests can rotate it. The file is named by
// --token-file, by $FLEETGRAPH_TEST_TOKEN_FILE, or by "tokenFile" in the
// cluster config client-go passes in $KUBERNETES_EXEC_INFO.
func execPlugin(args []string) int {
	path := os.Getenv("FLEETGRAPH_TEST_TOKEN_FILE")
	for i, a := range args {
		if a == "--token-file" && i+1 < len(args) {
			path = args[i+1]
		}
	}
	var info struct {
		Spec struct {
			Cluster struct {
				Config struct {
					TokenFile string `json:"tokenFile"`
				} `json:"config"`
			} `json:"cluster"`
		} `json:"spec"`
	}
	if raw := os.Getenv("KUBERNETES_EXEC_INFO"); raw != "" {
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			fmt.Fprintln(os.Stderr, "test exec plugin: KUBERNETES_EXEC_INFO:", err)
			return 1
		}
		if p := info.Spec.Cluster.Config.TokenFile; p != "" {
			path = p
		}
	}
	token, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test exec plugin:", err)
		return 1
	}
	out, err := json.Marshal(map[string]any{
		"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
		"status": map[string]any{"token": strings.TrimSpace(string(token))},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test exec plugin:", err)
		return 1
	}
	fmt.Println(string(out))
	return 0
}

// Resources of the source CRDs, as the fixtures serve them.
var (
	gvrGitopsCluster  = schema.GroupVersionResource{Group: sources.GitopsGroup, Version: "v1alpha1", Resource: sources.GitopsResource}
	gvrCAPICluster    = schema.GroupVersionResource{Group: sources.CAPIGroup, Version: "v1beta2", Resource: sources.CAPIResource}
	gvrClusterProfile = schema.GroupVersionResource{Group: sources.ClusterProfileGroup, Version: "v1alpha1", Resource: sources.ClusterProfileResource}
)

// leafNamespace holds the ServiceAccount whose tokens fleetgraph uses in
// the leaves, and leafPods the pods every leaf is seeded with.
const (
	leafNamespace = "fleetgraph-system"
	leafSA        = "fleetgraph"
	leafPods      = 3
)

// fleetEnv is one management cluster with the source CRDs and two leaves.
type fleetEnv struct {
	mgmt   *testcluster.Cluster
	leaves []*testcluster.Cluster
	kube   kubernetes.Interface // management, direct
	dyn    dynamic.Interface    // management, direct

	mu     sync.Mutex
	tokens int
}

func startFleet(t *testing.T) *fleetEnv {
	t.Helper()
	cs := testcluster.StartAll(t, testcluster.Options{Name: "mgmt"}, testcluster.Options{Name: "leaf-1"}, testcluster.Options{Name: "leaf-2"})
	e := &fleetEnv{mgmt: cs[0], leaves: cs[1:]}
	e.kube = kubernetes.NewForConfigOrDie(e.mgmt.DirectConfig)
	e.dyn = dynamic.NewForConfigOrDie(e.mgmt.DirectConfig)
	if err := e.mgmt.InstallSourceCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, leaf := range e.leaves {
		kube := kubernetes.NewForConfigOrDie(leaf.DirectConfig)
		for _, ns := range []string{leafNamespace, "app"} {
			if _, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range leafPods {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i)},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			}
			if _, err := kube.CoreV1().Pods("app").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kube.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "fleetgraph-reads-all"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: leafSA, Namespace: leafNamespace}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// token issues a new ServiceAccount token in a leaf and returns it with
// the name of the Secret whose deletion revokes it.
func (e *fleetEnv) token(t *testing.T, leaf *testcluster.Cluster) (token, bound string) {
	t.Helper()
	e.mu.Lock()
	e.tokens++
	bound = fmt.Sprintf("token-%d", e.tokens)
	e.mu.Unlock()
	token, err := leaf.ServiceAccountToken(t.Context(), leafNamespace, leafSA, bound)
	if err != nil {
		t.Fatal(err)
	}
	return token, bound
}

// kubeconfig is a leaf's kubeconfig for a token.
func kubeconfig(t *testing.T, leaf *testcluster.Cluster, token string) []byte {
	t.Helper()
	data, err := clientcmd.Write(*leaf.KubeconfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// namespace creates a namespace in the management cluster.
func (e *fleetEnv) namespace(t *testing.T, name string) {
	t.Helper()
	if _, err := e.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// putSecret creates or replaces a Secret of the management cluster.
func (e *fleetEnv) putSecret(t *testing.T, ns, name string, labels map[string]string, data map[string][]byte) {
	t.Helper()
	secrets := e.kube.CoreV1().Secrets(ns)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Data: data}
	old, err := secrets.Get(t.Context(), name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = secrets.Create(t.Context(), sec, metav1.CreateOptions{})
	case err == nil:
		sec.ResourceVersion = old.ResourceVersion
		_, err = secrets.Update(t.Context(), sec, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("put secret %s/%s: %v", ns, name, err)
	}
}

// putObject creates or replaces a custom resource of the management
// cluster, writing status through its subresource as controllers do.
func (e *fleetEnv) putObject(t *testing.T, gvr schema.GroupVersionResource, kind, ns, name string, labels map[string]string, spec, status map[string]any) {
	t.Helper()
	res := e.dyn.Resource(gvr).Namespace(ns)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
	obj.SetLabels(labels)
	cur, err := res.Get(t.Context(), name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = res.Create(t.Context(), obj, metav1.CreateOptions{})
	case err == nil:
		obj.SetResourceVersion(cur.GetResourceVersion())
		cur, err = res.Update(t.Context(), obj, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("put %s %s/%s: %v", kind, ns, name, err)
	}
	if status != nil {
		cur.Object["status"] = status
		if _, err := res.UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("put %s %s/%s status: %v", kind, ns, name, err)
		}
	}
}

func (e *fleetEnv) deleteObject(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	if err := e.dyn.Resource(gvr).Namespace(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s %s/%s: %v", gvr.Resource, ns, name, err)
	}
}

// fleet runs a Manager, a Registry and sources over a fresh index.
type fleet struct {
	store *index.Store
	rec   *conntest.Recorder
	reg   *sources.Registry
}

func runFleet(t *testing.T, srcs ...sources.Source) *fleet {
	t.Helper()
	f := &fleet{store: index.New(memtables.Open)}
	mgr, err := connection.NewManager(connection.Options{
		Store: f.store, ProbeInterval: 500 * time.Millisecond, BackoffMax: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.rec = conntest.NewRecorder(t, f.store)
	f.reg = sources.NewRegistry(mgr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	mgrDone, srcDone := make(chan error, 1), make(chan error, 1)
	go func() { mgrDone <- mgr.Run(ctx) }()
	go func() { srcDone <- sources.Run(ctx, f.reg, srcs...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-srcDone; err != nil {
			t.Errorf("sources: %v", err)
		}
		if err := <-mgrDone; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return f
}

// options are the sources' options for one test namespace.
func (e *fleetEnv) options(ns string) sources.Options {
	return sources.Options{
		Management: e.mgmt.Config, Namespace: ns,
		ArgoCDNamespace: ns, SecretsNamespace: ns,
	}
}

// waitConnected waits until a cluster is connected with its seeded pods
// indexed, and checks its labels.
func (f *fleet) waitConnected(t *testing.T, cluster string, n int, labels map[string]string) {
	t.Helper()
	f.rec.WaitFor(t, cluster, index.StateConnected, n, 60*time.Second)
	conntest.Eventually(t, 30*time.Second, cluster+" pods indexed", func() error {
		pods := 0
		for _, o := range conntest.AllRows(t, f.store, cluster) {
			if o.Kind == "Pod" && o.Namespace == "app" {
				pods++
			}
		}
		if pods < leafPods {
			return fmt.Errorf("%d of %d pods", pods, leafPods)
		}
		return nil
	})
	row, ok := f.store.GetCluster(nil, cluster)
	if !ok {
		t.Fatalf("cluster %s not in the index", cluster)
	}
	for k, v := range labels {
		if row.Labels[k] != v {
			t.Errorf("cluster %s: label %s=%q, want %q (labels %v)", cluster, k, row.Labels[k], v, row.Labels)
		}
	}
}

// waitError waits until a cluster is disconnected with an error that
// holds want.
func (f *fleet) waitError(t *testing.T, cluster, want string) {
	t.Helper()
	conntest.Eventually(t, 30*time.Second, cluster+" error", func() error {
		row, ok := f.store.GetCluster(nil, cluster)
		switch {
		case !ok:
			return fmt.Errorf("cluster %s not in the index", cluster)
		case row.State != index.StateDisconnected:
			return fmt.Errorf("state %s (error %q)", row.State, row.LastError)
		case !strings.Contains(row.LastError, want):
			return fmt.Errorf("error %q does not hold %q", row.LastError, want)
		}
		return nil
	})
}

// waitGone waits until a cluster and its rows are gone.
func (f *fleet) waitGone(t *testing.T, cluster string) {
	t.Helper()
	conntest.Eventually(t, 30*time.Second, cluster+" removed", func() error {
		if _, ok := f.store.GetCluster(nil, cluster); ok {
			return fmt.Errorf("cluster %s still present", cluster)
		}
		if n := len(conntest.RowVersions(t, f.store, cluster)); n != 0 {
			return fmt.Errorf("%d rows of %s left", n, cluster)
		}
		return nil
	})
}

// rotate checks a credential rotation: put installs the new token where
// the source reads it, the old token is revoked, and the cluster must go on
// with at most one DISCONNECTED, still seeing changes. With reconnects set,
// the source must reconnect the cluster with the new token before the old
// one is revoked (it saw the change); otherwise (exec plugins) client-go
// fetches the new token when the old one is refused.
func (f *fleet) rotate(t *testing.T, e *fleetEnv, cluster string, leaf *testcluster.Cluster, oldBound string, reconnects bool, put func(token string)) {
	t.Helper()
	before := f.rec.Count(cluster, index.StateDisconnected)
	connected := f.rec.Count(cluster, index.StateConnected)
	token, _ := e.token(t, leaf)
	put(token)
	if reconnects {
		f.rec.WaitFor(t, cluster, index.StateConnected, connected+1, 30*time.Second)
	}
	if err := leaf.RevokeToken(t.Context(), leafNamespace, oldBound); err != nil {
		t.Fatal(err)
	}
	// A change made after the revocation reaches the index only over the
	// new credentials.
	name := fmt.Sprintf("after-rotation-%d", time.Now().UnixNano())
	kube := kubernetes.NewForConfigOrDie(leaf.DirectConfig)
	if _, err := kube.CoreV1().Pods("app").Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	conntest.Eventually(t, 60*time.Second, "pod created after the rotation", func() error {
		for _, o := range conntest.AllRows(t, f.store, cluster) {
			if o.Name == name {
				return nil
			}
		}
		return fmt.Errorf("pod %s not indexed", name)
	})
	conntest.Eventually(t, 30*time.Second, "connected after the rotation", func() error {
		if row, _ := f.store.GetCluster(nil, cluster); row == nil || row.State != index.StateConnected {
			return fmt.Errorf("cluster %s is %v", cluster, row)
		}
		return nil
	})
	if n := f.rec.Count(cluster, index.StateDisconnected) - before; n > 1 {
		t.Errorf("rotation: %d DISCONNECTED transitions, want at most 1: %v", n, f.rec.Of(cluster))
	}
	t.Logf("rotation of %s: %d DISCONNECTED, %d CONNECTED", cluster,
		f.rec.Count(cluster, index.StateDisconnected)-before, f.rec.Count(cluster, index.StateConnected)-connected)
}
