package fleetgraph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// rogueEdge speaks the edge protocol by hand, to send what a real edge
// never would.
type rogueEdge struct {
	t   *testing.T
	ws  *websocket.Conn
	seq uint64
}

func dialRogue(t *testing.T, url, cluster, token string) *rogueEdge {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/edge", &websocket.DialOptions{ //nolint:bodyclose // coder closes it
		Subprotocols: []string{edge.Subprotocol}, CompressionMode: websocket.CompressionNoContextTakeover,
	})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(64 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	r := &rogueEdge{t: t, ws: ws}
	r.send(&edge.Message{Type: edge.TypeHello, Hello: &edge.Hello{Version: edge.ProtocolVersion, Cluster: cluster, Instance: "rogue", Token: token}})
	if m := r.next(); m.Type != edge.TypeWelcome {
		t.Fatalf("hello: %s %+v", m.Type, m.Reject)
	}
	return r
}

func (r *rogueEdge) send(m *edge.Message) {
	r.t.Helper()
	r.seq++
	m.Seq, m.Time = r.seq, time.Now()
	if err := wsjson.Write(r.t.Context(), r.ws, m); err != nil {
		r.t.Fatal(err)
	}
}

// next reads the next message; a close ends the test.
func (r *rogueEdge) next() *edge.Message {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 20*time.Second)
	defer cancel()
	var m edge.Message
	if err := wsjson.Read(ctx, r.ws, &m); err != nil {
		r.t.Fatalf("reading from the manager: %v", err)
	}
	return &m
}

// snapshot sends a one-part full snapshot and returns the manager's
// answer to it (an ack or a reject).
func (r *rogueEdge) snapshot(kinds []edge.KindState, rows []index.Object) *edge.Message {
	r.t.Helper()
	raws := make([]json.RawMessage, len(rows))
	for i := range rows {
		b, err := json.Marshal(&rows[i])
		if err != nil {
			r.t.Fatal(err)
		}
		raws[i] = b
	}
	r.send(&edge.Message{Type: edge.TypeSnapshot, Snapshot: &edge.Snapshot{ID: r.seq, Final: true, Full: true, Kinds: kinds, Rows: raws}})
	for {
		if m := r.next(); m.Type == edge.TypeAck || m.Type == edge.TypeReject {
			return m
		}
	}
}

// TestEdgeSpeaksOnlyForItsCluster plays a rogue edge of cluster A against
// a manager that also serves cluster B, a real cluster pushed by a real
// edge agent: A describes Services with the resource "pods" before B
// connects, and later sends rows of B. B's viewer, who may list only pods,
// sees B's pods and nothing else in pages, counts and facets, and B's rows
// are untouched.
func TestEdgeSpeaksOnlyForItsCluster(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "edge-b"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 2, Pods: 2, Services: 2}); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	if _, err := kube.RbacV1().Roles("ns-0").Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-lister"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings("ns-0").Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "bob"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-lister"},
		Subjects:   []rbacv1.Subject{userSubject("bob")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokens, []byte("root-token,root,0,ops\nbob-token,bob,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := authz.OpenTokenFile(tokens, authz.TokenFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, url := runServer(t, fleetgraph.Config{
		Authenticator: users, AdminGroups: []string{"ops"},
		EdgeTokens: edge.NewStaticTokens(map[string]string{"tok-a": "edge-a", "tok-b": "edge-b"}),
	})

	// A's edge first: Services "are" pods, and a pod of its own.
	a := dialRogue(t, url, "edge-a", "tok-a")
	lying := index.Kind{Version: "v1", Kind: "Service", Resource: "pods", Namespaced: true}
	podKind := index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	if m := a.snapshot([]edge.KindState{{Kind: lying, Synced: true}, {Kind: podKind, Synced: true}}, []index.Object{
		{Cluster: "edge-a", Namespace: "ns-0", Version: "v1", Kind: "Service", Resource: "pods", Name: "fake", Status: index.StatusHealthy},
	}); m.Type != edge.TypeAck {
		t.Fatalf("A's snapshot: %s %+v", m.Type, m.Reject)
	}

	// Then B's real edge.
	runAgent(t, url, "edge-b", "tok-b", c.DirectConfig)
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := query(t, url, "root-token", `{ facets(filter: {clusters: ["edge-b"], kinds: ["Pod", "Service"]}) { total } cluster(name: "edge-b") { sync { synced } } }`)
		if strings.Contains(string(r.Data), `"total":9`) && strings.Contains(string(r.Data), `"synced":true`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B never synced its 4 pods and 5 services (the kubernetes one too): %s %v", r.Data, r.Errors)
		}
		time.Sleep(200 * time.Millisecond)
	}
	bobSees := func() string {
		t.Helper()
		r := query(t, url, "bob-token", `{ objects(first: 100, filter: {clusters: ["edge-b"]}) { totalCount edges { node { kind namespace name } } }
			facets(filter: {clusters: ["edge-b"]}) { total kinds { value count } namespaces { value count } } }`)
		if len(r.Errors) > 0 {
			t.Fatalf("bob's query: %v", r.Errors)
		}
		return string(r.Data)
	}
	const want = `{"objects":{"totalCount":2,"edges":[{"node":{"kind":"Pod","namespace":"ns-0","name":"pod-0"}},{"node":{"kind":"Pod","namespace":"ns-0","name":"pod-1"}}]},` +
		`"facets":{"total":2,"kinds":[{"value":"Pod","count":2}],"namespaces":[{"value":"ns-0","count":2}]}}`
	if got := bobSees(); got != want {
		t.Errorf("bob, who may list B's pods in ns-0, sees\n %s\nwant\n %s", got, want)
	}

	// A now sends a row of B, then a delete of one: each ends A's session
	// and changes nothing of B.
	before := allRows(t, url, "edge-b")
	for _, bad := range []*edge.Message{
		{Type: edge.TypeDelta, Delta: &edge.Delta{Upserts: []json.RawMessage{json.RawMessage(
			`{"cluster":"edge-b","namespace":"ns-0","version":"v1","kind":"Pod","resource":"pods","name":"pod-0","status":"UNHEALTHY"}`)}}},
		{Type: edge.TypeDelta, Delta: &edge.Delta{Deletes: []index.Key{{Cluster: "edge-b", Kind: "Pod", Namespace: "ns-0", Name: "pod-1"}}}},
	} {
		a = dialRogue(t, url, "edge-a", "tok-a")
		a.send(bad)
		m := a.next()
		for m.Type == edge.TypeAck {
			m = a.next()
		}
		if m.Type != edge.TypeReject || m.Reject.Reason != edge.ReasonWrongCluster {
			t.Errorf("A sending B's rows: %s %+v; want a wrong_cluster reject", m.Type, m.Reject)
		}
	}
	if after := allRows(t, url, "edge-b"); !slices.Equal(before, after) {
		t.Errorf("B's rows changed:\n before %v\n after  %v", before, after)
	}
	if got := bobSees(); got != want {
		t.Errorf("after A's attempts bob sees %s", got)
	}
}

// runAgent runs a real edge agent for a cluster until the test ends.
func runAgent(t *testing.T, managerURL, cluster, token string, local *rest.Config) {
	t.Helper()
	agent, err := edge.NewAgent(edge.AgentOptions{
		Manager: managerURL + "/edge", Cluster: cluster, Token: func() (string, error) { return token, nil },
		Local: rest.CopyConfig(local), BackoffInitial: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
}

// allRows lists a cluster's rows as a fleet admin sees them, with status
// and resource version.
func allRows(t *testing.T, url, cluster string) []string {
	t.Helper()
	r := query(t, url, "root-token", fmt.Sprintf(`{ objects(first: 1000, filter: {clusters: [%q]}) { edges { node { id status resourceVersion } } } }`, cluster))
	var d struct {
		Objects struct {
			Edges []struct {
				Node struct{ ID, Status, ResourceVersion string }
			}
		}
	}
	if err := json.Unmarshal(r.Data, &d); err != nil || len(r.Errors) > 0 {
		t.Fatalf("listing %s: %v %v", cluster, err, r.Errors)
	}
	var out []string
	for _, e := range d.Objects.Edges {
		out = append(out, e.Node.ID+" "+e.Node.Status+" "+e.Node.ResourceVersion)
	}
	return out
}
