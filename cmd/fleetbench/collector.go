package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// runCollector measures the first full sync of a real cluster: it starts a
// control plane and creates the objects through the API, then, -runs times
// alternating (so that neither side always meets a warmer API server),
// times fleetgraph collecting them into a fresh index and times the floor:
// the fastest list of the same objects a client can make with the
// collector's own options (its clients, so protobuf for built-in kinds;
// one goroutine per kind; resourceVersion=0, served from the watch cache;
// every object decoded, nothing kept). It prints medians, and each side's
// peak resident memory growth (VmHWM after resetting it, over the
// resident set before the run), not what is left after a collection:
//
//	collector: objects=N runs=R sync_s=X objects_per_s=Y floor_list_s=F sync_over_floor=X/F rss_peak_mb=P floor_rss_peak_mb=Q heap_mb=H
func runCollector(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("collector", flag.ContinueOnError)
	namespaces := fs.Int("namespaces", 500, "namespaces to create")
	pods := fs.Int("pods", 60, "pods per namespace")
	services := fs.Int("services", 20, "services (each with an EndpointSlice) per namespace")
	runs := fs.Int("runs", 3, "alternating runs of the collector and the floor list")
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

	var syncs, floors, peaks, floorPeaks, heaps []float64
	objects := 0
	for r := range *runs {
		var took time.Duration
		peak, err := peakGrowth(func() error {
			var err error
			took, objects, err = syncOnce(ctx, c, logger, &heaps)
			return err
		})
		if err != nil {
			return err
		}
		logger.Info("collector", "run", r+1, "objects", objects, "took", took, "rss_peak_mb", peak/(1<<20))
		syncs, peaks = append(syncs, took.Seconds()), append(peaks, float64(peak)/(1<<20))

		var listed, rbacListed int
		peak, err = peakGrowth(func() error {
			var err error
			took, listed, rbacListed, err = floorList(ctx, c.DirectConfig)
			return err
		})
		if err != nil {
			return err
		}
		if listed != objects {
			return fmt.Errorf("run %d: the floor listed %d objects, the collector indexed %d", r+1, listed, objects)
		}
		logger.Info("floor list", "run", r+1, "objects", listed, "rbac", rbacListed, "took", took, "rss_peak_mb", peak/(1<<20))
		floors, floorPeaks = append(floors, took.Seconds()), append(floorPeaks, float64(peak)/(1<<20))
	}
	sync, floor := median(syncs), median(floors)
	fmt.Printf("collector: objects=%d runs=%d sync_s=%.2f objects_per_s=%.0f floor_list_s=%.2f sync_over_floor=%.2f rss_peak_mb=%.0f floor_rss_peak_mb=%.0f heap_mb=%.0f\n",
		objects, *runs, sync, float64(objects)/sync, floor, sync/floor, median(peaks), median(floorPeaks), median(heaps))
	return nil
}

// syncOnce runs one first sync of the cluster into a fresh index and
// returns its time and the objects indexed; it appends the live heap
// holding the index afterwards to heaps.
func syncOnce(ctx context.Context, c *testcluster.Cluster, logger *slog.Logger, heaps *[]float64) (time.Duration, int, error) {
	store := index.New(memtables.Open)
	mgr, err := connection.NewManager(connection.Options{Store: store, Logger: logger})
	if err != nil {
		return 0, 0, err
	}
	if err := mgr.Add(connection.Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}); err != nil {
		return 0, 0, err
	}
	sub, err := store.Subscribe(store.LastSeq())
	if err != nil {
		return 0, 0, err
	}
	defer sub.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- mgr.Run(runCtx) }()
	syncErr := waitSynced(ctx, sub, c.Name)
	took := time.Since(start)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	*heaps = append(*heaps, float64(ms.HeapAlloc)/(1<<20))
	cancel()
	if err := errors.Join(syncErr, <-done); err != nil {
		return 0, 0, err
	}
	page, err := store.Query(ctx, index.Query{Filter: index.Filter{Clusters: []string{c.Name}}, First: 1, Access: &index.Access{All: true}})
	if err != nil {
		return 0, 0, err
	}
	if page.TotalCount == 0 {
		return 0, 0, errors.New("the sync indexed no objects")
	}
	return took, page.TotalCount, nil
}

// peakGrowth runs fn and returns how far the resident set peaked above
// where it started (baselineRSS).
func peakGrowth(fn func() error) (int64, error) {
	before, err := baselineRSS()
	if err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	_, peak, err := procRSS(os.Getpid())
	if err != nil {
		return 0, err
	}
	return peak - before, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
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

// floorList lists every object the collector collects (its kinds, RBAC
// included) the fastest way the collector's own clients allow: protobuf
// for built-in kinds (JSON for custom resources, which speak nothing
// else), one goroutine per kind, resourceVersion=0 so the watch cache
// answers in one response. Every object is decoded; nothing is kept. It
// returns the objects listed apart from the RBAC ones (what the index
// lists as objects) and the RBAC ones.
func floorList(ctx context.Context, cfg *rest.Config) (took time.Duration, objects, rbacObjects int, err error) {
	cl, err := collector.NewClients(cfg)
	if err != nil {
		return 0, 0, 0, err
	}
	defer cl.HTTP.CloseIdleConnections()
	opts := metav1.ListOptions{ResourceVersion: "0"}
	core, rbac := cl.Kube.CoreV1(), cl.Kube.RbacV1()
	lists := []func() (int, error){
		func() (int, error) { l, err := core.Namespaces().List(ctx, opts); return countItems(l, err) },
		func() (int, error) { l, err := core.Pods("").List(ctx, opts); return countItems(l, err) },
		func() (int, error) { l, err := core.Services("").List(ctx, opts); return countItems(l, err) },
		func() (int, error) {
			l, err := cl.Kube.DiscoveryV1().EndpointSlices("").List(ctx, opts)
			return countItems(l, err)
		},
		func() (int, error) { l, err := rbac.Roles("").List(ctx, opts); return countItems(l, err) },
		func() (int, error) { l, err := rbac.ClusterRoles().List(ctx, opts); return countItems(l, err) },
		func() (int, error) { l, err := rbac.RoleBindings("").List(ctx, opts); return countItems(l, err) },
		func() (int, error) { l, err := rbac.ClusterRoleBindings().List(ctx, opts); return countItems(l, err) },
	}
	for _, gvr := range []schema.GroupVersionResource{
		testcluster.GVRKustomization, testcluster.GVRHelmRelease, testcluster.GVRGitRepository,
		testcluster.GVRVirtualService, testcluster.GVRDestRule, testcluster.GVRGateway,
	} {
		lists = append(lists, func() (int, error) {
			l, err := cl.Dynamic.Resource(gvr).List(ctx, opts)
			if err != nil {
				return 0, fmt.Errorf("list %s: %w", gvr.Resource, err)
			}
			return len(l.Items), nil
		})
	}
	start := time.Now()
	counts := make([]int, len(lists))
	errs := make([]error, len(lists))
	var wg sync.WaitGroup
	for i, list := range lists {
		wg.Go(func() { counts[i], errs[i] = list() })
	}
	wg.Wait()
	took = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, 0, err
	}
	for i, c := range counts {
		if i >= 4 && i < 8 { // the RBAC lists
			rbacObjects += c
		} else {
			objects += c
		}
	}
	return took, objects, rbacObjects, nil
}

// countItems returns the length of a typed list.
func countItems(l k8sruntime.Object, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	return meta.LenList(l), nil
}
