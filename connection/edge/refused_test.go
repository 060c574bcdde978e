package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// TestRefusedClusterGrantsNothing: a cluster whose data the manager
// refuses as a whole keeps no grants at the manager (review-s11: a
// cluster refused by quota kept its stale RBAC rows). The attack: a
// namespace editor creates ConfigMaps until the cluster is over
// RowsPerCluster, so every session of its edge is refused with quota;
// then the cluster's admin deletes alice's RoleBinding, and that
// revocation never reaches the manager. Over a real websocket, with the
// real RBAC authorizer over the manager's index:
//
//   - a delta: the edge's delta with the editor's ConfigMaps is refused,
//     and the revocation comes after it;
//   - a snapshot: the edge is away (its grants stay, as for any
//     disconnect), the cluster is flooded and the binding deleted
//     meanwhile, and the returning edge's first snapshot is refused.
//
// In both, from the refusal on nobody may read anything through the
// cluster's RBAC (erin's untouched grant goes too: the manager cannot
// tell which of the rows it holds are still true), while the cluster's
// objects stay as last known and stale, for fleet admins. Once the
// cluster is back under its quota, the next snapshot is accepted and
// grants exactly what the cluster grants now: erin, not alice.
func TestRefusedClusterGrantsNothing(t *testing.T) {
	const cluster, instance = "edge-c", "edge-c-1"
	const quota = 10
	ctx := t.Context()
	h := newHubHarness(t, HubOptions{Quotas: Quotas{RowsPerCluster: quota}})
	az := authz.NewAuthorizer(h.store, authz.Options{})
	may := func(name, resource string) bool {
		d, _ := az.Authorize(ctx, cluster, authz.NewIdentity(&user.DefaultInfo{Name: name}), authz.Attributes{
			Verb: "get", Namespace: "default", Resource: resource, Name: "x", ResourceRequest: true,
		})
		return d.Allowed
	}
	aliceBinding := rbacRow(cluster, roleBindingKind, "default", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice"))
	policy := map[index.Kind][]index.Object{
		clusterRoleKind: {
			rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
			rbacRow(cluster, clusterRoleKind, "", "svc-reader", rules("get", "services")),
		},
		clusterRoleBindingKind: {rbacRow(cluster, clusterRoleBindingKind, "", "erin-reads", boundTo(index.KindClusterRole, "svc-reader", "erin"))},
		roleBindingKind:        {aliceBinding},
	}
	// 3 ConfigMaps and 4 RBAC rows fit the quota; the editor's 10 do not.
	cms, flood := testRows(cluster, 3, "1"), testRows(cluster, quota, "1")
	var cmNames []string
	for _, o := range cms {
		cmNames = append(cmNames, o.Kind+"/"+o.Namespace+"/"+o.Name)
	}

	// granting returns why the users of allowed are not exactly those of
	// alice (configmaps) and erin (services) who may read.
	granting := func(allowed ...string) error {
		var errs []error
		for _, g := range []struct{ user, resource string }{{"alice", "configmaps"}, {"erin", "services"}} {
			want := slices.Contains(allowed, g.user)
			if got := may(g.user, g.resource); got != want {
				errs = append(errs, fmt.Errorf("%s may get %s: %v, want %v", g.user, g.resource, got, want))
			}
		}
		return errors.Join(errs...)
	}
	// state returns why the cluster is not as want: connected (not stale)
	// with the ConfigMaps of cms, or, refused, stale with them still.
	state := func(refused bool) error {
		var errs []error
		if got := names(t, h.store, cluster); !slices.Equal(got, cmNames) {
			errs = append(errs, fmt.Errorf("the manager has the ConfigMaps %v, want %v", got, cmNames))
		}
		if c, ok := h.store.GetCluster(nil, cluster); !ok || c.Stale() != refused {
			errs = append(errs, fmt.Errorf("cluster %+v (found %v), want stale %v", c, ok, refused))
		}
		return errors.Join(errs...)
	}
	// expect waits until exactly allowed may read and the cluster is as
	// state(refused) wants.
	expect := func(t *testing.T, what string, refused bool, allowed ...string) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, what, func() error {
			return errors.Join(granting(allowed...), state(refused))
		})
	}
	// start starts the edge with the ConfigMaps cms and the policy rows,
	// without alice's binding if revoked.
	start := func(t *testing.T, objs []index.Object, revoked bool) (*Agent, func()) {
		t.Helper()
		a, stop := runAgent(t, AgentOptions{Manager: h.url, Cluster: cluster, Instance: instance})
		if err := a.buf.Replace(ctx, cluster, testKind, objs); err != nil {
			t.Fatal(err)
		}
		for kind, rows := range policy {
			if revoked && kind == roleBindingKind {
				rows = nil
			}
			if err := a.buf.Replace(ctx, cluster, kind, rows); err != nil {
				t.Fatal(err)
			}
		}
		a.buf.expect([]index.Kind{testKind, clusterRoleKind, clusterRoleBindingKind, roleBindingKind})
		return a, stop
	}
	// refusedFor waits until the manager has refused the edge over its
	// rows quota.
	refusedFor := func(t *testing.T, a *Agent) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, "the edge refused over its quota", func() error {
			last := a.Stats().LastReject
			switch {
			case last == nil:
				return fmt.Errorf("not refused yet, want a %s reject", ReasonQuota)
			case last.Reason != ReasonQuota:
				return fmt.Errorf("last reject %s (%s), want a %s one", last.Reason, last.Message, ReasonQuota)
			}
			return nil
		})
	}
	// withheld checks that the index says why the cluster's RBAC kinds
	// have no rows.
	withheld := func(t *testing.T) {
		t.Helper()
		n := 0
		for _, ke := range h.store.KindErrors(nil, cluster) {
			if ke.Kind.Group == index.RBACGroup && strings.HasPrefix(ke.Error, "withheld: the manager refused this cluster's data (quota: ") {
				n++
			}
		}
		if n != len(policy) {
			t.Errorf("%d RBAC kinds say their rows are withheld, want %d: %+v", n, len(policy), h.store.KindErrors(nil, cluster))
		}
	}
	// recover removes the editor's ConfigMaps: the next session's
	// snapshot is accepted and grants what the cluster grants now.
	recoverFrom := func(t *testing.T, a *Agent) {
		t.Helper()
		if err := a.buf.Replace(ctx, cluster, testKind, cms); err != nil {
			t.Fatal(err)
		}
		expect(t, "the cluster back under its quota", false, "erin")
	}

	t.Run("a delta", func(t *testing.T) {
		a, stop := start(t, cms, false)
		defer stop()
		expect(t, "the grants synced", false, "alice", "erin")
		if err := a.buf.Replace(ctx, cluster, testKind, flood); err != nil {
			t.Fatal(err)
		}
		refusedFor(t, a)
		// The revocation, which no session of this edge can deliver
		// while the cluster is over its quota.
		if err := a.buf.Delete(ctx, aliceBinding.Key()); err != nil {
			t.Fatal(err)
		}
		expect(t, "no grants while refused", true)
		withheld(t)
		recoverFrom(t, a)
	})

	t.Run("a snapshot", func(t *testing.T) {
		_, stop := start(t, cms, false)
		expect(t, "the grants restored", false, "alice", "erin")
		stop()
		h.waitReleased(t, cluster)
		// A plain disconnect keeps the cluster's last known state,
		// grants included.
		if err := granting("alice", "erin"); err != nil {
			t.Fatalf("after a disconnect: %v", err)
		}
		a, stop := start(t, flood, true)
		defer stop()
		refusedFor(t, a)
		expect(t, "no grants after a refused first snapshot", true)
		withheld(t)
		if s := a.Stats(); s.Sessions == 0 {
			t.Errorf("no session was welcomed: the refusal was not of the snapshot")
		}
		recoverFrom(t, a)
	})
}

// TestWhichEndsWithholdPolicy: which ends of a session withhold the
// cluster's RBAC rows (docs/security.md, "A refused cluster grants
// nothing"). Those that refuse what the edge sent (refusesData: the next
// session sends the same and is refused the same way, so a revocation may
// never arrive) leave the cluster no RBAC rows; the others keep the last
// known rows, stale, as the design wants for an edge that merely went
// away: a plain disconnect, a sequence gap (messages lost, all that
// arrived before applied, and the next session's snapshot as welcome as
// ever), the same edge connecting again (superseded), its token removed
// (unauthorized: the operator's call, as for a removed cluster), the
// manager shutting down, and the manager's own index failing. In every
// case another cluster's RBAC rows stay as they were, even when the edge
// sent rows of that cluster (wrong cluster): a refusal blanks the
// session's own cluster only.
func TestWhichEndsWithholdPolicy(t *testing.T) {
	const cluster, instance, otherCluster = "edge-a", "edge-a-1", "edge-b"
	policy := []index.Object{
		rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
		rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice")),
		rbacRow(cluster, roleKind, "default", "secret-reader", rules("get", "secrets")),
		rbacRow(cluster, roleBindingKind, "default", "bob-reads", boundTo(index.KindRole, "secret-reader", "bob")),
	}
	rows := append(testRows(cluster, 2, "1"), policy...)
	snapshot := &Message{Type: TypeSnapshot, Snapshot: &Snapshot{
		ID: 1, Final: true, Full: true, Rows: rawRows(t, rows), Kinds: []KindState{
			{Kind: testKind, Synced: true},
			{Kind: clusterRoleKind, Synced: true},
			{Kind: clusterRoleBindingKind, Synced: true},
			{Kind: roleKind, Synced: true},
			{Kind: roleBindingKind, Synced: true},
		},
	}}
	// The other cluster's grants, in the index before the session, and
	// the rows of it the edge sends: a binding of its own.
	otherPolicy := []index.Object{
		rbacRow(otherCluster, clusterRoleKind, "", "svc-reader", rules("get", "services")),
		rbacRow(otherCluster, clusterRoleBindingKind, "", "erin-reads", boundTo(index.KindClusterRole, "svc-reader", "erin")),
	}
	otherWant := map[string]int{index.KindClusterRole: 1, index.KindClusterRoleBinding: 1}
	other := []index.Object{rbacRow(otherCluster, clusterRoleBindingKind, "", "mallory-reads", boundTo(index.KindClusterRole, "svc-reader", "mallory"))}
	// RBAC rows may come in deltas, with no kind record.
	delta := &Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, rows)}}
	for _, tc := range []struct {
		name     string
		end      func(h *hubHarness, c *rawClient)
		withheld bool
		first    *Message // the snapshot when nil
	}{
		{"malformed", func(_ *hubHarness, c *rawClient) {
			if err := c.writeRaw(websocket.MessageText, []byte("{")); err != nil {
				t.Fatal(err)
			}
			c.expectReject(ReasonMalformed)
		}, true, nil},
		{"wrong cluster", func(_ *hubHarness, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, other)}})
			c.expectReject(ReasonWrongCluster)
		}, true, nil},
		{"invalid", func(_ *hubHarness, c *rawClient) {
			c.send(&Message{Type: TypeSnapshot, Snapshot: &Snapshot{ID: 2, Part: 1}})
			c.expectReject(ReasonInvalid)
		}, true, nil},
		{"oversize", func(_ *hubHarness, c *rawClient) {
			if err := c.writeRaw(websocket.MessageText, make([]byte, 65<<10)); err != nil {
				t.Fatal(err)
			}
			c.expectReject(ReasonOversize)
		}, true, nil},
		{"quota", func(_ *hubHarness, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows(cluster, 20, "1"))}})
			c.expectReject(ReasonQuota)
		}, true, nil},
		{"malformed, rows by delta", func(_ *hubHarness, c *rawClient) {
			if err := c.writeRaw(websocket.MessageText, []byte("{")); err != nil {
				t.Fatal(err)
			}
			c.expectReject(ReasonMalformed)
		}, true, delta},
		{"sequence gap", func(_ *hubHarness, c *rawClient) {
			c.send(&Message{Type: TypeDelta, Seq: c.seq + 2, Delta: &Delta{}})
			c.expectReject(ReasonSequenceGap)
		}, false, nil},
		{"disconnect", func(_ *hubHarness, c *rawClient) { c.conn.closeNow() }, false, nil},
		{"superseded", func(h *hubHarness, c *rawClient) {
			again := dialRaw(t, h.url)
			again.welcome(cluster, instance)
			c.expectReject(ReasonSuperseded)
			again.conn.closeNow()
		}, false, nil},
		{"unauthorized", func(h *hubHarness, c *rawClient) {
			h.hub.opts.Tokens.(*revocableTokens).revoked.Store(true)
			h.hub.recheckTokens()
			c.expectReject(ReasonUnauthorized)
		}, false, nil},
		{"shutdown", func(h *hubHarness, c *rawClient) {
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				h.stop()
			}()
			c.expectReject(ReasonShutdown)
			<-stopped
		}, false, nil},
		{"the manager's index fails", func(h *hubHarness, c *rawClient) {
			h.hub.opts.Store.(*gatedStore).failUpserts.Store(true)
			c.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows(cluster, 1, "2"))}})
			if m, err := c.read(); err == nil {
				t.Fatalf("after the index failed: %s %+v, want the connection closed", m.Type, m.Reject)
			}
		}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gatedStore{Store: index.New(memtables.Open)}
			if err := g.Store.UpsertBatch(t.Context(), otherPolicy); err != nil {
				t.Fatal(err)
			}
			h := newHubHarness(t, HubOptions{
				Store: g, Tokens: &revocableTokens{StaticTokens: NewStaticTokens(testTokens)},
				MaxMessageBytes: 64 << 10, Quotas: Quotas{RowsPerCluster: 10},
			})
			c := dialRaw(t, h.url)
			c.welcome(cluster, instance)
			first := snapshot
			if tc.first != nil {
				first = tc.first
			}
			c.send(first)
			c.awaitAck(c.seq)
			tc.end(h, c)
			h.waitReleased(t, cluster)
			want := map[string]int{index.KindRole: 1, index.KindClusterRole: 1, index.KindRoleBinding: 1, index.KindClusterRoleBinding: 1}
			if tc.withheld {
				want = map[string]int{}
			}
			if got := h.store.PolicyRows(cluster); !maps.Equal(got, want) {
				t.Errorf("RBAC rows after the session ended: %v, want %v", got, want)
			}
			if got := h.store.PolicyRows(otherCluster); !maps.Equal(got, otherWant) {
				t.Errorf("RBAC rows of %s, another cluster: %v, want %v as they were", otherCluster, got, otherWant)
			}
			if got, want := names(t, h.store, cluster), []string{"ConfigMap/default/cm-00000", "ConfigMap/default/cm-00001"}; !slices.Equal(got, want) {
				t.Errorf("the manager has the ConfigMaps %v, want %v", got, want)
			}
		})
	}
}

// revocableTokens are tokens that all go when revoked is set.
type revocableTokens struct {
	*StaticTokens
	revoked atomic.Bool
}

func (r *revocableTokens) Cluster(token string) (string, bool) {
	if r.revoked.Load() {
		return "", false
	}
	return r.StaticTokens.Cluster(token)
}

// TestWithholdWhileShuttingDown: a refusal that comes as the hub shuts
// down (the session's context already cancelled) still withholds the
// cluster's RBAC rows (review-s12 L1: the write was cancelled with the
// session, and the stale grants stayed, for the next owner too).
func TestWithholdWhileShuttingDown(t *testing.T) {
	const cluster = "edge-a"
	st := index.New(memtables.Open)
	rows := []index.Object{
		rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
		rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice")),
	}
	if err := st.UpsertBatch(t.Context(), rows); err != nil {
		t.Fatal(err)
	}
	s := &session{h: &Hub{opts: HubOptions{Store: st}}, cluster: cluster, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s.withholdPolicy(ctx, &Reject{Reason: ReasonQuota, Message: "over RowsPerCluster"})
	if got := st.PolicyRows(cluster); len(got) != 0 {
		t.Errorf("the cluster still has RBAC rows %v after a refusal during shutdown", got)
	}
}

// gatedStore is the harness's index with a gate before each withhold of
// RBAC rows (an ApplySnapshot whose kinds say "withheld:"), to hold a
// session at that point, and, once failUpserts is set, an index that
// fails every UpsertBatch (the manager's own failure).
type gatedStore struct {
	*index.Store
	gate        func() // nil: no gate
	upsertGate  func() // nil: no gate; runs before every UpsertBatch
	failUpserts atomic.Bool
}

func (g *gatedStore) ApplySnapshot(ctx context.Context, cluster string, kinds []index.KindSnapshot, retire bool) error {
	if g.gate != nil && len(kinds) > 0 && strings.HasPrefix(kinds[0].Err, "withheld:") {
		g.gate()
	}
	return g.Store.ApplySnapshot(ctx, cluster, kinds, retire)
}

func (g *gatedStore) UpsertBatch(ctx context.Context, rows []index.Object) error {
	if g.upsertGate != nil {
		g.upsertGate()
	}
	if g.failUpserts.Load() {
		return errors.New("the index failed")
	}
	return g.Store.UpsertBatch(ctx, rows)
}

// TestDisownWaitsForTheSession: Hub.Disown returns only once the session
// it ends has ended, so the withhold of a session refused just before the
// collector lost the cluster cannot land after the cluster is claimed
// here again and blank the new session's RBAC rows (review-s12 L2). The
// old session is held at its withhold until Disown has asked it to end;
// its edge then never answers the close handshake, so the session is
// still closing for closeGrace when a Disown that did not wait returns.
func TestDisownWaitsForTheSession(t *testing.T) {
	const cluster = "edge-a"
	policy := []index.Object{
		rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps")),
		rbacRow(cluster, clusterRoleBindingKind, "", "alice-reads", boundTo(index.KindClusterRole, "cm-reader", "alice")),
	}
	snapshot := func() *Message {
		return &Message{Type: TypeSnapshot, Snapshot: &Snapshot{
			ID: 1, Final: true, Full: true, Rows: rawRows(t, policy), Kinds: []KindState{
				{Kind: clusterRoleKind, Synced: true}, {Kind: clusterRoleBindingKind, Synced: true},
			},
		}}
	}
	atWithhold, disowning := make(chan struct{}), make(chan struct{})
	var once sync.Once
	g := &gatedStore{Store: index.New(memtables.Open), gate: func() {
		once.Do(func() { close(atWithhold) })
		<-disowning
	}}
	h := newHubHarness(t, HubOptions{Store: g, Quotas: Quotas{RowsPerCluster: 10}})

	old := dialRaw(t, h.url)
	old.welcome(cluster, "edge-a-1")
	old.send(snapshot())
	old.awaitAck(old.seq)
	s, _ := h.hub.active(cluster)
	old.send(&Message{Type: TypeDelta, Delta: &Delta{Upserts: rawRows(t, testRows(cluster, 20, "1"))}})
	awaitClosed(t, atWithhold, "the withhold of the session refused with quota") // it waits for Disown's end
	go func() {
		<-s.stop
		close(disowning)
	}()
	h.hub.Disown(cluster, "collector b took its lease")
	select {
	case <-s.done:
	default:
		t.Fatal("Disown returned while the session it ended was still running")
	}

	// Claimed here again: the new session's rows stay.
	c := dialRaw(t, h.url)
	c.welcome(cluster, "edge-a-1")
	c.send(snapshot())
	c.awaitAck(c.seq)
	want := map[string]int{index.KindClusterRole: 1, index.KindClusterRoleBinding: 1}
	if got := g.PolicyRows(cluster); !maps.Equal(got, want) {
		t.Errorf("RBAC rows of the new session: %v, want %v", got, want)
	}
}

// TestDisownAllEndsEverySessionFirst: releasing many clusters at once
// (the replication collector at shutdown) ends every session before it
// waits for any, so stalled edges cost one session's end, not one each
// (a stalled edge's end takes about shutdownGrace). Each
// session is held at its last step (Claims.Released) until all three
// have come there; none can end before then, so a DisownAll that waited
// for one session before it ended the next never gets the second there.
// The edges read nothing after their welcome.
func TestDisownAllEndsEverySessionFirst(t *testing.T) {
	clusters := []string{"edge-a", "edge-b", "edge-c"}
	claims := &gatedClaims{released: make(chan string, len(clusters)), gate: make(chan struct{})}
	h := newHubHarness(t, HubOptions{Claims: claims})
	for _, cluster := range clusters {
		dialRaw(t, h.url).welcome(cluster, cluster+"-1")
	}
	disowned := make(chan struct{})
	go func() {
		defer close(disowned)
		h.hub.DisownAll(clusters, "collector a is shutting down")
	}()
	defer func() {
		claims.open()
		<-disowned
	}()
	for i := range clusters {
		select {
		case <-claims.released:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d sessions were told to end while the first was held ending: DisownAll waits for one before it ends the next", i, len(clusters))
		}
	}
	select {
	case <-disowned:
		t.Fatal("DisownAll returned before its sessions had ended")
	default:
	}
	claims.open()
	<-disowned
	for _, cluster := range clusters {
		if s, known := h.hub.active(cluster); s != nil || known {
			t.Errorf("cluster %s is still claimed here after DisownAll", cluster)
		}
	}
}

// gatedClaims admits every edge and holds each Released (a session's
// last step before it is done) until open.
type gatedClaims struct {
	released chan string
	gate     chan struct{}
	once     sync.Once
}

func (g *gatedClaims) Claim(context.Context, string, string) error { return nil }

func (g *gatedClaims) Released(cluster, _ string) {
	g.released <- cluster
	<-g.gate
}

func (g *gatedClaims) open() { g.once.Do(func() { close(g.gate) }) }

// TestDisownBetweenClaimAndWelcomeRefuses: a Disown that runs after the
// collector's Claim passed and before the session is active (the
// collector lost the cluster meanwhile) refuses the edge with a retryable
// reject; it is not welcomed at a collector that no longer owns the
// cluster (review-s13 L1).
func TestDisownBetweenClaimAndWelcomeRefuses(t *testing.T) {
	claims := &heldClaims{entered: make(chan struct{}), gate: make(chan struct{})}
	h := newHubHarness(t, HubOptions{Claims: claims})
	c := dialRaw(t, h.url)
	answer := make(chan *Message, 1)
	c.send(&Message{Type: TypeHello, Hello: &Hello{Version: ProtocolVersion, Cluster: "edge-a", Instance: "edge-a-1", Token: tokenFor("edge-a")}})
	go func() {
		m, _ := c.read()
		answer <- m
	}()
	<-claims.entered // Claim passed; acquire is in the gap
	h.hub.Disown("edge-a", "collector a lost the cluster")
	close(claims.gate)
	m := <-answer
	if m == nil || m.Type != TypeReject || m.Reject.Reason != ReasonGracePeriod || m.Reject.RetryAfterMillis <= 0 {
		t.Fatalf("hello answered with %+v after a Disown between Claim and welcome, want a grace_period reject with a retry", m)
	}
	if s, _ := h.hub.active("edge-a"); s != nil {
		t.Fatal("the session is active after the cluster was disowned")
	}
}

// heldClaims admits every edge, but holds Claim at its return until gate
// is closed, after saying so on entered.
type heldClaims struct {
	entered chan struct{}
	gate    chan struct{}
}

func (g *heldClaims) Claim(context.Context, string, string) error {
	close(g.entered)
	<-g.gate
	return nil
}

func (g *heldClaims) Released(string, string) {}
