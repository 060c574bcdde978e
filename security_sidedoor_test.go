package fleetgraph_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestNoSideDoors plays a viewer probing for what exists (issue 12, item
// 3): against a real cluster, every question about a cluster the viewer
// sees nothing in gets, byte for byte, the answer a made-up cluster gets;
// inside a cluster the viewer sees something in, an invisible namespace or
// object answers like a missing one; and /metrics, whose labels name every
// cluster, is not readable by viewers.
func TestNoSideDoors(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "real"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 2, Pods: 2}); err != nil {
		t.Fatal(err)
	}
	bindView(t, c, "ns-0", userSubject("alice"))
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokens, []byte("root-token,root,0,ops\nalice-token,alice,1\ncarol-token,carol,2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := authz.OpenTokenFile(tokens, authz.TokenFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	specs, err := connection.KubeconfigSpecs(c.Kubeconfig, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, url := runServer(t, fleetgraph.Config{Clusters: specs, Authenticator: users, AdminGroups: []string{"ops"}})
	waitSynced(t, url, "root-token", 4)

	// answer returns the body of q with every name in names replaced by
	// a placeholder, so answers about different names compare.
	answer := func(token, q string, names ...string) string {
		t.Helper()
		code, body := post(t, url, token, q)
		for i, n := range names {
			body = strings.ReplaceAll(body, n, fmt.Sprintf("<name%d>", i))
		}
		return fmt.Sprintf("HTTP %d %s", code, body)
	}
	probes := []string{
		`{ object(cluster: "%s", kind: "Pod", namespace: "ns-0", name: "pod-0") { name } }`,
		`{ object(cluster: "%s", kind: "Namespace", name: "ns-0") { name } }`,
		`{ object(cluster: "%s", kind: "Pod", name: "pod-0") { name } }`,
		`{ object(cluster: "%s", kind: "NoSuchKind", name: "x") { name } }`,
		`{ cluster(name: "%s") { name } }`,
		`{ objects(filter: {clusters: ["%s"]}) { totalCount staleClusters edges { node { id } } } }`,
		`{ facets(filter: {clusters: ["%s"]}) { total clusters { value count } staleClusters } }`,
		`{ clusters { name } fleet { clustersTotal message } }`,
	}

	t.Run("an invisible cluster answers like a made-up one", func(t *testing.T) {
		for _, p := range probes {
			real := answer("carol-token", fmt.Sprintf(p, "real"), "real")
			madeUp := answer("carol-token", fmt.Sprintf(p, "made-up"), "made-up")
			if real != madeUp {
				t.Errorf("%s\n real:    %s\n made-up: %s", p, real, madeUp)
			}
		}
		// A viewer who sees something in the cluster is told it exists,
		// so the probes can tell.
		if a := answer("alice-token", fmt.Sprintf(probes[4], "real")); !strings.Contains(a, `"name":"real"`) {
			t.Errorf("alice asking for her cluster: %s", a)
		}
	})

	t.Run("inside a visible cluster, invisible namespaces and objects answer like missing ones", func(t *testing.T) {
		q := `{ object(cluster: "real", kind: "Pod", namespace: "%s", name: "%s") { name } }`
		existing := answer("alice-token", fmt.Sprintf(q, "ns-1", "pod-0"), "ns-1", "pod-0")
		for _, other := range [][2]string{{"ns-1", "no-such-pod"}, {"no-such-ns", "pod-0"}} {
			if a := answer("alice-token", fmt.Sprintf(q, other[0], other[1]), other[0], other[1]); a != existing {
				t.Errorf("%v answers\n %s\nbut an existing invisible pod answers\n %s", other, a, existing)
			}
		}
		if !strings.Contains(existing, "FORBIDDEN") {
			t.Errorf("an invisible pod: %s; want FORBIDDEN", existing)
		}
		if a := answer("alice-token", fmt.Sprintf(q, "ns-0", "pod-0")); !strings.Contains(a, `"pod-0"`) {
			t.Errorf("alice's own pod: %s", a)
		}
	})

	t.Run("viewers cannot read /metrics", func(t *testing.T) {
		for _, token := range []string{"", "carol-token", "alice-token"} {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/metrics", nil)
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 64<<10)
			n, _ := resp.Body.Read(b)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK || strings.Contains(string(b[:n]), "real") {
				t.Errorf("/metrics with token %q: %d %.200s", token, resp.StatusCode, b[:n])
			}
		}
	})
}
