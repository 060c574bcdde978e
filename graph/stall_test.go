package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// seedBigCluster adds cluster "big" with the index's synthetic fleet of n
// objects, which system:masters (the test user admin) may read.
func seedBigCluster(t testing.TB, s *index.Store, n int) {
	t.Helper()
	ctx := context.Background()
	f := indextest.Fleet{Clusters: 1, Namespaces: n / 10, PerNamespace: 10, Seed: 7}
	must(t, s.UpsertCluster(ctx, index.Cluster{Name: "big", Mode: index.ModePull, State: index.StateConnected, Synced: true}))
	byKind := make([][]index.Object, len(indextest.Kinds))
	for i := range f.Size() {
		o := f.Object(i)
		o.Cluster = "big"
		byKind[f.KindOf(i)] = append(byKind[f.KindOf(i)], o)
	}
	for k, rows := range byKind {
		must(t, s.Replace(ctx, "big", indextest.Kinds[k], rows))
	}
	must(t, s.Replace(ctx, "big", clusterRoleKind, []index.Object{
		clusterRole("big", "cluster-admin", index.PolicyRule{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}),
	}))
	must(t, s.Replace(ctx, "big", crbKind, []index.Object{binding("big", "", "cluster-admin", index.KindClusterRole, "cluster-admin", groupSubject("system:masters"))}))
}

// costliestSelector is a label selector of the most terms the default
// limits allow that every row of the synthetic fleet matches: each term
// names app, which every row has, so checking a row reads its labels once
// per term.
func costliestSelector() string {
	terms := make([]string, DefaultMaxSelectorTerms)
	for i := range terms {
		terms[i] = fmt.Sprintf("app!=none-%d", i)
	}
	return strings.Join(terms, ",")
}

// TestNoQueryStallsTheServer plays the attack on a running API
// (real HTTP): while a collector keeps writing, attackers of two identities
// send, from four clients at once and over and over, the costliest
// document the limits let through: nine aliased facets, each over a label
// selector of the most terms allowed that every row matches, so each is a
// full scan. Meanwhile another viewer sends one-row queries: she must get
// many answered while each scan runs, never waiting for a whole scan (no
// read holds the index's lock for more than a chunk, and at most one scan
// runs at a time, leaving her a core). This is an ordering, not a timing:
// before the fix a writer waiting for the scan queued her behind it, so
// she got one or two queries in per scan. (Without the input limits a
// selector of thousands of terms made each scan, and so her wait, last
// for seconds; TestInputBounds checks those.)
func TestNoQueryStallsTheServer(t *testing.T) {
	store := seededStore(t)
	seedBigCluster(t, store, 50_000)
	f := newFixtureWith(t, store)

	selector := costliestSelector()
	facets := func(aliases int) string {
		var b strings.Builder
		b.WriteString("query($s: String) {")
		for i := range aliases {
			fmt.Fprintf(&b, " f%d: facets(filter: {labelSelector: $s}) { total }", i)
		}
		b.WriteString(" }")
		return b.String()
	}
	vars := map[string]any{"s": selector}

	// A collector's steady writes: without them readers never wait for
	// each other, with them a reader waits for any writer waiting for a
	// long read.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			o := testObject(podKind, "big", "churn", fmt.Sprintf("churn-%d", i%100), index.StatusHealthy)
			if err := store.Upsert(ctx, o); err != nil {
				if ctx.Err() != nil {
					return // the test is over: stop cancelled the write in flight
				}
				t.Errorf("upsert: %v", err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})

	var one struct{ F0 struct{ Total int } }
	start := time.Now()
	f.query("admin", facets(1), vars, &one)
	if one.F0.Total < 50_000 {
		t.Fatalf("the selector matched %d rows; it must match every row", one.F0.Total)
	}
	t.Logf("one full scan alone: %v", time.Since(start))

	var mu sync.Mutex
	attacks, errs := 0, map[string]int{}
	for i := range 4 {
		user := []string{"admin", "root"}[i%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				_, resp := f.post(user, facets(9), vars)
				mu.Lock()
				attacks++
				if len(resp.Errors) > 0 {
					errs[resp.code()]++
				}
				mu.Unlock()
			}
		})
	}
	waitUntil(t, 10*time.Second, "the attack runs", func() bool { return f.readsGauge(readScan, "running") > 0 })

	// The victim sends one-row queries until three scans have ended.
	scansEnded := func() float64 { return testutil.ToFloat64(f.h.metrics.readsDone.WithLabelValues(readScan)) }
	base := scansEnded()
	var took []time.Duration
	for scansEnded()-base < 3 {
		var r struct {
			Objects struct{ Edges []json.RawMessage }
		}
		start := time.Now()
		f.query("alice", `{ objects(first: 1) { edges { node { name } } } }`, nil, &r)
		took = append(took, time.Since(start))
		if len(r.Objects.Edges) != 1 {
			t.Fatalf("alice's query returned %d rows", len(r.Objects.Edges))
		}
	}
	ended := int(scansEnded() - base)
	stop()
	wg.Wait()
	slices.Sort(took)
	t.Logf("alice: %d queries while %d scans ended, median %v, p90 %v, slowest %v; %d attacks answered, errors by code %v",
		len(took), ended, took[len(took)/2], took[len(took)*9/10], took[len(took)-1], attacks, errs)
	// Waiting for each scan, she would get one or two queries in per
	// scan; she gets hundreds.
	if len(took) < 10*ended {
		t.Errorf("alice got %d queries answered while %d scans ran: she waited for them", len(took), ended)
	}
	// Attackers get answers or, when their own queued scans outlast the
	// request's deadline, DEADLINE_EXCEEDED; nothing else.
	for code := range errs {
		if code != CodeDeadlineExceeded {
			t.Errorf("attackers got %s errors", code)
		}
	}
	f.assertAlive()
}

// TestScansStopAtTheDeadline sends a full scan whose request deadline
// passes while it runs: the scan stops at its next chunk and the answer is
// DEADLINE_EXCEEDED. A scan that did not look at its context would run to
// its end and answer the counts.
func TestScansStopAtTheDeadline(t *testing.T) {
	store := seededStore(t)
	seedBigCluster(t, store, 50_000)
	f := newFixtureWith(t, store, func(o *Options) { o.Limits.RequestTimeout = 20 * time.Millisecond })
	status, resp := f.post("admin", `query($s: String) { facets(filter: {labelSelector: $s}) { total } }`,
		map[string]any{"s": costliestSelector()})
	if resp.code() != CodeDeadlineExceeded {
		t.Fatalf("%d %s %+v; want DEADLINE_EXCEEDED", status, resp.Data, resp.Errors)
	}
	// Normally the deadline passes during the scan; on a loaded machine it
	// may pass while the request still waits for its slot.
	t.Logf("%s", resp.Errors[0].Message)
	waitUntil(t, 5*time.Second, "the scan's slot is free", func() bool { return f.readsGauge(readScan, "running") == 0 })
	f.assertAlive()
}
