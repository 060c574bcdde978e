package queries

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/examples/internal/exampletest"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// The fleet of the test: east (env=prod) and west (env=staging), each with
// namespaces team-a-0..5 of pods, a service and Flux objects, seeded so that
// each namespace has one crash-looping pod and team-a-4 a failing
// Kustomization and HelmRelease. alice may read team-a-0 of east only.
const (
	namespaces   = 6
	podsPerNS    = 10
	kustomizeKey = "Kustomization.kustomize.toolkit.fluxcd.io"
)

// object is one object as the tests compare them.
type object struct {
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Group     string `json:"group"`
	Name      string `json:"name"`
}

func (o object) String() string {
	return fmt.Sprintf("%s/%s/%s/%s", o.Cluster, o.Namespace, kindKey(o.Kind, o.Group), o.Name)
}

// kindKey is a kind as facets name it: "Kind" or "Kind.group".
func kindKey(kind, group string) string {
	if group == "" {
		return kind
	}
	return kind + "." + group
}

type count struct {
	Value string `json:"value"`
	Count int    `json:"count"`
}

func counts(cs []count) map[string]int {
	out := map[string]int{}
	for _, c := range cs {
		out[c.Value] = c.Count
	}
	return out
}

// TestQueries runs every document of this directory against fleetgraph
// serving two real clusters, and checks each answer against the clusters'
// own API servers.
func TestQueries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real kube-apiservers")
	}
	users := []testcluster.User{{Name: "alice"}}
	tcs := testcluster.StartAll(t, testcluster.Options{Name: "east", Users: users}, testcluster.Options{Name: "west", Users: users})
	east, west := tcs[0], tcs[1]
	for _, c := range tcs {
		if err := c.InstallFluxCRDs(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Prefix: "team-a", Namespaces: namespaces, Pods: podsPerNS, Services: 1, Flux: true}); err != nil {
			t.Fatal(err)
		}
	}
	// Istio runs in east only: west cannot serve the Istio kinds, which
	// cluster-health.graphql shows.
	if err := east.InstallIstioCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
	grantRead(t, east, "team-a-0", "alice")
	fleet := exampletest.Serve(t, []exampletest.Cluster{
		{Cluster: east, Labels: map[string]string{"env": "prod"}},
		{Cluster: west, Labels: map[string]string{"env": "staging"}},
	}, "alice")
	fleet.WaitConnected(t, 2*time.Minute, index.StateConnected, "east", "west")
	kube := &truth{clusters: []*testcluster.Cluster{east, west}}

	tested := map[string]bool{}
	run := func(file string, test func(t *testing.T, doc string)) {
		tested[file] = true
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(strings.TrimSuffix(file, ".graphql"), func(t *testing.T) { test(t, string(doc)) })
	}

	run("unhealthy-kustomizations.graphql", func(t *testing.T, doc string) {
		// Page by 1 to follow the cursors as a client would.
		got := unhealthyKustomizations(t, fleet, doc, 1)
		if want := kube.failingFlux(t, testcluster.GVRKustomization); !slices.Equal(keys(got), want) {
			t.Errorf("got %v, want %v", keys(got), want)
		}
		for _, n := range got {
			if !strings.Contains(n.Message, "kustomize build failed") || n.Stale {
				t.Errorf("%s: message %q, stale %v; want Flux's message, live", n.object, n.Message, n.Stale)
			}
		}
	})

	run("failing-pods.graphql", func(t *testing.T, doc string) {
		var data struct {
			Objects struct {
				TotalCount int
				Edges      []struct {
					Node struct {
						object
						Message string
						Summary struct {
							Phase    string
							Restarts int
							Node     string
						}
					}
				}
			}
		}
		fleet.Query(t, "admin", doc, map[string]any{"clusters": []string{"east"}}, &data)
		var got []string
		for _, e := range data.Objects.Edges {
			n := e.Node
			n.Kind = "Pod"
			got = append(got, n.String())
			if !strings.HasPrefix(n.Message, "CrashLoopBackOff") || n.Summary.Restarts != 7 || n.Summary.Phase != "Running" || n.Summary.Node == "" {
				t.Errorf("%s: message %q, summary %+v", n.object, n.Message, n.Summary)
			}
		}
		want := kube.failingPods(t, "east")
		if slices.Sort(got); !slices.Equal(got, want) || data.Objects.TotalCount != len(want) {
			t.Errorf("got %d %v, want %v", data.Objects.TotalCount, got, want)
		}
		if len(want) != namespaces {
			t.Errorf("the seed has %d crash-looping pods in east, want one per namespace", len(want))
		}
	})

	run("problems-by-cluster.graphql", func(t *testing.T, doc string) {
		var data struct {
			Facets struct {
				Total                       int
				Clusters, Kinds, Namespaces []count
			}
		}
		fleet.Query(t, "admin", doc, nil, &data)
		unhealthy := kube.unhealthy(t)
		byCluster, byKind, byNS := map[string]int{}, map[string]int{}, map[string]int{}
		for _, o := range unhealthy {
			byCluster[o.Cluster]++
			byKind[kindKey(o.Kind, o.Group)]++
			byNS[o.Namespace]++
		}
		f := data.Facets
		if f.Total != len(unhealthy) || !maps.Equal(counts(f.Clusters), byCluster) || !maps.Equal(counts(f.Kinds), byKind) || !maps.Equal(counts(f.Namespaces), byNS) {
			t.Errorf("got %+v\nwant total %d, clusters %v, kinds %v, namespaces %v", f, len(unhealthy), byCluster, byKind, byNS)
		}
	})

	run("where-does-it-run.graphql", func(t *testing.T, doc string) {
		var data struct {
			Facets  struct{ Clusters, Namespaces, Statuses []count }
			Objects struct {
				TotalCount int
				Edges      []struct{ Node object }
			}
		}
		fleet.Query(t, "admin", doc, map[string]any{"selector": "app=app-3"}, &data)
		want := kube.pods(t, "app=app-3")
		var got []string
		byCluster := map[string]int{}
		for _, e := range data.Objects.Edges {
			e.Node.Kind = "Pod"
			got = append(got, e.Node.String())
		}
		for _, o := range want {
			c, _, _ := strings.Cut(o, "/")
			byCluster[c]++
		}
		if slices.Sort(got); !slices.Equal(got, want) || !maps.Equal(counts(data.Facets.Clusters), byCluster) || len(want) == 0 {
			t.Errorf("got %v (clusters %v), want %v", got, data.Facets.Clusters, want)
		}
	})

	run("cluster-health.graphql", func(t *testing.T, doc string) {
		var data struct {
			Fleet struct {
				ClustersTotal, ClustersSynced int
				Rebuilding                    bool
			}
			Clusters []struct {
				Name, Mode string
				Labels     []struct{ Key, Value string }
				Metadata   []struct{ Key, Value string }
				Connection struct{ State string }
				Sync       struct {
					Synced     bool
					Kinds      int
					KindErrors []struct{ Kind, Error string }
				}
			}
		}
		fleet.Query(t, "admin", doc, nil, &data)
		if data.Fleet.ClustersTotal != 2 || data.Fleet.ClustersSynced != 2 || data.Fleet.Rebuilding {
			t.Errorf("fleet %+v, want 2 of 2 synced", data.Fleet)
		}
		// The Istio kinds fleetgraph collects, which west does not serve.
		var istio []string
		for _, a := range collector.NewRegistry().Adapters() {
			if strings.HasSuffix(a.Group, "istio.io") {
				istio = append(istio, a.GroupKind())
			}
		}
		slices.Sort(istio)
		for _, c := range data.Clusters {
			md := map[string]string{}
			for _, m := range c.Metadata {
				md[m.Key] = m.Value
			}
			var failing []string
			for _, k := range c.Sync.KindErrors {
				failing = append(failing, k.Kind)
				if !strings.Contains(k.Error, "not served") {
					t.Errorf("%s: kind %s: error %q, want not served", c.Name, k.Kind, k.Error)
				}
			}
			slices.Sort(failing)
			if c.Name == "west" && !slices.Equal(failing, istio) || c.Name == "east" && len(failing) > 0 {
				t.Errorf("%s: failing kinds %v (Istio kinds %v)", c.Name, failing, istio)
			}
			// A kind that is merely not served does not degrade a cluster.
			if c.Mode != "PULL" || c.Connection.State != "CONNECTED" || !c.Sync.Synced || c.Sync.Kinds == 0 ||
				!strings.HasPrefix(md["kubernetes.version"], "v1.") || len(c.Labels) != 1 || c.Labels[0].Key != "env" {
				t.Errorf("cluster %+v", c)
			}
		}
	})

	run("unhealthy-in-clusters-labelled.graphql", func(t *testing.T, doc string) {
		var data struct {
			Clusters []struct{ Name string }
			Objects  struct {
				TotalCount int
				Edges      []struct{ Node object }
			}
		}
		fleet.Query(t, "admin", doc, map[string]any{"clusterSelector": "env=prod"}, &data)
		var got, want []string
		for _, e := range data.Objects.Edges {
			got = append(got, e.Node.String())
		}
		for _, o := range kube.unhealthy(t) {
			if o.Cluster == "east" {
				want = append(want, o.String())
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if len(data.Clusters) != 1 || data.Clusters[0].Name != "east" || !slices.Equal(got, want) || data.Objects.TotalCount != len(want) {
			t.Errorf("clusters %v, objects %v; want [east], %v", data.Clusters, got, want)
		}
	})

	run("why-can-i-see.graphql", func(t *testing.T, doc string) {
		type answer struct {
			Viewer     struct{ Username string }
			WhyVisible struct {
				Visible bool
				Summary string
				Grants  []struct {
					Verb    string
					Binding struct{ Kind, Name, Namespace string }
					Role    struct{ Kind, Name string }
				}
			}
		}
		var seen answer
		fleet.Query(t, "alice", doc, map[string]any{"cluster": "east", "kind": "Pod", "namespace": "team-a-0", "name": "pod-0"}, &seen)
		w := seen.WhyVisible
		if seen.Viewer.Username != "alice" || !w.Visible || len(w.Grants) == 0 {
			t.Fatalf("alice on her own namespace: %+v", seen)
		}
		for _, g := range w.Grants {
			if g.Binding.Kind != "RoleBinding" || g.Binding.Name != "alice-reads" || g.Binding.Namespace != "team-a-0" || g.Role.Name != "reader" {
				t.Errorf("grant %+v, want RoleBinding team-a-0/alice-reads of ClusterRole reader", g)
			}
		}
		for _, other := range []map[string]any{
			{"cluster": "east", "kind": "Pod", "namespace": "team-a-1", "name": "pod-0"},
			{"cluster": "west", "kind": "Pod", "namespace": "team-a-0", "name": "pod-0"},
		} {
			var not answer
			fleet.Query(t, "alice", doc, other, &not)
			if not.WhyVisible.Visible || len(not.WhyVisible.Grants) > 0 || not.WhyVisible.Summary == "" {
				t.Errorf("alice on %v: %+v, want not visible, with a reason", other, not.WhyVisible)
			}
		}
	})

	run("live-manifest.graphql", func(t *testing.T, doc string) {
		pod, err := kubernetes.NewForConfigOrDie(east.DirectConfig).CoreV1().Pods("team-a-0").Get(t.Context(), "pod-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var data struct {
			Object struct {
				ResourceVersion string
				Manifest        corev1.Pod
			}
		}
		vars := map[string]any{"cluster": "east", "kind": "Pod", "namespace": "team-a-0", "name": "pod-0"}
		fleet.Query(t, "alice", doc, vars, &data)
		m := data.Object.Manifest
		if m.UID != pod.UID || m.Spec.NodeName != pod.Spec.NodeName || data.Object.ResourceVersion != pod.ResourceVersion {
			t.Errorf("manifest uid %s node %s rv %s; the cluster has %s, %s, %s", m.UID, m.Spec.NodeName, data.Object.ResourceVersion, pod.UID, pod.Spec.NodeName, pod.ResourceVersion)
		}
		// The cluster itself refuses alice a pod of another namespace.
		vars["namespace"] = "team-a-1"
		_, resp, err := exampletest.Post(t.Context(), fleet.URL, fleet.Token("alice"), doc, vars)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Errors) != 1 || resp.Errors[0].Extensions["code"] != "FORBIDDEN" {
			t.Errorf("alice reading team-a-1/pod-0: %+v, want one FORBIDDEN error", resp.Errors)
		}
	})

	run("my-view.graphql", func(t *testing.T, doc string) {
		var data struct {
			Viewer struct{ Username string }
			Facets struct {
				Total                int
				Clusters, Namespaces []count
			}
		}
		fleet.Query(t, "alice", doc, nil, &data)
		// The objects of team-a-0, and the Namespace itself: a RoleBinding
		// in a namespace lets its subjects get that Namespace, as
		// kube-apiserver decides it. Cluster-scoped objects count under no
		// namespace.
		n := kube.countIn(t, "east", "team-a-0")
		if data.Viewer.Username != "alice" || data.Facets.Total != n+1 ||
			!maps.Equal(counts(data.Facets.Clusters), map[string]int{"east": n + 1}) || !maps.Equal(counts(data.Facets.Namespaces), map[string]int{"team-a-0": n}) {
			t.Errorf("got %+v, want %d objects in east/team-a-0 and the Namespace", data, n)
		}
	})

	run("recent-changes.graphql", func(t *testing.T, doc string) {
		// Everything so far was seen before t0; change two objects of
		// team-a-1 in east and one of team-a-2, then ask for team-a-1's
		// changes since t0 (the document's "last minute", made short).
		t0 := time.Now()
		time.Sleep(10 * time.Millisecond)
		pods := kubernetes.NewForConfigOrDie(east.DirectConfig).CoreV1()
		if _, err := pods.Pods("team-a-1").Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "new-pod"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/new:1.0"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{"team-a-1", "team-a-2"} {
			if _, err := pods.Pods(ns).Patch(t.Context(), "pod-3", "application/merge-patch+json", []byte(`{"metadata":{"labels":{"changed":"yes"}}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{"east/team-a-1/Pod/pod-3", "east/team-a-1/Pod/new-pod"} // most recent first
		var got []string
		exampletest.Eventually(t, 30*time.Second, "the changes seen", func() error {
			var data struct {
				Objects struct {
					Edges []struct {
						Node struct {
							object
							UpdatedAt time.Time
						}
					}
				}
			}
			fleet.Query(t, "admin", doc, map[string]any{"namespace": "team-a-1"}, &data)
			got = nil
			var last time.Time
			for i, e := range data.Objects.Edges {
				if i > 0 && e.Node.UpdatedAt.After(last) {
					t.Fatalf("edges not in updatedAt order: %v after %v", e.Node.UpdatedAt, last)
				}
				last = e.Node.UpdatedAt
				if e.Node.UpdatedAt.After(t0) {
					e.Node.Namespace = "team-a-1"
					got = append(got, e.Node.String())
				}
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("changed since t0: %v, want %v", got, want)
			}
			return nil
		})
	})

	// Last: it stops west.
	run("stale-clusters.graphql", func(t *testing.T, doc string) {
		failing := kube.failingFlux(t, testcluster.GVRKustomization)
		stopped := time.Now()
		if err := west.Stop(); err != nil {
			t.Fatal(err)
		}
		fleet.WaitConnected(t, 2*time.Minute, index.StateDisconnected, "west")
		var data struct {
			Facets   struct{ StaleClusters []string }
			Clusters []struct {
				Name       string
				Stale      bool
				Connection struct {
					State     string
					Since     time.Time
					LastError string
				}
			}
		}
		fleet.Query(t, "admin", doc, nil, &data)
		if !slices.Equal(data.Facets.StaleClusters, []string{"west"}) {
			t.Errorf("staleClusters %v, want [west]", data.Facets.StaleClusters)
		}
		for _, c := range data.Clusters {
			conn := c.Connection
			switch c.Name {
			case "west":
				if !c.Stale || conn.State != "DISCONNECTED" || conn.LastError == "" || conn.Since.Before(stopped) {
					t.Errorf("west: %+v, want stale, DISCONNECTED since the stop, with an error", c)
				}
			case "east":
				if c.Stale || conn.State != "CONNECTED" {
					t.Errorf("east: %+v, want live", c)
				}
			}
		}
		// Its rows stay, marked stale.
		ks, err := os.ReadFile("unhealthy-kustomizations.graphql")
		if err != nil {
			t.Fatal(err)
		}
		all := unhealthyKustomizations(t, fleet, string(ks), 100)
		if !slices.Equal(keys(all), failing) {
			t.Errorf("after west stopped: %v, want %v", keys(all), failing)
		}
		for _, n := range all {
			if n.Stale != (n.Cluster == "west") {
				t.Errorf("%s: stale %v", n.object, n.Stale)
			}
		}
	})

	files, err := filepath.Glob("*.graphql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !tested[f] {
			t.Errorf("%s is not run by this test: add it", f)
		}
	}
}

// grantRead lets user read everything in one namespace of a cluster: a
// RoleBinding alice-reads to the ClusterRole reader.
func grantRead(t *testing.T, c *testcluster.Cluster, ns, user string) {
	t.Helper()
	rbac := kubernetes.NewForConfigOrDie(c.DirectConfig).RbacV1()
	if _, err := rbac.ClusterRoles().Create(t.Context(), &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"*"}, Resources: []string{"*"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-reads"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kustomization is a node of unhealthy-kustomizations.graphql.
type kustomization struct {
	object
	Message string
	Stale   bool
}

// unhealthyKustomizations runs the document, following pageInfo.endCursor
// page by page as a client would.
func unhealthyKustomizations(t *testing.T, fleet *exampletest.Fleet, doc string, first int) []kustomization {
	t.Helper()
	var out []kustomization
	var after any
	for pages := 0; ; pages++ {
		var data struct {
			Objects struct {
				TotalCount int
				PageInfo   struct {
					HasNextPage bool
					EndCursor   string
				}
				Edges []struct{ Node kustomization }
			}
		}
		fleet.Query(t, "admin", doc, map[string]any{"first": first, "after": after}, &data)
		for _, e := range data.Objects.Edges {
			n := e.Node
			n.Kind, n.Group = "Kustomization", "kustomize.toolkit.fluxcd.io"
			out = append(out, n)
		}
		if !data.Objects.PageInfo.HasNextPage {
			if len(out) != data.Objects.TotalCount {
				t.Errorf("%d objects on %d pages, totalCount %d", len(out), pages+1, data.Objects.TotalCount)
			}
			return out
		}
		after = data.Objects.PageInfo.EndCursor
	}
}

// keys returns the sorted keys of kustomizations.
func keys(ks []kustomization) []string {
	out := make([]string, 0, len(ks))
	for _, k := range ks {
		out = append(out, k.String())
	}
	slices.Sort(out)
	return out
}

// truth answers the tests' questions from the clusters' own API servers,
// read directly (not through fleetgraph's fault proxies), at the time of
// asking.
type truth struct {
	clusters []*testcluster.Cluster
}

// list lists a resource in one cluster (all namespaces when ns is empty).
func (tr *truth) list(t *testing.T, c *testcluster.Cluster, gvr schema.GroupVersionResource, ns, selector string) []unstructured.Unstructured {
	t.Helper()
	l, err := dynamic.NewForConfigOrDie(c.DirectConfig).Resource(gvr).Namespace(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func key(cluster string, u *unstructured.Unstructured) object {
	gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
	if err != nil {
		panic(err)
	}
	return object{Cluster: cluster, Namespace: u.GetNamespace(), Kind: u.GetKind(), Group: gv.Group, Name: u.GetName()}
}

// failingFlux returns the sorted keys of the Flux objects of a resource
// whose Ready condition is False: their last reconciliation failed.
func (tr *truth) failingFlux(t *testing.T, gvr schema.GroupVersionResource) []string {
	var out []string
	for _, o := range tr.unhealthy(t) {
		if o.Group == gvr.Group && o.Kind != "Pod" {
			out = append(out, o.String())
		}
	}
	slices.Sort(out)
	return out
}

// failingPods returns the sorted keys of the pods of a cluster with a
// container waiting in CrashLoopBackOff.
func (tr *truth) failingPods(t *testing.T, cluster string) []string {
	var out []string
	for _, o := range tr.unhealthy(t) {
		if o.Cluster == cluster && o.Kind == "Pod" {
			out = append(out, o.String())
		}
	}
	slices.Sort(out)
	return out
}

// unhealthy returns every object that should be UNHEALTHY: crash-looping
// pods and Flux objects whose Ready condition is False.
func (tr *truth) unhealthy(t *testing.T) []object {
	var out []object
	for _, c := range tr.clusters {
		for _, u := range tr.list(t, c, testcluster.GVRPod, "", "") {
			statuses, _, _ := unstructured.NestedSlice(u.Object, "status", "containerStatuses")
			for _, s := range statuses {
				if reason, _, _ := unstructured.NestedString(s.(map[string]any), "state", "waiting", "reason"); reason == "CrashLoopBackOff" {
					out = append(out, key(c.Name, &u))
					break
				}
			}
		}
		for _, gvr := range []schema.GroupVersionResource{testcluster.GVRKustomization, testcluster.GVRHelmRelease, testcluster.GVRGitRepository} {
			for _, u := range tr.list(t, c, gvr, "", "") {
				conditions, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
				for _, cond := range conditions {
					m := cond.(map[string]any)
					if m["type"] == "Ready" && m["status"] == "False" {
						out = append(out, key(c.Name, &u))
					}
				}
			}
		}
	}
	return out
}

// pods returns the sorted keys of the pods matching a label selector in
// every cluster.
func (tr *truth) pods(t *testing.T, selector string) []string {
	var out []string
	for _, c := range tr.clusters {
		for _, u := range tr.list(t, c, testcluster.GVRPod, "", selector) {
			out = append(out, key(c.Name, &u).String())
		}
	}
	slices.Sort(out)
	return out
}

// countIn counts the objects fleetgraph collects in one namespace of a
// cluster: the seeded kinds (there are no others in a test cluster).
func (tr *truth) countIn(t *testing.T, cluster, ns string) int {
	n := 0
	for _, c := range tr.clusters {
		if c.Name != cluster {
			continue
		}
		for _, gvr := range []schema.GroupVersionResource{
			testcluster.GVRPod, testcluster.GVRService, testcluster.GVREndpointSlice,
			testcluster.GVRKustomization, testcluster.GVRHelmRelease, testcluster.GVRGitRepository,
		} {
			n += len(tr.list(t, c, gvr, ns, ""))
		}
	}
	return n
}
