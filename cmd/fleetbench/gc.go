package main

import (
	"flag"
	"log/slog"
	"os"
	"runtime/metrics"
	"strconv"

	"github.com/fleetgraph/fleetgraph/internal/gcpolicy"
)

// gcFlag registers -gc-headroom, fleetgraph serve's --gc-headroom with the
// same default.
func gcFlag(fs *flag.FlagSet) *int {
	return fs.Int("gc-headroom", gcpolicy.DefaultHeadroom, "run the garbage-collection policy fleetgraph serve runs by default (internal/gcpolicy) with this headroom, in percent of the live heap; 0 for the Go default (GOGC 100), as does a non-empty GOGC in the environment")
}

// gcPolicy is serve's default policy with -gc-headroom's headroom.
func gcPolicy(headroom int) gcpolicy.Policy {
	p := gcpolicy.Default()
	p.Headroom = headroom
	return p
}

// startGCPolicy starts the policy fleetgraph serve starts, with the same
// code, so that what fleetbench measures of fleetgraph's memory and GC is
// what serve holds. It returns the Tuner to stop and a description of the
// policy in force for the report.
func startGCPolicy(headroom int) (*gcpolicy.Tuner, string, error) {
	t, err := gcpolicy.Start(gcPolicy(headroom), slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return nil, "", err
	}
	if t.Off() != "" {
		return t, t.String(), nil
	}
	return t, "on, as in fleetgraph serve: " + t.String(), nil
}

// gcHeadroomKey is the gc_headroom value of a result line: the headroom
// in percent, or "off" when the policy does not run.
func gcHeadroomKey(t *gcpolicy.Tuner) string {
	if t.Off() != "" {
		return "off"
	}
	return strconv.Itoa(t.Headroom())
}

// gcStats are the runtime's cumulative GC figures (runtime/metrics): its
// estimate of the CPU time spent collecting, the CPU capacity
// (GOMAXPROCS x wall clock) it compares with, and the collections.
type gcStats struct {
	gcCPU, totalCPU float64 // seconds
	cycles          uint64
}

func readGCStats() gcStats {
	s := []metrics.Sample{
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	metrics.Read(s)
	var g gcStats
	if s[0].Value.Kind() == metrics.KindFloat64 && s[1].Value.Kind() == metrics.KindFloat64 {
		g.gcCPU, g.totalCPU = s[0].Value.Float64(), s[1].Value.Float64()
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		g.cycles = s[2].Value.Uint64()
	}
	return g
}

// heapAllocs returns the bytes the process has allocated on the heap so
// far (cumulative, freed or not).
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// since returns the figures of the interval since g0.
func (g gcStats) since(g0 gcStats) gcStats {
	return gcStats{g.gcCPU - g0.gcCPU, g.totalCPU - g0.totalCPU, g.cycles - g0.cycles}
}

// share is the GC's share of the CPU capacity (0 when unknown).
func (g gcStats) share() float64 {
	if g.totalCPU <= 0 {
		return 0
	}
	return g.gcCPU / g.totalCPU
}
