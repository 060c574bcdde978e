package retry

import (
	"context"
	"math/rand/v2"
	"time"

	"k8s.io/utils/clock"
)

// The retry loops' constants, with the reasons for them. The public
// defaults of connection and edge (DefaultBackoffInitial, DefaultBackoffMax)
// are these.
const (
	// PullReconnectInitial is the first wait before a lost pull cluster
	// is probed again. A killed API server usually restarts within a
	// second or two, so the first tries come fast.
	PullReconnectInitial = 250 * time.Millisecond
	// PullReconnectMax caps that wait. A probe of a dead server is one
	// cheap TCP attempt, so a low cap costs little and keeps recovery
	// within seconds of the server coming back.
	PullReconnectMax = 2 * time.Second
	// EdgeReconnectInitial is the first wait before an edge reconnects to
	// the manager: a manager restart should be bridged in about a second.
	EdgeReconnectInitial = 500 * time.Millisecond
	// EdgeReconnectMax caps it, so that a fleet of edges retrying a
	// manager that is down does not add up to a storm, yet every edge is
	// back within half a minute of the manager.
	EdgeReconnectMax = 30 * time.Second
	// EdgeLocalInitial and EdgeLocalMax pace an edge's retries of its
	// local API server's discovery when the edge starts before it: quick
	// at first, then every 30 s.
	EdgeLocalInitial = time.Second
	EdgeLocalMax     = 30 * time.Second
	// KindListInitial is the first wait after a kind's list fails: a 429
	// or a blip should be retried quickly.
	KindListInitial = time.Second
	// KindListMax caps it: a kind that is forbidden or broken is retried
	// once a minute, so it recovers on its own without hammering the API
	// server.
	KindListMax = time.Minute
	// SourceResourceEvery is how often a cluster source whose resource
	// (its CRD) the management cluster does not serve looks again:
	// installing the CRD later needs no restart, and a discovery request
	// every 10 s is nothing to the API server.
	SourceResourceEvery = 10 * time.Second
	// PublishInitial is the first wait before a replication publish to
	// NATS JetStream is retried: a publish fails while the stream elects a
	// new leader (a NATS server died), which takes a second or two, and
	// the retry should land soon after.
	PublishInitial = 50 * time.Millisecond
	// PublishMax caps it: every owned cluster of a collector retries at
	// once during an election, and a wait of 2 s spreads them while still
	// catching the new leader within about the election's time.
	PublishMax = 2 * time.Second
	// StreamInitial and StreamMax pace a replication node's attempts to
	// open its stream: a JetStream cluster that starts with fleetgraph
	// elects its leaders within a few seconds, so the first retries come
	// soon; later ones (NATS down, a stream replica count the cluster
	// cannot place) are spaced so that each leaves a readable log line.
	StreamInitial = 250 * time.Millisecond
	StreamMax     = 5 * time.Second
	// ReconnectJitter spreads reconnects by ±20%: enough to break up a
	// crowd, little enough that a retry is not much later than planned.
	ReconnectJitter = 0.2
	// KindListJitter spreads retries of failing kinds by ±50%: every kind
	// of a cluster fails at once when its API server throttles or breaks,
	// and dozens of kinds should not come back in the same instant.
	KindListJitter = 0.5
)

// The policies of the loops whose bounds are not options.
var (
	// KindList paces a collector's retries of a kind whose list fails.
	KindList = Policy{Initial: KindListInitial, Max: KindListMax, Jitter: KindListJitter}
	// EdgeLocal paces an edge's retries of its local API server.
	EdgeLocal = Policy{Initial: EdgeLocalInitial, Max: EdgeLocalMax, Jitter: ReconnectJitter}
	// Publish paces retries of a replication publish (package
	// replication).
	Publish = Policy{Initial: PublishInitial, Max: PublishMax, Jitter: ReconnectJitter}
	// Stream paces a replication node's attempts to open its stream.
	Stream = Policy{Initial: StreamInitial, Max: StreamMax, Jitter: ReconnectJitter}
	// SourceResource paces a cluster source's look for its resource: a
	// steady interval, since nothing is failing that backing off would
	// spare.
	SourceResource = Policy{Initial: SourceResourceEvery, Max: SourceResourceEvery}
)

// Reconnect is the policy of a reconnect loop whose bounds are options (a
// pull cluster's, an edge's).
func Reconnect(initial, maximum time.Duration) Policy {
	return Policy{Initial: initial, Max: maximum, Jitter: ReconnectJitter}
}

// Policy is an exponential backoff: the first wait is Initial, each later
// one twice the one before, never more than Max, and each is spread
// uniformly over ±Jitter of itself.
type Policy struct {
	Initial time.Duration
	// Max caps every wait; a Max below Initial counts as Initial.
	Max time.Duration
	// Jitter is a fraction in [0, 1).
	Jitter float64
}

// Backoff is one retry loop's place in its Policy.
//
// Concurrency: none. Each loop owns its Backoff and calls it from its own
// goroutine.
type Backoff struct {
	policy Policy
	clock  clock.Clock
	next   time.Duration
}

// New returns a Backoff at the start of p that waits on clk; nil means the
// real clock. Tests inject a fake clock, or run in a testing/synctest
// bubble with the real one.
func New(p Policy, clk clock.Clock) *Backoff {
	if clk == nil {
		clk = clock.RealClock{}
	}
	p.Max = max(p.Max, p.Initial)
	return &Backoff{policy: p, clock: clk, next: p.Initial}
}

// Next returns the jittered wait before the next attempt and doubles the
// one after it, up to Max.
func (b *Backoff) Next() time.Duration {
	d := Jitter(b.next, b.policy.Jitter)
	b.next = min(2*b.next, b.policy.Max)
	return d
}

// Reset starts over at Initial, after an attempt succeeded.
func (b *Backoff) Reset() { b.next = b.policy.Initial }

// Wait sleeps for Next(). It returns false, at once, if ctx ends first.
func (b *Backoff) Wait(ctx context.Context) bool { return b.Sleep(ctx, b.Next()) }

// Sleep sleeps for d on the Backoff's clock, for a loop that stretches
// Next() (an edge told to retry after a grace period). It returns false,
// at once, if ctx ends first.
func (b *Backoff) Sleep(ctx context.Context, d time.Duration) bool {
	t := b.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// Jitter returns d plus or minus up to fraction of it, uniformly.
func Jitter(d time.Duration, fraction float64) time.Duration {
	return time.Duration(float64(d) * (1 + fraction*(2*rand.Float64()-1)))
}
