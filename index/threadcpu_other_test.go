//go:build !linux

package index_test

// threadCPU reports that the CPU time of one thread is not known here
// (RUSAGE_THREAD is Linux's; darwin refuses it and Windows has no
// getrusage), so cpuPerOp reports no cpu-ns/op.
func threadCPU() (ns int64, ok bool) { return 0, false }
