package retry

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestBackoffSequence(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		policy Policy
		want   []time.Duration
	}{
		{"doubles up to the cap", Policy{Initial: 250 * ms, Max: 2 * time.Second}, []time.Duration{250 * ms, 500 * ms, time.Second, 2 * time.Second, 2 * time.Second}},
		{"a cap that is not a doubling", Policy{Initial: time.Second, Max: 3 * time.Second}, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{"a cap below the first wait counts as the first wait", Policy{Initial: time.Second, Max: ms}, []time.Duration{time.Second, time.Second}},
		{"the source resource policy is a steady interval", SourceResource, []time.Duration{10 * time.Second, 10 * time.Second, 10 * time.Second}},
		{"the kind list policy without jitter", Policy{Initial: KindListInitial, Max: KindListMax}, []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.policy, nil)
			for i, want := range tc.want {
				if got := b.Next(); got != want {
					t.Fatalf("wait %d: %s, want %s", i+1, got, want)
				}
			}
			b.Reset()
			if got := b.Next(); got != tc.want[0] {
				t.Fatalf("after Reset: %s, want %s", got, tc.want[0])
			}
		})
	}
}

// TestBackoffJitter: every wait lies within ±Jitter of the unjittered one,
// and the waits really are spread (a crowd does not retry in lockstep).
func TestBackoffJitter(t *testing.T) {
	p := Reconnect(time.Second, time.Second)
	b := New(p, nil)
	lo, hi := time.Duration(float64(time.Second)*(1-p.Jitter)), time.Duration(float64(time.Second)*(1+p.Jitter))
	seen := map[time.Duration]bool{}
	minSeen, maxSeen := hi, lo
	for range 1000 {
		d := b.Next()
		if d < lo || d > hi {
			t.Fatalf("wait %s outside [%s, %s]", d, lo, hi)
		}
		seen[d] = true
		minSeen, maxSeen = min(minSeen, d), max(maxSeen, d)
	}
	// 1000 uniform draws cover well over half of the ±20% band.
	if len(seen) < 900 || maxSeen-minSeen < time.Duration(float64(hi-lo)*0.9) {
		t.Errorf("waits not spread: %d distinct in [%s, %s]", len(seen), minSeen, maxSeen)
	}
}

// TestBackoffWaits runs a retry loop in a synctest bubble: each Wait takes
// exactly the planned time on the fake clock, and a cancelled context ends
// a Wait at once.
func TestBackoffWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(Policy{Initial: 250 * time.Millisecond, Max: time.Second}, nil)
		start := time.Now()
		var at []time.Duration
		for range 4 {
			if !b.Wait(t.Context()) {
				t.Fatal("Wait returned false with a live context")
			}
			at = append(at, time.Since(start))
		}
		want := []time.Duration{250 * time.Millisecond, 750 * time.Millisecond, 1750 * time.Millisecond, 2750 * time.Millisecond}
		for i := range want {
			if at[i] != want[i] {
				t.Fatalf("attempts at %v, want %v", at, want)
			}
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan bool)
		go func() { done <- b.Wait(ctx) }()
		synctest.Wait() // the Wait is blocked on its timer
		before := time.Now()
		cancel()
		if <-done {
			t.Fatal("Wait returned true after its context ended")
		}
		if d := time.Since(before); d != 0 {
			t.Fatalf("Wait took %s to notice the cancel", d)
		}
	})
}

// TestBackoffUsesItsClock: a Backoff given a fake clock waits on it, not on
// real time.
func TestBackoffUsesItsClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	b := New(Policy{Initial: time.Hour, Max: time.Hour}, clk)
	done := make(chan bool)
	go func() { done <- b.Wait(t.Context()) }()
	for deadline := time.Now().Add(10 * time.Second); !clk.HasWaiters(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Wait does not wait on its clock")
		}
	}
	select {
	case <-done:
		t.Fatal("Wait returned before its clock moved")
	default:
	}
	clk.Step(time.Hour)
	if !<-done {
		t.Fatal("Wait returned false")
	}
}
