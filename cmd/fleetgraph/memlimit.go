package main

import (
	"errors"
	"log/slog"
	"math"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// setMemoryLimit gives the Go runtime a soft memory limit (GOMEMLIMIT) of
// 90% of the container's cgroup memory limit, so that the garbage
// collector works harder as the heap nears the limit instead of the
// kernel killing the process: with the default GOGC alone, a heap of N
// bytes may grow to 2N before it is collected. GOMEMLIMIT in the
// environment takes precedence; AUTOMEMLIMIT sets another ratio, or
// "off". Outside a cgroup, or without a limit, nothing changes.
func setMemoryLimit(provider memlimit.Provider) {
	limit, err := memlimit.Set(memlimit.WithProvider(provider))
	switch {
	case errors.Is(err, memlimit.ErrNoCgroup):
		slog.Debug("no cgroup memory limit: GOMEMLIMIT left unset")
	case err != nil:
		slog.Warn("GOMEMLIMIT not set from the cgroup memory limit", "err", err)
	case limit != math.MaxInt64:
		slog.Info("memory limit", "gomemlimit_bytes", limit)
	}
}
