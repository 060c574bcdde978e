package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// peer is one store under comparison, loaded with the synthetic fleet and
// answering the workloads. Every peer returns whole rows (every column a
// page shows), so that no store is timed doing less than the others; pages
// are the first page in (name, key) order.
type peer interface {
	name() string
	// load stores every object of the fleet, indexes included.
	load(ctx context.Context, f indextest.Fleet, batch int) error
	// get returns the key of the object with key k ("" when absent): Q1.
	get(ctx context.Context, k index.Key) (string, error)
	// page returns the first q.first matches, in order.
	page(ctx context.Context, q pageQuery) (pageAnswer, error)
	// facets counts every object by status, kind, cluster and namespace.
	facets(ctx context.Context) (facetAnswer, error)
	// update applies new versions of stored objects (churn).
	update(ctx context.Context, objs []index.Object) error
	// size returns the bytes the store holds for the fleet and how they
	// were measured.
	size(ctx context.Context) (int64, string, error)
	close()
}

// pageQuery is one list request of Q2, Q3, Q4 or Q6. Empty fields do not
// filter.
type pageQuery struct {
	cluster, namespace, kind string
	status                   index.Status
	labelKey, labelValue     string
	scope                    *scope // nil: a fleet admin
	first                    int
}

// scope is a viewer's RBAC restriction, in the form each store applies it:
// the (cluster, namespace) pairs the viewer may list in and the kinds it
// may list there, and the same as an index.Access.
type scope struct {
	id         string
	clusters   []string // pairs: clusters[i], namespaces[i]
	namespaces []string
	kinds      []string
	access     *index.Access
}

// newScope builds the scope of a viewer bound in nsPerCluster namespaces of
// clusters clusters, every fleet kind allowed (Fleet.NamespaceAccess).
func newScope(id string, f indextest.Fleet, clusters, nsPerCluster int) *scope {
	a := f.NamespaceAccess(clusters, nsPerCluster)
	s := &scope{id: id, access: a}
	for _, c := range slices.Sorted(maps.Keys(a.Clusters)) {
		for _, ns := range slices.Sorted(maps.Keys(a.Clusters[c].Namespaces)) {
			s.clusters = append(s.clusters, c)
			s.namespaces = append(s.namespaces, ns)
		}
	}
	for _, k := range indextest.Kinds {
		s.kinds = append(s.kinds, k.Kind)
	}
	return s
}

// pageAnswer and facetAnswer are a store's answer as its client holds it
// when the request returns (rows scanned into Go values, a reply decoded):
// what a timed run pays for. keys and counts, the common form in which
// every store's answers are checked against fleetgraph's, are built only
// by check, so that no store is timed on the harness's conversion.
type pageAnswer interface {
	len() int
	keys() []string
}

type facetAnswer interface {
	len() int // the counts that are not zero
	counts() facetCounts
}

// rows is a pageAnswer of a store's own row type.
type rows[T any] struct {
	list []T
	key  func(*T) string
}

func (r rows[T]) len() int { return len(r.list) }

func (r rows[T]) keys() []string {
	out := make([]string, len(r.list))
	for i := range r.list {
		out[i] = r.key(&r.list[i])
	}
	return out
}

// facetCounts maps "status/X", "kind/X", "cluster/X" and "namespace/X" to
// counts (zeros left out).
type facetCounts map[string]int

// facetRows is a facetAnswer of SQL rows (key, count), keys already in
// facetCounts form.
type facetRows []facetRow

type facetRow struct {
	key string
	n   int
}

// sqlResult is what scanFacets reads: pgx.Rows, or sqlRows.
type sqlResult interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}

// scanFacets reads (key, count) rows.
func scanFacets(rs sqlResult) (facetRows, error) {
	defer rs.Close()
	var out facetRows
	for rs.Next() {
		var c facetRow
		if err := rs.Scan(&c.key, &c.n); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rs.Err()
}

func (r facetRows) len() int {
	n := 0
	for _, c := range r {
		if c.n > 0 {
			n++
		}
	}
	return n
}

func (r facetRows) counts() facetCounts {
	out := make(facetCounts, len(r))
	for _, c := range r {
		if c.n > 0 {
			out[c.key] = c.n
		}
	}
	return out
}

// keyString is the key every store reports rows by.
func keyString(cluster, group, kind, namespace, name string) string {
	return cluster + "/" + group + "/" + kind + "/" + namespace + "/" + name
}

// workload is one timed query. Its requests are numbered, so that every
// store answers the same sequence of them, however many it makes.
type workload struct {
	name string
	desc string
	// request returns request i, built off the clock: the call to time,
	// which returns the result's size.
	request func(i int) func(ctx context.Context, p peer) (int, error)
	// check checks a store's answer to request i against fleetgraph's.
	check func(ctx context.Context, p, ref peer, i int) error
}

// run runs request i on p, building it first.
func (w workload) run(ctx context.Context, p peer, i int) (int, error) {
	return w.request(i)(ctx, p)
}

// compareOptions are the flags of fleetbench compare.
type compareOptions struct {
	sizes      []int
	stores     map[string]bool
	iterations int
	minTime    time.Duration
	budget     time.Duration
	churnRate  int
	churnFor   time.Duration
	batch      int
	workDir    string
	report     string
	chart      string
	verbose    bool
	// sizeResult: set in the process that measures one size (see
	// runCompare), the file its sizeResult goes to.
	sizeResult string
	gcHeadroom string // gc_headroom in the size line: a percent, or "off"
	gcPolicy   string // the GC policy in force, described
}

// runCompare is fleetbench compare: see the package doc and BENCHMARKS.md.
//
// Each size is measured in a process of its own: compare starts its own
// executable once per size, with -size-result, and the parent only merges
// the results and writes the report. In one process, what a smaller size's
// stores left (the in-process SQLite's memory, the clients' buffers, the
// runtime's retained pages) would count as fleetgraph's memory at the next
// size, whose figure is the process's RSS growth over its load.
func runCompare(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	sizes := fs.String("sizes", "100000,1000000", "fleet sizes (objects, multiples of 10,000: clusters of 1,000 namespaces x 10), each measured in a process of its own")
	stores := fs.String("stores", "fleetgraph,fleetgraph_http,postgres_typed,postgres_jsonb,sqlite,redis", "stores to compare")
	o := compareOptions{}
	fs.IntVar(&o.iterations, "iterations", 1000, "timed runs of each workload at least (fewer when -budget runs out)")
	fs.DurationVar(&o.minTime, "min-time", time.Second, "time each workload on each store for at least this long (within -budget), however fast it answers")
	fs.DurationVar(&o.budget, "budget", 5*time.Second, "time budget of one workload on one store (at least 5 runs)")
	fs.IntVar(&o.churnRate, "churn-rate", 20000, "updates per second during the churn run")
	fs.DurationVar(&o.churnFor, "churn-duration", 5*time.Second, "length of the churn run")
	fs.IntVar(&o.batch, "batch", 1000, "rows per load batch")
	fs.StringVar(&o.workDir, "dir", "", "directory for the servers' data (default: a new temporary directory, removed afterwards)")
	fs.StringVar(&o.report, "report", "", "write the Markdown report (BENCHMARKS.md) here")
	fs.StringVar(&o.chart, "chart", "", "write the PNG chart of p50 per workload and store here")
	fs.BoolVar(&o.verbose, "v", false, "progress on stderr")
	fs.StringVar(&o.sizeResult, "size-result", "", "internal: measure the one size of -sizes in this process and write its results here, as JSON (compare starts one such process per size)")
	gcHeadroom := gcFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n%10000 != 0 {
			return fmt.Errorf("-sizes: %q is not a positive multiple of 10,000", s)
		}
		o.sizes = append(o.sizes, n)
	}
	slices.Sort(o.sizes)
	if o.iterations <= 0 || o.minTime < 0 || o.budget <= 0 {
		return fmt.Errorf("-iterations (%d) and -budget (%v) must be positive, -min-time (%v) not negative", o.iterations, o.budget, o.minTime)
	}
	o.stores = map[string]bool{}
	for _, s := range strings.Split(*stores, ",") {
		if !slices.Contains(allStores, s) {
			return fmt.Errorf("-stores: unknown store %q (known: %s)", s, strings.Join(allStores, ", "))
		}
		o.stores[s] = true
	}
	if o.sizeResult != "" {
		if len(o.sizes) != 1 {
			return fmt.Errorf("-size-result: measures one size, -sizes has %d", len(o.sizes))
		}
		return compareOneSize(ctx, o, *gcHeadroom)
	}
	// Checked here too, so that a bad flag fails before any size starts.
	if err := gcPolicy(*gcHeadroom).Validate(); err != nil {
		return fmt.Errorf("-gc-headroom: %w", err)
	}
	if o.workDir == "" {
		dir, err := os.MkdirTemp("", "fleetbench-compare-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		o.workDir = dir
	}
	// PostgreSQL runs as its own user when fleetbench runs as root, and
	// must reach its data directory inside.
	if err := errors.Join(os.MkdirAll(o.workDir, 0o755), os.Chmod(o.workDir, 0o755)); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	rep := &report{args: args, opts: o, started: time.Now(), loadStart: loadAverage()}
	for _, n := range o.sizes {
		res, err := compareInChild(ctx, exe, fs, o, n)
		if err != nil {
			return fmt.Errorf("size %d: %w", n, err)
		}
		rep.sizes = append(rep.sizes, res)
	}
	rep.gc = rep.sizes[0].GCPolicy // every size's process runs the same flags
	rep.finished = time.Now()
	if o.report != "" {
		if err := rep.writeMarkdown(o.report, o.chart); err != nil {
			return err
		}
	}
	if o.chart != "" {
		if err := rep.writeChart(o.chart); err != nil {
			return err
		}
	}
	return nil
}

// compareInChild measures size n in a new process of exe (fleetbench, or
// the test binary) with the flags fs was given, its output on fleetbench's
// and killed with it (runChild), and returns what it measured.
func compareInChild(ctx context.Context, exe string, fs *flag.FlagSet, o compareOptions, n int) (*sizeResult, error) {
	resultPath := filepath.Join(o.workDir, fmt.Sprintf("size-%d.json", n))
	args := []string{"compare", "-sizes", strconv.Itoa(n), "-dir", o.workDir, "-size-result", resultPath}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "sizes", "dir", "size-result", "report", "chart": // the parent's
		default:
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	if o.verbose {
		fmt.Fprintf(os.Stderr, "compare: size=%d: measuring in a process of its own: %s\n", n, strings.Join(args, " "))
	}
	if err := os.Remove(resultPath); err != nil && !errors.Is(err, os.ErrNotExist) { // an earlier run's, with the same -dir
		return nil, err
	}
	if err := runChild(ctx, exe, args); err != nil {
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && !ee.Exited() {
			// Killed by a signal (the OOM killer at 1M, say): it printed no error.
			return nil, fmt.Errorf("the size's process: %w (killed by a signal; if by the OOM killer, the kernel log says so)", err)
		}
		return nil, fmt.Errorf("the size's process: %w (its error is above)", err)
	}
	res, err := readSizeResult(resultPath)
	if err != nil {
		return nil, err
	}
	if res.Objects != n {
		return nil, fmt.Errorf("the size's results %s are for %d objects", resultPath, res.Objects)
	}
	return res, nil
}

// readSizeResult reads the results a size's process wrote.
func readSizeResult(path string) (*sizeResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the size's process wrote no results: %w", err)
	}
	var res sizeResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("the size's results %s: %w", path, err)
	}
	return &res, nil
}

// compareOneSize is the process that measures one size (-size-result): it
// runs the GC policy fleetgraph serve runs, measures, and writes its
// sizeResult for the parent.
func compareOneSize(ctx context.Context, o compareOptions, gcHeadroom int) error {
	// Before anything is loaded: fleetgraph's peak RSS is measured over
	// its load, under the policy serve runs.
	gc, gcHow, err := startGCPolicy(gcHeadroom)
	if err != nil {
		return fmt.Errorf("-gc-headroom: %w", err)
	}
	defer gc.Stop()
	o.gcHeadroom, o.gcPolicy = gcHeadroomKey(gc), gcHow
	if o.workDir == "" {
		return errors.New("-size-result needs -dir")
	}
	res, err := compareSize(ctx, o, o.sizes[0])
	if err != nil {
		return fmt.Errorf("size %d: %w", o.sizes[0], err)
	}
	res.Process.PID = os.Getpid()
	startedMu.Lock()
	res.Process.Servers = slices.Clone(started)
	startedMu.Unlock()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(o.sizeResult, b, 0o644)
}

// allStores lists the stores in report order; fleetgraph first, as the
// reference every answer is checked against, and the first loaded: its
// memory is the process's growth over its load, which another store's
// load before it would add to.
var allStores = []string{"fleetgraph", "fleetgraph_http", "postgres_typed", "postgres_jsonb", "sqlite", "redis"}

// peerStores are the stores best_peer_ratio is taken over.
var peerStores = []string{"postgres_typed", "postgres_jsonb", "sqlite", "redis"}

// sizeResult is everything measured at one fleet size. Each size is
// measured in a process of its own, which hands its sizeResult to the
// parent as JSON: hence the exported fields.
type sizeResult struct {
	Objects   int
	Workloads []string
	Latency   map[string]map[string]latency // workload -> store
	Rows      map[string]int                // result size of each workload
	LoadS     map[string]float64
	Bytes     map[string]float64 // per object
	BytesHow  map[string]string
	Churn     map[string]churnResult
	Versions  map[string]string
	Schemas   map[string]string
	Descs     map[string]string
	// fleetgraph's live heap per object after its load, and the GC policy
	// its process ran (gc_headroom: a percent, or "off"; and described).
	Heap       float64
	GCHeadroom string
	GCPolicy   string
	// Process is the process that measured this size.
	Process sizeProcess
}

// sizeProcess describes the process that measured a size: its id, the
// servers it started (for tests that check none is left), and the heap it
// had allocated before fleetgraph's load and during it (cumulative
// allocations, runtime/metrics /gc/heap/allocs:bytes): a process that
// measured a smaller size first would have allocated more before the load
// than that size's load alone (TestCompareSizesIsolated).
type sizeProcess struct {
	PID                        int
	Servers                    []int
	AllocBeforeLoad, LoadAlloc uint64
}

type latency struct {
	P50, P99 time.Duration
	N        int
}

type churnResult struct {
	Rate     float64 // updates applied per second
	P50, P99 time.Duration
	Queries  int
	// GCShare is the share of the process's CPU capacity (GOMAXPROCS x
	// the run's wall clock) the Go runtime estimates it spent collecting
	// garbage, and GCCycles the collections. The process holds
	// fleetgraph's index throughout, so they are fleetgraph's cost (and
	// the harness's) on its run, and mean nothing on another store's.
	GCShare  float64
	GCCycles uint64
}

// compareSize loads one fleet size into every store and measures it.
func compareSize(ctx context.Context, o compareOptions, n int) (*sizeResult, error) {
	f := indextest.Fleet{Clusters: n / 10000, Namespaces: 1000, PerNamespace: 10, Seed: 1}
	logf := func(format string, a ...any) {
		if o.verbose {
			fmt.Fprintf(os.Stderr, "compare: size=%d: "+format+"\n", append([]any{n}, a...)...)
		}
	}
	res := &sizeResult{
		Objects: n, Latency: map[string]map[string]latency{}, Rows: map[string]int{},
		LoadS: map[string]float64{}, Bytes: map[string]float64{}, BytesHow: map[string]string{},
		Churn: map[string]churnResult{}, Versions: map[string]string{}, Schemas: map[string]string{},
		Descs: map[string]string{}, GCHeadroom: o.gcHeadroom, GCPolicy: o.gcPolicy,
	}
	// Q6 restrictions: a team viewer bound in 50 namespaces of 10
	// clusters (q6a) and one bound in 200 namespaces of every cluster,
	// 20,000 namespaces at 1M objects (q6b).
	q6a := newScope("q6a", f, min(10, f.Clusters), 50)
	q6b := newScope("q6b", f, f.Clusters, 200)
	wls := workloads(f, q6a, q6b)

	ref := newFleetgraph(q6a, q6b)
	var pg *pgServer
	if o.stores["postgres_typed"] || o.stores["postgres_jsonb"] {
		var err error
		if pg, err = startPostgres(ctx, filepath.Join(o.workDir, fmt.Sprintf("size-%d", n))); err != nil {
			return nil, err
		}
		defer pg.stop()
	}
	var peers []peer
	defer func() {
		for _, p := range peers {
			p.close()
		}
	}()
	for _, name := range allStores {
		if !o.stores[name] && name != "fleetgraph" {
			continue
		}
		var p peer
		var err error
		switch name {
		case "fleetgraph":
			p = ref
		case "fleetgraph_http":
			p, err = newFleetgraphHTTP(ref)
		case "postgres_typed", "postgres_jsonb":
			p, err = newPostgres(ctx, name, pg)
		case "sqlite":
			p, err = newSQLite(ctx, filepath.Join(o.workDir, fmt.Sprintf("size-%d", n)))
		case "redis":
			p, err = newRedis(ctx, filepath.Join(o.workDir, fmt.Sprintf("size-%d", n)), q6a, q6b)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		peers = append(peers, p)
		if v, ok := p.(interface{ version() string }); ok {
			res.Versions[name] = v.version()
		}
		if s, ok := p.(interface{ schema() string }); ok {
			res.Schemas[name] = s.schema()
		}
		if name == "fleetgraph_http" {
			continue // serves the in-process store: nothing to load
		}
		logf("loading %s", name)
		start := time.Now()
		if err := p.load(ctx, f, o.batch); err != nil {
			return nil, fmt.Errorf("%s: load: %w", name, err)
		}
		res.LoadS[name] = time.Since(start).Seconds()
		b, how, err := p.size(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: size: %w", name, err)
		}
		res.Bytes[name], res.BytesHow[name] = float64(b)/float64(n), how
		if p == ref {
			res.Heap = float64(ref.heap) / float64(n)
			res.Process.AllocBeforeLoad, res.Process.LoadAlloc = ref.allocBefore, ref.loadAlloc
		}
		logf("%s loaded in %.1fs, %.0f bytes/object (%s)", name, res.LoadS[name], res.Bytes[name], how)
	}

	for _, w := range wls {
		res.Workloads = append(res.Workloads, w.name)
		res.Descs[w.name] = w.desc
		res.Latency[w.name] = map[string]latency{}
		rows, err := w.run(ctx, ref, 0)
		if err != nil {
			return nil, fmt.Errorf("fleetgraph %s: %w", w.name, err)
		}
		res.Rows[w.name] = rows
		for _, p := range peers {
			// Every store's answers to the first requests must be
			// fleetgraph's before any is timed.
			for i := range 8 {
				if err := w.check(ctx, p, ref, i); err != nil {
					return nil, fmt.Errorf("%s %s: wrong answer: %w", p.name(), w.name, err)
				}
			}
			l, err := timeWorkload(ctx, w, p, o.runs())
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", p.name(), w.name, err)
			}
			res.Latency[w.name][p.name()] = l
			logf("%s %s: p50 %v p99 %v over %d runs", w.name, p.name(), l.P50, l.P99, l.N)
		}
		printWorkload(res, w.name)
	}

	if o.churnRate > 0 {
		updates := churnUpdates(f, int(float64(o.churnRate)*o.churnFor.Seconds()*1.3)+o.churnRate)
		q3 := wls[2]
		for _, p := range peers {
			if p.name() == "fleetgraph_http" {
				continue
			}
			c, err := churnRun(ctx, p, q3, updates, o.churnRate, o.churnFor)
			if err != nil {
				return nil, fmt.Errorf("%s churn: %w", p.name(), err)
			}
			res.Churn[p.name()] = c
			logf("churn %s: %.0f updates/s, q3 p50 %v p99 %v over %d queries; process GC %.1f%% of its CPU capacity, %d cycles", p.name(), c.Rate, c.P50, c.P99, c.Queries, 100*c.GCShare, c.GCCycles)
		}
	}
	printSize(res, o.churnRate)
	return res, nil
}

// workloads returns Q1..Q6 over fleet f.
func workloads(f indextest.Fleet, q6a, q6b *scope) []workload {
	// Q1 and Q2 look up a random object of the fleet in every request,
	// the same sequence for every store: request i asks for object
	// requestObject(i), so that a store that makes more requests in its
	// -min-time does not ask for the same objects again.
	keyOf := func(i int) index.Key { return f.Key(requestObject(i, f.Size())) }
	pageWorkload := func(name, desc string, q func(i int) pageQuery) workload {
		return workload{
			name: name, desc: desc,
			request: func(i int) func(context.Context, peer) (int, error) {
				q := q(i)
				return func(ctx context.Context, p peer) (int, error) {
					a, err := p.page(ctx, q)
					if err != nil {
						return 0, err
					}
					return a.len(), nil
				}
			},
			check: func(ctx context.Context, p, ref peer, i int) error {
				wa, err := ref.page(ctx, q(i))
				if err != nil {
					return err
				}
				ga, err := p.page(ctx, q(i))
				if err != nil {
					return err
				}
				got, want := ga.keys(), wa.keys()
				if !slices.Equal(got, want) {
					return fmt.Errorf("request %d: %d rows %s, want %d rows %s", i, len(got), head(got), len(want), head(want))
				}
				return nil
			},
		}
	}
	q3 := pageQuery{kind: "Kustomization", status: index.StatusUnhealthy, first: 100}
	q6aQ, q6bQ := q3, q3
	q6aQ.scope, q6bQ.scope = q6a, q6b
	return []workload{
		{
			name: "Q1", desc: "get one object by key (cluster, group, kind, namespace, name)",
			request: func(i int) func(context.Context, peer) (int, error) {
				k := keyOf(i)
				return func(ctx context.Context, p peer) (int, error) { return 1, get(ctx, p, k) }
			},
			check: func(ctx context.Context, p, _ peer, i int) error { return get(ctx, p, keyOf(i)) },
		},
		pageWorkload("Q2", "one kind in one namespace of one cluster, first 100 by name (those of a random object, a new one every run)", func(i int) pageQuery {
			k := keyOf(i)
			return pageQuery{cluster: k.Cluster, namespace: k.Namespace, kind: k.Kind, first: 100}
		}),
		pageWorkload("Q3", "kind=Kustomization status=UNHEALTHY, first 100 by name (the same request every run)", func(int) pageQuery { return q3 }),
		pageWorkload("Q4", "label selector app=v0, first 100 by name (the same request every run)", func(int) pageQuery {
			return pageQuery{labelKey: "app", labelValue: "v0", first: 100}
		}),
		{
			name: "Q5", desc: "facets: counts by status, kind, cluster and namespace over the whole fleet",
			request: func(int) func(context.Context, peer) (int, error) {
				return func(ctx context.Context, p peer) (int, error) {
					a, err := p.facets(ctx)
					if err != nil {
						return 0, err
					}
					return a.len(), nil
				}
			},
			check: func(ctx context.Context, p, ref peer, _ int) error {
				wa, err := ref.facets(ctx)
				if err != nil {
					return err
				}
				ga, err := p.facets(ctx)
				if err != nil {
					return err
				}
				got, want := ga.counts(), wa.counts()
				if ga.len() != len(got) {
					return fmt.Errorf("facets: %d counts, len says %d", len(got), ga.len())
				}
				if !maps.Equal(got, want) {
					return fmt.Errorf("facets differ: %d counts, want %d (%s)", len(got), len(want), facetDiff(got, want))
				}
				return nil
			},
		},
		pageWorkload("Q6a", fmt.Sprintf("Q3 for a viewer bound in %d namespaces (the same request every run)", len(q6a.namespaces)), func(int) pageQuery { return q6aQ }),
		pageWorkload("Q6b", fmt.Sprintf("Q3 for a viewer bound in %d namespaces (the same request every run)", len(q6b.namespaces)), func(int) pageQuery { return q6bQ }),
	}
}

// get gets the object of key k from p and checks that it is k's.
func get(ctx context.Context, p peer, k index.Key) error {
	got, err := p.get(ctx, k)
	if err == nil && got != keyString(k.Cluster, k.Group, k.Kind, k.Namespace, k.Name) {
		err = fmt.Errorf("get %s: got %q", k, got)
	}
	return err
}

// requestObject returns the object, of n, that request i of Q1 and Q2
// asks for: a well-spread hash of i (splitmix64's finalizer), so that the
// sequence looks random and rarely repeats within a run of any length.
func requestObject(i, n int) int {
	x := uint64(i) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return int((x ^ (x >> 31)) % uint64(n))
}

// head shows the first keys of a page in an error.
func head(keys []string) string {
	return fmt.Sprint(keys[:min(3, len(keys))])
}

// facetDiff names the first few counts that differ.
func facetDiff(got, want facetCounts) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] && len(out) < 4 {
			out = append(out, fmt.Sprintf("%s=%d want %d", k, got[k], want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok && len(out) < 4 {
			out = append(out, fmt.Sprintf("unexpected %s=%d", k, got[k]))
		}
	}
	return strings.Join(out, ", ")
}

// runRule is how many times, and for how long, one workload runs on one
// store: at least iterations runs and for at least minTime, unless budget
// runs out first (but at least minRuns).
//
// A count of runs alone times each store over a window as long as its
// answers are slow: 1,000 runs of a 5 µs answer last 5 ms, which one
// transient of the store's process can fill. The first such transient
// found was fleetgraph's own, right after its load: the runtime hands
// out heap pages nothing has touched yet until the first collection, and
// a first touch costs 10-15 µs on this machine's VM, so Q2-Q4 ran 2-5
// times slower in some runs than in others, and Q5 and Q6b 4-7 times
// slower than once the heap is reused. minTime makes every store's
// percentiles cover at least a second of its own steady state, its
// collections or checkpoints included; a slower store runs longer, to
// make its iterations. A fast store makes many more requests than a slow
// one, so requests must not repeat what a store was asked before (Q1
// and Q2 ask for a new object every run: requestObject).
type runRule struct {
	iterations int
	minTime    time.Duration
	budget     time.Duration
}

func (o compareOptions) runs() runRule {
	return runRule{iterations: o.iterations, minTime: o.minTime, budget: o.budget}
}

// more reports whether a workload that has run i times since start runs
// again.
func (r runRule) more(i int, elapsed time.Duration) bool {
	if i < minRuns {
		return true
	}
	return (i < r.iterations || elapsed < r.minTime) && elapsed < r.budget
}

// timeWorkload runs w on p after a warm-up, as long as rule says, and
// returns its percentiles. Every run's result size must be the
// reference's for the same request.
func timeWorkload(ctx context.Context, w workload, p peer, rule runRule) (latency, error) {
	// The warm-up's requests are numbered -1, -2, ...: none of them is
	// timed after.
	warm, warmed := time.Now(), 0
	for ; warmed < min(rule.iterations/10, 20) && time.Since(warm) < rule.budget/5; warmed++ {
		if _, err := w.run(ctx, p, -1-warmed); err != nil {
			return latency{}, err
		}
	}
	// Room for the runs the warm-up's pace predicts, so that the list of
	// durations is not regrown between timed runs: in fleetbench's
	// process, that is fleetgraph's heap.
	runs := rule.iterations
	if warmed > 0 {
		if per := time.Since(warm) / time.Duration(warmed); per > 0 {
			runs = max(runs, int(rule.minTime/per)*5/4)
		}
	}
	ds := make([]time.Duration, 0, min(runs, 1<<22))
	start := time.Now()
	for i := 0; rule.more(i, time.Since(start)); i++ {
		call := w.request(i)
		t := time.Now()
		if _, err := call(ctx, p); err != nil {
			return latency{}, err
		}
		ds = append(ds, time.Since(t))
		if err := ctx.Err(); err != nil {
			return latency{}, err
		}
	}
	slices.Sort(ds)
	return latency{P50: ds[len(ds)/2], P99: ds[len(ds)*99/100], N: len(ds)}, nil
}

// minRuns is the fewest timed runs of a workload; with so few, p99 is the
// slowest run (the report gives n).
const minRuns = 5

// churnUpdates returns n updates of random objects, each a real change:
// a new version whose status, message or labels differ from the version
// the store holds at that point of the sequence.
func churnUpdates(f indextest.Fleet, n int) []index.Object {
	rnd := rand.New(rand.NewPCG(3, 4))
	return f.Changes(n, func() int { return rnd.IntN(f.Size()) })
}

// churnRun applies updates at rate per second, in 10 ms ticks, while Q3
// runs back to back for d, and returns Q3's latency and the rate reached.
func churnRun(ctx context.Context, p peer, q3 workload, updates []index.Object, rate int, d time.Duration) (churnResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const tick = 10 * time.Millisecond
	perTick := max(1, rate/100)
	var applied atomic.Int64
	var werr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now()
		for i := 0; i+perTick <= len(updates) && ctx.Err() == nil; i += perTick {
			if err := p.update(ctx, updates[i:i+perTick]); err != nil {
				if ctx.Err() == nil {
					werr = err
				}
				cancel()
				return
			}
			applied.Add(int64(perTick))
			next = next.Add(tick)
			if w := time.Until(next); w > 0 {
				time.Sleep(w)
			}
		}
	}()
	var ds []time.Duration
	gc0 := readGCStats()
	start := time.Now()
	for i := 0; time.Since(start) < d && ctx.Err() == nil; i++ {
		t := time.Now()
		if _, err := q3.run(ctx, p, i); err != nil {
			if ctx.Err() == nil {
				cancel()
				wg.Wait()
				return churnResult{}, err
			}
			break
		}
		ds = append(ds, time.Since(t))
	}
	elapsed := time.Since(start)
	n := applied.Load()
	gc := readGCStats().since(gc0)
	cancel()
	wg.Wait()
	if werr != nil {
		return churnResult{}, werr
	}
	if len(ds) == 0 {
		return churnResult{}, errors.New("no query finished")
	}
	slices.Sort(ds)
	return churnResult{
		Rate: float64(n) / elapsed.Seconds(), P50: ds[len(ds)/2], P99: ds[len(ds)*99/100], Queries: len(ds),
		GCShare: gc.share(), GCCycles: gc.cycles,
	}, nil
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d.Nanoseconds())/1e3, 'f', 1, 64) }

// bestPeer returns the store with the lowest p50 among the peers measured
// for a workload.
func bestPeer(res *sizeResult, w string) (string, latency, bool) {
	best, found := "", false
	var bl latency
	for _, s := range peerStores {
		if l, ok := res.Latency[w][s]; ok && (!found || l.P50 < bl.P50) {
			best, bl, found = s, l, true
		}
	}
	return best, bl, found
}

// printWorkload prints the compare line of one workload.
func printWorkload(res *sizeResult, w string) {
	lat := res.Latency[w]
	var b strings.Builder
	fmt.Fprintf(&b, "compare: size=%d workload=%s rows=%d", res.Objects, w, res.Rows[w])
	fg := lat["fleetgraph"]
	fmt.Fprintf(&b, " fleetgraph_p50_us=%s fleetgraph_p99_us=%s", us(fg.P50), us(fg.P99))
	for _, s := range allStores[1:] {
		if l, ok := lat[s]; ok {
			fmt.Fprintf(&b, " %s_p50_us=%s", s, us(l.P50))
		}
	}
	if best, bl, ok := bestPeer(res, w); ok {
		fmt.Fprintf(&b, " best_peer=%s best_peer_ratio=%.1f", best, float64(bl.P50)/float64(fg.P50))
	}
	fmt.Println(b.String())
}

// printSize prints the load, size and churn line of one fleet size.
func printSize(res *sizeResult, churnRate int) {
	var b strings.Builder
	fmt.Fprintf(&b, "compare: size=%d load_s", res.Objects)
	for _, s := range allStores {
		if v, ok := res.LoadS[s]; ok {
			fmt.Fprintf(&b, " %s=%.1f", s, v)
		}
	}
	b.WriteString(" bytes_per_object")
	for _, s := range allStores {
		if v, ok := res.Bytes[s]; ok {
			fmt.Fprintf(&b, " %s=%.0f", s, v)
		}
	}
	fmt.Fprintf(&b, " fleetgraph_heap_bytes_per_object=%.0f gc_headroom=%s", res.Heap, res.GCHeadroom)
	fmt.Println(b.String())
	if len(res.Churn) == 0 {
		return
	}
	b.Reset()
	fmt.Fprintf(&b, "compare: size=%d churn_target_per_s=%d updates_per_s", res.Objects, churnRate)
	for _, s := range allStores {
		if c, ok := res.Churn[s]; ok {
			fmt.Fprintf(&b, " %s=%.0f", s, c.Rate)
		}
	}
	b.WriteString(" q3_p50_us")
	for _, s := range allStores {
		if c, ok := res.Churn[s]; ok {
			fmt.Fprintf(&b, " %s=%s", s, us(c.P50))
		}
	}
	b.WriteString(" q3_p99_us")
	for _, s := range allStores {
		if c, ok := res.Churn[s]; ok {
			fmt.Fprintf(&b, " %s=%s", s, us(c.P99))
		}
	}
	if c, ok := res.Churn["fleetgraph"]; ok {
		fmt.Fprintf(&b, " fleetgraph_gc_cpu_pct=%.1f fleetgraph_gc_cycles=%d", 100*c.GCShare, c.GCCycles)
	}
	fmt.Println(b.String())
}
