package gcpolicy

import (
	"bytes"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

// TestPercent: the Go default while the heap is small, the floor's share
// in between, Headroom once the heap is large.
func TestPercent(t *testing.T) {
	def, quarter := Default(), Policy{Headroom: 25, Floor: DefaultFloor}
	for _, c := range []struct {
		name string
		p    Policy
		live uint64
		want int
	}{
		{"unknown heap", def, 0, 100},
		{"tiny heap", def, 1 * mib, 100},
		{"at the floor", def, 16 * mib, 100},
		{"between the floor and twice it, rounded up", def, 24 * mib, 67},
		{"where Headroom takes over", def, 32 * mib, 50},
		{"100k objects", def, 65 * mib, 50},
		{"1M objects", def, 455 * mib, 50},
		{"10M objects", def, 4600 * mib, 50},
		{"25%: the floor's share, rounded up", quarter, 48 * mib, 34},
		{"25% at 1M objects", quarter, 455 * mib, 25},
		{"off", Policy{Floor: DefaultFloor}, 4600 * mib, 100},
		{"no floor", Policy{Headroom: 50}, 1 * mib, 50},
		{"headroom 100 is the Go default", Policy{Headroom: 100, Floor: DefaultFloor}, 4600 * mib, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.p.Percent(c.live); got != c.want {
				t.Errorf("Percent(%d MiB) = %d, want %d", c.live/mib, got, c.want)
			}
		})
	}
}

// TestStartOff: GOGC in the environment wins over the policy, and so does
// a headroom of 0; neither changes the GC percent or arms the hook, and the
// Tuner says why, as the log does.
func TestStartOff(t *testing.T) {
	for _, c := range []struct {
		name, gogc string // gogc "": empty in the environment, as if unset
		headroom   int
		why        string // logged, and the Tuner's Off
		described  string // the Tuner's String
	}{
		{"GOGC set", "150", DefaultHeadroom, "GOGC=150 is set in the environment", "off (GOGC=150 is set in the environment)"},
		{"GOGC=off", "off", DefaultHeadroom, "GOGC=off is set in the environment", "off (GOGC=off is set in the environment)"},
		{"headroom 0", "", 0, "gc headroom 0", "off (gc headroom 0): the Go default, GOGC 100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOGC", c.gogc) // empty, as templating leaves it, is the default: not off
			if why, _ := off(Default()); c.gogc == "" && why != "" {
				t.Fatalf("off(Default()) = %q with GOGC empty, want on", why)
			}
			before := debug.SetGCPercent(100)
			defer debug.SetGCPercent(before)
			var log bytes.Buffer
			tu, err := Start(Policy{Headroom: c.headroom, Floor: 1}, slog.New(slog.NewTextHandler(&log, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if tu.Off() != c.why || tu.Headroom() != 0 || tu.String() != c.described {
				t.Errorf("Tuner: Off %q, Headroom %d, String %q; want %q, 0, %q", tu.Off(), tu.Headroom(), tu.String(), c.why, c.described)
			}
			runtime.GC()
			if got := int(readUint64(gogcMetric)); got != 100 {
				t.Errorf("GC percent %d after a collection, want it left at 100", got)
			}
			tu.Stop()
			if got := int(readUint64(gogcMetric)); got != 100 {
				t.Errorf("GC percent %d after Stop, want it left at 100", got)
			}
			if !strings.Contains(log.String(), "gc policy off") || !strings.Contains(log.String(), c.why) {
				t.Errorf("log %q does not say the policy is off because of %q", log.String(), c.why)
			}
		})
	}
}

// TestStartOn: with GOGC empty, Start runs the policy and the Tuner says
// so: its headroom and its description.
func TestStartOn(t *testing.T) {
	t.Setenv("GOGC", "")
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	p := Default()
	p.Headroom = 30
	tu, err := Start(p, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer tu.Stop()
	if tu.Off() != "" || tu.Headroom() != 30 || tu.String() != p.String() {
		t.Errorf("Tuner: Off %q, Headroom %d, String %q; want on, 30, %q", tu.Off(), tu.Headroom(), tu.String(), p.String())
	}
}

func TestStartRejectsBadHeadroom(t *testing.T) {
	for _, h := range []int{-1, 1, MinHeadroom - 1, 101} {
		if _, err := Start(Policy{Headroom: h}, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("headroom %d: no error", h)
		}
	}
}

// TestTunerFollowsCollections: after each collection the percent is the
// policy's for the live heap (a 1-byte floor, so any heap is large), and
// Stop restores the percent Start found. Each step waits for the hook's
// own report, not for a clock.
func TestTunerFollowsCollections(t *testing.T) {
	before := debug.SetGCPercent(100)
	defer debug.SetGCPercent(before)
	applied := make(chan int, 1)
	tu := start(Policy{Headroom: 30, Floor: 1}, func(pct int) {
		select {
		case applied <- pct:
		default: // a collection the test did not ask for
		}
	})
	for i := range 3 { // the hook re-arms itself
		runtime.GC()
		if pct := <-applied; pct != 30 {
			t.Fatalf("collection %d: the hook set %d, want 30", i, pct)
		}
		if got := int(readUint64(gogcMetric)); got != 30 {
			t.Fatalf("collection %d: GC percent %d, want 30", i, got)
		}
	}
	tu.Stop()
	select {
	case <-applied: // a collection before Stop that the test did not ask for
	default:
	}
	if got := int(readUint64(gogcMetric)); got != 100 {
		t.Fatalf("after Stop: GC percent %d, want the 100 Start found", got)
	}
	// A collection's hook queued before Stop may still run after it: it
	// must set nothing (called here directly, so the test need not wait
	// for the runtime's cleanup goroutine).
	tu.cycle()
	if got := int(readUint64(gogcMetric)); got != 100 {
		t.Fatalf("a hook run after Stop set the GC percent to %d", got)
	}
	select {
	case pct := <-applied:
		t.Fatalf("a hook ran after Stop and applied %d", pct)
	default:
	}
	var nilTuner *Tuner
	nilTuner.Stop()
}
