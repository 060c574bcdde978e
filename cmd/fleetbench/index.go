package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// runIndex ingests the synthetic fleet into an index.Store and measures
// ingest throughput, live heap per object, the latency of the queries of
// issue 3 (Q1..Q6) and Q3 under churn, then prints:
//
//	index: objects=N ingest_per_s=X heap_bytes_per_object=Y q1_p99_us=... churn_q3_p99_us=...
//
// The generator is kept out of every timed section: ingest times only the
// UpsertBatch calls (each batch is generated before its clock starts), and
// the Q1/Q2 keys and the churn updates are generated beforehand. With -v it
// also logs CPU time per operation, which on a shared machine says more
// than wall-clock percentiles.
func runIndex(ctx context.Context, args []string) error {
	return indexBench(ctx, "index", args)
}

// runScale is fleetbench scale: the index benchmark at 10M objects (1,000
// clusters), without the churn run, printing
//
//	scale: objects=N heap_bytes_per_object=.. rss_gib=.. ingest_per_s=.. q3_p99_us=.. q4_p99_us=.. facets_p99_us=.. q6b_p99_us=..
//
// rss_gib is the process's peak resident set (VmHWM), the generator's
// garbage included. The run models fleetgraph serve in a container with
// -container-memory of memory (8 GiB by default): serve then sets the Go
// runtime's soft limit (GOMEMLIMIT) to 90% of it, and so does this run;
// memory_limit_gib in the line says which container it was (0: none).
// Both modes run fleetgraph serve's garbage-collection policy
// (internal/gcpolicy; -gc-headroom 0 for the Go default), and gc_headroom
// in the line says which.
func runScale(ctx context.Context, args []string) error {
	return indexBench(ctx, "scale", args)
}

func indexBench(ctx context.Context, mode string, args []string) error {
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	fleet := indextest.DefaultFleet()
	if mode == "scale" {
		fleet.Clusters = 1000
	}
	fs.IntVar(&fleet.Clusters, "clusters", fleet.Clusters, "clusters in the synthetic fleet")
	fs.IntVar(&fleet.Namespaces, "namespaces", fleet.Namespaces, "namespaces per cluster")
	fs.IntVar(&fleet.PerNamespace, "per-namespace", fleet.PerNamespace, "objects per namespace")
	batch := fs.Int("batch", 1000, "rows per ingest transaction")
	iters := fs.Int("iterations", 2000, "timed runs of each query")
	churnRate := fs.Int("churn-rate", 20000, "updates per second during the churn measurement")
	churnWriters := fs.Int("churn-writers", 0, "goroutines applying the churn updates (default one per cluster)")
	churnFor := fs.Duration("churn-duration", 3*time.Second, "how long to measure Q3 under churn")
	verbose := fs.Bool("v", false, "print details to stderr")
	ingestOnly := fs.Bool("ingest-only", false, "stop after the ingest and heap figures (for profiling)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the ingest phase to this file")
	queryProfile := fs.String("qcpuprofile", "", "write a CPU profile of the query phase (Q1..Q6, not churn) to this file")
	churnProfile := fs.String("churncpuprofile", "", "write a CPU profile of the churn phase to this file")
	memProfile := fs.String("memprofile", "", "write a heap profile after the ingest to this file")
	gcHeadroom := gcFlag(fs)
	containerGiB := 0.0
	if mode == "scale" {
		fs.Float64Var(&containerGiB, "container-memory", 8, "GiB: run as fleetgraph serve in a container with this memory limit (GOMEMLIMIT 90% of it); 0 for no limit")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if containerGiB > 0 {
		debug.SetMemoryLimit(int64(containerGiB * 0.9 * (1 << 30)))
	}
	gc, _, err := startGCPolicy(*gcHeadroom)
	if err != nil {
		return err
	}
	defer gc.Stop()
	logf := func(format string, a ...any) {
		if *verbose {
			fmt.Fprintf(os.Stderr, format+"\n", a...)
		}
	}

	s := index.New(memtables.Open)
	heapBefore := measure.LiveHeap()
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	// The ingest figure times the UpsertBatch calls only: each batch is
	// generated before its clock starts, so the generator's own cost (it
	// formats names, UIDs and messages) is not counted. ingestCPU is the
	// process CPU time spent inside those calls, garbage collection
	// included.
	var ingest, ingestCPU time.Duration
	cpu0 := measure.CPUTime()
	err = fleet.Each(*batch, func(rows []index.Object) error {
		c, start := measure.CPUTime(), time.Now()
		err := s.UpsertBatch(ctx, rows)
		ingest += time.Since(start)
		ingestCPU += measure.CPUTime() - c
		return err
	})
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	stopProfile()
	n := fleet.Size()
	heap := measure.LiveHeap() - heapBefore
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return err
		}
		werr := pprof.Lookup("heap").WriteTo(f, 0)
		if err := errors.Join(werr, f.Close()); err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
	}
	if *ingestOnly {
		_, peak, err := procRSS(os.Getpid())
		if err != nil {
			return err
		}
		fmt.Printf("index: objects=%d ingest_per_s=%.0f ingest_cpu_us_per_object=%.2f heap_bytes_per_object=%.0f peak_rss_bytes_per_object=%.0f gc_headroom=%s\n",
			n, float64(n)/ingest.Seconds(), ingestCPU.Seconds()*1e6/float64(n), float64(heap)/float64(n), float64(peak)/float64(n), gcHeadroomKey(gc))
		return nil
	}
	for c := range fleet.Clusters {
		if err := s.UpsertCluster(ctx, index.Cluster{Name: indextest.ClusterName(c), State: index.StateConnected, Mode: index.ModePull}); err != nil {
			return err
		}
	}
	logf("ingested %d objects in %v: CPU %v in UpsertBatch (%v/object), %v including the generator; heap %d MiB",
		n, ingest, ingestCPU, ingestCPU/time.Duration(n), measure.CPUTime()-cpu0, heap>>20)

	admin := &index.Access{All: true}
	rnd := rand.New(rand.NewPCG(1, 2))
	// Q1 and Q2 look up random objects. Their keys are generated here, not
	// inside the timed calls: generating an object costs more than Q1.
	keys := make([]index.Key, 4096)
	for i := range keys {
		o := fleet.Object(rnd.IntN(n))
		keys[i] = o.Key()
	}
	q3 := index.Query{
		Filter: index.Filter{Kinds: []string{"Kustomization"}, Statuses: []index.Status{index.StatusUnhealthy}},
		Order:  index.Order{Field: index.OrderName}, First: 100, Access: admin,
	}
	q6a, q6b := q3, q3
	// q6a: a team viewer bound in 50 namespaces of 10 clusters (the
	// 10 namespaces of 5 clusters it once had held no match at all).
	q6a.Access = fleet.NamespaceAccess(min(10, fleet.Clusters), 50)
	q6b.Access = fleet.NamespaceAccess(100, 200)

	// The answers every query must give, from the generator (q1 and q2
	// are checked against the key they look up).
	refStart := time.Now()
	kust := index.GroupResource{Group: "kustomize.toolkit.fluxcd.io", Resource: "kustomizations"}
	isQ3 := func(o *index.Object) bool { return o.Kind == "Kustomization" && o.Status == index.StatusUnhealthy }
	ref := computeReference(fleet, q3.First, map[string]func(*index.Object) bool{
		"q3": isQ3,
		"q4": func(o *index.Object) bool { return o.Labels.Get("app") == "v0" },
		"q6a": func(o *index.Object) bool {
			return isQ3(o) && q6a.Access.Allows(o.Cluster, kust, o.Namespace, o.Name)
		},
		"q6b": func(o *index.Object) bool {
			return isQ3(o) && q6b.Access.Allows(o.Cluster, kust, o.Namespace, o.Name)
		},
	})
	logf("reference answers from the generator in %v", time.Since(refStart).Round(time.Millisecond))

	type timedQuery struct {
		name string
		fn   func() error
	}
	// Each page is checked against the reference once, row by row, before
	// it is timed; every timed run must give the reference's page length
	// and total.
	query := func(name string, q index.Query) func() error {
		p, err := s.Query(ctx, q)
		if err == nil {
			err = ref.checkPage(name, p)
		}
		if err != nil {
			return func() error { return err }
		}
		rows, total := len(p.Edges), p.TotalCount
		return func() error {
			p, err := s.Query(ctx, q)
			if err == nil && (len(p.Edges) != rows || p.TotalCount != total) {
				err = fmt.Errorf("%d rows of %d matches, the generator says %d of %d", len(p.Edges), p.TotalCount, rows, total)
			}
			return err
		}
	}
	if stopProfile, err = startCPUProfile(*queryProfile); err != nil {
		return err
	}
	results := map[string]time.Duration{}
	var q2Rows, q2Runs int
	for _, m := range []timedQuery{
		{"q1", func() error {
			k := keys[rnd.IntN(len(keys))]
			if o, ok := s.Get(k); !ok || o.Key() != k {
				return fmt.Errorf("q1: %s not found", k)
			}
			return nil
		}},
		{"q2", func() error {
			k := keys[rnd.IntN(len(keys))]
			p, err := s.Query(ctx, index.Query{
				Filter: index.Filter{Clusters: []string{k.Cluster}, Namespaces: []string{k.Namespace}, Kinds: []string{k.Kind}},
				First:  100, Access: admin,
			})
			if err == nil && !slices.ContainsFunc(p.Edges, func(e index.Edge) bool { return e.Object.Key() == k }) && p.TotalCount <= 100 {
				err = fmt.Errorf("q2: %s is not in its namespace's page", k)
			}
			if err == nil {
				q2Rows, q2Runs = q2Rows+len(p.Edges), q2Runs+1
			}
			return err
		}},
		{"q3", query("q3", q3)},
		{"q4", query("q4", index.Query{Filter: index.Filter{LabelSelector: "app=v0"}, First: 100, Access: admin})},
		{"q5", func() error {
			f, err := s.Facets(ctx, index.Filter{}, admin)
			if err == nil {
				err = ref.checkFacets(f, n)
			}
			return err
		}},
		{"q6a", query("q6a", q6a)},
		{"q6b", query("q6b", q6b)},
	} {
		// Each workload starts from a collected heap, as a Go benchmark
		// does, so that it pays for the collections of its own garbage
		// and not for one that the ingest, the reference answers or the
		// workload before it made due (a 200 ms mark of the 1M heap fell
		// in q4's window in every run of session 8's A/B).
		runtime.GC()
		cpu0 := measure.CPUTime()
		d, p50, err := p99(*iters, m.fn)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		results[m.name] = d
		logf("%s p50 %v p99 %v cpu/op %v", m.name, p50, d, (measure.CPUTime()-cpu0)/time.Duration(*iters+min(*iters/10, 100)))
	}
	// The result sizes go into the line beside the latencies.
	sizes := fmt.Sprintf("q2_mean_rows=%.1f q3_rows=%d q3_total=%d q4_rows=%d q4_total=%d q6a_rows=%d q6a_total=%d q6b_rows=%d q6b_total=%d",
		float64(q2Rows)/float64(max(q2Runs, 1)), len(ref.pages["q3"]), ref.totals["q3"], len(ref.pages["q4"]), ref.totals["q4"],
		len(ref.pages["q6a"]), ref.totals["q6a"], len(ref.pages["q6b"]), ref.totals["q6b"])

	stopProfile()
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1e3) }
	if mode == "scale" {
		_, peak, err := procRSS(os.Getpid())
		if err != nil {
			return err
		}
		fmt.Printf("scale: objects=%d heap_bytes_per_object=%.0f rss_gib=%.2f ingest_per_s=%.0f q3_p99_us=%s q4_p99_us=%s facets_p99_us=%s q6b_p99_us=%s memory_limit_gib=%.1f gc_headroom=%s %s\n",
			n, float64(heap)/float64(n), float64(peak)/(1<<30), float64(n)/ingest.Seconds(),
			us(results["q3"]), us(results["q4"]), us(results["q5"]), us(results["q6b"]), containerGiB, gcHeadroomKey(gc), sizes)
		runtime.KeepAlive(s)
		return nil
	}

	if *churnWriters <= 0 {
		*churnWriters = fleet.Clusters
	}
	churn, churnRateReached, err := churnQ3(ctx, s, fleet, q3, *churnRate, *churnWriters, *churnFor, *churnProfile, logf)
	if err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	fmt.Printf("index: objects=%d ingest_per_s=%.0f heap_bytes_per_object=%.0f q1_p99_us=%s q2_p99_us=%s q3_p99_us=%s q4_p99_us=%s q5_p99_us=%s q6a_p99_us=%s q6b_p99_us=%s churn_q3_p99_us=%s churn_changes_per_s=%.0f gc_headroom=%s %s\n",
		n, float64(n)/ingest.Seconds(), float64(heap)/float64(n),
		us(results["q1"]), us(results["q2"]), us(results["q3"]), us(results["q4"]), us(results["q5"]),
		us(results["q6a"]), us(results["q6b"]), us(churn), churnRateReached, gcHeadroomKey(gc), sizes)
	runtime.KeepAlive(s)
	return nil
}

// queryFor runs q back to back for d and returns the sorted latencies and
// how many garbage collections ran meanwhile. Queries run back to back, as
// in the idle measurement. (Sleeping between them, as the churn loop once
// did, made even a churn-free run about three times slower at the median:
// each query started on cold caches.)
func queryFor(ctx context.Context, s *index.Store, q index.Query, d time.Duration) ([]time.Duration, uint32, error) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc0 := ms.NumGC
	var ds []time.Duration
	for start := time.Now(); time.Since(start) < d; {
		t := time.Now()
		if _, err := s.Query(ctx, q); err != nil {
			return nil, 0, err
		}
		ds = append(ds, time.Since(t))
	}
	runtime.ReadMemStats(&ms)
	slices.Sort(ds)
	return ds, ms.NumGC - gc0, nil
}

// startCPUProfile starts a CPU profile into path unless path is empty, and
// returns the function that stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "fleetbench: CPU profile:", err)
		}
	}, nil
}

// p99 runs fn after a warm-up and returns the 99th and 50th percentile
// durations.
func p99(iters int, fn func() error) (p99, p50 time.Duration, err error) {
	for range min(iters/10, 100) {
		if err := fn(); err != nil {
			return 0, 0, err
		}
	}
	ds := make([]time.Duration, iters)
	for i := range ds {
		start := time.Now()
		if err := fn(); err != nil {
			return 0, 0, err
		}
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return ds[len(ds)*99/100], ds[len(ds)/2], nil
}

// churnQ3 applies rate single-object updates per second (new versions of
// random objects, each a real change) from writers goroutines while
// measuring Q3 back to back, and returns Q3's p99.
func churnQ3(ctx context.Context, s *index.Store, fleet indextest.Fleet, q index.Query, rate, writers int, d time.Duration, profile string, logf func(string, ...any)) (time.Duration, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The updates are generated before the clock starts: generating one
	// costs several times more than applying it, and on two cores the
	// generator would compete with the queries it is meant to disturb.
	perWriter := churnByWriter(fleet, int(float64(rate)*d.Seconds()*1.5)+1000, writers)
	// The same loop without churn first, for comparison: a window as long
	// as the churn one holds as many garbage collections (the queries'
	// own garbage triggers them), which the short idle Q3 window may miss.
	if base, gcs, err := queryFor(ctx, s, q, d); err == nil {
		logf("no churn: %d queries, p50 %v p90 %v p99 %v, %d GC cycles", len(base), base[len(base)/2], base[len(base)*9/10], base[len(base)*99/100], gcs)
	} else {
		return 0, 0, err
	}
	// The baseline is read before the writers start: read after, it
	// missed their first updates and the check below failed a correct run
	// ("60035 updates applied but 60021 changes published").
	published := s.FeedStats().Published
	var applied atomic.Int64
	wait := pace(ctx, rate, perWriter, func(ctx context.Context, o index.Object) error {
		err := s.Upsert(ctx, o)
		if err == nil {
			applied.Add(1)
		}
		return err
	})
	stopProfile, err := startCPUProfile(profile)
	if err != nil {
		return 0, 0, err
	}
	defer stopProfile()
	start := time.Now()
	cpu0 := measure.CPUTime()
	ds, gcs, err := queryFor(ctx, s, q, d)
	if err != nil {
		return 0, 0, err
	}
	cancel()
	err = wait()
	took := time.Since(start)
	if err != nil {
		return 0, 0, err
	}
	// Only changes count: every applied update must have been published.
	changes := s.FeedStats().Published - published
	if n := applied.Load(); uint64(n) != changes {
		return 0, 0, fmt.Errorf("%d updates applied but %d changes published: the churn counted no-ops", n, changes)
	}
	logf("churn: %d queries, p50 %v p90 %v, process CPU %v over %v, %d GC cycles",
		len(ds), ds[len(ds)/2], ds[len(ds)*9/10], measure.CPUTime()-cpu0, took, gcs)
	perSec := float64(changes) / took.Seconds()
	if perSec < 0.9*float64(rate) {
		// A loaded machine cannot always keep up; say so rather than
		// print a figure that looks like the requested rate.
		fmt.Fprintf(os.Stderr, "fleetbench: churn reached only %.0f changes/s of %d\n", perSec, rate)
	}
	return ds[len(ds)*99/100], perSec, nil
}

// churnByWriter returns n updates of random objects of the fleet, split
// among writers by cluster. Each update is a real change of the version
// before it (a new resource version alone would be skipped by the index as
// unchanged, and once made about a quarter of the updates). A writer
// applies the updates of its clusters in sequence order, so each one stays
// a change when applied.
func churnByWriter(fleet indextest.Fleet, n, writers int) [][]index.Object {
	rnd := rand.New(rand.NewPCG(3, 4))
	var picked []int
	all := fleet.Changes(n, func() int {
		i := rnd.IntN(fleet.Size())
		picked = append(picked, i)
		return i
	})
	perWriter := make([][]index.Object, writers)
	for j, i := range picked {
		g := fleet.ClusterOf(i) % writers
		perWriter[g] = append(perWriter[g], all[j])
	}
	return perWriter
}

// pace applies the updates of perWriter[g] in order from one goroutine per
// g, rate updates per second across them, each goroutine on a 1 ms tick, as
// the collector's reflectors (one per cluster and kind) deliver their watch
// events. apply returns once the update is applied, so the writers bound
// the rate to len(perWriter) per apply latency. The goroutines stop when
// their updates are done or ctx ends; wait waits for them and returns the
// first error of apply (none for a write that ctx cancelled).
func pace(ctx context.Context, rate int, perWriter [][]index.Object, apply func(context.Context, index.Object) error) (wait func() error) {
	writers := len(perWriter)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			const tick = time.Millisecond
			perTick := float64(rate) / float64(writers) / 1000
			// Stagger the writers, as independent watch streams are:
			// started in step, they all fired on the same tick.
			credit, next := float64(g)/float64(writers), time.Now()
			updates := perWriter[g]
			for i := 0; ctx.Err() == nil && i < len(updates); {
				for credit += perTick; credit >= 1 && i < len(updates); credit-- {
					if err := apply(ctx, updates[i]); err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
					i++
				}
				next = next.Add(tick)
				if w := time.Until(next); w > 0 {
					time.Sleep(w)
				}
			}
		}()
	}
	return func() error {
		wg.Wait()
		close(errs)
		return <-errs
	}
}
