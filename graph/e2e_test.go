package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// The end-to-end tests run the API over real kube-apiservers from
// internal/testcluster, collected by the connection manager into the index,
// with real RBAC: everything between a client's websocket and a leaf's etcd
// is production code.
//
//	g-east: alice may view ns-0 (RoleBinding to the aggregated "view")
//	g-west: bob may view ns-1
//	both:   admin is in system:masters (cluster-admin); "weak" is a user
//	        without impersonation rights, standing in for a collector
//	        whose credentials lack them.

// e2e is a fleet of real clusters served by a Handler.
type e2e struct {
	*fixture
	east, west *testcluster.Cluster
	mgr        *connection.Manager
}

// leafClients serves object(...) with the manager's configs, or with a
// user's config on every cluster when as is set.
type leafClients struct {
	mgr      *connection.Manager
	clusters map[string]*testcluster.Cluster
	mu       sync.Mutex
	as       string
}

func (l *leafClients) RESTConfig(cluster string) (*rest.Config, error) {
	l.mu.Lock()
	as := l.as
	l.mu.Unlock()
	if as == "" {
		return l.mgr.RESTConfig(cluster)
	}
	c, ok := l.clusters[cluster]
	if !ok {
		return nil, fmt.Errorf("no cluster %q", cluster)
	}
	return c.UserConfig(as), nil
}

func (l *leafClients) actAs(user string) {
	l.mu.Lock()
	l.as = user
	l.mu.Unlock()
}

// startE2E starts two seeded clusters, the manager and the API, with
// Options adjusted by opts.
func startE2E(t *testing.T, opts ...func(*Options)) (*e2e, *leafClients) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real kube-apiservers")
	}
	users := []testcluster.User{{Name: "alice"}, {Name: "bob"}, {Name: "weak"}}
	clusters := testcluster.StartAll(t, testcluster.Options{Name: "g-east", Users: users}, testcluster.Options{Name: "g-west", Users: users})
	east, west := clusters[0], clusters[1]
	for _, c := range clusters {
		if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 2, Pods: 3, Services: 1}); err != nil {
			t.Fatal(err)
		}
	}
	bindView(t, east, "ns-0", "alice")
	bindView(t, west, "ns-1", "bob")

	store := index.New(memtables.Open)
	mgr, err := connection.NewManager(connection.Options{Store: store, Logger: testLogger(t)})
	must(t, err)
	for _, c := range []*testcluster.Cluster{east, west} {
		must(t, mgr.Add(connection.Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	leaf := &leafClients{mgr: mgr, clusters: map[string]*testcluster.Cluster{east.Name: east, west.Name: west}}
	f := newFixtureWith(t, store, append([]func(*Options){func(o *Options) {
		o.LeafClients = leaf
		o.AdminGroups = nil
	}}, opts...)...)
	e := &e2e{fixture: f, east: east, west: west, mgr: mgr}
	e.waitFor(t, 90*time.Second, "both clusters synced", func() error {
		for _, c := range []string{east.Name, west.Name} {
			row, ok := store.GetCluster(nil, c)
			if !ok || !row.Synced || row.State != index.StateConnected {
				return fmt.Errorf("cluster %s: %+v", c, row)
			}
		}
		return nil
	})
	return e, leaf
}

// bindView lets user view one namespace of a cluster.
func bindView(t *testing.T, c *testcluster.Cluster, ns, user string) {
	t.Helper()
	_, err := kubernetes.NewForConfigOrDie(c.DirectConfig).RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{})
	must(t, err)
}

func (e *e2e) waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leafTruth returns the ids of the objects of the collected kinds that
// user can read on a cluster, asking the cluster itself with the user's
// credentials: lists cluster-wide or per namespace, and gets of namespaces
// by name, which is the visibility rule for these roles.
func (e *e2e) leafTruth(t *testing.T, c *testcluster.Cluster, user string) []string {
	t.Helper()
	cfg := c.DirectConfig
	if user != testcluster.AdminUser {
		cfg = rest.CopyConfig(c.DirectConfig)
		cfg.BearerToken = c.Tokens[user]
	}
	dyn := dynamic.NewForConfigOrDie(cfg)
	admin := kubernetes.NewForConfigOrDie(c.DirectConfig)
	nss, err := admin.CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
	must(t, err)
	var out []string
	for _, k := range e.store.Kinds(c.Name) {
		if k.Group == index.RBACGroup {
			continue
		}
		gvr := schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Resource}
		add := func(ns, name string) {
			out = append(out, index.Key{Cluster: c.Name, Group: k.Group, Kind: k.Kind, Namespace: ns, Name: name}.String())
		}
		if !k.Namespaced {
			if list, err := dyn.Resource(gvr).List(t.Context(), metav1.ListOptions{}); err == nil {
				for _, o := range list.Items {
					add("", o.GetName())
				}
				continue
			}
			for _, ns := range nss.Items {
				if _, err := dyn.Resource(gvr).Get(t.Context(), ns.Name, metav1.GetOptions{}); err == nil {
					add("", ns.Name)
				}
			}
			continue
		}
		for _, ns := range nss.Items {
			list, err := dyn.Resource(gvr).Namespace(ns.Name).List(t.Context(), metav1.ListOptions{})
			if apierrors.IsForbidden(err) {
				continue
			}
			must(t, err)
			for _, o := range list.Items {
				add(ns.Name, o.GetName())
			}
		}
	}
	return out
}

func TestE2EFleet(t *testing.T) {
	e, leaf := startE2E(t)
	east, west := e.east, e.west

	t.Run("queries match each cluster's RBAC", func(t *testing.T) {
		for _, user := range []string{"admin", "alice", "bob"} {
			var want []string
			for _, c := range []*testcluster.Cluster{east, west} {
				want = append(want, e.leafTruth(t, c, user)...)
			}
			sort.Strings(want)
			e.waitFor(t, 10*time.Second, user+"'s objects", func() error {
				got, total, _ := e.pageAll(user, 7, map[string]any{"clusters": []string{east.Name, west.Name}})
				slices.Sort(got)
				if total != len(want) || !slices.Equal(got, want) {
					return fmt.Errorf("got %d (total %d) %v, want %d %v", len(got), total, got, len(want), want)
				}
				return nil
			})
			var fr facetsResult
			e.query(user, facetsQuery, map[string]any{"filter": map[string]any{"clusters": []string{east.Name, west.Name}}}, &fr)
			if fr.Facets.Total != len(want) {
				t.Errorf("%s: facets total %d, want %d", user, fr.Facets.Total, len(want))
			}
		}
		var cr clustersResult
		e.query("alice", clustersQuery, nil, &cr)
		if len(cr.Clusters) != 1 || cr.Clusters[0].Name != east.Name || cr.Fleet.Message != "All 1 clusters synced" {
			t.Errorf("alice's clusters %+v", cr)
		}
	})

	t.Run("object is read live as the viewer", func(t *testing.T) {
		const q = `query($c: String!, $k: String!, $ns: String, $n: String!) { object(cluster: $c, kind: $k, namespace: $ns, name: $n) {
			cluster kind namespace name uid resourceVersion manifest fetchedAt } }`
		type detail struct {
			Object *struct {
				Name     string
				UID      string
				Manifest map[string]any
			}
		}
		var d detail
		e.query("alice", q, map[string]any{"c": east.Name, "k": "Pod", "ns": "ns-0", "n": "pod-0"}, &d)
		meta, _ := d.Object.Manifest["metadata"].(map[string]any)
		if d.Object == nil || d.Object.Name != "pod-0" || meta["managedFields"] != nil || meta["uid"] != d.Object.UID {
			t.Errorf("alice's own pod: %+v", d.Object)
		}
		e.query("alice", q, map[string]any{"c": east.Name, "k": "pods", "ns": "ns-0", "n": "nope"}, &d)
		if d.Object != nil {
			t.Errorf("a missing pod is %+v, want null", d.Object)
		}
		for _, tc := range []struct {
			name, user, cluster, ns, as, code string
		}{
			{"other namespace", "alice", east.Name, "ns-1", "", CodeForbidden},
			{"other cluster", "alice", west.Name, "ns-1", "", CodeForbidden},
			{"collector without impersonation", "alice", east.Name, "ns-0", "weak", CodeImpersonationDenied},
		} {
			t.Run(tc.name, func(t *testing.T) {
				leaf.actAs(tc.as)
				defer leaf.actAs("")
				_, resp := e.post(tc.user, q, map[string]any{"c": tc.cluster, "k": "Pod", "ns": tc.ns, "n": "pod-0"})
				if resp.code() != tc.code || resp.Errors[0].Extensions["status"] != float64(403) {
					t.Fatalf("errors %+v, want %s", resp.Errors, tc.code)
				}
				t.Logf("%s: %s", tc.code, resp.Errors[0].Message)
			})
		}
		e.assertAlive()
	})

	t.Run("stop and restart: one DISCONNECTED, one CONNECTED, objectChanges keeps streaming", func(t *testing.T) {
		admin := e.connect("admin")
		admin.subscribe("conn", clusterConnectionSub, nil)
		bob := e.connect("bob")
		bob.subscribe("conn", clusterConnectionSub, map[string]any{"clusters": []string{west.Name}})
		bob.subscribe("obj", objectChangesSub, map[string]any{"filter": map[string]any{"kinds": []string{"Pod"}}})
		alice := e.connect("alice")
		alice.subscribe("conn", clusterConnectionSub, nil)
		e.waitSubscribers(4)

		must(t, west.Stop())
		if ev := nextConnWithin(t, admin, "conn", 30*time.Second); ev.Cluster != west.Name || ev.State != "DISCONNECTED" {
			t.Fatalf("admin got %+v, want %s DISCONNECTED", ev, west.Name)
		}
		must(t, west.Start(t.Context()))
		// Until CONNECTED, only CONNECTING may come between (the manager
		// reports its reconnect attempt); never a second DISCONNECTED.
		for _, c := range []*wsClient{admin, bob} {
			var states []string
			for len(states) == 0 || states[len(states)-1] != "CONNECTED" {
				ev := nextConnWithin(t, c, "conn", 60*time.Second)
				if ev.Cluster != west.Name {
					t.Fatalf("event about %s", ev.Cluster)
				}
				states = append(states, ev.State)
			}
			if c == admin {
				states = append([]string{"DISCONNECTED"}, states...)
			}
			t.Logf("transitions: %v", states)
			if slices.Index(states, "DISCONNECTED") != 0 || strings.Count(strings.Join(states, " "), "DISCONNECTED") != 1 ||
				slices.ContainsFunc(states[1:len(states)-1], func(s string) bool { return s != "CONNECTING" }) {
				t.Errorf("transitions %v, want DISCONNECTED, CONNECTING..., CONNECTED", states)
			}
		}
		// The same subscription, never resubscribed, sees a pod created
		// after the reconnect.
		_, err := kubernetes.NewForConfigOrDie(west.DirectConfig).CoreV1().Pods("ns-1").Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "after-restart"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}, metav1.CreateOptions{})
		must(t, err)
		for {
			ev := nextDataWithin[changeEvent](t, bob, "obj", 30*time.Second).ObjectChanges
			if ev.Object.Name == "after-restart" {
				if ev.Type != "ADDED" || ev.Object.Cluster != west.Name {
					t.Errorf("got %+v", ev)
				}
				break
			}
		}
		// Exactly one of each: nothing more arrives.
		for _, c := range []*wsClient{admin, bob} {
			if m, err := c.readTimeoutFor("conn", 2*time.Second); err == nil {
				t.Errorf("extra connection event %s", m.Payload)
			}
		}
		if m, err := alice.readTimeoutFor("conn", time.Second); err == nil {
			t.Errorf("alice saw %s about a cluster she cannot see", m.Payload)
		}
		for _, c := range []*wsClient{admin, bob, alice} {
			_ = c.c.CloseNow()
		}
		e.waitSubscribers(0)
	})

	t.Run("revoking a RoleBinding stops the stream within 2s", func(t *testing.T) {
		alice := e.connect("alice")
		alice.subscribe("obj", objectChangesSub, map[string]any{"filter": map[string]any{"kinds": []string{"Pod"}}})
		e.waitSubscribers(1)
		pods := kubernetes.NewForConfigOrDie(east.DirectConfig).CoreV1().Pods("ns-0")
		newPod := func(name string) {
			_, err := pods.Create(t.Context(), &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
			}, metav1.CreateOptions{})
			must(t, err)
		}
		newPod("before-revoke")
		if ev := nextDataWithin[changeEvent](t, alice, "obj", 30*time.Second).ObjectChanges; ev.Object.Name != "before-revoke" {
			t.Fatalf("before the revoke got %+v", ev)
		}
		rbs := kubernetes.NewForConfigOrDie(east.DirectConfig).RbacV1().RoleBindings("ns-0")
		must(t, rbs.Delete(t.Context(), "alice-view", metav1.DeleteOptions{}))
		revoked := time.Now()
		e.waitFor(t, 2*time.Second, "the revoke reaching queries", func() error {
			var r objectsResult
			e.query("alice", objectsQuery, map[string]any{"first": 0, "filter": map[string]any{"clusters": []string{east.Name}}}, &r)
			if r.Objects.TotalCount != 0 {
				return fmt.Errorf("alice still sees %d objects", r.Objects.TotalCount)
			}
			return nil
		})
		t.Logf("queries stopped showing the namespace %v after the RoleBinding was deleted", time.Since(revoked).Round(time.Millisecond))
		// Pods keep coming; once the revoke has reached her stream, none
		// arrives. It must reach it within 2 s.
		var last time.Time
		for i := 0; time.Since(revoked) < 4*time.Second; i++ {
			newPod(fmt.Sprintf("after-revoke-%d", i))
			if m, err := alice.readTimeoutFor("obj", 250*time.Millisecond); err == nil {
				last = time.Now()
				t.Logf("delivered %v after the revoke: %s", last.Sub(revoked).Round(time.Millisecond), m.Payload)
			}
		}
		if !last.IsZero() && last.Sub(revoked) > 2*time.Second {
			t.Errorf("events still arrived %v after the RoleBinding was deleted", last.Sub(revoked))
		}
		var r objectsResult
		e.query("alice", objectsQuery, map[string]any{"filter": map[string]any{"clusters": []string{east.Name}}}, &r)
		if r.Objects.TotalCount != 0 {
			t.Errorf("after the revoke alice still sees %d objects", r.Objects.TotalCount)
		}
	})
}

// readTimeoutFor reads the next message of operation id within d, keeping
// other operations' messages.
func (c *wsClient) readTimeoutFor(id string, d time.Duration) (wsMessage, error) {
	for i, m := range c.pending {
		if m.ID == id {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return m, nil
		}
	}
	deadline := time.Now().Add(d)
	for {
		m, err := c.readTimeout(time.Until(deadline))
		if err != nil {
			return m, err
		}
		if m.ID == id {
			return m, nil
		}
		c.pending = append(c.pending, m)
	}
}

// nextDataWithin is nextData with a deadline.
func nextDataWithin[T any](t *testing.T, c *wsClient, id string, d time.Duration) T {
	t.Helper()
	m, err := c.readTimeoutFor(id, d)
	if err != nil {
		t.Fatalf("operation %s: nothing within %v: %v", id, d, err)
	}
	var p struct {
		Data   T
		Errors []gqlErr
	}
	must(t, json.Unmarshal(m.Payload, &p))
	if m.Type != "next" || len(p.Errors) > 0 {
		t.Fatalf("operation %s: %s %s", id, m.Type, m.Payload)
	}
	return p.Data
}

type connEventData = struct {
	Cluster, State string
	Previous       *string
	Message        *string
	At             time.Time
}

func nextConnWithin(t *testing.T, c *wsClient, id string, d time.Duration) connEventData {
	t.Helper()
	return nextDataWithin[connEvent](t, c, id, d).ClusterConnection
}
