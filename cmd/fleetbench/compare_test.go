package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCompareSmall runs the whole comparison on a 10,000-object fleet with
// every store: real PostgreSQL and Redis servers started by the harness
// (make test installs them through bench-servers), SQLite and fleetgraph
// over HTTP. Each store's answers are checked against fleetgraph's inside
// the run, so a wrong schema or query fails here. Afterwards the report
// and chart exist, and no server process is left.
func TestCompareSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and Redis")
	}
	// Not t.TempDir: its parent is private, and PostgreSQL runs as its
	// own user when the test runs as root.
	dir, err := os.MkdirTemp("", "fleetbench-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	report, chart := filepath.Join(dir, "BENCHMARKS.md"), filepath.Join(dir, "chart.png")
	// The sections of the other benchmarks, below the marker, survive.
	kept := keptMarker + "\n\n## 10 million objects\n\nkept\n"
	if err := os.WriteFile(report, []byte("# old figures\n\n"+kept), 0o644); err != nil {
		t.Fatal(err)
	}
	err = runCompare(context.Background(), []string{
		"-sizes", "10000", "-iterations", "20", "-budget", "50ms", "-churn-rate", "2000", "-churn-duration", "300ms",
		"-dir", filepath.Join(dir, "data"), "-report", report, "-chart", chart,
	})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(md), "\n"+kept) || strings.Contains(string(md), "# old figures") {
		t.Errorf("the report does not end with the kept sections, or kept the old figures:\n%s", md)
	}
	for _, want := range []string{"## 10000 objects", "| Q6b |", "### postgres_jsonb", "### redis", "| sqlite |", "Garbage-collection policy of each size's fleetbench process", "runs on each store for at least 1s and 20 runs"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if st, err := os.Stat(chart); err != nil || st.Size() < 1000 {
		t.Errorf("chart: %v", err)
	}
	// The servers were started by the size's process, which says which.
	pids := sizeResults(t, filepath.Join(dir, "data"), 10000)[0].Process.Servers
	if len(pids) < 2 {
		t.Errorf("started %d servers, want PostgreSQL and Redis", len(pids))
	}
	for _, pid := range pids {
		// Reaped children are gone; the group is checked too, for the
		// processes PostgreSQL starts.
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process group %d is still there (%v)", pid, err)
		}
	}
	if left := processesUnder(t, dir); len(left) > 0 {
		t.Errorf("processes left running: %s", strings.Join(left, "; "))
	}
}

// TestCompareSizesIsolated: each size is measured in a process of its
// own, so fleetgraph's memory at the larger size counts nothing the
// smaller size's run left. The check is on what the process had allocated
// before fleetgraph's load (cumulative, so deterministic where RSS is
// not): in a process that ran the smaller size first it would be more than
// that size's load alone allocated; in a fresh one it is the harness's
// setup, a fraction of it.
func TestCompareSizesIsolated(t *testing.T) {
	dir := t.TempDir()
	err := runCompare(context.Background(), []string{
		"-sizes", "20000,10000", "-stores", "fleetgraph", "-iterations", "5", "-budget", "10ms", "-churn-rate", "0",
		"-dir", dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	rs := sizeResults(t, dir, 10000, 20000)
	small, large := rs[0].Process, rs[1].Process
	if small.PID == os.Getpid() || large.PID == os.Getpid() || small.PID == large.PID {
		t.Errorf("sizes measured in processes %d and %d, the test is %d: want one new process each", small.PID, large.PID, os.Getpid())
	}
	if small.LoadAlloc == 0 || large.AllocBeforeLoad >= small.LoadAlloc {
		t.Errorf("the 20,000-object process had allocated %d MiB before fleetgraph's load, the 10,000-object load alone %d MiB: the larger size counts the smaller one's run",
			large.AllocBeforeLoad>>20, small.LoadAlloc>>20)
	}
	t.Logf("allocated before fleetgraph's load: %d and %d MiB; by the 10,000-object load: %d MiB", small.AllocBeforeLoad>>20, large.AllocBeforeLoad>>20, small.LoadAlloc>>20)
	for _, r := range rs {
		if b := r.Bytes["fleetgraph"]; b <= 0 || !strings.Contains(r.BytesHow["fleetgraph"], "right before it") {
			t.Errorf("size %d: fleetgraph %.0f bytes per object (%s)", r.Objects, b, r.BytesHow["fleetgraph"])
		}
	}
}

// sizeResults reads the results the processes of compare's sizes wrote in
// dir (compare's -dir).
func sizeResults(t *testing.T, dir string, sizes ...int) []*sizeResult {
	t.Helper()
	var out []*sizeResult
	for _, n := range sizes {
		r, err := readSizeResult(filepath.Join(dir, fmt.Sprintf("size-%d.json", n)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// processesUnder lists the command lines of processes that name dir.
func processesUnder(t *testing.T, dir string) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		if cmd := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cmd, dir) {
			out = append(out, cmd)
		}
	}
	return out
}

// TestRunRule: a workload runs for -min-time even past -iterations, never
// past -budget, and at least minRuns times whatever the clock says.
func TestRunRule(t *testing.T) {
	r := runRule{iterations: 1000, minTime: time.Second, budget: 5 * time.Second}
	for _, c := range []struct {
		i       int
		elapsed time.Duration
		want    bool
	}{
		{0, 0, true},
		{minRuns - 1, time.Hour, true},            // the fewest runs, however slow
		{minRuns, 5 * time.Second, false},         // budget spent
		{500, 10 * time.Millisecond, true},        // neither count nor time reached
		{1000, 10 * time.Millisecond, true},       // the count, not the time
		{1_000_000, 999 * time.Millisecond, true}, // a fast store runs on
		{1000, time.Second, false},                // both reached
		{999, 4 * time.Second, true},              // the count, within budget
	} {
		if got := r.more(c.i, c.elapsed); got != c.want {
			t.Errorf("more(%d, %v) = %v, want %v", c.i, c.elapsed, got, c.want)
		}
	}
	// A -min-time beyond the budget: the budget wins.
	if (runRule{iterations: 10, minTime: time.Minute, budget: time.Second}).more(10, time.Second) {
		t.Error("ran past the budget for -min-time")
	}
}

// TestRequestsDoNotRepeat: Q1 and Q2 ask for a new object in (nearly)
// every request, however many requests a fast store makes in -min-time,
// so that it is not timed on answers it gave before.
func TestRequestsDoNotRepeat(t *testing.T) {
	const n, runs = 1_000_000, 200_000
	seen := make(map[int]bool, runs)
	for i := -20; i < runs; i++ { // the warm-up's requests too
		o := requestObject(i, n)
		if o < 0 || o >= n {
			t.Fatalf("requestObject(%d, %d) = %d, out of range", i, n, o)
		}
		seen[o] = true
	}
	// Drawn at random with replacement, 200,020 of 1,000,000 objects
	// give about 181,000 distinct ones.
	if len(seen) < 175_000 {
		t.Errorf("%d requests asked for %d distinct objects", runs+20, len(seen))
	}
}
