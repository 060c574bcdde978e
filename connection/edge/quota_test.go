package edge

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
)

// TestRowCost checks that rowCost names the string that is over, and that
// it allocates nothing for a row within the limits: the edge calls it for
// every key it takes under the buffer's lock, and the manager for every
// row it decodes.
func TestRowCost(t *testing.T) {
	row := index.Object{
		Cluster: "c", Namespace: "ns", Version: "v1", Kind: "Pod", Resource: "pods", Name: "web-0",
		UID: "8a6c2f0e-0000-4000-8000-000000000000", Summary: []byte(`{"phase":"Running"}`),
	}
	for i := range 10 {
		row.Labels = withLabel(row.Labels, fmt.Sprintf("label-%d", i), fmt.Sprintf("value-%d", i))
	}
	cost, over, _ := rowCost(&row, 64)
	if over != "" || cost <= len(row.Name)+len(row.UID)+len(row.Summary) {
		t.Fatalf("rowCost = %d, %q: want a cost over the row's bytes and nothing over", cost, over)
	}
	if n := testing.AllocsPerRun(100, func() { rowCost(&row, 64) }); n != 0 {
		t.Errorf("rowCost allocates %v times a row within the limits, want 0", n)
	}

	row.Labels = withLabel(row.Labels, "label-3", strings.Repeat("x", 65))
	if _, over, what := rowCost(&row, 64); over != "the value of label label-3 is 65 bytes" || what != "the value of label" {
		t.Errorf("over = %q (%q), want the value of label label-3 named", over, what)
	}
	row.Summary = []byte(strings.Repeat("y", 70))
	if _, over, what := rowCost(&row, 64); over != "summary is 70 bytes" || what != "summary" {
		t.Errorf("over = %q (%q), want the summary named first", over, what)
	}
}

// TestJSONLen: jsonLen is the length of a string after the JSON round
// trip from the edge to the manager, invalid UTF-8 included.
func TestJSONLen(t *testing.T) {
	for _, s := range []string{
		"", "plain", "héllo ✓", "\uFFFD", // a real U+FFFD stays three bytes
		"\xff", "\xff\xfe\xfd", "a\xffb", "\xe2\x9c", // a truncated sequence: each byte is replaced
		"\xed\xa0\x80", // an encoded surrogate is invalid UTF-8
	} {
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var decoded string
		if err := json.Unmarshal(data, &decoded); err != nil {
			t.Fatal(err)
		}
		if got := jsonLen(s); got != len(decoded) {
			t.Errorf("jsonLen(%q) = %d, want %d", s, got, len(decoded))
		}
	}
}

// TestRowsOverAQuotaAreLeftOut: one leaf object over one of the manager's
// per-row quotas costs only itself, not its cluster's sync (review-s10
// H1). The API server lets anyone who may edit a Pod give it an owner
// reference of any length, and a RoleBinding a User subject of any
// length; sent, such a row ended every session of its edge with quota,
// and the cluster never synced. A real agent, over a real websocket, with
// a ConfigMap whose owner reference names 20 KiB and a RoleBinding whose
// subject does, among rows that fit: the cluster syncs with every other
// row, the ConfigMap as a placeholder (not synced, review-s11 D1) and
// without the RoleBinding, no session is refused, and the agent counts
// them. Then a RoleBinding that fit changes to one over the quota: the
// manager drops it (the edge sends a delete of its key, so the manager
// does not keep granting what the binding no longer says). The second
// case gives the manager a smaller quota than the default: the edge holds
// rows to what the Welcome announces.
func TestRowsOverAQuotaAreLeftOut(t *testing.T) {
	for _, tc := range []struct {
		name   string
		quotas Quotas
		long   int // bytes of the strings over the quota
	}{
		{name: "the default quota", long: 20 << 10},
		{name: "a quota the welcome announces", quotas: Quotas{StringBytes: 4 << 10}, long: 5 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const cluster = "edge-b"
			ctx := t.Context()
			h := newHubHarness(t, HubOptions{Quotas: tc.quotas})
			long := strings.Repeat("a", tc.long)
			// A name the index refuses (its key is over 4 KiB) though under
			// the default string quota: RBAC names have no length limit.
			longKey := strings.Repeat("k", 5<<10)
			configMaps := testRows(cluster, 50, "1")
			owned := testRows(cluster, 1, "1")[0]
			owned.Name, owned.UID = "owned-by-a-long-name", "uid-owned"
			owned.OwnerRefs = []index.OwnerRef{{Kind: "Widget", Name: long}}
			configMaps = append(configMaps, owned)
			var want []string
			for _, o := range configMaps {
				want = append(want, "ConfigMap/default/"+o.Name)
			}
			slices.Sort(want)

			bindingKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}
			binding := func(name, user string) index.Object {
				return index.Object{
					Cluster: cluster, Namespace: "default", Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings",
					Name: name, UID: "uid-" + name, Policy: &index.Policy{
						RoleRef:  index.RoleRef{APIGroup: index.RBACGroup, Kind: index.KindClusterRole, Name: "view"},
						Subjects: []index.Subject{{Kind: "User", APIGroup: index.RBACGroup, Name: user}},
					},
				}
			}
			never := time.Hour // one snapshot: no resync counts the rows again
			a := startAgent(t, AgentOptions{
				Manager: h.url, Cluster: cluster, PingInterval: 5 * time.Second, PongWait: time.Minute,
				Resync: ResyncOptions{Interval: never, Min: never, Max: never},
			})
			if err := a.buf.Replace(ctx, cluster, testKind, configMaps); err != nil {
				t.Fatal(err)
			}
			if err := a.buf.Replace(ctx, cluster, bindingKind, []index.Object{binding("alice", "alice"), binding("bob", "bob"), binding("long", long), binding(longKey, "carol")}); err != nil {
				t.Fatal(err)
			}
			a.buf.expect([]index.Kind{testKind, bindingKind})

			bindingNames := func() string {
				var out []string
				for _, b := range h.store.ListRoleBindings(cluster, "") {
					out = append(out, b.Name)
				}
				return strings.Join(out, ",")
			}
			// refused fails at once if the manager refused a session: with
			// the rows over the quota sent, it refuses every one.
			refused := func() {
				t.Helper()
				if s := a.Stats(); s.Rejects > 0 {
					t.Fatalf("the manager refused %d sessions, the last: %v", s.Rejects, s.LastReject)
				}
			}
			conntest.Eventually(t, 30*time.Second, "the cluster synced", func() error {
				refused()
				if c, ok := h.store.GetCluster(nil, cluster); !ok || c.State != index.StateConnected {
					return errString("not connected")
				}
				if got := names(t, h.store, cluster); !slices.Equal(got, want) {
					return fmt.Errorf("the manager has %d ConfigMaps %v..., want the %d that fit", len(got), got[:min(3, len(got))], len(want))
				}
				if got := bindingNames(); got != "alice,bob" {
					return fmt.Errorf("the manager has the RoleBindings %q, want alice,bob", got)
				}
				return nil
			})
			if o, ok := h.store.Get(owned.Key()); !ok || o.Status != index.StatusUnknown || len(o.OwnerRefs) != 0 {
				t.Errorf("the ConfigMap over the quota: %+v, want a placeholder", o)
			}
			if s := a.Stats(); s.OverQuota != 3 || s.TooBig != 0 {
				t.Errorf("the agent counts %d rows over a quota and %d too big, want 3 and 0", s.OverQuota, s.TooBig)
			}

			if err := a.buf.Upsert(ctx, binding("bob", long)); err != nil {
				t.Fatal(err)
			}
			conntest.Eventually(t, 30*time.Second, "bob's binding dropped", func() error {
				refused()
				if got := bindingNames(); got != "alice" {
					return fmt.Errorf("the manager has the RoleBindings %q, want alice", got)
				}
				return nil
			})
			if s := a.Stats(); s.OverQuota != 4 || s.Sessions != 1 {
				t.Errorf("the agent counts %d rows over a quota in %d sessions, want 4 in 1", s.OverQuota, s.Sessions)
			}
		})
	}
}

// TestRowQuotasOfTheWelcome: the edge holds rows to the quotas the
// Welcome announces, and to the defaults when a manager from before the
// fields announces none; a manager announces its own.
func TestRowQuotasOfTheWelcome(t *testing.T) {
	if q := rowQuotas(&Welcome{}); q.LabelsPerRow != DefaultLabelsPerRow || q.StringBytes != DefaultStringBytes {
		t.Errorf("an old manager's quotas: %d labels, %d bytes; want the defaults", q.LabelsPerRow, q.StringBytes)
	}
	h := newHubHarness(t, HubOptions{Quotas: Quotas{LabelsPerRow: 7, StringBytes: 999}})
	c := dialRaw(t, h.url)
	m := c.hello("edge-a", "i", tokenFor("edge-a"))
	if m.Type != TypeWelcome {
		t.Fatalf("hello: got %s %+v", m.Type, m.Reject)
	}
	if q := rowQuotas(m.Welcome); q.LabelsPerRow != 7 || q.StringBytes != 999 {
		t.Errorf("the welcome announces %d labels, %d bytes; want 7, 999", q.LabelsPerRow, q.StringBytes)
	}
}

// TestRefusedDataKeepsTheBackoff: a session the manager ended over what
// the edge sent does not reset the reconnect backoff, since the next
// session sends the same (review-s10 H1), unless it lasted stableSession
// (review-s10-edge L-E2: one refusal long ago kept every later reconnect
// slow); other endings of a welcomed session do. A reject the edge raised
// itself over the manager's messages (a RejectError) is not counted as the
// manager's (review-s10-edge L-E1) but keeps the backoff too: the manager
// sends the same in the next session (review-s11 E1).
func TestRefusedDataKeepsTheBackoff(t *testing.T) {
	short, long := time.Second, stableSession
	for _, tc := range []struct {
		err      error
		welcomed bool
		lasted   time.Duration
		reset    bool
	}{
		{err: &Reject{Reason: ReasonQuota}, welcomed: true, lasted: short},
		{err: &Reject{Reason: ReasonOversize}, welcomed: true, lasted: short},
		{err: &Reject{Reason: ReasonInvalid}, welcomed: true, lasted: short},
		{err: &Reject{Reason: ReasonMalformed}, welcomed: true, lasted: short},
		{err: &Reject{Reason: ReasonWrongCluster}, welcomed: true, lasted: short},
		{err: fmt.Errorf("session: %w", &Reject{Reason: ReasonQuota}), welcomed: true, lasted: short},
		{err: &Reject{Reason: ReasonQuota}, welcomed: true, lasted: long - time.Millisecond},
		// A long good session resets it however it ended.
		{err: &Reject{Reason: ReasonQuota}, welcomed: true, lasted: long, reset: true},
		{err: &Reject{Reason: ReasonInvalid}, welcomed: true, lasted: 3 * long, reset: true},
		// The edge's own complaints about the manager keep it, unless
		// the session lasted.
		{err: rejectf(ReasonInvalid, "ack of seq 9, but 3 is the last sent"), welcomed: true, lasted: short},
		{err: rejectf(ReasonMalformed, "not a JSON message"), welcomed: true, lasted: short},
		{err: fmt.Errorf("session: %w", rejectf(ReasonOversize, "a message over the limit")), welcomed: true, lasted: short},
		{err: rejectf(ReasonSequenceGap, "expected seq 4 from the manager, got 6"), welcomed: true, lasted: long - time.Millisecond},
		{err: rejectf(ReasonInvalid, "a manager may not send hello messages"), welcomed: true, lasted: long, reset: true},
		{err: &Reject{Reason: ReasonSuperseded}, welcomed: true, lasted: short, reset: true},
		{err: &Reject{Reason: ReasonShutdown}, welcomed: true, lasted: short, reset: true},
		{err: &Reject{Reason: ReasonSequenceGap}, welcomed: true, lasted: short, reset: true},
		{err: errString("connection reset"), welcomed: true, lasted: short, reset: true},
		{err: nil, welcomed: true, lasted: short, reset: true},
		// Never welcomed: never reset, however long the attempt took.
		{err: &Reject{Reason: ReasonUnauthorized}, lasted: long},
		{err: &Reject{Reason: ReasonGracePeriod}, lasted: short},
		{err: errString("connection refused"), lasted: long},
	} {
		rej := peerReject(tc.err)
		if got := resetsBackoff(tc.welcomed, tc.err, tc.lasted); got != tc.reset {
			t.Errorf("resetsBackoff(welcomed %v, %v, after %s) = %v, want %v", tc.welcomed, tc.err, tc.lasted, got, tc.reset)
		}
		var own *RejectError
		if errors.As(tc.err, &own) && rej != nil {
			t.Errorf("%v, the edge's own reject, counts as the manager's", tc.err)
		}
	}
}

// TestLeftOutDelete: a delta replaces a row it leaves out (over a quota,
// against the index's rules, too large) with a delete of its key, so the
// manager drops the row's older state; unless the index refuses the key
// itself, when the manager never held a row of it and would end the
// session over the delete.
func TestLeftOutDelete(t *testing.T) {
	q := Quotas{StringBytes: 16}
	long := strings.Repeat("a", 17)
	for _, tc := range []struct {
		name   string
		mut    func(o *index.Object)
		delete bool
	}{
		{name: "an owner reference", mut: func(o *index.Object) { o.OwnerRefs = []index.OwnerRef{{Kind: "Widget", Name: long}} }, delete: true},
		{name: "the message", mut: func(o *index.Object) { o.Message = long }, delete: true},
		// Key strings over a quota a manager may have had larger
		// before: the index takes the delete.
		{name: "the name", mut: func(o *index.Object) { o.Name = long }, delete: true},
		{name: "the namespace", mut: func(o *index.Object) { o.Namespace = long }, delete: true},
		{name: "the kind", mut: func(o *index.Object) { o.Kind = long }, delete: true},
		// Keys the index refuses.
		{name: "a 5 KiB name", mut: func(o *index.Object) { o.Name = strings.Repeat("n", 5<<10) }},
		{name: "a NUL in the name", mut: func(o *index.Object) { o.Name = "a\x00b" }},
		{name: "no name", mut: func(o *index.Object) { o.Name = "" }},
	} {
		row := testRows("c", 1, "1")[0]
		tc.mut(&row)
		if _, over := q.checkRow(&row); over == nil {
			t.Fatalf("%s: the row is not over the quota", tc.name)
		}
		if k, ok := leftOutDelete(&row); ok != tc.delete || k != row.Key() {
			t.Errorf("%s: delete %v of %s, want %v", tc.name, ok, k, tc.delete)
		}
	}
	// A key the index refuses (over 4 KiB in all) with every string under
	// the quota: the index's rule, invalid.
	row := testRows("c", 1, "1")[0]
	row.Name = strings.Repeat("n", 5<<10)
	wide := Quotas{StringBytes: 16 << 10}
	if _, over := wide.checkRow(&row); over == nil || over.quota != "index" || over.reject.Reason != ReasonInvalid {
		t.Errorf("a 5 KiB name: over %+v, want the index's rule, invalid", over)
	}
}

// TestRefusedSessionsBackOff: an edge whose every session the manager
// refuses over its data (here: more rows than the manager's per-cluster
// quota, which the edge does not check) waits longer after each, rather
// than reconnecting after the first wait every time (review-s10 H1): with
// waits of 100 ms doubling (±20%), five sessions take at least 0.8 x
// (100 + 200 + 400 + 800) ms; a backoff reset after each welcome made
// them take about 5 x 100 ms. (A lower bound: a loaded machine only makes
// it longer.)
func TestRefusedSessionsBackOff(t *testing.T) {
	const cluster, sessions = "edge-b", 5
	h := newHubHarness(t, HubOptions{Quotas: Quotas{RowsPerCluster: 5}})
	start := time.Now()
	a := startAgent(t, AgentOptions{
		Manager: h.url, Cluster: cluster, BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Hour,
		PingInterval: 5 * time.Second, PongWait: time.Minute,
	})
	if err := a.buf.Replace(t.Context(), cluster, testKind, testRows(cluster, 10, "1")); err != nil {
		t.Fatal(err)
	}
	a.buf.expect([]index.Kind{testKind})
	conntest.Eventually(t, 30*time.Second, "five sessions refused", func() error {
		if s := a.Stats(); s.Rejects < sessions {
			return fmt.Errorf("%d refused", s.Rejects)
		}
		return nil
	})
	took := time.Since(start)
	if rej := a.Stats().LastReject; rej == nil || rej.Reason != ReasonQuota {
		t.Fatalf("the last reject is %v, want quota", rej)
	}
	if least := 1200 * time.Millisecond; took < least {
		t.Errorf("%d refused sessions in %s, want at least %s: the backoff did not grow", sessions, took.Round(time.Millisecond), least)
	}
}
