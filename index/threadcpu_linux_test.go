//go:build linux

package index_test

import "syscall"

// threadCPU returns the CPU time, user and system, this thread has used,
// for cpuPerOp. It leaves out what the runtime does for this thread's
// work on other threads, notably the garbage collector's background
// marking, so with the collector on it undercounts a change that
// allocates more (review-s11 B1).
func threadCPU() (ns int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		panic(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
