package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// runCollector measures the first full sync of a real cluster: it starts a
// control plane, creates the objects through the API, then times fleetgraph
// collecting them into an index, and compares that with the time a bare
// list of the same kinds takes, to show whether the API server or fleetgraph
// bounds the sync.
//
//	collector: objects=N sync_s=X objects_per_s=Y rss_mb=Z heap_mb=H api_list_s=L
func runCollector(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("collector", flag.ContinueOnError)
	namespaces := fs.Int("namespaces", 500, "namespaces to create")
	pods := fs.Int("pods", 60, "pods per namespace")
	services := fs.Int("services", 20, "services (each with an EndpointSlice) per namespace")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	c, err := testcluster.New(ctx, testcluster.Options{Name: "bench"})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if err := c.InstallFluxCRDs(ctx); err != nil {
		return err
	}
	if err := c.InstallIstioCRDs(ctx); err != nil {
		return err
	}
	seedStart := time.Now()
	res, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: *namespaces, Pods: *pods, Services: *services, Flux: true, Istio: true, Workers: 32})
	if err != nil {
		return err
	}
	logger.Info("seeded", "objects", res.Total, "took", time.Since(seedStart).Round(time.Second))

	listTook, listed, err := bareList(ctx, c.DirectConfig)
	if err != nil {
		return err
	}
	logger.Info("bare list", "objects", listed, "took", listTook)

	runtime.GC()
	debug.FreeOSMemory()
	rssBefore, err := rssBytes()
	if err != nil {
		return err
	}

	store := index.New(memtables.Open)
	mgr, err := connection.NewManager(connection.Options{Store: store, Logger: logger})
	if err != nil {
		return err
	}
	if err := mgr.Add(connection.Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}); err != nil {
		return err
	}
	sub, err := store.Subscribe(store.LastSeq())
	if err != nil {
		return err
	}
	defer sub.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- mgr.Run(runCtx) }()
	syncErr := waitSynced(ctx, sub, c.Name)
	took := time.Since(start)

	// Steady state: what the process keeps once the sync's transient
	// buffers are garbage and returned to the OS.
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rssAfter, rssErr := rssBytes()
	cancel()
	if err := errors.Join(syncErr, rssErr, <-done); err != nil {
		return err
	}

	page, err := store.Query(ctx, index.Query{Filter: index.Filter{Clusters: []string{c.Name}}, First: 1, Access: &index.Access{All: true}})
	if err != nil {
		return err
	}
	objects := page.TotalCount
	fmt.Printf("collector: objects=%d sync_s=%.2f objects_per_s=%.0f rss_mb=%.0f heap_mb=%.0f api_list_s=%.2f\n",
		objects, took.Seconds(), float64(objects)/took.Seconds(),
		float64(rssAfter-rssBefore)/(1<<20), float64(ms.HeapAlloc)/(1<<20), listTook.Seconds())
	return nil
}

// waitSynced waits for the cluster's first CONNECTED or DEGRADED state.
func waitSynced(ctx context.Context, sub *index.Subscription, cluster string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		evs, err := sub.Next(ctx, nil)
		if err != nil {
			return fmt.Errorf("waiting for the first sync: %w", err)
		}
		for _, e := range evs {
			if e.Type == index.EventCluster && e.Cluster == cluster && e.ClusterRow.Synced {
				return nil
			}
		}
	}
}

// bareList lists every object of the collected kinds with plain paginated
// requests and no processing: the floor a first sync cannot beat.
func bareList(ctx context.Context, cfg *rest.Config) (time.Duration, int, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return 0, 0, err
	}
	gvrs := []schema.GroupVersionResource{
		testcluster.GVRNamespace, testcluster.GVRPod, testcluster.GVRService, testcluster.GVREndpointSlice,
		testcluster.GVRKustomization, testcluster.GVRHelmRelease, testcluster.GVRGitRepository,
		testcluster.GVRVirtualService, testcluster.GVRDestRule, testcluster.GVRGateway,
	}
	start := time.Now()
	n := 0
	for _, gvr := range gvrs {
		opts := metav1.ListOptions{Limit: 500}
		for {
			list, err := dyn.Resource(gvr).List(ctx, opts)
			if err != nil {
				return 0, 0, fmt.Errorf("list %s: %w", gvr.Resource, err)
			}
			n += len(list.Items)
			if opts.Continue = list.GetContinue(); opts.Continue == "" {
				break
			}
		}
	}
	return time.Since(start), n, nil
}

// rssBytes reads the process's resident set size.
func rssBytes() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read RSS: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse RSS %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}
