package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

// BenchmarkIsolation is `make bench-isolation`. On the index's synthetic
// 1M-object fleet, over real HTTP, attackers (fleet admins, so every row
// is theirs to scan) send from isolationAttackers clients of two
// identities, back to back, the costliest document the limits allow: nine
// aliased facets, each over a label selector of the most terms allowed,
// every one of which every row matches (a full scan, each row's labels
// read 64 times). Meanwhile it measures what others pay:
//
//   - an ordinary viewer (viewer-q3, bound in 200 namespaces of every
//     cluster) sends, one after the other, Q1 (one object: a cluster,
//     namespace and kind, first 1) and Q3 (UNHEALTHY Kustomizations, first
//     100, by name), each timed from sending the request to reading the
//     answer's last byte and checked after;
//   - ingest: new versions of 1,000 objects per UpsertBatch, back to back,
//     as rows per second; the same writer alone beforehand gives the idle
//     rate.
//
// It prints one line:
//
//	isolation: objects=1000000 attackers=4 victim_q1_p99_ms=.. victim_q3_p99_ms=.. ingest_during_attack_per_s=.. ingest_idle_per_s=.. victim_q1_idle_p99_ms=.. victim_q3_idle_p99_ms=..
//
// The last two are the victim's p99s with the writer but without the
// attack, measured before it, so that what the attack costs the victim
// can be told from what the machine and the writer cost.
//
// FLEETGRAPH_BENCH_SMALL=1 runs it on 100k objects for a quick check.
func BenchmarkIsolation(b *testing.B) {
	p := benchParamsFromEnv()
	p.subscribers = 0
	ctx := context.Background()
	store := index.New(memtables.Open)
	must(b, benchIngest(ctx, store, p))

	attackers := []string{"attacker-a", "attacker-b"}
	tokens := map[string]string{"viewer-q3": "tok-viewer-q3"}
	csv := "tok-viewer-q3,viewer-q3,uid-viewer-q3\n"
	for _, a := range attackers {
		tokens[a] = "tok-" + a
		csv += fmt.Sprintf("tok-%s,%s,uid-%s,fleet-admins\n", a, a, a)
	}
	h, srv := startBenchServer(b, store, csv, []string{"fleet-admins"})

	measureFor := 20 * time.Second
	if p.fleet.Size() < 1_000_000 {
		measureFor = 5 * time.Second
	}
	w := newIsolationWriter(p.fleet)
	idle, err := w.run(ctx, store, measureFor/2)
	must(b, err)
	b.Logf("ingest alone: %.0f rows/s", idle)

	// The same victim and writer without an attack, for comparison (logged
	// and printed as victim_*_idle_p99_ms).
	wctx, stopWriter := context.WithCancel(ctx)
	var wwg sync.WaitGroup
	var idleWriteErr error
	wwg.Go(func() { _, idleWriteErr = w.run(wctx, store, measureFor/2) })
	q1Idle, q3Idle := isolationVictim(b, srv.URL, tokens["viewer-q3"], p.fleet, measureFor/2)
	stopWriter()
	wwg.Wait()
	must(b, idleWriteErr)

	// The attack.
	actx, stopAttack := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var attacks, fields, deadlines atomic.Int64
	doc := isolationAttackDoc()
	for i := range isolationAttackers {
		client := &http.Client{}
		token := tokens[attackers[i%len(attackers)]]
		wg.Go(func() {
			for actx.Err() == nil {
				resp, err := postGraphQL(actx, client, srv.URL, token, doc)
				if actx.Err() != nil {
					return
				}
				if err != nil {
					b.Error(err)
					return
				}
				attacks.Add(1)
				for _, e := range resp.Errors {
					if c, _ := e.Extensions["code"].(string); c != CodeDeadlineExceeded {
						b.Errorf("attacker: %s: %s", c, e.Message)
						return
					}
					deadlines.Add(1)
				}
				var data map[string]*struct{ Total int }
				if err := json.Unmarshal(resp.Data, &data); err != nil {
					b.Error(err)
					return
				}
				for _, f := range data {
					if f != nil {
						if f.Total != p.fleet.Size() {
							b.Errorf("attacker's facets counted %d rows of %d", f.Total, p.fleet.Size())
						}
						fields.Add(1)
					}
				}
			}
		})
	}
	for testutil.ToFloat64(h.metrics.reads.WithLabelValues(readScan, "running")) == 0 {
		time.Sleep(10 * time.Millisecond)
	}

	scans0 := testutil.ToFloat64(h.metrics.readsDone.WithLabelValues(readScan))

	// The victim and the writer, during the attack.
	var during float64
	var writeErr error
	wg.Go(func() { during, writeErr = w.run(actx, store, measureFor) })
	q1, q3 := isolationVictim(b, srv.URL, tokens["viewer-q3"], p.fleet, measureFor)
	stopAttack()
	wg.Wait()
	must(b, writeErr)

	scans := testutil.ToFloat64(h.metrics.readsDone.WithLabelValues(readScan)) - scans0
	b.Logf("attack: %.0f scans run, %d documents answered (%d facets fields computed, %d stopped by the deadline)", scans, attacks.Load(), fields.Load(), deadlines.Load())
	b.Logf("victim without attack: %d Q1 (p50 %v), %d Q3 (p50 %v)", len(q1Idle), q1Idle[len(q1Idle)/2], len(q3Idle), q3Idle[len(q3Idle)/2])
	b.Logf("victim under attack: %d Q1 (p50 %v), %d Q3 (p50 %v)", len(q1), q1[len(q1)/2], len(q3), q3[len(q3)/2])
	if scans < 2 {
		b.Fatalf("%.0f scans ran during the attack", scans)
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1e3) }
	p99 := func(ds []time.Duration) time.Duration { return ds[min(len(ds)-1, len(ds)*99/100)] }
	fmt.Printf("isolation: objects=%d attackers=%d victim_q1_p99_ms=%s victim_q3_p99_ms=%s ingest_during_attack_per_s=%.0f ingest_idle_per_s=%.0f victim_q1_idle_p99_ms=%s victim_q3_idle_p99_ms=%s\n",
		p.fleet.Size(), isolationAttackers, ms(p99(q1)), ms(p99(q3)), during, idle, ms(p99(q1Idle)), ms(p99(q3Idle)))
}

// isolationAttackers is how many attacking clients run at once.
const isolationAttackers = 4

// isolationAttackDoc is the costliest document the default limits admit:
// as many aliased facets as MaxComplexity allows scans, each over
// costliestSelector.
func isolationAttackDoc() []byte {
	var q strings.Builder
	q.WriteString("query($s: String) {")
	for i := range 9 { // ten do not fit (TestCostPricesScansAndLiveReads)
		fmt.Fprintf(&q, " f%d: facets(filter: {labelSelector: $s}) { total }", i)
	}
	q.WriteString(" }")
	body, err := json.Marshal(map[string]any{"query": q.String(), "variables": map[string]any{"s": costliestSelector()}})
	if err != nil {
		panic(err)
	}
	return body
}

// postGraphQL sends a prepared request body.
func postGraphQL(ctx context.Context, client *http.Client, url, token string, body []byte) (gqlResponse, error) {
	var out gqlResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/graphql", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return out, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("status %d: %q: %w", resp.StatusCode, b, err)
	}
	return out, nil
}

// isolationVictim sends Q1 and Q3 in turn as viewer-q3 for d and returns
// their round trips, sorted.
func isolationVictim(b *testing.B, url, token string, f indextest.Fleet, d time.Duration) (q1, q3 []time.Duration) {
	q3c := newQ3Client(b, url, token)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	rnd := rand.New(rand.NewPCG(7, 8))
	visible := map[string]bool{} // viewer-q3's namespaces, as benchIngest binds them
	for j := range min(200, f.Namespaces) {
		visible[indextest.NamespaceName(j*5%f.Namespaces)] = true
	}
	const q1Query = `query($f: ObjectFilter) { objects(filter: $f, first: 1) { edges { node { id name status } } } }`
	for end := time.Now().Add(d); time.Now().Before(end); {
		// An object in one of viewer-q3's namespaces.
		o := f.Object(rnd.IntN(f.Size()))
		for !visible[o.Namespace] {
			o = f.Object(rnd.IntN(f.Size()))
		}
		body, err := json.Marshal(map[string]any{"query": q1Query, "variables": map[string]any{
			"f": map[string]any{"clusters": []string{o.Cluster}, "namespaces": []string{o.Namespace}, "kinds": []string{o.Kind}},
		}})
		must(b, err)
		start := time.Now()
		resp, err := postGraphQL(context.Background(), client, url, token, body)
		q1 = append(q1, time.Since(start))
		must(b, err)
		var r struct {
			Objects struct{ Edges []json.RawMessage }
		}
		must(b, json.Unmarshal(resp.Data, &r))
		if len(resp.Errors) > 0 || len(r.Objects.Edges) != 1 {
			b.Fatalf("Q1: %d edges, errors %+v", len(r.Objects.Edges), resp.Errors)
		}
		q3 = append(q3, q3c.do(b))
	}
	slices.Sort(q1)
	slices.Sort(q3)
	return q1, q3
}

// isolationWriter applies new versions of the fleet's objects, 1,000 per
// UpsertBatch, alternating between two versions generated beforehand so
// that every batch changes its rows.
type isolationWriter struct {
	batches [2][][]index.Object
	next    int
}

func newIsolationWriter(f indextest.Fleet) *isolationWriter {
	w := &isolationWriter{}
	rnd := rand.New(rand.NewPCG(9, 10))
	for range 50 {
		ids := make([]int, 1000)
		for i := range ids {
			ids[i] = rnd.IntN(f.Size())
		}
		for v := range 2 {
			batch := make([]index.Object, len(ids))
			for i, id := range ids {
				batch[i] = f.Version(id, 1000+v)
				batch[i].Message = fmt.Sprintf("isolation version %d", v) // every batch changes its rows
			}
			w.batches[v] = append(w.batches[v], batch)
		}
	}
	return w
}

// run writes batches back to back for d (or until stop ends) and returns
// the rows written per second.
func (w *isolationWriter) run(stop context.Context, s *index.Store, d time.Duration) (float64, error) {
	rows := 0
	start := time.Now()
	for time.Since(start) < d && stop.Err() == nil {
		i := w.next
		w.next++
		if err := s.UpsertBatch(context.Background(), w.batches[(i/len(w.batches[0]))%2][i%len(w.batches[0])]); err != nil {
			return 0, err
		}
		rows += 1000
	}
	return float64(rows) / time.Since(start).Seconds(), nil
}
