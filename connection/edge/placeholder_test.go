package edge

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// TestHeldBackObjectsArePlaceholders: an object whose row the edge holds
// back stays visible at the manager as a placeholder, not synced, while
// an RBAC row held back still fails closed (review-s11 D1: a namespace
// editor could hide any of their objects fleet-wide with a 20 KiB owner
// reference). A real agent and hub over a real websocket, the manager
// reading 64 KiB messages, with the real RBAC authorizer over the
// manager's index:
//
//   - a Deployment given a 20 KiB owner reference (over the string
//     quota), a ConfigMap given more labels than LabelsPerRow, and one
//     whose labels add up to more than a message: each shows at the
//     manager as its key with status Unknown, a message naming why, and
//     no labels, owners or summary; it counts in the cluster's facets;
//   - bob's RoleBinding, changed to name someone else with a 20 KiB
//     name, is deleted: the manager holds no such binding and nobody may
//     read through it;
//   - fixed on the leaf (deltas only), each full row replaces its
//     placeholder, and the binding grants what it now says.
//
// The same for a delta and for a first snapshot; no session is refused.
func TestHeldBackObjectsArePlaceholders(t *testing.T) {
	const cluster, instance = "edge-d", "edge-d-1"
	ctx := t.Context()
	h := newHubHarness(t, HubOptions{MaxMessageBytes: 64 << 10})
	mayGetIt := mayGet(t, h, cluster)
	may := func(name string) bool { return mayGetIt(name, "configmaps") }
	deployKind := index.Kind{Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments", Namespaced: true}
	deploy := func(rv string, owner string) index.Object {
		o := index.Object{
			Cluster: cluster, Namespace: "default", Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments",
			Name: "web", UID: "uid-web", ResourceVersion: rv, Status: index.StatusHealthy,
			Labels: index.LabelsOf(map[string]string{"app": "web"}), Summary: []byte(`{"replicas":3}`),
			CreatedAt: time.Unix(1700000000, 0).UTC(),
		}
		if owner != "" {
			o.OwnerRefs = []index.OwnerRef{{Kind: "Widget", Name: owner}}
		}
		return o
	}
	cms := testRows(cluster, 3, "1")
	manyLabels, tooBig := cms[0], cms[1]
	manyLabels.ResourceVersion, tooBig.ResourceVersion = "2", "2"
	for i := range DefaultLabelsPerRow + 1 {
		manyLabels.Labels = withLabel(manyLabels.Labels, fmt.Sprintf("l-%03d", i), "v")
	}
	for i, v := range padding(8, 10<<10) { // each under the string quota, 80 KiB in all
		tooBig.Labels = withLabel(tooBig.Labels, fmt.Sprintf("big-%d", i), v)
	}
	binding := func(users ...string) index.Object {
		return rbacRow(cluster, roleBindingKind, "default", "cm-readers", boundTo(index.KindClusterRole, "cm-reader", users...))
	}
	good := map[index.Kind][]index.Object{
		testKind:        cms,
		deployKind:      {deploy("1", "")},
		clusterRoleKind: {rbacRow(cluster, clusterRoleKind, "", "cm-reader", rules("get", "configmaps"))},
		roleBindingKind: {binding("alice")},
	}
	// The cluster as the editor and its admin changed it: alice's grant
	// revoked, given to bob and to a 20 KiB name the edge cannot send.
	bad := []index.Object{deploy("2", strings.Repeat("o", 20<<10)), manyLabels, tooBig, binding("bob", strings.Repeat("u", 20<<10))}
	// The placeholders the manager shows, by name, with the message each
	// must carry.
	notSyncedWant := map[string]string{
		"Deployment/default/web":     "not synced: over the manager's quota for an owner reference",
		"ConfigMap/default/cm-00000": "not synced: over the manager's quota for labels",
		"ConfigMap/default/cm-00001": "not synced: too large for a message to the manager",
	}

	start := func(changes []index.Object) (*Agent, func()) {
		return runAgentWith(t, h, cluster, instance, good, changes)
	}
	refused := func(t *testing.T, a *Agent) {
		t.Helper()
		if s := a.Stats(); s.Rejects > 0 {
			t.Fatalf("the manager refused %d sessions, the last: %v", s.Rejects, s.LastReject)
		}
	}
	// objects returns the manager's objects of the cluster by name.
	objects := func() map[string]*index.Object {
		out := map[string]*index.Object{}
		for _, o := range conntest.AllRows(t, h.store, cluster) {
			out[o.Kind+"/"+o.Namespace+"/"+o.Name] = o
		}
		return out
	}
	bindings := func() []string {
		var out []string
		for _, b := range h.store.ListRoleBindings(cluster, "") {
			out = append(out, b.Name)
		}
		return out
	}
	// synced waits until the manager has every object in full, and the
	// binding grants exactly the users of allowed.
	synced := func(t *testing.T, a *Agent, what string, allowed ...string) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, what, func() error {
			refused(t, a)
			var errs []error
			objs := objects()
			if len(objs) != 4 {
				errs = append(errs, fmt.Errorf("the manager has %d objects, want 4", len(objs)))
			}
			for name, o := range objs {
				if o.Status != index.StatusHealthy || o.Labels.Len() == 0 || o.Message != "" {
					errs = append(errs, fmt.Errorf("%s: %s %q with %d labels, want the full row", name, o.Status, o.Message, o.Labels.Len()))
				}
			}
			if d := objs["Deployment/default/web"]; d != nil && string(d.Summary) != `{"replicas":3}` {
				errs = append(errs, fmt.Errorf("the Deployment's summary is %s", d.Summary))
			}
			for _, u := range []string{"alice", "bob"} {
				if got, want := may(u), slices.Contains(allowed, u); got != want {
					errs = append(errs, fmt.Errorf("%s may get configmaps: %v, want %v", u, got, want))
				}
			}
			return errors.Join(errs...)
		})
	}
	// heldBack waits until the manager shows the placeholders of
	// notSyncedWant, the untouched ConfigMap in full, and no binding.
	heldBack := func(t *testing.T, a *Agent, what string) {
		t.Helper()
		conntest.Eventually(t, 30*time.Second, what, func() error {
			refused(t, a)
			var errs []error
			objs := objects()
			for name, msg := range notSyncedWant {
				o := objs[name]
				switch {
				case o == nil:
					errs = append(errs, fmt.Errorf("the manager does not show %s", name))
				case o.Status != index.StatusUnknown || o.Message != msg:
					errs = append(errs, fmt.Errorf("%s: %s %q, want %s %q", name, o.Status, o.Message, index.StatusUnknown, msg))
				case o.Labels.Len() != 0 || len(o.OwnerRefs) != 0 || len(o.Summary) != 0:
					errs = append(errs, fmt.Errorf("%s: a placeholder with %d labels, %d owners, summary %q", name, o.Labels.Len(), len(o.OwnerRefs), o.Summary))
				case o.UID != "uid-web" && name == "Deployment/default/web":
					errs = append(errs, fmt.Errorf("%s: uid %q", name, o.UID))
				}
			}
			if o := objs["ConfigMap/default/cm-00002"]; o == nil || o.Status != index.StatusHealthy {
				errs = append(errs, errors.New("the untouched ConfigMap is not shown in full"))
			}
			if b := bindings(); len(b) != 0 {
				errs = append(errs, fmt.Errorf("the manager holds the RoleBindings %v, want none", b))
			}
			for _, u := range []string{"alice", "bob"} {
				if may(u) {
					errs = append(errs, fmt.Errorf("%s may get configmaps", u))
				}
			}
			// The placeholders count where the objects would.
			f, err := h.store.Facets(ctx, index.Filter{Clusters: []string{cluster}}, &index.Access{All: true})
			if err != nil {
				return err
			}
			unknown := 0
			for _, c := range f.Statuses {
				if c.Value == string(index.StatusUnknown) {
					unknown = c.Count
				}
			}
			if f.Total != 4 || unknown != 3 {
				errs = append(errs, fmt.Errorf("the facets count %d objects, %d unknown; want 4, 3", f.Total, unknown))
			}
			if s := a.Stats(); s.OverQuota != 3 || s.TooBig != 1 || s.Placeholders != 3 {
				errs = append(errs, fmt.Errorf("%d rows over a quota, %d too big, %d placeholders sent; want 3, 1, 3 (none for the RoleBinding)", s.OverQuota, s.TooBig, s.Placeholders))
			}
			return errors.Join(errs...)
		})
	}

	t.Run("deltas", func(t *testing.T) {
		a, stop := start(nil)
		defer stop()
		synced(t, a, "the cluster synced", "alice")
		for _, o := range bad {
			if err := a.buf.Upsert(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		heldBack(t, a, "the placeholders shown, the binding deleted")
		// Fixed on the leaf: each object as it was but for its version,
		// and the binding for bob alone.
		fixed := []index.Object{deploy("3", "w"), cms[0], cms[1], binding("bob")}
		fixed[1].ResourceVersion, fixed[2].ResourceVersion = "3", "3"
		for _, o := range fixed {
			if err := a.buf.Upsert(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		synced(t, a, "the full rows back", "bob")
		if d := objects()["Deployment/default/web"]; d == nil || !slices.Equal(d.OwnerRefs, []index.OwnerRef{{Kind: "Widget", Name: "w"}}) {
			t.Errorf("the fixed Deployment's owners: %+v", d)
		}
		if s := a.Stats(); s.Sessions != 1 {
			t.Errorf("%d sessions, want 1", s.Sessions)
		}
	})

	t.Run("a snapshot", func(t *testing.T) {
		a, stop := start(nil)
		synced(t, a, "the cluster restored", "alice")
		stop()
		h.waitReleased(t, cluster)
		a, stop = start(bad)
		defer stop()
		heldBack(t, a, "the placeholders shown by the first snapshot, the binding dropped")
		oneSessionSnapshotted(t, a)
	})
}

// TestPlaceholder: the placeholder of a held-back row passes the
// manager's own checks (index.ValidateRow and the per-row quotas, through
// encodeWithin) and carries nothing of the row but its identity; an RBAC
// row gets none, nor does a row whose key is itself over a quota or
// refused by the index (those fall back to leftOutDelete).
func TestPlaceholder(t *testing.T) {
	q := Quotas{StringBytes: 64, LabelsPerRow: 2}
	q.setDefaults()
	long := strings.Repeat("a", 65)
	const room = 1 << 10
	// cm is a ConfigMap's row as mut changes it.
	cm := func(mut func(o *index.Object)) index.Object {
		o := testRows("c", 1, "1")[0]
		mut(&o)
		return o
	}
	tooLarge := func(o *index.Object) { // every string under the quota, over 1 KiB in all
		o.UID = strings.Repeat("u", 60)
		o.Labels = index.LabelsOf(map[string]string{strings.Repeat("k", 60): strings.Repeat("v", 60)})
		o.OwnerRefs = slices.Repeat([]index.OwnerRef{{Kind: "Widget", Name: strings.Repeat("w", 60)}}, 20)
	}
	for _, tc := range []struct {
		name  string
		row   index.Object
		quota string // the quota the row is over
		msg   string // the placeholder's message; "" for none
	}{
		{name: "an owner reference", row: cm(func(o *index.Object) { o.OwnerRefs = []index.OwnerRef{{Kind: "Widget", Name: long}} }), quota: "an owner reference", msg: "not synced: over the manager's quota for an owner reference"},
		{name: "labels", row: cm(func(o *index.Object) { o.Labels = withLabel(o.Labels, "x", "y") }), quota: "labels", msg: "not synced: over the manager's quota for labels"},
		{name: "the message", row: cm(func(o *index.Object) { o.Message = long }), quota: "message", msg: "not synced: over the manager's quota for message"},
		{name: "a summary that does not encode", row: cm(func(o *index.Object) { o.Summary = []byte(`{"x":`) }), quota: quotaEncoding, msg: "not synced: the object's row does not encode"},
		{name: "too large for a message", row: cm(tooLarge), quota: quotaMessageSize, msg: "not synced: too large for a message to the manager"},
		// No placeholder: RBAC rows, and keys over a quota or refused.
		{name: "a RoleBinding's subject", row: rbacRow("c", roleBindingKind, "default", "b", boundTo(index.KindClusterRole, "view", long)), quota: "a subject"},
		{name: "a ClusterRole's rule", row: rbacRow("c", clusterRoleKind, "", "r", rules(long, "pods")), quota: "a policy rule entry"},
		{name: "the name", row: cm(func(o *index.Object) { o.Name = long }), quota: "name"},
		{name: "a NUL in the name", row: cm(func(o *index.Object) { o.Name = "a\x00b" }), quota: quotaIndex},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := tc.row
			raw, over := encodeWithin(&q, &row, room)
			if over == nil || over.quota != tc.quota {
				t.Fatalf("the row is over %+v, want the quota %q", over, tc.quota)
			}
			p, ok := placeholder(&row, over)
			if ok {
				raw, over = encodeWithin(&q, &p, room)
			}
			if tc.msg == "" {
				if ok && over == nil {
					t.Fatalf("a placeholder %+v is sent, want none", p)
				}
				return
			}
			if !ok || over != nil {
				t.Fatalf("no placeholder (%v), or the manager refuses it: %+v", ok, over)
			}
			if err := index.ValidateRow(&p); err != nil {
				t.Errorf("the index refuses the placeholder: %v", err)
			}
			want := index.Object{
				Cluster: row.Cluster, Namespace: row.Namespace, Group: row.Group, Version: row.Version, Kind: row.Kind,
				Resource: row.Resource, Name: row.Name, UID: row.UID, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt,
				ResourceVersion: row.ResourceVersion, Status: index.StatusUnknown, Message: tc.msg,
			}
			got := p
			if got.Labels.Len() != 0 || got.OwnerRefs != nil || got.Summary != nil || got.Policy != nil {
				t.Errorf("the placeholder carries the row's content: %+v", got)
			}
			got.Labels, got.OwnerRefs, got.Summary, got.Policy = index.Labels{}, nil, nil, nil
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("placeholder\n %+v\nwant\n %+v", got, want)
			}
			if len(raw) == 0 {
				t.Error("the placeholder encodes to nothing")
			}
		})
	}
}
