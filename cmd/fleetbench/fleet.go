package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// fleetOptions configures fleetbench fleet.
type fleetOptions struct {
	shape   fleetShape
	rate    int64
	warmup  time.Duration
	window  time.Duration
	verbose bool
	profile string
	heap    string
	relist  time.Duration
	syncs   int
}

// runFleet is fleetbench fleet: the real collector (connection.Manager, as
// fleetgraph serve runs it) against N simulated leaf clusters served over
// HTTPS by a load generator process (see fleetServer), for each N of
// -clusters. It prints, per size:
//
//	fleet: clusters=N objects=.. first_sync_s=.. steady_cpu_cores=.. rss_mb=.. change_to_index_p99_ms=..
//
// first_sync_s runs from the manager's start until every cluster has
// synced (the fleet is no longer rebuilding); then every cluster must be
// CONNECTED and hold exactly the generator's objects and RBAC rows. The
// generator changes pods at -rate changes per second across the fleet from
// its start; after a warm-up, steady_cpu_cores is the collector process's
// CPU time (getrusage: user+system, garbage collection included) over the
// window divided by its length, rss_mb its resident set at the window's
// end, and change_to_index_p99_ms the 99th percentile of the time from a
// change on a leaf (its resource version is its time) to the change's
// event in the index feed, over the window's changes. Then the churn stops
// and the run waits until every object's resource version in the index is
// the generator's (a digest per cluster): every change arrived.
//
// Each size runs in a process of its own, so that its RSS is its own; the
// generator runs in another (its own process group, killed with its
// parent), so that its CPU is not counted.
func runFleet(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	sizes := fs.String("clusters", "10,50,200", "comma-separated cluster counts, one run each")
	var o fleetOptions
	fs.IntVar(&o.shape.Namespaces, "namespaces", 50, "namespaces per cluster")
	fs.IntVar(&o.shape.Pods, "pods", 60, "pods per namespace")
	fs.IntVar(&o.shape.Services, "services", 20, "services (each with an EndpointSlice) per namespace")
	fs.Int64Var(&o.rate, "rate", 1000, "changes per second across the fleet")
	fs.DurationVar(&o.warmup, "warmup", 10*time.Second, "wait after the first sync before measuring")
	fs.DurationVar(&o.window, "window", 60*time.Second, "steady-state measurement window (the collector's relists, every 5 minutes by default, fall outside it unless -relist is shorter)")
	fs.BoolVar(&o.verbose, "v", false, "log progress to stderr")
	fs.DurationVar(&o.relist, "relist", 0, "the collector's anti-entropy relist interval (0: its default)")
	fs.IntVar(&o.syncs, "max-concurrent-syncs", 0, "clusters that may sync at once (connection.Options.MaxConcurrentSyncs: 0 its default, -1 no limit)")
	fs.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of the steady-state window to this file")
	fs.StringVar(&o.heap, "memprofile", "", "write a heap profile at the end of the window to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ns []int
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("fleet: bad -clusters %q", *sizes)
		}
		ns = append(ns, n)
	}
	if len(ns) == 1 {
		r, err := fleetOnce(ctx, ns[0], o)
		if err != nil {
			return err
		}
		fmt.Println(r)
		return nil
	}
	// One process per size: re-run this command with one size.
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for _, n := range ns {
		child := []string{"fleet", "-clusters", strconv.Itoa(n)}
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "clusters" {
				child = append(child, "-"+f.Name+"="+f.Value.String())
			}
		})
		if err := runChild(ctx, exe, child); err != nil {
			return fmt.Errorf("fleet with %d clusters: %w", n, err)
		}
	}
	return nil
}

// runChild runs exe with args in its own process group, killed with
// fleetbench, with fleetbench's output.
func runChild(ctx context.Context, exe string, args []string) error {
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		return ctx.Err()
	}
}

// fleetResult is the outcome of one fleet size.
type fleetResult struct {
	clusters, objects int
	firstSync         time.Duration
	steadyCores       float64
	rssBytes          int64
	changeP99         time.Duration
	changes           int // changes that reached the index during the window
}

// String returns the fleet: line.
func (r fleetResult) String() string {
	return fmt.Sprintf("fleet: clusters=%d objects=%d first_sync_s=%.2f steady_cpu_cores=%.3f rss_mb=%.0f change_to_index_p99_ms=%.1f",
		r.clusters, r.objects, r.firstSync.Seconds(), r.steadyCores, float64(r.rssBytes)/(1<<20), float64(r.changeP99.Microseconds())/1e3)
}

// fleetOnce measures one fleet size.
func fleetOnce(ctx context.Context, n int, o fleetOptions) (fleetResult, error) {
	logf := func(format string, a ...any) {
		if o.verbose {
			fmt.Fprintf(os.Stderr, "fleet %d: "+format+"\n", append([]any{n}, a...)...)
		}
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	dir, err := os.MkdirTemp("", "fleetbench-fleet-")
	if err != nil {
		return fleetResult{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	gen, err := startFleetServer(ctx, dir, n, o)
	if err != nil {
		return fleetResult{}, err
	}
	defer gen.stop()
	logf("generator serving %s (pid %d)", gen.url, gen.pid())

	listed, rbac := o.shape.objects()
	store := index.New(memtables.Open)
	metrics := prometheus.NewRegistry()
	mgr, err := connection.NewManager(connection.Options{
		Store: store, Logger: logger, Relist: o.relist, MaxConcurrentSyncs: o.syncs, Registerer: metrics,
	})
	if err != nil {
		return fleetResult{}, err
	}
	for c := range n {
		name := simClusterName(c)
		host := gen.clusterURLs[c] + "/clusters/" + name
		err := mgr.Add(connection.Spec{Name: name, Config: func(context.Context) (*rest.Config, error) {
			return &rest.Config{Host: host, BearerToken: "fleetbench", TLSClientConfig: rest.TLSClientConfig{CAData: gen.ca}}, nil
		}})
		if err != nil {
			return fleetResult{}, err
		}
	}
	_, rss0, _ := procRSS(os.Getpid())
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0, start := measure.CPUTime(), time.Now()
	go func() { done <- mgr.Run(runCtx) }()
	defer func() {
		cancel()
		<-done
	}()

	// First sync: every cluster synced.
	admin := &index.Access{All: true}
	for {
		fl := store.Fleet(admin)
		if fl.ClustersTotal == n && fl.ClustersSynced == n && !fl.Rebuilding {
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return fleetResult{}, err
		}
		if time.Since(start) > 30*time.Minute {
			return fleetResult{}, fmt.Errorf("first sync: %s after 30 minutes", fl.Message)
		}
	}
	firstSync, syncCPU := time.Since(start), measure.CPUTime()-cpu0
	_, syncPeak, _ := procRSS(os.Getpid())
	logf("first sync %.2fs, CPU %.2fs, peak RSS %d MiB, %.0f clusters lost (DISCONNECTED) during it, %.0f timed-out probes forgiven",
		firstSync.Seconds(), syncCPU.Seconds(), syncPeak>>20,
		metricSum(metrics, "fleetgraph_cluster_state_transitions_total", "state", "DISCONNECTED"),
		metricSum(metrics, "fleetgraph_cluster_probe_timeouts_forgiven_total", "", ""))
	if err := checkFleetCounts(ctx, store, n, o.shape); err != nil {
		return fleetResult{}, fmt.Errorf("after the first sync: %w", err)
	}

	if err := sleepCtx(ctx, o.warmup); err != nil {
		return fleetResult{}, err
	}
	sub, err := store.Subscribe(store.LastSeq())
	if err != nil {
		return fleetResult{}, err
	}
	defer sub.Close()
	subCtx, stopSub := context.WithCancel(ctx)
	lats := make(chan []time.Duration, 1)
	go func() { lats <- changeLatencies(subCtx, sub) }()
	stopProfile, err := startCPUProfile(o.profile)
	if err != nil {
		stopSub()
		return fleetResult{}, err
	}
	cpuA, tA := measure.CPUTime(), time.Now()
	werr := sleepCtx(ctx, o.window)
	cpuB, tB := measure.CPUTime(), time.Now()
	stopProfile()
	rss, peak, rerr := procRSS(os.Getpid())
	if o.heap != "" {
		rerr = errors.Join(rerr, writeHeapProfile(o.heap))
	}
	stopSub()
	ds := <-lats
	if err := errors.Join(werr, rerr); err != nil {
		return fleetResult{}, err
	}
	if len(ds) == 0 && o.rate > 0 {
		return fleetResult{}, errors.New("no change reached the index during the window")
	}
	cores := (cpuB - cpuA).Seconds() / tB.Sub(tA).Seconds()
	slices.Sort(ds)
	p := func(q float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[min(len(ds)-1, int(q*float64(len(ds))))]
	}
	logf("window %v: %d changes reached the index (%.0f/s), latency p50 %v p99 %v max %v; RSS %d MiB (before collecting %d MiB, peak %d MiB)",
		tB.Sub(tA).Round(time.Millisecond), len(ds), float64(len(ds))/tB.Sub(tA).Seconds(), p(0.5), p(0.99), p(1), rss>>20, rss0>>20, peak>>20)

	// Stop the churn; then every change must have reached the index.
	if err := gen.control(ctx, http.MethodPost, "churn?rate=0", nil); err != nil {
		return fleetResult{}, err
	}
	changes, err := waitFleetDigests(ctx, store, gen, logf)
	if err != nil {
		return fleetResult{}, err
	}
	logf("every one of %d changes reached the index", changes)
	return fleetResult{
		clusters: n, objects: n * (listed + rbac), firstSync: firstSync, steadyCores: cores,
		rssBytes: rss, changeP99: p(0.99), changes: len(ds),
	}, nil
}

// metricSum adds up a counter's series whose label has the value given,
// or all of them for label "" (0 if the registry cannot be read).
func metricSum(g prometheus.Gatherer, name, label, value string) float64 {
	families, err := g.Gather()
	if err != nil {
		return 0
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label == "" || slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == label && l.GetValue() == value
			}) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// changeLatencies collects, until ctx ends, the time from each pod change
// on a leaf (its resource version is its time in Unix nanoseconds) to its
// event in the index feed.
func changeLatencies(ctx context.Context, sub *index.Subscription) []time.Duration {
	var ds []time.Duration
	buf := make([]*index.Event, 0, 256)
	for {
		evs, err := sub.Next(ctx, buf[:0])
		if err != nil {
			return ds
		}
		now := time.Now().UnixNano()
		for _, e := range evs {
			if e.Type != index.EventModified || e.Key().Kind != "Pod" {
				continue
			}
			if rv, err := strconv.ParseInt(e.Object().ResourceVersion, 10, 64); err == nil {
				ds = append(ds, time.Duration(now-rv))
			}
		}
	}
}

// checkFleetCounts checks that every cluster is CONNECTED and holds exactly
// the generator's objects and RBAC rows.
func checkFleetCounts(ctx context.Context, store *index.Store, n int, shape fleetShape) error {
	listed, _ := shape.objects()
	admin := &index.Access{All: true}
	for c := range n {
		name := simClusterName(c)
		cl, ok := store.GetCluster(nil, name)
		if !ok || cl.State != index.StateConnected {
			return fmt.Errorf("cluster %s is not CONNECTED: %+v %v", name, cl, store.KindErrors(nil, name))
		}
		f, err := store.Facets(ctx, index.Filter{Clusters: []string{name}}, admin)
		if err != nil {
			return err
		}
		if f.Total != listed {
			return fmt.Errorf("cluster %s: %d objects in the index, the leaf has %d (kind errors: %v)", name, f.Total, listed, store.KindErrors(nil, name))
		}
		bindings := len(store.ListClusterRoleBindings(name))
		roles := 0
		for i := range simClusterRoles {
			if _, ok := store.GetClusterRole(name, "fleet:role-"+strconv.Itoa(i)); ok {
				roles++
			}
		}
		for i := range shape.Namespaces {
			ns := simNamespace(i)
			bindings += len(store.ListRoleBindings(name, ns))
			if _, ok := store.GetRole(name, ns, "app-editor"); ok {
				roles++
			}
		}
		wantRoles := simClusterRoles + shape.Namespaces*simRolesPerNS
		wantBindings := simClusterRoleBindings + shape.Namespaces*simBindingsPerNS
		if roles != wantRoles || bindings != wantBindings {
			return fmt.Errorf("cluster %s: %d roles and %d bindings in the index, the leaf has %d and %d", name, roles, bindings, wantRoles, wantBindings)
		}
	}
	return nil
}

// waitFleetDigests waits until every cluster's digest of (key, resource
// version) over its rows in the index equals the generator's, and returns
// the number of changes the generator made.
func waitFleetDigests(ctx context.Context, store *index.Store, gen *fleetGen, logf func(string, ...any)) (int, error) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var states []fleetState
		if err := gen.control(ctx, http.MethodGet, "state", &states); err != nil {
			return 0, err
		}
		changes, differ := 0, []string{}
		for _, st := range states {
			changes += st.Changes
			d, rows, err := indexDigest(ctx, store, st.Cluster)
			if err != nil {
				return 0, err
			}
			if d != st.Digest || rows != st.Listed {
				differ = append(differ, fmt.Sprintf("%s (%d rows of %d)", st.Cluster, rows, st.Listed))
			}
		}
		if len(differ) == 0 {
			return changes, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the index still differs from the leaves 3 minutes after the churn stopped: %s", strings.Join(differ, ", "))
		}
		logf("waiting for %d clusters to converge", len(differ))
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return 0, err
		}
	}
}

// indexDigest returns the digest of a cluster's rows in the index (see
// rowDigest) and their number, read a page at a time.
func indexDigest(ctx context.Context, store *index.Store, cluster string) (uint64, int, error) {
	var d uint64
	rows := 0
	q := index.Query{Filter: index.Filter{Clusters: []string{cluster}}, First: index.MaxPageSize, Access: &index.Access{All: true}}
	for {
		p, err := store.Query(ctx, q)
		if err != nil {
			return 0, 0, err
		}
		for _, e := range p.Edges {
			d ^= rowDigest(e.Object.Key(), e.Object.ResourceVersion)
			rows++
		}
		if !p.HasNextPage {
			return d, rows, nil
		}
		q.After = p.Edges[len(p.Edges)-1].Cursor
	}
}

// writeHeapProfile writes the heap profile (in-use and allocated space).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("heap").WriteTo(f, 0), f.Close())
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fleetGen is the running load generator.
type fleetGen struct {
	*daemon
	url         string   // the controls' (the first cluster's listener)
	clusterURLs []string // each cluster's listener, in order
	ca          []byte
	client      *http.Client
}

// startFleetServer starts the generator (fleetbench fleet-server) and waits
// until it serves.
func startFleetServer(ctx context.Context, dir string, n int, o fleetOptions) (*fleetGen, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	caFile, readyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ready")
	d, err := startDaemon("fleet-server", filepath.Join(dir, "fleet-server.log"), nil, exe, "fleet-server",
		"-clusters", strconv.Itoa(n), "-namespaces", strconv.Itoa(o.shape.Namespaces), "-pods", strconv.Itoa(o.shape.Pods),
		"-services", strconv.Itoa(o.shape.Services), "-rate", strconv.FormatInt(o.rate, 10),
		"-ca-file", caFile, "-ready-file", readyFile)
	if err != nil {
		return nil, err
	}
	g := &fleetGen{daemon: d}
	deadline := time.Now().Add(15 * time.Minute) // building 1M objects on a loaded machine
	for {
		if b, err := os.ReadFile(readyFile); err == nil && len(b) > 0 {
			g.clusterURLs = strings.Fields(string(b))
			if len(g.clusterURLs) != n {
				d.stop()
				return nil, fmt.Errorf("fleet-server listens for %d clusters, want %d", len(g.clusterURLs), n)
			}
			g.url = g.clusterURLs[0]
			break
		}
		select {
		case err := <-d.done:
			d.done <- err
			d.stop()
			return nil, fmt.Errorf("fleet-server exited (%w): %s", err, d.logTail())
		case <-ctx.Done():
			d.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("fleet-server not ready within 15 minutes: %s", d.logTail())
		}
	}
	if g.ca, err = os.ReadFile(caFile); err != nil {
		d.stop()
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(g.ca)
	g.client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return g, nil
}

// control calls one of the generator's controls and decodes its JSON
// answer into out (if not nil).
func (g *fleetGen) control(ctx context.Context, method, what string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, g.url+"/fleetbench/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return fmt.Errorf("fleet-server %s: %w", what, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fleet-server %s: HTTP %d: %s", what, resp.StatusCode, body)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}
