package main

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestSetMemoryLimit: a container limit of 1 GiB gives the runtime a soft
// limit of 90% of it, and GOMEMLIMIT in the environment wins over the
// container's limit.
func TestSetMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	for _, k := range []string{"AUTOMEMLIMIT", "GOMEMLIMIT"} {
		t.Setenv(k, "") // restored after the test
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}

	const container = 1 << 30
	setMemoryLimit(memlimit.Limit(container))
	if got, want := debug.SetMemoryLimit(-1), int64(container*9/10); got != want {
		t.Fatalf("container limit 1 GiB: GOMEMLIMIT %d, want %d", got, want)
	}

	debug.SetMemoryLimit(before)
	t.Setenv("GOMEMLIMIT", "3GiB")
	setMemoryLimit(memlimit.Limit(1 << 30))
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("GOMEMLIMIT set by the operator: the limit became %d, want it left at %d", got, before)
	}
}
