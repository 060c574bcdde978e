package measure

import (
	"runtime"
	"syscall"
	"time"
)

// CPUTime returns the process's user+system CPU time. On a shared, loaded
// machine, CPU per operation separates the cost of the code from time
// spent waiting for a core.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// LiveHeap returns the live heap after a full collection.
func LiveHeap() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// LiveHeapAndStacks returns the live heap after a full collection plus the
// memory of goroutine stacks: what holding goroutines (a websocket's
// readers, writers and pumps) costs beyond their heap objects.
func LiveHeapAndStacks() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}
