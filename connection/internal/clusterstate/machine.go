package clusterstate

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/fleetgraph/fleetgraph/index"
)

// SeenEvery throttles writes of LastSeen while nothing else in the row
// changes: each write is a change event for subscribers, and a row per
// probe or per edge message would be noise. A write for any other reason
// carries the latest LastSeen.
const SeenEvery = 10 * time.Second

// Sink is what a Machine writes: the cluster-row call of index.Sink.
type Sink interface {
	UpsertCluster(ctx context.Context, c index.Cluster) error
}

// Config configures a Machine.
type Config struct {
	Name   string
	Labels map[string]string
	Mode   index.SyncMode
	Sink   Sink
	// Clock stamps Since and LastSeen; nil means the real clock.
	Clock clock.PassiveClock
	// Logger logs transitions; nil means slog.Default().
	Logger *slog.Logger
	// OnTransition, if set, is called with the state entered on each
	// transition (the callers count them in their metrics).
	OnTransition func(index.ConnectionState)
	// Resume, if set, is the cluster's row as another owner of the
	// cluster last wrote it (a replicated collector taking the cluster
	// over, see package replication): the machine continues from it, as
	// if it had written it, instead of starting afresh. Labels and Mode
	// still come from this Config.
	Resume *index.Cluster
}

// KindStatus is a connection's word on one kind: Err is empty when the kind
// collects, and says why when it fails (which degrades the cluster).
type KindStatus struct {
	Kind string // its group and kind, as index.Kind.GroupKind
	Err  string
}

// Report is news from a connection about its kinds and metadata.
type Report struct {
	// Kinds are the kinds whose state this report gives.
	Kinds []KindStatus
	// All says that Kinds lists every kind of the connection, so a
	// failing kind not in it has recovered (an edge's full snapshot).
	All bool
	// Synced says that the connection's initial sync is complete: from
	// now on the cluster is CONNECTED, or DEGRADED while a kind fails.
	Synced bool
	// Metadata, if not nil, replaces the cluster's metadata.
	Metadata map[string]string
}

// Machine is one cluster's connection state. Each connection (a pull
// session, an edge session) gets a generation from Connect and names it in
// every later call; calls naming an older generation change nothing, so a
// probe or a session that outlived its connection cannot move the state.
//
// An outage is one DISCONNECTED and one CONNECTED (or DEGRADED): once
// DISCONNECTED, the cluster stays so until a new connection has synced, and
// reconnect attempts that fail on the way only update LastError. See the
// connection package's documentation for the whole table.
//
// Concurrency: safe for concurrent use. Every call holds one lock while it
// computes and writes the row, so rows reach the Sink in the order of the
// calls. In practice one goroutine drives it at a time: a pull cluster's
// lifecycle goroutine, or the edge session that holds the cluster's claim.
type Machine struct {
	cfg   Config
	clock clock.PassiveClock
	log   *slog.Logger

	mu       sync.Mutex
	row      index.Cluster // the row as it should be, but for LastSeen
	wrote    index.Cluster // the row as last written
	written  bool          // whether a row has been written
	lastSeen time.Time     // latest contact, written lazily (SeenEvery)
	gen      uint64        // the current connection
	live     bool          // the current connection is up: not yet Lost
	synced   bool          // the current connection has finished its initial sync
	failing  map[string]string
}

// New returns a Machine. It writes nothing until the first Connect.
func New(cfg Config) *Machine {
	m := &Machine{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, failing: map[string]string{}}
	if m.clock == nil {
		m.clock = clock.RealClock{}
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("cluster", cfg.Name)
	m.row = index.Cluster{Name: cfg.Name, Labels: maps.Clone(cfg.Labels), Mode: cfg.Mode}
	if r := cfg.Resume; r != nil {
		m.row.State, m.row.Since, m.row.LastError, m.row.Synced = r.State, r.Since, r.LastError, r.Synced
		m.row.Metadata = maps.Clone(r.Metadata)
		m.lastSeen = r.LastSeen
		m.wrote, m.written = *r, true
	}
	return m
}

// Generation returns the current connection's generation (0 before the
// first Connect).
func (m *Machine) Generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// Connect begins a new connection and returns its generation, which makes
// every older one stale. seen says the cluster has answered already (an
// edge's Hello, a successful probe just before); metadata, if not nil,
// replaces the row's. A first connection, or one replacing a live one, is
// CONNECTING; during an outage the cluster stays DISCONNECTED, and a
// resumed cluster's first connection keeps the state it resumed.
func (m *Machine) Connect(ctx context.Context, seen bool, metadata map[string]string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	m.gen++
	m.live, m.synced = true, false
	clear(m.failing)
	if seen {
		m.lastSeen = now
	}
	if metadata != nil {
		m.row.Metadata = maps.Clone(metadata)
	}
	// The first connection of a resumed cluster continues the previous
	// owner's: a live row stays as it is until this connection's sync
	// says otherwise (a handover is no transition).
	resuming := m.cfg.Resume != nil && m.gen == 1
	if m.row.State != index.StateDisconnected && !resuming {
		m.enter(index.StateConnecting, now)
	}
	m.flush(ctx)
	return m.gen
}

// Seen records that connection gen heard from the cluster.
func (m *Machine) Seen(ctx context.Context, gen uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.current(gen) {
		return
	}
	m.lastSeen = m.clock.Now()
	m.flush(ctx)
}

// Report applies news from connection gen about its kinds and metadata.
// Until the connection has synced, kind news is only remembered; once it
// has, the cluster is CONNECTED, or DEGRADED with the first failing kind's
// error (in kind order) as LastError.
func (m *Machine) Report(ctx context.Context, gen uint64, r Report) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.current(gen) {
		return
	}
	if r.All {
		clear(m.failing)
	}
	for _, k := range r.Kinds {
		if k.Err == "" {
			delete(m.failing, k.Kind)
		} else {
			m.failing[k.Kind] = k.Kind + ": " + k.Err
		}
	}
	if r.Metadata != nil {
		m.row.Metadata = maps.Clone(r.Metadata)
	}
	if r.Synced {
		m.synced, m.row.Synced = true, true
	}
	if m.synced {
		now := m.clock.Now()
		m.lastSeen = now // a synced connection has just been answered
		if len(m.failing) == 0 {
			m.enter(index.StateConnected, now)
			m.row.LastError = ""
		} else {
			m.enter(index.StateDegraded, now)
			m.row.LastError = m.failing[slices.Min(slices.Collect(maps.Keys(m.failing)))]
		}
	}
	m.flush(ctx)
}

// Lost records that connection gen is lost, or (called again for it) that
// it still cannot be re-established: the cluster is DISCONNECTED with err
// as LastError. Its rows stay in the index, stale.
func (m *Machine) Lost(ctx context.Context, gen uint64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if gen != m.gen {
		m.log.Debug("ignoring the loss of an older connection", "gen", gen, "current", m.gen)
		return
	}
	m.live, m.synced = false, false
	m.enter(index.StateDisconnected, m.clock.Now())
	if err != nil {
		m.row.LastError = err.Error()
	}
	m.flush(ctx)
}

// SetLabels replaces the cluster's labels, for example when its source
// object was relabelled. It is no transition and needs no connection: the
// row is written at once if one was written before, else with the first
// Connect.
func (m *Machine) SetLabels(ctx context.Context, labels map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if maps.Equal(m.row.Labels, labels) {
		return
	}
	m.row.Labels = maps.Clone(labels)
	if m.written {
		m.flush(ctx)
	}
}

// current reports whether gen is the live connection. mu must be held.
func (m *Machine) current(gen uint64) bool {
	if gen != m.gen || !m.live {
		m.log.Debug("ignoring a call from an older connection", "gen", gen, "current", m.gen, "live", m.live)
		return false
	}
	return true
}

// enter moves to state; the same state again is no transition. mu must be
// held.
func (m *Machine) enter(state index.ConnectionState, now time.Time) {
	if m.row.State == state {
		return
	}
	m.log.Info("cluster state", "mode", m.cfg.Mode, "from", m.row.State, "to", state)
	if m.cfg.OnTransition != nil {
		m.cfg.OnTransition(state)
	}
	m.row.State, m.row.Since = state, now
}

// flush writes the row if it changed, or if only LastSeen did, once it is
// SeenEvery old. mu must be held.
func (m *Machine) flush(ctx context.Context) {
	next := m.row
	next.LastSeen = m.lastSeen
	if m.written && sameButSeen(&m.wrote, &next) && next.LastSeen.Sub(m.wrote.LastSeen) < SeenEvery {
		return
	}
	next.Labels, next.Metadata = maps.Clone(next.Labels), maps.Clone(next.Metadata)
	m.wrote, m.written = next, true
	if err := m.cfg.Sink.UpsertCluster(ctx, next); err != nil && ctx.Err() == nil {
		m.log.Error("writing cluster state failed", "err", err)
	}
}

// sameButSeen reports whether two rows differ at most in LastSeen.
func sameButSeen(a, b *index.Cluster) bool {
	return a.Name == b.Name && a.Mode == b.Mode && a.State == b.State && a.Since.Equal(b.Since) &&
		a.LastError == b.LastError && a.Synced == b.Synced &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Metadata, b.Metadata)
}
