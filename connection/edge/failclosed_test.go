package edge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// The RBAC kinds, as the collector reports them.
var (
	roleKind               = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles", Namespaced: true}
	clusterRoleKind        = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}
	roleBindingKind        = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}
	clusterRoleBindingKind = index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings"}
)

// rbacRow is an RBAC row of cluster: a Role or ClusterRole with rules, or
// a binding with ref and subjects, in namespace ns ("" for the cluster
// kinds).
func rbacRow(cluster string, kind index.Kind, ns, name string, p index.Policy) index.Object {
	return index.Object{
		Cluster: cluster, Group: kind.Group, Version: kind.Version, Kind: kind.Kind, Resource: kind.Resource,
		Namespace: ns, Name: name, UID: "uid-" + name, Policy: &p,
	}
}

func rules(verb, resource string, more ...index.PolicyRule) index.Policy {
	return index.Policy{Rules: append([]index.PolicyRule{{Verbs: []string{verb}, APIGroups: []string{""}, Resources: []string{resource}}}, more...)}
}

func boundTo(kind, role string, users ...string) index.Policy {
	p := index.Policy{RoleRef: index.RoleRef{APIGroup: index.RBACGroup, Kind: kind, Name: role}}
	for _, u := range users {
		p.Subjects = append(p.Subjects, index.Subject{Kind: "User", APIGroup: index.RBACGroup, Name: u})
	}
	return p
}

// padding returns n strings of size bytes each, every one under the
// per-row string quota: what makes a row too large for a message without
// being over a quota.
func padding(n, size int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%04d", i) + strings.Repeat("p", size-4)
	}
	return out
}

// runAgent starts an agent and returns it with a stop that waits for it.
func runAgent(t *testing.T, opts AgentOptions) (*Agent, func()) {
	t.Helper()
	token := tokenFor(opts.Cluster)
	opts.Token = func() (string, error) { return token, nil }
	setDefault(&opts.PingInterval, testPing)
	setDefault(&opts.PongWait, testPongWait)
	setDefault(&opts.BackoffInitial, 100*time.Millisecond)
	setDefault(&opts.BackoffMax, time.Second)
	a, err := NewAgent(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// mayGet returns a function that asks the real RBAC authorizer, over the
// manager's index, whether the user name may get resource in namespace
// default of cluster. The authorizer's error names the rules it could not
// read (a binding to a role the index does not have), which deny, as in
// Kubernetes: only the decision counts here.
func mayGet(t *testing.T, h *hubHarness, cluster string) func(name, resource string) bool {
	az := authz.NewAuthorizer(h.store, authz.Options{})
	return func(name, resource string) bool {
		d, _ := az.Authorize(t.Context(), cluster, authz.NewIdentity(&user.DefaultInfo{Name: name}), authz.Attributes{
			Verb: "get", Namespace: "default", Resource: resource, Name: "x", ResourceRequest: true,
		})
		return d.Allowed
	}
}

// runAgentWith starts an agent of cluster as instance that holds rows (by
// kind) and then changes before its first snapshot, with no periodic
// resync (none counts the rows it holds back again), and returns it with
// a stop that waits for it.
func runAgentWith(t *testing.T, h *hubHarness, cluster, instance string, rows map[index.Kind][]index.Object, changes []index.Object) (*Agent, func()) {
	t.Helper()
	never := time.Hour
	a, stop := runAgent(t, AgentOptions{
		Manager: h.url, Cluster: cluster, Instance: instance,
		Resync: ResyncOptions{Interval: never, Min: never, Max: never},
	})
	var kinds []index.Kind
	for kind, rs := range rows {
		if err := a.buf.Replace(t.Context(), cluster, kind, rs); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, kind)
	}
	for _, o := range changes {
		if err := a.buf.Upsert(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
	a.buf.expect(kinds)
	return a, stop
}

// TestLeftOutRowsFailClosed: a row the edge does not send never leaves
// the manager with its older state, and for RBAC never with a grant the
// cluster revoked (review-s10-edge M-E1). The manager reads 64 KiB
// messages; a binding whose subjects, or a role whose rules, add up to
// more is too large for any message though every string of it is under
// the per-row quota. Over a real websocket, checked with the real RBAC
// authorizer over the manager's index:
//
//   - deltas: alice's ClusterRoleBinding is changed to name someone else
//     and made too large, bob's Role loses its rule on secrets and is made
//     too large, carol's ClusterRole loses its rule on pods and gets a
//     rule string over the quota: none of the three may read any more.
//     Rows a broken edge holds that the index refuses (a RoleBinding with
//     no namespace, a ConfigMap whose name holds a NUL) are not sent and
//     cost no session; a ConfigMap whose row no longer encodes stays as a
//     placeholder, not synced (review-s11 D1; only RBAC rows fail closed
//     by a delete). erin's grant and the other ConfigMaps, untouched,
//     stay.
//   - a snapshot: the grants are restored, the edge stops, the same
//     revocations happen while it is away, and a new session of the same
//     instance starts with a full snapshot that leaves the rows out: the
//     manager drops them at its commit.
//
// No session is refused in either: one row costs only itself.
func TestLeftOutRowsFailClosed(t *testing.T) {
	const cluster, instance = "edge-b", "edge-b-1"
	ctx := t.Context()
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 64 << 10})
	may := mayGet(t, h, cluster)
	type grant struct {
		user, resource string
	}
	grants := []grant{{"alice", "configmaps"}, {"bob", "secrets"}, {"carol", "pods"}, {"erin", "services"}}
	// granting returns why the users in allowed are not exactly those
	// that may read what grants give them, failing at once if the manager
	// refused a session.
	granting := func(t *testing.T, a *Agent, allowed ...string) error {
		t.Helper()
		if s := a.Stats(); s.Rejects > 0 {
			t.Fatalf("the manager refused %d sessions, the last: %v", s.Rejects, s.LastReject)
		}
		var errs []error
		for _, g := range grants {
			want := slices.Contains(allowed, g.user)
			if got := may(g.user, g.resource); got != want {
				errs = append(errs, fmt.Errorf("%s may get %s: %v, want %v", g.user, g.resource, got, want))
			}
		}
		return errors.Join(errs...)
	}
	// expect waits until exactly the users in allowed may read what
	// grants give them.
	expect := func(t *testing.T, a *Agent, what string, allowed ...string) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, what, func() error { return granting(t, a, allowed...) })
	}
	granted := map[index.Kind][]index.Object{
		clusterRoleKind: {
			rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
			rbacRow(cluster, clusterRoleKind, "", "pod-reader", rules("get", "pods")),
			rbacRow(cluster, clusterRoleKind, "", "svc-reader", rules("get", "services")),
		},
		clusterRoleBindingKind: {
			rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice")),
			rbacRow(cluster, clusterRoleBindingKind, "", "carol-reads", boundTo(index.KindClusterRole, "pod-reader", "carol")),
			rbacRow(cluster, clusterRoleBindingKind, "", "erin-reads", boundTo(index.KindClusterRole, "svc-reader", "erin")),
		},
		roleKind:        {rbacRow(cluster, roleKind, "default", "secret-reader", rules("get", "secrets"))},
		roleBindingKind: {rbacRow(cluster, roleBindingKind, "default", "bob-reads", boundTo(index.KindRole, "secret-reader", "bob"))},
	}
	// The revocations: each row as the cluster now has it, which the edge
	// cannot send.
	tooManySubjects := boundTo(index.KindClusterRole, "cm-reader", append([]string{"dave"}, padding(12, 6<<10)...)...)
	tooManyRules := rules("list", "configmaps", index.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: padding(12, 6<<10)})
	overQuota := rules("get", "services", index.PolicyRule{Verbs: []string{strings.Repeat("v", 20<<10)}, Resources: []string{"pods"}})
	revoked := []index.Object{
		rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", tooManySubjects),
		rbacRow(cluster, roleKind, "default", "secret-reader", tooManyRules),
		rbacRow(cluster, clusterRoleKind, "", "pod-reader", overQuota),
	}
	// What a broken edge holds that the index refuses; the manager never
	// had these keys.
	refused := []index.Object{
		rbacRow(cluster, roleBindingKind, "", "no-namespace", boundTo(index.KindClusterRole, "cm-reader", "mallory")),
	}
	badKey := testRows(cluster, 1, "1")[0]
	badKey.Name = "a\x00b"
	// A ConfigMap the manager has, whose row no longer encodes (a Summary
	// that is not JSON): before, the session ended over it, every time.
	badSummary := testRows(cluster, 3, "2")[2]
	badSummary.Summary = []byte(`{"x":`)

	leftCMs := []string{"ConfigMap/default/cm-00000", "ConfigMap/default/cm-00001", "ConfigMap/default/cm-00002"}
	changed := append(append(revoked, refused...), badKey, badSummary)
	upsert := func(a *Agent, rows []index.Object) {
		for _, o := range rows {
			if err := a.buf.Upsert(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	granted[testKind] = testRows(cluster, 3, "1")
	// start starts the edge with the granted rows, then those of changes,
	// before its first snapshot.
	start := func(changes []index.Object) (*Agent, func()) {
		return runAgentWith(t, h, cluster, instance, granted, changes)
	}

	// expectRevoked waits until the whole of changed is in: only erin
	// may read, the manager has only the ConfigMaps of leftCMs, the one
	// of badSummary as a placeholder, and the edge counted the rows it
	// left out. The rows of changed may come in
	// more than one delta, so each part is waited for, not only the first;
	// on timeout every part still wrong is named.
	expectRevoked := func(t *testing.T, a *Agent, what string) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, what, func() error {
			var errs []error
			if err := granting(t, a, "erin"); err != nil {
				errs = append(errs, err)
			}
			if got := names(t, h.store, cluster); !slices.Equal(got, leftCMs) {
				errs = append(errs, fmt.Errorf("the manager has the ConfigMaps %v, want %v", got, leftCMs))
			}
			if o, ok := h.store.Get(badSummary.Key()); !ok || o.Status != index.StatusUnknown || len(o.Summary) != 0 {
				errs = append(errs, fmt.Errorf("the ConfigMap whose row does not encode: %+v, want a placeholder", o))
			}
			if s := a.Stats(); s.TooBig != 2 || s.OverQuota != 4 {
				errs = append(errs, fmt.Errorf("%d rows too big, %d over a quota or the index's rules; want 2, 4", s.TooBig, s.OverQuota))
			}
			return errors.Join(errs...)
		})
	}

	t.Run("deltas", func(t *testing.T) {
		a, stop := start(nil)
		defer stop()
		expect(t, a, "the grants synced", "alice", "bob", "carol", "erin")
		upsert(a, changed)
		expectRevoked(t, a, "the grants revoked")
		if s := a.Stats(); s.Sessions != 1 {
			t.Errorf("%d sessions, want 1", s.Sessions)
		}
	})

	t.Run("a snapshot", func(t *testing.T) {
		a, stop := start(nil)
		expect(t, a, "the grants restored", "alice", "bob", "carol", "erin")
		stop()
		h.waitReleased(t, cluster)
		if !may("alice", "configmaps") || !may("bob", "secrets") {
			t.Fatal("the manager dropped the grants when the edge left; the snapshot would prove nothing")
		}
		// The cluster revokes the grants while its edge is away; the
		// manager serves what it had meanwhile (rows of a disconnected
		// cluster stay, as stale), until the edge is back.
		a, stop = start(changed)
		defer stop()
		expectRevoked(t, a, "the grants revoked by the first snapshot")
		oneSessionSnapshotted(t, a)
	})
}

// oneSessionSnapshotted checks that a has had one session and sent a
// snapshot in it. The agent counts a snapshot once the write of its last
// part has returned, which may be after the manager committed it and the
// test saw the commit: it waits for the count rather than reading it once.
func oneSessionSnapshotted(t *testing.T, a *Agent) {
	t.Helper()
	conntest.Eventually(t, 30*time.Second, "the agent counted its snapshot", func() error {
		if s := a.Stats(); s.Snapshots == 0 {
			return errors.New("no snapshot counted yet")
		}
		return nil
	})
	if s := a.Stats(); s.Sessions != 1 {
		t.Errorf("%d sessions, want 1", s.Sessions)
	}
}
