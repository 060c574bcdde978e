package fleetgraph_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
	"github.com/fleetgraph/fleetgraph/internal/conntest"
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
	users := tokenFileUsers(t, "root-token,root,0,ops\nbob-token,bob,1\n")
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

// sendAcked sends m and waits until the manager acknowledged it (applied
// it to the index); a reject ends the test.
func (r *rogueEdge) sendAcked(m *edge.Message) {
	r.t.Helper()
	r.send(m)
	for {
		a := r.next()
		if a.Type == edge.TypeReject {
			r.t.Fatalf("%s %d rejected: %+v", m.Type, m.Seq, a.Reject)
		}
		if a.Type == edge.TypeAck && a.Ack.Seq >= m.Seq {
			return
		}
	}
}

// rawRows encodes rows for a snapshot or delta.
func rawRows(t *testing.T, rows []index.Object) []json.RawMessage {
	t.Helper()
	raws := make([]json.RawMessage, len(rows))
	for i := range rows {
		b, err := json.Marshal(&rows[i])
		if err != nil {
			t.Fatal(err)
		}
		raws[i] = b
	}
	return raws
}

// thingKind is the fresh kind of churn round r.
func thingKind(r int) index.Kind {
	return index.Kind{Group: "example.com", Version: "v1", Kind: fmt.Sprintf("Thing%d", r), Resource: fmt.Sprintf("thing%ds", r), Namespaced: true}
}

// dictionaryStrings scrapes fleetgraph_index_dictionary_strings as a fleet
// admin.
func dictionaryStrings(t *testing.T, url, token string) map[string]int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	out := map[string]int{}
	for line := range strings.Lines(string(b)) {
		var name string
		var n int
		if _, err := fmt.Sscanf(line, "fleetgraph_index_dictionary_strings{dictionary=%q} %d", &name, &n); err == nil {
			out[name] = n
		}
	}
	if len(out) == 0 {
		t.Fatalf("/metrics has no fleetgraph_index_dictionary_strings:\n%s", b)
	}
	return out
}

// TestEdgeChurnDoesNotGrowDictionaries plays an edge that replaces its
// rows again and again, by full snapshots and by deltas, each time with
// label keys, label values, a namespace and (in snapshots) a kind never
// sent before, while
// another cluster's rows sit in the index. The index's dictionaries
// (fleetgraph_index_dictionary_strings) stay bounded by the live rows and
// the replay buffer's recent past, not by everything the edge ever sent;
// the other cluster's rows, the edge's own last rows and queries by label
// are unchanged, and the server keeps serving.
func TestEdgeChurnDoesNotGrowDictionaries(t *testing.T) {
	const (
		rounds = 120
		perRow = 40  // rows the edge keeps
		replay = 256 // change events the index keeps
	)
	users := tokenFileUsers(t, "root-token,root,0,ops\n")
	_, url := runServer(t, fleetgraph.Config{
		Authenticator: users, AdminGroups: []string{"ops"}, ReplayBuffer: replay,
		EdgeTokens: edge.NewStaticTokens(map[string]string{"tok-a": "edge-a", "tok-b": "edge-b"}),
	})
	podKind := index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	kinds := []edge.KindState{{Kind: podKind, Synced: true}}

	// B's rows, indexed once.
	b := dialRogue(t, url, "edge-b", "tok-b")
	var bRows []index.Object
	for i := range 5 {
		bRows = append(bRows, index.Object{
			Cluster: "edge-b", Namespace: "steady", Version: "v1", Kind: "Pod", Resource: "pods", Name: fmt.Sprintf("b-%d", i),
			Status: index.StatusHealthy, Labels: index.LabelsOf(map[string]string{"team": "b", "idx": fmt.Sprint(i)}), ResourceVersion: "1",
		})
	}
	if m := b.snapshot(kinds, bRows); m.Type != edge.TypeAck {
		t.Fatalf("B's snapshot: %s %+v", m.Type, m.Reject)
	}
	before := allRows(t, url, "edge-b")
	start := dictionaryStrings(t, url, "root-token")

	// A churns: round r's rows carry strings no round sent before.
	a := dialRogue(t, url, "edge-a", "tok-a")
	rowsOf := func(r int) []index.Object {
		rows := make([]index.Object, perRow)
		for i := range rows {
			rows[i] = index.Object{
				Cluster: "edge-a", Namespace: fmt.Sprintf("ns-%d", r/2), Version: "v1", Kind: "Pod", Resource: "pods",
				Name: fmt.Sprintf("p-%d", i), Status: index.StatusHealthy, ResourceVersion: fmt.Sprint(r),
				Labels: index.LabelsOf(map[string]string{"app": fmt.Sprintf("v-%d-%d", r, i), fmt.Sprintf("key-%d", r): "x"}),
			}
		}
		return rows
	}
	for r := range rounds {
		if r%2 == 0 {
			// A full snapshot: last round's rows go (a new namespace),
			// and so does last round's kind (a new one each time).
			thing := thingKind(r)
			rows := append(rowsOf(r), index.Object{
				Cluster: "edge-a", Namespace: "ns-things", Group: thing.Group, Version: thing.Version, Kind: thing.Kind,
				Resource: thing.Resource, Name: "thing", Status: index.StatusHealthy,
			})
			a.sendAcked(&edge.Message{Type: edge.TypeSnapshot, Snapshot: &edge.Snapshot{
				ID: uint64(r) + 1, Final: true, Full: true, Kinds: append(kinds, edge.KindState{Kind: thing, Synced: true}), Rows: rawRows(t, rows),
			}})
		} else {
			// A delta replacing every row's labels in place.
			a.sendAcked(&edge.Message{Type: edge.TypeDelta, Delta: &edge.Delta{Upserts: rawRows(t, rowsOf(r))}})
		}
	}
	end := dictionaryStrings(t, url, "root-token")
	// At most the live strings and about three rounds' worth (the
	// replay buffer's) wait; without reclaiming, each grows by a round's
	// worth per round (60 kinds and namespaces, 120 keys, about 4,800
	// values).
	for d, most := range map[string]int{"kinds": 5, "namespaces": 20, "label_keys": 20, "label_values": 400, "label_pairs": 400} {
		if end[d] > start[d]+most {
			t.Errorf("%s: %d strings after %d rounds of fresh strings (%d before); want at most %d more",
				d, end[d], rounds, start[d], most)
		}
	}
	t.Logf("dictionary strings before %v, after %v", start, end)

	// The server serves, B is untouched, and A's last rows are as sent.
	if after := allRows(t, url, "edge-b"); !slices.Equal(before, after) {
		t.Errorf("B's rows changed:\n before %v\n after  %v", before, after)
	}
	for _, c := range []struct{ filter, want string }{
		{`{labelSelector: "team=b"}`, `"totalCount":5`},
		{`{labelSelector: "idx=3", clusters: ["edge-b"]}`, `"totalCount":1`},
		{fmt.Sprintf(`{labelSelector: "app=v-%d-7", namespaces: ["ns-%d"]}`, rounds-1, (rounds-1)/2), `"totalCount":1`},
		{fmt.Sprintf(`{labelSelector: "key-%d=x"}`, rounds-1), fmt.Sprintf(`"totalCount":%d`, perRow)},
		{`{labelSelector: "app=v-0-7"}`, `"totalCount":0`},
		{`{clusters: ["edge-a"], kinds: ["Pod"]}`, fmt.Sprintf(`"totalCount":%d`, perRow)},
		{fmt.Sprintf(`{kinds: [%q]}`, thingKind(rounds-2).Kind), `"totalCount":1`},
		{fmt.Sprintf(`{kinds: [%q]}`, thingKind(rounds-4).Kind), `"totalCount":0`},
	} {
		r := query(t, url, "root-token", fmt.Sprintf(`{ objects(first: 1, filter: %s) { totalCount } }`, c.filter))
		if len(r.Errors) > 0 || !strings.Contains(string(r.Data), c.want) {
			t.Errorf("objects(filter: %s): %s %v; want %s", c.filter, r.Data, r.Errors, c.want)
		}
	}
}

// TestRefusedEdgeClusterGrantsNothing: through the API, a push cluster
// whose data the manager refuses over its quota grants nothing from its
// RBAC rows, which may be outdated, while its fleet admins still see its
// last known objects, stale (docs/security.md, "A refused cluster grants
// nothing"). bob may list the cluster's ConfigMaps by a ClusterRoleBinding;
// once the edge's delta of ten more ConfigMaps is refused (quota), bob sees
// nothing of the cluster, and root (ops, a fleet admin) sees the one
// ConfigMap the manager had, in a stale cluster.
func TestRefusedEdgeClusterGrantsNothing(t *testing.T) {
	users := tokenFileUsers(t, "root-token,root,0,ops\nbob-token,bob,1\n")
	_, url := runServer(t, fleetgraph.Config{
		Authenticator: users, AdminGroups: []string{"ops"},
		EdgeTokens: edge.NewStaticTokens(map[string]string{"tok-a": "edge-a"}),
		Edge:       edge.HubOptions{Quotas: edge.Quotas{RowsPerCluster: 5}},
	})
	cmKind := index.Kind{Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}
	roleKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}
	bindingKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings"}
	cm := func(name string) index.Object {
		return index.Object{Cluster: "edge-a", Namespace: "ns-0", Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Name: name, Status: index.StatusHealthy}
	}
	a := dialRogue(t, url, "edge-a", "tok-a")
	if m := a.snapshot([]edge.KindState{{Kind: cmKind, Synced: true}, {Kind: roleKind, Synced: true}, {Kind: bindingKind, Synced: true}}, []index.Object{
		cm("cm-0"),
		{Cluster: "edge-a", Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles", Name: "cm-lister", Policy: &index.Policy{
			Rules: []index.PolicyRule{{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}},
		}},
		{Cluster: "edge-a", Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings", Name: "bob", Policy: &index.Policy{
			RoleRef:  index.RoleRef{APIGroup: index.RBACGroup, Kind: index.KindClusterRole, Name: "cm-lister"},
			Subjects: []index.Subject{{Kind: "User", APIGroup: index.RBACGroup, Name: "bob"}},
		}},
	}); m.Type != edge.TypeAck {
		t.Fatalf("the snapshot: %s %+v", m.Type, m.Reject)
	}
	const q = `{ objects(first: 100, filter: {clusters: ["edge-a"]}) { totalCount staleClusters edges { node { name } } } }`
	sees := func(token string) string {
		t.Helper()
		r := query(t, url, token, q)
		if len(r.Errors) > 0 {
			t.Fatalf("%s's query: %v", token, r.Errors)
		}
		return string(r.Data)
	}
	const one = `{"objects":{"totalCount":1,"staleClusters":[],"edges":[{"node":{"name":"cm-0"}}]}}`
	if got := sees("bob-token"); got != one {
		t.Fatalf("bob, who may list the ConfigMaps, sees %s, want %s", got, one)
	}

	var flood []index.Object
	for i := range 10 {
		flood = append(flood, cm(fmt.Sprintf("flood-%d", i)))
	}
	a.send(&edge.Message{Type: edge.TypeDelta, Delta: &edge.Delta{Upserts: rawRows(t, flood)}})
	if m := a.next(); m.Type != edge.TypeReject || m.Reject.Reason != edge.ReasonQuota {
		t.Fatalf("the flood: %s %+v; want a quota reject", m.Type, m.Reject)
	}
	// The RBAC rows are withheld before the Reject is sent.
	if got, want := sees("bob-token"), `{"objects":{"totalCount":0,"staleClusters":[],"edges":[]}}`; got != want {
		t.Errorf("bob, after the refusal, sees %s, want %s", got, want)
	}
	// The cluster is marked stale once the session has ended, after the
	// Reject.
	const stale = `{"objects":{"totalCount":1,"staleClusters":["edge-a"],"edges":[{"node":{"name":"cm-0"}}]}}`
	conntest.Eventually(t, 10*time.Second, "root, a fleet admin, sees the stale ConfigMap", func() error {
		if got := sees("root-token"); got != stale {
			return fmt.Errorf("root sees %s, want %s", got, stale)
		}
		return nil
	})
}

// tokenFileUsers is an authenticator of a static token file (the
// `--token-file` format) with these lines, written to a temporary file.
func tokenFileUsers(t *testing.T, lines string) *authz.TokenFile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := authz.OpenTokenFile(path, authz.TokenFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return users
}
