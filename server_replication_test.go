package fleetgraph_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
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
