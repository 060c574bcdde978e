package connection

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

var podsGR = index.GroupResource{Resource: "pods"}

func TestRevocationReachesAuthz(t *testing.T) {
	t.Parallel()
	c := startClusters(t, testcluster.Options{Name: "revoke", Users: []testcluster.User{{Name: "alice"}}})[0]
	seeded(t, c, false, false, 2)
	ctx := t.Context()
	rbac := c.Client().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods", "services"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := func(name, role string) {
		t.Helper()
		if _, err := rbac.RoleBindings("ns-0").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind("alice-view", "view")

	h := newHarness(t, Options{}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	az := authz.NewAuthorizer(h.store, authz.Options{})
	alice := authz.NewIdentity(&user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}})
	sees := func() bool { return az.ClusterAccess(c.Name, alice).Allows(podsGR, "ns-0", "pod-0") }

	conntest.Eventually(t, 5*time.Second, "alice sees pods through the aggregated view role", func() error {
		if !sees() {
			return fmt.Errorf("alice cannot see pod-0")
		}
		return nil
	})
	if az.ClusterAccess(c.Name, alice).Allows(podsGR, "ns-1", "pod-0") {
		t.Fatal("alice sees pods outside her namespace")
	}

	t.Run("deleting the binding revokes within 2s", func(t *testing.T) {
		start := time.Now()
		if err := rbac.RoleBindings("ns-0").Delete(ctx, "alice-view", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		conntest.Eventually(t, 2*time.Second, "revocation", func() error {
			if sees() {
				return fmt.Errorf("alice still sees pod-0")
			}
			return nil
		})
		t.Logf("revoked after %s", time.Since(start).Round(time.Millisecond))
	})

	t.Run("editing the referenced ClusterRole revokes within 2s", func(t *testing.T) {
		bind("alice-pods", "pod-reader")
		conntest.Eventually(t, 5*time.Second, "grant", func() error {
			if !sees() {
				return fmt.Errorf("alice cannot see pod-0")
			}
			return nil
		})
		role, err := rbac.ClusterRoles().Get(ctx, "pod-reader", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		role.Rules[0].Resources = []string{"services"}
		start := time.Now()
		if _, err := rbac.ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		conntest.Eventually(t, 2*time.Second, "revocation", func() error {
			if sees() {
				return fmt.Errorf("alice still sees pod-0")
			}
			return nil
		})
		t.Logf("revoked after %s", time.Since(start).Round(time.Millisecond))
		if !az.ClusterAccess(c.Name, alice).Allows(index.GroupResource{Resource: "services"}, "ns-0", "svc-0") {
			t.Error("alice lost services too")
		}
	})
}

// faultInjector fails requests that match, as a misbehaving API server or
// proxy would.
type faultInjector struct {
	next   http.RoundTripper
	match  func(*http.Request) bool
	status int
	left   atomic.Int32
	hits   atomic.Int32
}

func (f *faultInjector) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.match(req) && f.left.Add(-1) >= 0 {
		f.hits.Add(1)
		body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected %d","code":%d}`, f.status, f.status)
		return &http.Response{
			StatusCode: f.status, Status: http.StatusText(f.status), Request: req, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": []string{"application/json"}},
			Body:   &stringBody{strings.NewReader(body)},
		}, nil
	}
	return f.next.RoundTrip(req)
}

type stringBody struct{ *strings.Reader }

func (stringBody) Close() error { return nil }

func TestThrottlingForbiddenAndGoneAreRetried(t *testing.T) {
	t.Parallel()
	c := startClusters(t, testcluster.Options{Name: "faults"})[0]
	seeded(t, c, false, false, 2)

	// Pods get a 429 (without Retry-After; client-go backs off and
	// retries it itself), services six 403s (three attempts of a
	// watch-list and the list it falls back to, with our backoff in
	// between), and the first watch of endpoint slices a 410 Gone.
	throttle := &faultInjector{status: http.StatusTooManyRequests, match: func(r *http.Request) bool {
		return strings.HasSuffix(r.URL.Path, "/pods")
	}}
	throttle.left.Store(1)
	forbid := &faultInjector{status: http.StatusForbidden, match: func(r *http.Request) bool {
		return strings.HasSuffix(r.URL.Path, "/services")
	}}
	forbid.left.Store(6)
	gone := &faultInjector{status: http.StatusGone, match: func(r *http.Request) bool {
		return strings.HasSuffix(r.URL.Path, "/endpointslices") && r.URL.Query().Get("watch") == "true"
	}}
	gone.left.Store(1)
	spec := Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) {
		cfg := rest.CopyConfig(c.Config)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			gone.next = rt
			forbid.next = gone
			throttle.next = forbid
			return throttle
		}
		return cfg, nil
	}}
	h := newHarness(t, Options{}, spec)
	// Services fail at first: the cluster is degraded with the reason on
	// the kind, and recovers on its own through the kind's backoff.
	h.rec.WaitFor(t, c.Name, index.StateDegraded, 1, 60*time.Second)
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	if n := throttle.hits.Load(); n != 1 {
		t.Errorf("%d throttled requests, want 1", n)
	}
	if n := forbid.hits.Load(); n != 6 {
		t.Errorf("%d forbidden requests, want 6", n)
	}
	if n := gone.hits.Load(); n != 1 {
		t.Errorf("%d gone watches, want 1", n)
	}
	for _, e := range h.store.KindErrors(nil, c.Name) {
		if e.Kind.Group == "" || e.Kind.Group == "discovery.k8s.io" {
			t.Errorf("kind error left after recovery: %+v", e)
		}
	}
	if _, err := c.Client().CoreV1().Services("ns-0").Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "after-faults"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := conntest.Truth(t, c, h.store.Kinds(c.Name))
	conntest.Eventually(t, 10*time.Second, "convergence after 429, 403 and 410", func() error { return conntest.DiffKeys(want, conntest.RowVersions(t, h.store, c.Name)) })
	if n := h.rec.Count(c.Name, index.StateDisconnected); n != 0 {
		t.Errorf("429, 403 and 410 caused %d disconnections", n)
	}
}
