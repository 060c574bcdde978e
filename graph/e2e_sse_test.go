package graph

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestE2ESSE runs subscriptions over server-sent events against real
// clusters: events arrive as each cluster's RBAC allows, anonymous
// streams are refused, the per-viewer limit holds, a revoked token ends
// its streams, and Close ends the rest cleanly.
func TestE2ESSE(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens.csv")
	must(t, os.WriteFile(file, []byte("sse-alice,alice,uid-alice\n"), 0o600))
	tf, err := authz.OpenTokenFile(file, authz.TokenFileOptions{Interval: 100 * time.Millisecond, Logger: testLogger(t)})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tf.Run(ctx)
	e, _ := startE2E(t, func(o *Options) {
		o.Authenticator = &authz.Union{Authenticators: []authz.Authenticator{tf, o.Authenticator}}
		o.Websocket.MaxOperations = 2
	})
	podsFilter := map[string]any{"filter": map[string]any{"kinds": []string{"Pod"}}}

	if c, status, body := e.openSSE("", objectChangesSub, podsFilter, true); c != nil || status != http.StatusUnauthorized {
		t.Fatalf("anonymous stream: %d %s", status, body)
	}
	alice, status, body := e.openSSE("sse-alice", objectChangesSub, podsFilter, true) // GET, as EventSource
	if alice == nil {
		t.Fatalf("alice: %d %s", status, body)
	}
	bob, status, body := e.openSSE(e.tokens["bob"], objectChangesSub, podsFilter, false) // POST
	if bob == nil {
		t.Fatalf("bob: %d %s", status, body)
	}
	e.waitSubscribers(2)

	newPod := func(c *testcluster.Cluster, ns, name string) {
		t.Helper()
		_, err := kubernetes.NewForConfigOrDie(c.DirectConfig).CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}, metav1.CreateOptions{})
		must(t, err)
	}
	// Each sees the pod created where their RoleBinding is, and only it.
	newPod(e.east, "ns-1", "sse-nobodys")
	newPod(e.east, "ns-0", "sse-alices")
	newPod(e.west, "ns-1", "sse-bobs")
	for _, tc := range []struct {
		c    *sseClient
		want string
	}{{alice, "sse-alices"}, {bob, "sse-bobs"}} {
		ev := tc.c.next(30 * time.Second)
		if r := ev.payload(t); ev.Event != "next" || len(r.Errors) > 0 || !strings.Contains(string(r.Data), `"name":"`+tc.want+`"`) {
			t.Fatalf("got %+v, want the event of %s and no other", ev, tc.want)
		}
	}

	// The limit: two streams per viewer.
	second, status, body := e.openSSE("sse-alice", fleetSub, nil, false)
	if second == nil {
		t.Fatalf("alice's second stream: %d %s", status, body)
	}
	if c, status, body := e.openSSE("sse-alice", fleetSub, nil, true); c != nil || status != http.StatusTooManyRequests {
		t.Fatalf("alice's third stream: %d %s, want 429", status, body)
	}

	// Revoking the token ends both of alice's streams within 5 s.
	must(t, os.WriteFile(file, []byte("someone-else,carol,uid-carol\n"), 0o600))
	revoked := time.Now()
	for _, c := range []*sseClient{alice, second} {
		if msg := lastError(t, c.end(5*time.Second), CodeUnauthenticated); !strings.Contains(msg, "revoked") {
			t.Errorf("alice's stream ended with %q", msg)
		}
	}
	t.Logf("alice's streams ended %v after her token was removed", time.Since(revoked).Round(time.Millisecond))

	// Close ends bob's stream after its last event, and the response ends.
	closeCtx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	must(t, e.h.Close(closeCtx))
	lastError(t, bob.end(5*time.Second), CodeShuttingDown)
}
