package fleetgraph_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
	"github.com/fleetgraph/fleetgraph/replication"
)

// TestReplicatedRoles runs a collector and a query replica in one test
// process over an embedded JetStream server and a real cluster: the query
// replica answers from the stream what the collector collected, object
// details travel to the collector over NATS, and a new query replica is
// ready from the stream alone.
func TestReplicatedRoles(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "leaf"})
	ctx := t.Context()
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 2, Pods: 3, Services: 1}); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.RbacV1().RoleBindings("ns-0").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := replication.StartEmbedded(replication.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	repl := func(role fleetgraph.Role) *fleetgraph.Replication {
		nc, err := replication.ConnectEmbedded(ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return &fleetgraph.Replication{Role: role, Conn: nc, ID: "collector-a"}
	}
	_, collectorURL := runServer(t, fleetgraph.Config{
		Clusters:    []connection.Spec{{Name: "leaf", Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}},
		Replication: repl(fleetgraph.RoleCollector), Registry: prometheus.NewRegistry(),
	})
	users, err := authz.ParseStaticTokens(strings.NewReader("admin-token,admin,1,admins\nalice-token,alice,2\n"), "test", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	newQuery := func() string {
		_, url := runServer(t, fleetgraph.Config{
			Authenticator: users, AdminGroups: []string{"admins"}, Replication: repl(fleetgraph.RoleQuery), Registry: prometheus.NewRegistry(),
		})
		return url
	}
	queryURL := newQuery()

	want := `{"objects":{"totalCount":3}}` // alice sees the 3 pods of ns-0 (view does not cover RBAC objects)
	waitGraphQL(t, queryURL, "alice-token", `{ objects(filter: {kinds: ["Pod"]}) { totalCount } }`, want, 90*time.Second)
	r := query(t, queryURL, "admin-token", `{ cluster(name: "leaf") { mode connection { state } sync { synced } } fleet { clustersTotal clustersSynced } }`)
	if string(r.Data) != `{"cluster":{"mode":"PULL","connection":{"state":"CONNECTED"},"sync":{"synced":true}},"fleet":{"clustersTotal":1,"clustersSynced":1}}` {
		t.Fatalf("cluster on the query replica: %s %v", r.Data, r.Errors)
	}

	// Object details reach the leaf through the collector, as the viewer.
	detail := `{ object(cluster: "leaf", kind: "Pod", namespace: "ns-0", name: "pod-0") { name } }`
	if r := query(t, queryURL, "alice-token", detail); len(r.Errors) > 0 || string(r.Data) != `{"object":{"name":"pod-0"}}` {
		t.Fatalf("alice's detail: %s %v", r.Data, r.Errors)
	}
	if r := query(t, queryURL, "alice-token", `{ object(cluster: "leaf", kind: "Pod", namespace: "ns-1", name: "pod-0") { name } }`); len(r.Errors) != 1 {
		t.Fatalf("alice's detail in ns-1: %s %v, want an error", r.Data, r.Errors)
	}

	// The collector serves no queries, only its health.
	if r, err := httpGet(collectorURL + "/readyz"); err != nil || r != "ok\n" {
		t.Fatalf("collector /readyz: %q %v", r, err)
	}

	// A new query replica is ready from the stream and answers the same.
	second := newQuery()
	waitGraphQL(t, second, "alice-token", `{ objects(filter: {kinds: ["Pod"]}) { totalCount } }`, want, 30*time.Second)
	a := query(t, queryURL, "admin-token", `{ objects(first: 500) { totalCount edges { node { id status updatedAt } } } }`)
	b := query(t, second, "admin-token", `{ objects(first: 500) { totalCount edges { node { id status updatedAt } } } }`)
	if string(a.Data) != string(b.Data) {
		t.Fatalf("the replicas differ:\n%s\n%s", a.Data, b.Data)
	}
}

func waitGraphQL(t *testing.T, url, token, q, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := query(t, url, token, q)
		if string(r.Data) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s %v, want %s", q, r.Data, r.Errors, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpGet(url string) (string, error) {
	resp, err := http.Get(url) //nolint:noctx // a test's one-off GET
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestEdgesAcrossCollectors: two collectors sharing leases in a real
// management cluster, a query replica, and real edge agents of one real
// cluster. The edge's cluster is served by the replica from the collector
// that holds its session, with object details through it; a second edge
// instance is refused fleet-wide (at the other collector); and the first
// edge, reconnecting to the other collector, reclaims its cluster there.
func TestEdgesAcrossCollectors(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "edge-leaf"})
	ctx := t.Context()
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 1, Pods: 2}); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "admin-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "admin"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const leaseNS = "fleetgraph-leases"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := replication.StartEmbedded(replication.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	conn := func() *nats.Conn {
		nc, err := replication.ConnectEmbedded(ns)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	collector := func(id string) (string, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		_, url := runServer(t, fleetgraph.Config{
			EdgeTokens: edge.NewStaticTokens(map[string]string{"edge-secret": "edge-leaf"}),
			Registry:   reg,
			Replication: &fleetgraph.Replication{Role: fleetgraph.RoleCollector, Conn: conn(), Leases: &replication.LeaseOptions{
				Client: kubernetes.NewForConfigOrDie(c.DirectConfig), Namespace: leaseNS, ID: id, Duration: 3 * time.Second,
			}},
		})
		return url, reg
	}
	urlA, _ := collector("a")
	urlB, regB := collector("b")
	users, err := authz.ParseStaticTokens(strings.NewReader("admin-token,admin,1,admins\n"), "test", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	_, queryURL := runServer(t, fleetgraph.Config{
		Authenticator: users, AdminGroups: []string{"admins"}, Registry: prometheus.NewRegistry(),
		Replication: &fleetgraph.Replication{Role: fleetgraph.RoleQuery, Conn: conn()},
	})
	connected := `{"cluster":{"mode":"PUSH","connection":{"state":"CONNECTED"}}}`
	state := `{ cluster(name: "edge-leaf") { mode connection { state } } }`
	detail := `{ object(cluster: "edge-leaf", kind: "Pod", namespace: "ns-0", name: "pod-0") { name } }`

	stopFirst := startAgent(t, urlA, "vm-1", c.DirectConfig)
	waitGraphQL(t, queryURL, "admin-token", state, connected, 60*time.Second)
	if r := query(t, queryURL, "admin-token", detail); len(r.Errors) > 0 || string(r.Data) != `{"object":{"name":"pod-0"}}` {
		t.Fatalf("detail through collector a's edge session: %s %v", r.Data, r.Errors)
	}

	// Another instance's edge at the other collector is refused.
	stopSecond := startAgent(t, urlB, "vm-2", c.DirectConfig)
	waitFor(t, "collector b refuses the second edge", 30*time.Second, func() error {
		if n := counterValue(t, regB, "fleetgraph_edge_rejects_total", "reason", string(edge.ReasonAlreadyClaimed)); n < 1 {
			return fmt.Errorf("%v already_claimed rejects at b", n)
		}
		return nil
	})
	stopSecond()

	// The first edge moves to collector b and takes its cluster there.
	stopFirst()
	startAgent(t, urlB, "vm-1", c.DirectConfig)
	waitFor(t, "collector b holds the edge's session", 30*time.Second, func() error {
		if n := counterValue(t, regB, "fleetgraph_replication_cluster_owned", "mode", "push"); n != 1 {
			return fmt.Errorf("b owns %v push clusters", n)
		}
		return nil
	})
	waitGraphQL(t, queryURL, "admin-token", state, connected, 30*time.Second)
	if r := query(t, queryURL, "admin-token", detail); len(r.Errors) > 0 || string(r.Data) != `{"object":{"name":"pod-0"}}` {
		t.Fatalf("detail through collector b's edge session: %s %v", r.Data, r.Errors)
	}
}

// startAgent runs a real edge agent of instance for the cluster of local,
// connected to a manager; the function it returns stops it.
func startAgent(t *testing.T, managerURL, instance string, local *rest.Config) func() {
	t.Helper()
	agent, err := edge.NewAgent(edge.AgentOptions{
		Manager: managerURL + "/edge", Cluster: "edge-leaf", Instance: instance, Token: func() (string, error) { return "edge-secret", nil },
		Local: rest.CopyConfig(local), BackoffInitial: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	var once sync.Once
	end := func() {
		once.Do(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("agent %s: %v", instance, err)
			}
		})
	}
	t.Cleanup(end)
	return end
}

// counterValue sums a metric's series whose label has value.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return sum
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
