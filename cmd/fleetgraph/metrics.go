package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newMetricsRegistry returns the registry a fleetgraph process serves at
// /metrics, holding the Go runtime and process collectors. They describe
// the process, so the program that builds the registry registers them,
// once; the library registers only its own metrics on whatever registry it
// is given (see the package doc of fleetgraph).
//
// Besides the collector's defaults (go_memstats_*, go_gc_duration_seconds,
// go_goroutines, go_threads, GOGC, GOMEMLIMIT and GOMAXPROCS), it takes
// runtime/metrics' /gc/ set, whose go_gc_heap_live_bytes is the live heap
// that docs/operations.md sizes in bytes per object and go_gc_heap_goal_bytes
// what --gc-headroom lets the heap grow to, and its /sched/ set, whose
// go_sched_latencies_seconds shows goroutines waiting for a CPU on a busy
// manager. The /memory/ classes repeat go_memstats_* and are left out.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsGC, collectors.MetricsScheduler)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}
