package fleetgraph_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

type gqlResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []struct {
		Message    string         `json:"message"`
		Extensions map[string]any `json:"extensions"`
	} `json:"errors"`
}

func query(t *testing.T, url, token, q string) gqlResponse {
	t.Helper()
	body, err := json.Marshal(map[string]string{"query": q})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/graphql", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out gqlResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decoding the GraphQL response (HTTP %d): %v", resp.StatusCode, err)
	}
	return out
}

// TestEdgeEndToEnd runs a server with edge tokens and an edge agent for a
// real cluster, and reads through GraphQL: the cluster is PUSH and
// CONNECTED, the edge-replicated RBAC filters lists, and object(...) goes
// through the edge as the viewer.
func TestEdgeEndToEnd(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "e2e"})
	ctx := t.Context()
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: 2, Pods: 2, Services: 1}); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.RbacV1().Roles("ns-0").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings("ns-0").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	users, err := authz.ParseStaticTokens(strings.NewReader("alice-token,alice,1\nbob-token,bob,2\n"), "test", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	_, url := runServer(t, fleetgraph.Config{
		Authenticator: users,
		EdgeTokens:    edge.NewStaticTokens(map[string]string{"edge-secret": "e2e"}),
	})
	runAgent(t, url, "e2e", "edge-secret", c.DirectConfig)

	deadline := time.Now().Add(60 * time.Second)
	for {
		r := query(t, url, "alice-token", `{ cluster(name: "e2e") { mode connection { state } } }`)
		if string(r.Data) == `{"cluster":{"mode":"PUSH","connection":{"state":"CONNECTED"}}}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster never CONNECTED for alice: %s %v", r.Data, r.Errors)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Lists are filtered by the RBAC the edge replicated: alice sees the
	// two pods of ns-0 and nothing else.
	r := query(t, url, "alice-token", `{ objects(filter: {clusters: ["e2e"]}) { totalCount edges { node { namespace kind } } } }`)
	if len(r.Errors) > 0 || !strings.Contains(string(r.Data), `"totalCount":2`) || strings.Contains(string(r.Data), "ns-1") {
		t.Errorf("alice's objects: %s %v", r.Data, r.Errors)
	}

	detail := `{ object(cluster: "e2e", kind: "Pod", namespace: "ns-0", name: "pod-0") { name uid manifest } }`
	r = query(t, url, "alice-token", detail)
	if len(r.Errors) > 0 || !strings.Contains(string(r.Data), `"name":"pod-0"`) || !strings.Contains(string(r.Data), `"kind":"Pod"`) {
		t.Errorf("alice's live read through the edge: %s %v", r.Data, r.Errors)
	}
	r = query(t, url, "bob-token", detail)
	if len(r.Errors) != 1 || fmt.Sprint(r.Errors[0].Extensions["code"]) != "FORBIDDEN" {
		t.Errorf("bob's live read: %s %+v, want a FORBIDDEN error from the leaf", r.Data, r.Errors)
	}
}
