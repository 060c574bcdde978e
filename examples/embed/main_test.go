package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph/examples/internal/exampletest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

var widgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// TestEmbed runs the program against a real cluster holding Widgets: the
// custom kind is collected with its status, API keys authenticate over HTTP
// (header or bearer) and websockets, and the cluster's RBAC for the key's
// user and groups decides what each caller sees.
func TestEmbed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := testcluster.Start(t, testcluster.Options{Name: "east"})
	ctx := t.Context()
	if err := c.InstallCRDs(ctx, []byte(widgetCRD)); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	for _, ns := range []string{"widgets-a", "widgets-b"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	createWidget(t, c, "widgets-a", "ok", map[string]any{"type": "Ready", "status": "True", "reason": "Ready", "message": "all good"})
	createWidget(t, c, "widgets-a", "broken", map[string]any{"type": "Stalled", "status": "True", "reason": "NoParts", "message": "out of sprockets"})
	createWidget(t, c, "widgets-b", "other", map[string]any{"type": "Ready", "status": "True", "reason": "Ready", "message": "all good"})
	// The widget team may list widgets in widgets-a, and nothing else.
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-viewer"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, APIGroups: []string{"example.com"}, Resources: []string{"widgets"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.RbacV1().RoleBindings("widgets-a").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "widget-team"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "widget-viewer"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "widget-team"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	kubeconfig, keys := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "keys.csv")
	if err := c.WriteKubeconfig(kubeconfig, testcluster.AdminUser); err != nil {
		t.Fatal(err)
	}
	writeFile(t, keys, "# key,user,groups\nkey-admin,root,platform\nkey-carol,carol,widget-team;designers\n")
	url := startEmbed(t, "-kubeconfig", kubeconfig, "-api-keys", keys, "-listen", "127.0.0.1:0")

	exampletest.Eventually(t, 2*time.Minute, "east synced", func() error {
		var data struct {
			Cluster struct {
				Connection struct{ State string }
				Sync       struct{ Synced bool }
			}
		}
		if err := post(t, url, http.Header{"X-Api-Key": {"key-admin"}}, `{ cluster(name: "east") { connection { state } sync { synced } } }`, &data); err != nil {
			return err
		}
		if data.Cluster.Connection.State != "CONNECTED" || !data.Cluster.Sync.Synced {
			return fmt.Errorf("east: %+v", data.Cluster)
		}
		return nil
	})

	const widgetsQuery = `{ viewer { username groups } objects(filter: {kinds: ["Widget.example.com"]}) { edges { node { namespace name status message } } } }`
	type answer struct {
		Viewer struct {
			Username string
			Groups   []string
		}
		Objects struct {
			Edges []struct {
				Node struct{ Namespace, Name, Status, Message string }
			}
		}
	}
	rows := func(a answer) []string {
		var out []string
		for _, e := range a.Objects.Edges {
			n := e.Node
			out = append(out, fmt.Sprintf("%s/%s %s %s", n.Namespace, n.Name, n.Status, n.Message))
		}
		slices.Sort(out)
		return out
	}
	// carol, by header and by bearer token: her group's widgets, with the
	// status kstatus gives them.
	carolSees := []string{"widgets-a/broken UNHEALTHY out of sprockets", "widgets-a/ok HEALTHY Resource is Ready"}
	for _, h := range []http.Header{{"X-Api-Key": {"key-carol"}}, {"Authorization": {"Bearer key-carol"}}} {
		var a answer
		if err := post(t, url, h, widgetsQuery, &a); err != nil {
			t.Fatal(err)
		}
		if a.Viewer.Username != "carol" || !slices.Contains(a.Viewer.Groups, "widget-team") || !slices.Equal(rows(a), carolSees) {
			t.Errorf("carol (%v): %+v %q, want %q", h, a.Viewer, rows(a), carolSees)
		}
	}
	// The fleet admin sees every widget.
	var admin answer
	if err := post(t, url, http.Header{"X-Api-Key": {"key-admin"}}, widgetsQuery, &admin); err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(carolSees), "widgets-b/other HEALTHY Resource is Ready"); !slices.Equal(rows(admin), want) {
		t.Errorf("admin: %q, want %q", rows(admin), want)
	}

	// Websockets authenticate with the key in connection_init.
	if total := fleetOverWebsocket(t, url, "key-carol"); total != 1 {
		t.Errorf("carol's fleet over a websocket: %d clusters, want 1", total)
	}

	// Unknown keys and no credentials are refused.
	for _, h := range []http.Header{{"X-Api-Key": {"nope"}}, {"Authorization": {"Bearer nope"}}, {}} {
		if err := post(t, url, h, `{ viewer { username } }`, &struct{}{}); err == nil || !strings.Contains(err.Error(), "HTTP 401") {
			t.Errorf("%v: %v, want HTTP 401", h, err)
		}
	}
}

// TestEmbedBadKeys: the program refuses key files it cannot trust.
func TestEmbedBadKeys(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ keys, want string }{
		{"k,system:admin,\n", "system: names are Kubernetes' own"},
		{"k,eve,system:masters\n", "system: names are Kubernetes' own"},
		{"k,alice,\nk,bob,\n", "the key is listed twice"},
		{",alice,\n", "must not be empty"},
		{"k,alice\n", "wrong number of fields"},
		{"# nothing\n", "no keys"},
	} {
		path := filepath.Join(dir, "keys.csv")
		writeFile(t, path, tc.keys)
		err := run(t.Context(), []string{"-api-keys", path, "-kubeconfig", filepath.Join(dir, "none")}, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.keys, err, tc.want)
		}
	}
	if err := run(t.Context(), nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "-api-keys is required") {
		t.Errorf("no -api-keys: %v", err)
	}
}

func createWidget(t *testing.T, c *testcluster.Cluster, ns, name string, condition map[string]any) {
	t.Helper()
	ri := dynamic.NewForConfigOrDie(c.DirectConfig).Resource(widgets).Namespace(ns)
	w, err := ri.Create(t.Context(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(3)},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Object["status"] = map[string]any{"observedGeneration": w.GetGeneration(), "conditions": []any{condition}}
	if _, err := ri.UpdateStatus(t.Context(), w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startEmbed runs the program until the test ends, checking that it then
// exits cleanly, and returns its URL.
func startEmbed(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, w, os.Stderr)
		_ = w.CloseWithError(fmt.Errorf("embed exited: %w", err))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("embed: %v", err)
		}
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, r) }()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^serving (http://\S+) `).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("embed printed %q, want its URL", line)
	}
	return m[1]
}

// post runs a query with the given headers and decodes its data.
func post(t *testing.T, url string, h http.Header, query string, out any) error {
	body, _ := json.Marshal(map[string]string{"query": query})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/graphql", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var r exampletest.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("HTTP %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK || len(r.Errors) > 0 {
		return fmt.Errorf("HTTP %d: %+v", resp.StatusCode, r.Errors)
	}
	return json.Unmarshal(r.Data, out)
}

// fleetOverWebsocket reads the first fleet status over a
// graphql-transport-ws websocket, authenticated with key.
func fleetOverWebsocket(t *testing.T, url, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/graphql", &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.CloseNow() }()
	send := func(m map[string]any) {
		if err := wsjson.Write(ctx, conn, m); err != nil {
			t.Fatal(err)
		}
	}
	send(map[string]any{"type": "connection_init", "payload": map[string]string{"Authorization": "Bearer " + key}})
	send(map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{"query": "subscription { fleet { clustersTotal } }"}})
	for {
		var m struct {
			Type    string
			Payload struct {
				Data struct{ Fleet struct{ ClustersTotal int } }
			}
		}
		if err := wsjson.Read(ctx, conn, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type == "next" {
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return m.Payload.Data.Fleet.ClustersTotal
		}
		if m.Type != "connection_ack" {
			t.Fatalf("websocket: %+v", m)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
