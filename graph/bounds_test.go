package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apiserver/pkg/authentication/user"
)

// rowsUnchanged fails the test if the index's rows differ from before.
func (f *fixture) rowsUnchanged(before []*testRow) {
	f.t.Helper()
	if after := f.snapshotRows(); !reflect.DeepEqual(before, after) {
		f.t.Errorf("the rows changed: %d before, %d after", len(before), len(after))
	}
}

// testRow is what a row comparison looks at.
type testRow struct {
	ID, Status, RV string
	Labels         index.Labels
}

func (f *fixture) snapshotRows() []*testRow {
	f.t.Helper()
	objs := allTestObjects(f.t.(*testing.T), f.store)
	out := make([]*testRow, len(objs))
	for i, o := range objs {
		out[i] = &testRow{ID: o.Key().String(), Status: string(o.Status), RV: o.ResourceVersion, Labels: o.Labels}
	}
	return out
}

// TestInputBounds plays a viewer sending oversize filters over HTTP and a
// websocket: each gets BAD_USER_INPUT naming the limit, the server keeps
// serving, and no row changes.
func TestInputBounds(t *testing.T) {
	f := newFixture(t)
	before := f.snapshotRows()
	terms := make([]string, 100)
	for i := range terms {
		terms[i] = fmt.Sprintf("k%d=v", i)
	}
	values := make([]string, 100)
	for i := range values {
		values[i] = fmt.Sprintf("v%d", i)
	}
	many := make([]string, 1001)
	for i := range many {
		many[i] = fmt.Sprintf("c%d", i)
	}
	tests := []struct {
		name, query string
		vars        map[string]any
		limit       string
	}{
		{
			"selector bytes", `query($s: String) { objects(filter: {labelSelector: $s}) { totalCount } }`,
			map[string]any{"s": "app=" + strings.Repeat("x", 5000)},
			"filter.labelSelector.bytes",
		},
		{
			"selector terms", `query($s: String) { objects(filter: {labelSelector: $s}) { totalCount } }`,
			map[string]any{"s": strings.Join(terms, ",")},
			"filter.labelSelector.terms",
		},
		{
			"selector values", `query($s: String) { facets(filter: {labelSelector: $s}) { total } }`,
			map[string]any{"s": "app in (" + strings.Join(values, ",") + ")"},
			"filter.labelSelector.terms",
		},
		{
			"cluster selector terms", `query($s: String) { facets(filter: {clusterLabelSelector: $s}) { total } }`,
			map[string]any{"s": strings.Join(terms, ",")},
			"filter.clusterLabelSelector.terms",
		},
		{
			"clusters(labelSelector)", `query($s: String) { clusters(labelSelector: $s) { name } }`,
			map[string]any{"s": strings.Join(terms, ",")},
			"labelSelector.terms",
		},
		{
			"nameContains", `query($s: String) { objects(filter: {nameContains: $s}) { totalCount } }`,
			map[string]any{"s": strings.Repeat("a", 254)},
			"filter.nameContains",
		},
		{
			"cluster list", `query($c: [String!]) { objects(filter: {clusters: $c}) { totalCount } }`,
			map[string]any{"c": many},
			"filter.clusters",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := f.post("alice", tc.query, tc.vars)
			if status != http.StatusOK || resp.code() != CodeBadUserInput || resp.Errors[0].Extensions["limit"] != tc.limit {
				t.Fatalf("%d %+v; want BAD_USER_INPUT naming limit %s", status, resp.Errors, tc.limit)
			}
			if !strings.Contains(resp.Errors[0].Message, "at most") {
				t.Errorf("message %q does not say the limit", resp.Errors[0].Message)
			}
			f.assertAlive()
		})
	}
	t.Run("subscription", func(t *testing.T) {
		c := f.connect("alice")
		c.subscribe("1", `subscription($s: String) { objectChanges(filter: {labelSelector: $s}) { type } }`,
			map[string]any{"s": strings.Join(terms, ",")})
		m := c.readFor("1")
		if m.Type != "error" && m.Type != "next" || !strings.Contains(string(m.Payload), "filter.labelSelector.terms") {
			t.Fatalf("got %+v %s; want an error naming the limit", m, m.Payload)
		}
		f.assertAlive()
	})
	// Within the limits, the largest selector still answers.
	var r struct{ Objects struct{ TotalCount int } }
	f.query("alice", `query($s: String) { objects(filter: {labelSelector: $s}) { totalCount } }`,
		map[string]any{"s": "app in (" + strings.Join(values[:63], ",") + ")"}, &r)
	f.rowsUnchanged(before)
}

// TestCostPricesScansAndLiveReads: scans and live reads are priced, and
// aliases multiply the price, so a document cannot repeat them past the
// complexity limit.
func TestCostPricesScansAndLiveReads(t *testing.T) {
	f := newFixture(t)
	aliased := func(n int, field string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, " a%d: %s", i, field)
		}
		b.WriteString(" }")
		return b.String()
	}
	tests := []struct {
		name  string
		n     int
		field string
		ok    bool
	}{
		{"facets from counts", 64, `facets(filter: {kinds: ["Pod"]}) { total }`, true},
		{"nine selector facets", 9, `facets(filter: {labelSelector: "app"}) { total }`, true},
		{"ten selector facets", 10, `facets(filter: {labelSelector: "app"}) { total }`, false},
		{"ten name searches", 10, `objects(first: 1, filter: {nameContains: "pod"}) { totalCount }`, false},
		{"ten counts in another order", 10, `objects(first: 0, orderBy: {field: CREATED_AT}) { totalCount }`, false},
		{"fifty live reads", 50, `object(cluster: "east", kind: "Pod", namespace: "team-a", name: "x") { name }`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, resp := f.post("alice", aliased(tc.n, tc.field), nil)
			rejected := resp.code() == codeValidationFailed && resp.Errors[0].Extensions["limit"] == "complexity"
			if status != http.StatusOK || rejected == tc.ok {
				t.Fatalf("%d aliases of %s: %d %+v; want accepted=%v", tc.n, tc.field, status, resp.Errors, tc.ok)
			}
		})
	}
	f.assertAlive()
}

// viewerOf is the viewer a test user's token establishes.
func (f *fixture) viewerOf(name string) *viewer {
	return f.h.svc.newViewer(&user.DefaultInfo{Name: name, Groups: testUsers[name]})
}

// readsGauge reads the expensive_reads gauge.
func (f *fixture) readsGauge(kind, state string) float64 {
	return testutil.ToFloat64(f.h.metrics.reads.WithLabelValues(kind, state))
}

// TestExpensiveReadsWaitForSlots: a viewer's scans and live reads beyond
// its limits wait for its own slots, scans beyond the server's total wait
// for one of the server's, and a wait ends with DEADLINE_EXCEEDED at the
// request's deadline or when the client goes away; other viewers' cheap
// reads are not held up. The test holds the slots itself, so nothing
// depends on how long a scan takes.
func TestExpensiveReadsWaitForSlots(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		o.Limits.MaxScansPerViewer, o.Limits.MaxConcurrentScans, o.Limits.MaxLiveReadsPerViewer = 1, 1, 1
		o.Limits.RequestTimeout = 300 * time.Millisecond
	})
	ctx := context.Background()
	const scan = `{ objects(filter: {labelSelector: "app"}) { totalCount } }`
	const cheap = `{ objects(filter: {kinds: ["Pod"]}) { totalCount } }`
	const live = `{ object(cluster: "east", kind: "Pod", namespace: "team-a", name: "pod-team-a-0") { name } }`

	releaseScan, err := f.h.svc.admission.scan(ctx, f.viewerOf("alice"))
	must(t, err)
	releaseLive, err := f.h.svc.admission.liveRead(ctx, f.viewerOf("alice"))
	must(t, err)
	for _, tc := range []struct{ user, query, code, says string }{
		{"alice", scan, CodeDeadlineExceeded, "one of your 1 scans"},
		{"bob", scan, CodeDeadlineExceeded, "a scan slot of the server"},
		{"alice", live, CodeDeadlineExceeded, "one of your 1 live reads"},
		{"alice", cheap, "", ""},
		{"bob", cheap, "", ""},
	} {
		start := time.Now()
		_, resp := f.post(tc.user, tc.query, nil)
		took := time.Since(start)
		if resp.code() != tc.code || (tc.says != "" && !strings.Contains(resp.Errors[0].Message, tc.says)) {
			t.Errorf("%s %s: %+v; want %q saying %q", tc.user, tc.query, resp.Errors, tc.code, tc.says)
		}
		if tc.code == "" && took > 200*time.Millisecond {
			t.Errorf("%s's cheap read took %v while slots were held", tc.user, took)
		}
	}
	// Over a websocket too.
	c := f.connect("alice")
	c.subscribe("1", scan, nil)
	if m := c.readFor("1"); !strings.Contains(string(m.Payload), CodeDeadlineExceeded) {
		t.Errorf("a websocket query waiting for a slot: %+v %s", m, m.Payload)
	}
	releaseScan()
	releaseLive()
	var r struct{ Objects struct{ TotalCount int } }
	f.query("alice", scan, nil, &r)
	if r.Objects.TotalCount == 0 {
		t.Error("alice's scan found nothing once the slot was free")
	}

	t.Run("a client that goes away stops waiting", func(t *testing.T) {
		g := newFixture(t, func(o *Options) { o.Limits.MaxScansPerViewer = 1 })
		release, err := g.h.svc.admission.scan(ctx, g.viewerOf("alice"))
		must(t, err)
		defer release()
		reqCtx, cancel := context.WithCancel(ctx)
		body, _ := json.Marshal(map[string]any{"query": scan})
		req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, g.srv.URL+"/graphql", strings.NewReader(string(body)))
		must(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+g.tokens["alice"])
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		}()
		waitUntil(t, 5*time.Second, "alice's scan waits", func() bool { return g.readsGauge(readScan, "waiting") == 1 })
		cancel()
		<-done
		// The default deadline is 10 s; the wait must end long before.
		waitUntil(t, 2*time.Second, "the wait ends with the client", func() bool { return g.readsGauge(readScan, "waiting") == 0 })
	})
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
