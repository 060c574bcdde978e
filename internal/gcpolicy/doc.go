// Package gcpolicy bounds the garbage collector's headroom once the heap
// is large: fleetgraph's index is a big, mostly long-lived heap, and with
// the Go default (GOGC=100) a process holding L bytes live grows to about
// 2L before each collection and keeps those pages. At a million objects
// that headroom was 45% of peak RSS (session 8: 938 B/object of peak RSS
// for 511 B/object of live heap).
//
// After every collection a Tuner reads the live heap the collection marked
// (runtime/metrics, /gc/heap/live:bytes) and sets the GC percent
// (debug.SetGCPercent) to Policy.Percent of it: the Go default while the
// heap is small, then headroom of max(Floor, Headroom% of live); with the
// defaults, max(16 MiB, 50%). The hook is a cleanup (runtime.AddCleanup)
// on a sentinel allocated again after each cycle, so the package starts no
// goroutine of its own and reads no clock: it acts at most once per collection, on the runtime's cleanup
// goroutine.
//
// It composes with GOMEMLIMIT (cmd/fleetgraph/memlimit.go): the runtime
// collects at whichever of the two goals comes first, so the policy only
// lowers the goal below the memory limit, never raises it. GOGC set in the
// environment is the operator's choice and turns the policy off (an empty
// GOGC is the runtime's default, not a choice), and so does a Headroom of
// 0.
//
// Why not a library: bytedance/gopkg's gctuner (v0.1.4, the module proxy's
// latest) is the well-kept one, but it solves another problem, with the
// pre-GOMEMLIMIT trick of a fixed threshold in bytes: GOGC =
// (threshold-inuse)/inuse, clamped to [50, 500]. It cannot express
// headroom as a share of the live heap, it raises GOGC up to 500 on a
// small heap (more memory, not less), it ignores GOGC in the environment,
// keeps its bounds in mutable package variables, and reads HeapInuse with
// runtime.ReadMemStats (a stop-the-world, and a figure that counts
// unswept garbage and fragmentation as if it were live). What this
// package needs is a pure function and a once-per-cycle hook: a few dozen
// lines. A fixed low GOGC, as VictoriaMetrics sets (30), would do for a
// large heap, but would collect a small index every MiB or so of
// allocation; Percent keeps the Go default until the saving is worth it.
//
// It does not size anything from the cgroup (automemlimit does that), tune
// CPU, or return memory to the OS early (the runtime's scavenger does).
package gcpolicy
