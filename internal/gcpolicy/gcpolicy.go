package gcpolicy

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Defaults of fleetgraph serve and fleetbench.
const (
	// DefaultHeadroom is 50% of the live heap. At 1M objects (455 MB
	// live) it held peak RSS at 1.4x live instead of 1.7x, for about
	// twice the collections of GOGC=100 under the same allocation rate;
	// 25% held 1.25x for about four times (3 against 5 cycles in 5 s of
	// 20k updates/s, GC 16% against 24% of the CPU, quiet, session 9).
	// docs/operations.md has the measured cost.
	DefaultHeadroom = 50
	// MinHeadroom is the least headroom Validate accepts: below it a
	// large heap would be marked nearly all the time.
	MinHeadroom = 10
	// DefaultFloor is 16 MiB: below 16 MiB of live heap (about 25,000
	// objects) the policy keeps the Go default, as the few MiB it would
	// save are not worth twice the collections; it reaches
	// DefaultHeadroom at 32 MiB live (about 50,000 objects; compare's
	// 100k fleetgraph peaked at 1.7x its live heap with GOGC 100). A
	// collection's CPU grows with the live heap and their number with
	// 1/percent, so the policy costs the same share of CPU at any size
	// above the floor: the floor only says where the saving stops being
	// worth it.
	DefaultFloor = 16 << 20
)

// goDefault is GOGC's default, the most headroom the policy gives.
const goDefault = 100

// Policy says how much the heap may grow beyond the live heap between
// collections.
type Policy struct {
	// Headroom is the growth allowed once the heap is large, in percent
	// of the live heap; 0 turns the policy off.
	Headroom int
	// Floor is the least growth allowed, in bytes.
	Floor uint64
}

// Default returns the policy fleetgraph serve runs with.
func Default() Policy { return Policy{Headroom: DefaultHeadroom, Floor: DefaultFloor} }

// Percent returns the GC percent (GOGC) for a live heap of live bytes:
// enough for max(Floor, Headroom% of live) of growth, and never more than
// the Go default of 100 (nor for an unknown, zero, live heap).
func (p Policy) Percent(live uint64) int {
	if live == 0 || p.Headroom <= 0 {
		return goDefault
	}
	grow := max(p.Floor, live/100*uint64(p.Headroom))
	pct := (grow*100 + live - 1) / live // rounded up: the floor is a minimum
	return int(min(pct, goDefault))
}

// Validate reports a Headroom other than 0 (off) or MinHeadroom to 100.
func (p Policy) Validate() error {
	if p.Headroom != 0 && (p.Headroom < MinHeadroom || p.Headroom > goDefault) {
		return fmt.Errorf("gc headroom %d%%: want 0 (off) or %d to 100", p.Headroom, MinHeadroom)
	}
	return nil
}

// off returns why Start leaves the collector alone ("" if it does not):
// GOGC in the environment (the operator's setting wins; an empty one, as
// templating leaves, is the runtime's default and does not), or a Headroom
// of 0, and what runs instead when the environment does not say.
func off(p Policy) (why, instead string) {
	if v := os.Getenv("GOGC"); v != "" {
		return "GOGC=" + v + " is set in the environment", ""
	}
	if p.Headroom == 0 {
		return "gc headroom 0", "the Go default, GOGC 100"
	}
	return "", ""
}

// String describes p for logs and reports.
func (p Policy) String() string {
	return fmt.Sprintf("headroom max(%d MiB, %d%% of the live heap), at most GOGC's default of 100%%", p.Floor>>20, p.Headroom)
}

// Tuner applies a Policy after every garbage collection until Stop, or
// says why it does not (Off): callers ask it what is in force rather than
// decide again.
//
// Concurrency: Start arms a cleanup that runs on the runtime's cleanup
// goroutine after each collection; mu orders it with Stop, so no percent
// is set after Stop returns.
type Tuner struct {
	policy  Policy
	off     string     // why the policy is off; "" while it runs
	instead string     // what runs instead when off, if the environment does not say
	orig    int        // the GC percent before Start, restored by Stop
	applied func(int)  // tests: called after each cycle with the percent set
	mu      sync.Mutex // guards stopped and last
	stopped bool
	last    int
}

// Start applies p from the next collection on and logs what it does.
// When the policy is off (GOGC in the environment, or a Headroom of 0) it
// changes nothing, and the Tuner it returns says why (Off), as the log
// does.
func Start(p Policy, logger *slog.Logger) (*Tuner, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if why, instead := off(p); why != "" {
		logger.Info("gc policy off", "reason", why)
		return &Tuner{policy: p, off: why, instead: instead, stopped: true}, nil
	}
	t := start(p, nil)
	logger.Info("gc policy", "headroom_percent", p.Headroom, "floor_mib", p.Floor>>20,
		"gomemlimit_bytes", debug.SetMemoryLimit(-1)) // the runtime collects at whichever goal comes first
	return t, nil
}

// Off returns why the policy is off ("" while it runs): GOGC in the
// environment, or a Headroom of 0.
func (t *Tuner) Off() string { return t.off }

// Headroom returns the headroom in force in percent of the live heap, 0
// when the policy is off (the Go default, or the GOGC the environment
// sets).
func (t *Tuner) Headroom() int {
	if t.off != "" {
		return 0
	}
	return t.policy.Headroom
}

// String describes what is in force, for logs and reports: the policy, or
// why it is off and what runs instead.
func (t *Tuner) String() string {
	switch {
	case t.off == "":
		return t.policy.String()
	case t.instead == "":
		return "off (" + t.off + ")"
	default:
		return "off (" + t.off + "): " + t.instead
	}
}

func start(p Policy, applied func(int)) *Tuner {
	t := &Tuner{policy: p, applied: applied}
	t.orig = int(readUint64(gogcMetric))
	t.last = t.orig
	t.arm()
	return t
}

// Stop ends the policy and restores the GC percent Start found; on a
// policy that is off it does nothing. It is safe on a nil Tuner.
func (t *Tuner) Stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped {
		t.stopped = true
		debug.SetGCPercent(t.orig)
	}
}

// sentinel is what the cleanup hangs on: it holds a pointer, so it is never
// one of the tiny allocations the runtime packs together (a cleanup on
// those may run late or never).
type sentinel struct {
	_ *Tuner
	_ [8]byte
}

// arm allocates a sentinel and nothing keeps it: the next collection finds
// it unreachable and queues cycle.
func (t *Tuner) arm() {
	runtime.AddCleanup(new(sentinel), (*Tuner).cycle, t)
}

// cycle runs after each collection: it sets the percent for the live heap
// that collection marked and arms for the next. A sentinel allocated while
// the next collection is already marking survives it (new objects are
// allocated marked), so under back-to-back collections the policy may skip
// one; it never acts on a stale reading.
func (t *Tuner) cycle() {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	pct := t.policy.Percent(readUint64(liveMetric))
	if pct != t.last {
		debug.SetGCPercent(pct)
		t.last = pct
	}
	t.arm()
	if t.applied != nil {
		// Under mu and after arm: no report after Stop returns, and a
		// collection the test starts after a report finds the sentinel.
		t.applied(pct)
	}
	t.mu.Unlock()
}

// The runtime/metrics the Tuner reads (Go 1.21+).
const (
	liveMetric = "/gc/heap/live:bytes" // the heap the last collection marked live
	gogcMetric = "/gc/gogc:percent"    // the GC percent in force
)

// readUint64 reads one runtime metric; 0 if the runtime does not have it
// (Percent(0) is the Go default).
func readUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
