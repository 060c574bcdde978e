package connection

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection/internal/clusterstate"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// sigType is what a signal to a cluster's lifecycle says.
type sigType int

const (
	sigKindSynced sigType = iota
	sigKindFailed
	sigWatchFailed
	sigProbeOK
	sigProbeFailed
	sigReconnect
)

// signal is a message to a cluster's lifecycle goroutine. gen is the
// generation of the connection that produced it: the lifecycle ignores
// signals from older connections, so a probe that used a client from
// before a reconnect can never cause another reconnect (docs/design.md,
// connection lifecycle).
type signal struct {
	gen  uint64
	typ  sigType
	kind index.Kind
	err  error
	// flowed, on sigProbeFailed, says that the probe timed out while the
	// cluster's lists and watches delivered data.
	flowed bool
}

// signalBuffer is the depth of a cluster's signal channel. Senders never
// block: when it is full, a signal is dropped, which is safe because every
// signal is either repeated (probes, relists) or only a hint (watch
// failures, which merely trigger a probe).
const signalBuffer = 256

// forgiveAfterSync is how many timed-out probes in a row a synced
// connection forgives because its lists and watches delivered data during
// them. Until the connection has synced, every such probe is forgiven:
// the sync is when a busy manager answers its own probes late (fleetbench
// fleet, 200 clusters on a loaded 2-core machine: 3,176 reconnects during
// the first sync), a loss would start every list over, and the sync ends
// by itself once each kind has listed or failed. After it, only a few:
// watch bookmarks, error bodies and viewers' reads keep bytes flowing
// from a server whose storage is gone (an etcd outage makes /readyz slow
// rather than failed), so the grace must end. 3 delays such a loss by at
// most 3 probes, under 8 s at the defaults.
const forgiveAfterSync = 3

// cluster is one cluster's lifecycle.
//
// Concurrency: run is the only goroutine that reports to the cluster's
// state machine (which writes the cluster row), apart from poke reading
// the current generation. Collectors and the probe loop talk to run
// through signals; they and their connection are owned by one session and
// end with its context. cfg is read by other goroutines (RESTConfig) under
// mu.
type cluster struct {
	m    *Manager
	spec Spec

	cancel context.CancelFunc
	done   chan struct{}

	signals chan signal
	state   *clusterstate.Machine

	mu  sync.Mutex
	cfg *rest.Config // current connection's config, nil when not connected
}

func newCluster(m *Manager, spec Spec) *cluster {
	var resume *index.Cluster
	if m.opts.Resume != nil {
		if row, ok := m.opts.Resume(spec.Name); ok {
			resume = row
		}
	}
	return &cluster{
		m: m, spec: spec, signals: make(chan signal, signalBuffer),
		state: clusterstate.New(clusterstate.Config{
			Name: spec.Name, Labels: spec.Labels, Mode: index.ModePull, Sink: m.opts.Store, Logger: m.opts.Logger,
			OnTransition: func(s index.ConnectionState) {
				m.metrics.transitions.WithLabelValues(spec.Name, string(s)).Inc()
			},
			Resume: resume,
		}),
	}
}

// send delivers a signal without blocking.
func (c *cluster) send(s signal) {
	select {
	case c.signals <- s:
	default:
		c.m.metrics.signalsDropped.WithLabelValues(c.spec.Name).Inc()
	}
}

// poke sends a signal to the current connection. If the connection is
// lost before the signal is read, the next one ignores it.
func (c *cluster) poke(t sigType) { c.send(signal{gen: c.state.Generation(), typ: t}) }

func (c *cluster) currentConfig() *rest.Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg
}

func (c *cluster) setConfig(cfg *rest.Config) {
	c.mu.Lock()
	c.cfg = cfg
	c.mu.Unlock()
}

// run connects, serves the connection until it is lost, and reconnects,
// until ctx ends.
func (c *cluster) run(ctx context.Context) {
	log := c.m.opts.Logger.With("cluster", c.spec.Name)
	backoff := retry.New(retry.Reconnect(c.m.opts.BackoffInitial, c.m.opts.BackoffMax), nil)
	answered := false // whether the server answered a probe just before this session
	for ctx.Err() == nil {
		gen, err := c.session(ctx, answered)
		if ctx.Err() != nil {
			return
		}
		log.Warn("cluster connection lost", "err", err)
		c.state.Lost(ctx, gen, err)
		// Wait until the server answers again, with a fresh client
		// each time, then start a new session (which resyncs).
		for backoff.Wait(ctx) {
			if err := c.reachable(ctx); err != nil {
				c.state.Lost(ctx, gen, err) // still lost: a new LastError
				continue
			}
			backoff.Reset()
			answered = true
			break
		}
	}
}

// reachable builds a client from the source and probes it once.
func (c *cluster) reachable(ctx context.Context) error {
	cfg, closeIdle, err := c.buildConfig(ctx)
	if err != nil {
		return err
	}
	defer closeIdle()
	clients, err := collector.NewClients(cfg)
	if err != nil {
		return err
	}
	return c.probeOnce(ctx, clients)
}

// buildConfig gets a fresh config from the source and gives it a
// transport of its own with HTTP/2 health checks.
func (c *cluster) buildConfig(ctx context.Context) (*rest.Config, func(), error) {
	cfg, err := c.spec.Config(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("build client: %w", err)
	}
	cfg, tr, err := withHealthChecks(cfg, c.m.opts.HTTP2ReadIdle, c.m.opts.HTTP2PingTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("build transport: %w", err)
	}
	closeIdle := func() {}
	if tr != nil {
		closeIdle = tr.CloseIdleConnections
	}
	return cfg, closeIdle, nil
}

// session runs one connection: it builds clients, starts the collector and
// the probe loop, reports the sync once every kind has synced, and returns
// the connection's generation when it is lost or ctx ends.
func (c *cluster) session(ctx context.Context, answered bool) (uint64, error) {
	gen := c.state.Connect(ctx, answered, nil)
	// Wait for a turn to sync (Options.MaxConcurrentSyncs) before there is
	// a client, a collector or a probe: a waiting cluster costs nothing and
	// cannot be lost.
	doneSyncing, err := c.m.syncTurn(ctx)
	if err != nil {
		return gen, err
	}
	defer doneSyncing()
	cfg, closeIdle, err := c.buildConfig(ctx)
	if err != nil {
		return gen, err
	}
	defer closeIdle()
	activity := newReadActivity()
	cfg.Wrap(activity.wrap)
	clients, err := collector.NewClients(cfg)
	if err != nil {
		return gen, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()

	run, err := collector.Start(sctx, collector.Config{
		Cluster: c.spec.Name, Clients: clients, Sink: c.m.opts.Store, Registry: c.m.opts.Registry,
		Namespaces: c.m.opts.Namespaces, ExcludeNamespaces: c.m.opts.ExcludeNamespaces,
		Relist: c.m.opts.Relist, Logger: c.m.opts.Logger,
		OnEvent: func(e collector.Event) { c.collectorEvent(gen, e) },
	})
	if err != nil {
		return gen, err
	}
	defer run.Wait() // after cancel: no write of this session outlives it
	c.setConfig(cfg)
	defer c.setConfig(nil)
	c.state.Seen(ctx, gen) // discovery answered
	c.updateMetadata(sctx, gen, clients)

	probeKick := make(chan struct{}, 1)
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		c.probeLoop(sctx, gen, clients, activity, probeKick)
	}()
	defer func() { cancel(); <-probeDone }()

	// The connection has synced once every kind present at the start has
	// listed or failed.
	pending := map[string]bool{}
	for _, k := range run.Present {
		pending[k.GroupKind()] = true
	}
	synced := false
	report := func(k clusterstate.KindStatus) {
		delete(pending, k.Kind)
		synced = len(pending) == 0
		c.state.Report(ctx, gen, clusterstate.Report{Kinds: []clusterstate.KindStatus{k}, Synced: synced})
		if synced {
			doneSyncing()
		}
	}
	if len(pending) == 0 { // a cluster with no present kinds is synced at once
		synced = true
		c.state.Report(ctx, gen, clusterstate.Report{Synced: true})
		doneSyncing()
	}
	failures := 0
	forgiven := 0 // timed-out probes forgiven in a row since the sync

	for {
		var s signal
		select {
		case <-ctx.Done():
			return gen, ctx.Err()
		case s = <-c.signals:
		}
		if s.gen != gen {
			c.m.metrics.staleSignals.WithLabelValues(c.spec.Name).Inc()
			continue // from an older connection: harmless by construction
		}
		switch s.typ {
		case sigKindSynced:
			report(clusterstate.KindStatus{Kind: s.kind.GroupKind()})
		case sigKindFailed:
			report(clusterstate.KindStatus{Kind: s.kind.GroupKind(), Err: s.err.Error()})
		case sigWatchFailed:
			select { // check the connection now rather than at the next tick
			case probeKick <- struct{}{}:
			default:
			}
		case sigProbeOK:
			failures, forgiven = 0, 0
			c.state.Seen(ctx, gen)
		case sigProbeFailed:
			if s.flowed && (!synced || forgiven < forgiveAfterSync) {
				// The API server answers, only slowly to us: the data
				// is its answer (forgiveAfterSync says when not).
				if synced {
					forgiven++
				}
				c.m.metrics.forgiven.WithLabelValues(c.spec.Name).Inc()
				failures = 0
				c.state.Seen(ctx, gen)
				continue
			}
			failures++
			if failures >= c.m.opts.ProbeFailures {
				return gen, s.err
			}
			select { // confirm at once instead of waiting a whole interval
			case probeKick <- struct{}{}:
			default:
			}
		case sigReconnect:
			return gen, errors.New("reconnect requested")
		}
	}
}

// collectorEvent takes an event of the connection's collector: a failed
// relist is counted and changes nothing else (the kind's watch still
// delivers, so neither the kind nor the connection is in doubt); every
// other event is a signal to the connection.
func (c *cluster) collectorEvent(gen uint64, e collector.Event) {
	if e.Type == collector.RelistFailed {
		c.m.metrics.relistFailures.WithLabelValues(c.spec.Name, e.Kind.GroupKind()).Inc()
		return
	}
	c.send(collectorSignal(gen, e))
}

func collectorSignal(gen uint64, e collector.Event) signal {
	s := signal{gen: gen, kind: e.Kind, err: e.Err}
	switch e.Type {
	case collector.KindSynced:
		s.typ = sigKindSynced
	case collector.KindFailed:
		s.typ = sigKindFailed
	default:
		s.typ = sigWatchFailed
	}
	return s
}

// probeLoop probes /readyz every interval, or at once when kicked, and
// reports each result. It is the one probe loop of the cluster, whatever
// the number of clients watching its state (docs/design.md: no poll per
// viewer).
func (c *cluster) probeLoop(ctx context.Context, gen uint64, clients *collector.Clients, activity *readActivity, kick <-chan struct{}) {
	t := time.NewTicker(c.m.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		start := time.Now()
		err := c.probeOnce(ctx, clients)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// Whether a timeout is forgiven is the session's call
			// (forgiveAfterSync): it knows whether it has synced.
			flowed := errors.Is(err, context.DeadlineExceeded) && activity.since(start)
			c.send(signal{gen: gen, typ: sigProbeFailed, err: err, flowed: flowed})
		} else {
			c.send(signal{gen: gen, typ: sigProbeOK})
		}
	}
}

// probeOnce asks the API server whether it is ready. It sends one plain
// request: client-go's retries would hide a dead server for seconds.
func (c *cluster) probeOnce(ctx context.Context, clients *collector.Clients) error {
	ctx, cancel := context.WithTimeout(ctx, c.m.opts.ProbeTimeout)
	defer cancel()
	c.m.metrics.probes.WithLabelValues(c.spec.Name).Inc()
	err := probeReadyz(ctx, clients)
	if err != nil {
		c.m.metrics.probeFailures.WithLabelValues(c.spec.Name).Inc()
	}
	return err
}

func probeReadyz(ctx context.Context, clients *collector.Clients) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(clients.Host, "/")+"/readyz", nil)
	if err != nil {
		return fmt.Errorf("readyz probe: %w", err)
	}
	resp, err := clients.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("readyz probe: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz probe: HTTP %d", resp.StatusCode)
	}
	return nil
}

// updateMetadata records the Kubernetes version and Istio control plane.
func (c *cluster) updateMetadata(ctx context.Context, gen uint64, clients *collector.Clients) {
	md := map[string]string{}
	if v, err := clients.Discovery.ServerVersion(); err == nil {
		md["kubernetes.version"] = v.GitVersion
	}
	istio, err := collector.DetectIstio(ctx, clients)
	if err != nil {
		c.m.opts.Logger.Warn("istio detection failed", "cluster", c.spec.Name, "err", err)
	}
	maps.Copy(md, istio.Metadata())
	c.state.Report(ctx, gen, clusterstate.Report{Metadata: md})
}
