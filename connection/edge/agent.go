package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// Defaults and constants of the edge side.
const (
	// DefaultResyncInterval is the full resync interval (docs/design.md: every
	// 30 seconds). DefaultResyncMin and DefaultResyncMax bound the
	// adaptive interval: a busy cluster resyncs down to every 10 s, a
	// quiet one stretches to a minute, which keeps hundreds of idle
	// edges from costing the manager full diffs twice a minute.
	DefaultResyncInterval = 30 * time.Second
	DefaultResyncMin      = 10 * time.Second
	DefaultResyncMax      = time.Minute
	// DefaultMaxPending bounds the keys an edge remembers as changed but
	// not yet sent. Past it the edge forgets them and sends a full
	// snapshot instead, which costs one snapshot rather than memory.
	DefaultMaxPending = 100_000
	// DefaultBackoffInitial and DefaultBackoffMax bound the wait before
	// reconnecting to the manager; internal/retry gives the reasons for
	// the numbers.
	DefaultBackoffInitial = retry.EdgeReconnectInitial
	DefaultBackoffMax     = retry.EdgeReconnectMax
	// metadataRefresh is how often the edge re-reads the Kubernetes and
	// Istio versions: upgrades are rare, and a full snapshot carries the
	// refreshed values.
	metadataRefresh = 5 * time.Minute
	// maxDeltaKeys bounds the keys taken for one delta, so the first
	// changes after a burst are sent without waiting for the whole burst
	// to be encoded.
	maxDeltaKeys = 1000
	// maxDetailWorkers bounds detail requests the edge performs at once;
	// it is twice the manager's own bound, so it only bites on a
	// misbehaving manager.
	maxDetailWorkers = 2 * maxDetailInFlight
	// partBytes bounds the parts of a snapshot when deltas travel
	// between them (FeatureDeltasInSnapshot): a change waits for at most
	// one part to be encoded, sent and decoded. Per-message deflate's
	// window is 32 KiB, so parts this size compress as well as 4 MiB ones.
	partBytes = 256 << 10
	// envelopeSlack covers the parts of an envelope that vary between
	// the size estimate and the real message (sequence, time, part
	// number).
	envelopeSlack = 256
)

// ResyncOptions sets the full resync interval. Interval is where it starts;
// with Min < Max it adapts after each resync: halved (down to Min) when
// the cluster changed a lot since the last one or the change buffer
// overflowed, grown by half (up to Max) when nothing changed, and moved
// back toward Interval otherwise. Min = Max turns adaptation off.
type ResyncOptions struct {
	Interval, Min, Max time.Duration
}

func (r *ResyncOptions) setDefaults() {
	setDefault(&r.Interval, DefaultResyncInterval)
	setDefault(&r.Min, min(DefaultResyncMin, r.Interval))
	setDefault(&r.Max, max(DefaultResyncMax, r.Interval))
	r.Min = min(r.Min, r.Interval)
	r.Max = max(r.Max, r.Interval)
}

// highChurn is the share of rows changed between resyncs above which the
// cluster counts as busy.
const highChurn = 0.1

// next returns the interval after a resync that saw changes of rows rows.
func (r ResyncOptions) next(cur time.Duration, changes, rows int, overflowed bool) time.Duration {
	if r.Min >= r.Max {
		return r.Interval
	}
	switch {
	case overflowed || (rows > 0 && float64(changes) > highChurn*float64(rows)):
		return max(r.Min, cur/2)
	case changes == 0:
		return min(r.Max, cur+cur/2)
	case cur < r.Interval:
		return min(r.Interval, cur*2)
	case cur > r.Interval:
		return max(r.Interval, cur/2)
	}
	return cur
}

// AgentOptions configures an edge Agent.
type AgentOptions struct {
	// Manager is the manager's edge endpoint, ws(s):// or http(s)://,
	// e.g. https://fleetgraph.example.com/edge.
	Manager string
	// Cluster is the cluster id the edge claims; Token returns its token
	// (called on every connect, so a rotated token file is picked up).
	Cluster string
	Token   func() (string, error)
	// Instance identifies this process; empty means hostname plus a
	// random suffix.
	Instance string
	// Metadata is sent in Hello, e.g. region and environment; the
	// Kubernetes and Istio versions are added from the local cluster.
	Metadata map[string]string
	// Local is the local API server. The collector reads it, and detail
	// requests are performed on it with the viewer impersonated, so its
	// credentials need list and watch on the collected kinds and
	// impersonate on users and groups.
	Local *rest.Config
	// Registry, Namespaces and ExcludeNamespaces configure the collector
	// as in pull mode.
	Registry                      *collector.Registry
	Namespaces, ExcludeNamespaces []string
	Resync                        ResyncOptions
	// MaxPending bounds changed keys buffered while the manager is slow.
	MaxPending int
	// MaxResyncParts caps the parts of a periodic full resync the edge
	// keeps unacknowledged; 0 leaves the cap at the manager's window less
	// one. Below the cap the edge adapts how many to the round trip
	// (partWindow): about two on a LAN, more on a long link. The cap is
	// never below two (a 1 acts as 2), which also holds against a manager
	// whose window is 2 or less; there a resync's parts can take every
	// slot, and a delta between them waits for an ack.
	MaxResyncParts int
	// TLS configures wss:// connections; nil means the system roots.
	TLS *tls.Config
	// Dial, if set, opens the TCP connection to the manager (tests count
	// bytes with it).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// PingInterval and PongWait are the keep-alive, as on the manager.
	PingInterval, PongWait time.Duration
	// BackoffInitial and BackoffMax bound the jittered exponential wait
	// between reconnects.
	BackoffInitial, BackoffMax time.Duration
	Logger                     *slog.Logger
	// Registerer, if set, receives the agent's metrics (agentMetrics: its
	// counters, read at each scrape).
	Registerer prometheus.Registerer
}

// Agent is the edge: it collects its local cluster into a buffer and
// streams it to the manager, reconnecting with backoff and resyncing fully
// on every connect.
//
// Concurrency: Run starts the collector (its goroutines write the buffer)
// and, on its own goroutine, connects session after session. Each session
// has a reader goroutine (acks, detail requests, rejects), a pinger, and a
// goroutine per detail request in flight; the session goroutine sends
// snapshots and deltas and, when anything fails, closes the connection and
// waits for all of them before the next connect. Run returns after the
// collector and the last session have stopped.
type Agent struct {
	opts   AgentOptions
	url    string
	buf    *buffer
	log    *slog.Logger
	detail *detailClient // nil without Local

	metaMu   sync.Mutex
	metadata map[string]string

	stats agentCounters
	// budgetSpent: the last snapshot spent its delta budget; owned by the
	// goroutine that runs sessions, one at a time (Run).
	budgetSpent bool
	// overQuotaLogged holds the kinds of problem (a row's group and kind,
	// and the quota) already logged by noteOverQuota; owned, like
	// budgetSpent, by the goroutine that runs sessions.
	overQuotaLogged map[overQuotaProblem]bool
}

// overQuotaProblem is one kind of problem noteOverQuota logs once: rows
// of one kind over one quota.
type overQuotaProblem struct {
	group, kind, quota string
}

// noteOverQuota counts a row not sent because it is over one of the
// manager's per-row quotas, and logs the first row of each kind over each
// quota: a resync sends every row again, so a line per row would repeat
// every resync for as long as the object exists. AgentStats.OverQuota
// keeps counting (each snapshot or delta counts the row again).
func (a *Agent) noteOverQuota(row *index.Object, over *rowOverQuota) {
	a.stats.overQuota.Add(1)
	p := overQuotaProblem{group: row.Group, kind: row.Kind, quota: over.quota}
	if a.overQuotaLogged[p] {
		return
	}
	if a.overQuotaLogged == nil {
		a.overQuotaLogged = map[overQuotaProblem]bool{}
	}
	a.overQuotaLogged[p] = true
	a.log.Error("a row over the manager's per-row quota is not sent; the manager shows a placeholder of it, not synced (an RBAC row: drops it) (logged once per kind and quota, counted in AgentStats.OverQuota)",
		"group", row.Group, "kind", row.Kind, "quota", over.quota, "err", over.reject.Message)
}

// noteDeltaBudget logs when snapshots start to spend their delta budget
// and when they stop, once each way, as the manager logs a cluster's
// state once per outage: while it is spent, changes wait for each
// snapshot's end, which an operator should see (review-s9-a L7).
func (a *Agent) noteDeltaBudget(spent bool, snapshot uint64, allowance int) {
	switch {
	case spent && !a.budgetSpent:
		a.log.Info("changes wait for the snapshot's end: the manager's allowance for deltas between its parts is spent",
			"snapshot", snapshot, "allowance", allowance, "budget", allowance/deltaBudgetShare)
	case !spent && a.budgetSpent:
		a.log.Info("changes go between the snapshot's parts again", "snapshot", snapshot)
	}
	a.budgetSpent = spent
}

// agentCounters are the agent's running totals.
type agentCounters struct {
	sessions, rejects, messages, bytes, snapshots, parts, rows, tooBig atomic.Uint64
	overQuota, placeholders                                            atomic.Uint64
	deltasInSnapshot                                                   atomic.Uint64
	deltaBudgetSpent                                                   atomic.Uint64
	mostPartsInFlight                                                  atomic.Uint64
	lastReject                                                         atomic.Pointer[Reject]
}

// AgentStats is a snapshot of an agent's counters, for tests, benchmarks,
// logs and the agent's metrics (agentMetrics).
type AgentStats struct {
	// Sessions counts sessions the manager welcomed. Rejects counts
	// hellos and sessions the manager refused or ended with a reject, and
	// LastReject is the last of them; a session the edge ended over the
	// manager's messages is not one.
	Sessions, Rejects      uint64
	Messages, Bytes        uint64 // sent, before compression
	Snapshots, Parts, Rows uint64 // snapshots sent, their parts, rows in them
	Coalesced, Overflows   uint64 // changes merged in the buffer; buffer overflows
	TooBig                 uint64 // rows not sent because no message could carry them
	// OverQuota counts rows not sent because they are over one of the
	// manager's per-row quotas (Welcome.MaxLabelsPerRow, MaxStringBytes)
	// or the index's rules (index.ValidateRow), or do not encode: sent,
	// they would end the session. A row is counted each time it is not
	// sent (each snapshot or delta it would have gone into), and logged
	// once per kind and quota. The edge
	// sends a placeholder of the object instead (status Unknown, not
	// synced), as for a row TooBig counts; for an RBAC row, a delta sends
	// a delete of its key and a snapshot omits it.
	OverQuota uint64
	// Placeholders counts the placeholders encoded for sending in place
	// of rows held back (OverQuota, TooBig): one each time such a row
	// goes into a snapshot or a delta, counted when encoded, so one whose
	// send then fails (the connection lost) counts too. An RBAC row, or a
	// row whose key alone is over a quota, gets none.
	Placeholders uint64
	// DeltasInSnapshot counts deltas sent between the parts of a
	// snapshot (FeatureDeltasInSnapshot).
	DeltasInSnapshot uint64
	// DeltaBudgetSpent counts snapshots during which the edge stopped
	// sending deltas between the parts because they would have made the
	// manager keep more than half its allowance
	// (Welcome.MaxSnapshotDeltaBytes); the changes left waited for the
	// snapshot's end.
	DeltaBudgetSpent uint64
	// MostPartsInFlight is the most parts of a periodic resync the edge
	// has had unacknowledged at once: the largest its partWindow grew.
	MostPartsInFlight uint64
	LastReject        *Reject
}

// notePartsInFlight records n parts of a resync unacknowledged at once.
func (c *agentCounters) notePartsInFlight(n int) {
	for {
		most := c.mostPartsInFlight.Load()
		if uint64(n) <= most || c.mostPartsInFlight.CompareAndSwap(most, uint64(n)) {
			return
		}
	}
}

// NewAgent checks options and returns an Agent.
func NewAgent(opts AgentOptions) (*Agent, error) {
	if opts.Cluster == "" || opts.Token == nil || opts.Manager == "" {
		return nil, errors.New("edge: AgentOptions.Manager, Cluster and Token are required")
	}
	u, err := managerURL(opts.Manager)
	if err != nil {
		return nil, err
	}
	opts.Resync.setDefaults()
	setDefault(&opts.PingInterval, DefaultPingInterval)
	setDefault(&opts.PongWait, DefaultPongWait)
	setDefault(&opts.BackoffInitial, DefaultBackoffInitial)
	setDefault(&opts.BackoffMax, DefaultBackoffMax)
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultMaxPending
	}
	if opts.Registry == nil {
		opts.Registry = collector.NewRegistry()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Instance == "" {
		host, _ := os.Hostname() // only a readable prefix; the suffix makes it unique
		opts.Instance = strings.TrimPrefix(host+"-"+randomID()[:8], "-")
	}
	a := &Agent{
		opts: opts, url: u, buf: newBuffer(opts.Cluster, opts.MaxPending),
		log:      opts.Logger.With("cluster", opts.Cluster, "instance", opts.Instance),
		metadata: map[string]string{},
	}
	maps.Copy(a.metadata, opts.Metadata)
	if opts.Local != nil {
		if a.detail, err = newDetailClient(opts.Local); err != nil {
			return nil, err
		}
	}
	if opts.Registerer != nil { // last: an agent NewAgent refuses registers nothing
		if err := a.registerMetrics(opts.Registerer); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// managerURL turns http(s) into ws(s) and checks the URL.
func managerURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("edge: manager URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	case "ws", "wss":
	default:
		return "", fmt.Errorf("edge: manager URL %q: want ws, wss, http or https", s)
	}
	if u.Host == "" {
		return "", fmt.Errorf("edge: manager URL %q has no host", s)
	}
	return u.String(), nil
}

func newDetailClient(local *rest.Config) (*detailClient, error) {
	cfg := rest.CopyConfig(local)
	cfg.Impersonate = rest.ImpersonationConfig{} // each request brings the viewer's
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("edge: client for detail requests: %w", err)
	}
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	host = strings.TrimSuffix(host+cfg.APIPath, "/")
	return &detailClient{host: host, http: client, maxBody: DefaultMaxMessageBytes}, nil
}

// Instance returns the agent's instance id.
func (a *Agent) Instance() string { return a.opts.Instance }

// Stats returns the agent's counters.
func (a *Agent) Stats() AgentStats {
	s := &a.stats
	return AgentStats{
		Sessions: s.sessions.Load(), Rejects: s.rejects.Load(), Messages: s.messages.Load(), Bytes: s.bytes.Load(),
		Snapshots: s.snapshots.Load(), Parts: s.parts.Load(), Rows: s.rows.Load(), TooBig: s.tooBig.Load(), OverQuota: s.overQuota.Load(), Placeholders: s.placeholders.Load(),
		DeltasInSnapshot: s.deltasInSnapshot.Load(), DeltaBudgetSpent: s.deltaBudgetSpent.Load(), MostPartsInFlight: s.mostPartsInFlight.Load(), Coalesced: a.buf.coalesced.Load(), Overflows: a.buf.overflows.Load(), LastReject: s.lastReject.Load(),
	}
}

// Run collects and streams until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if a.opts.Local != nil {
		wg.Go(func() { a.collect(ctx) })
	}
	a.connectLoop(ctx)
	wg.Wait()
	return nil
}

// collect starts the collector against the local cluster, retrying until
// discovery succeeds, and refreshes the metadata until ctx ends.
func (a *Agent) collect(ctx context.Context) {
	backoff := retry.New(retry.EdgeLocal, nil)
	for ctx.Err() == nil {
		err := a.collectOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := backoff.Next()
		a.log.Warn("local API server not reachable; retrying", "err", err, "retry_in", wait.Round(time.Millisecond))
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

func (a *Agent) collectOnce(ctx context.Context) error {
	clients, err := collector.NewClients(a.opts.Local)
	if err != nil {
		return fmt.Errorf("local clients: %w", err)
	}
	run, err := collector.Start(ctx, collector.Config{
		Cluster: a.opts.Cluster, Clients: clients, Sink: a.buf, Registry: a.opts.Registry,
		Namespaces: a.opts.Namespaces, ExcludeNamespaces: a.opts.ExcludeNamespaces,
		Relist: a.opts.Resync.Interval, Logger: a.opts.Logger, OnEvent: a.buf.onEvent,
	})
	if err != nil {
		return err
	}
	a.buf.expect(run.Present)
	a.refreshMetadata(ctx, clients)
	t := time.NewTicker(metadataRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			run.Wait()
			return nil
		case <-t.C:
			a.refreshMetadata(ctx, clients)
		}
	}
}

// refreshMetadata reads the Kubernetes version and the Istio control
// plane into the metadata sent with Hello and full snapshots.
func (a *Agent) refreshMetadata(ctx context.Context, clients *collector.Clients) {
	md := map[string]string{}
	if v, err := clients.Discovery.ServerVersion(); err == nil {
		md["kubernetes.version"] = v.GitVersion
	} else {
		a.log.Warn("reading the Kubernetes version failed", "err", err)
	}
	istio, err := collector.DetectIstio(ctx, clients)
	if err != nil {
		a.log.Warn("istio detection failed", "err", err)
	}
	maps.Copy(md, istio.Metadata())
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	maps.Copy(a.metadata, md)
}

func (a *Agent) currentMetadata() map[string]string {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	return maps.Clone(a.metadata)
}

// connectLoop runs sessions until ctx ends, with jittered exponential
// backoff between them; a session may reset the backoff (resetsBackoff).
// AgentStats.Rejects and LastReject count the manager's rejects only: a
// session the edge ended over the manager's messages is its own
// complaint, logged with the session's end (it keeps the backoff all the
// same).
func (a *Agent) connectLoop(ctx context.Context) {
	backoff := retry.New(retry.Reconnect(a.opts.BackoffInitial, a.opts.BackoffMax), nil)
	for ctx.Err() == nil {
		start := time.Now()
		welcomed, err := a.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if resetsBackoff(welcomed, err, time.Since(start)) {
			backoff.Reset()
		}
		wait := backoff.Next()
		if rej := peerReject(err); rej != nil {
			a.stats.rejects.Add(1)
			a.stats.lastReject.Store(rej)
			wait = max(wait, time.Duration(rej.RetryAfterMillis)*time.Millisecond)
		}
		a.log.Warn("manager session ended", "err", err, "retry_in", wait.Round(time.Millisecond))
		if !backoff.Sleep(ctx, wait) {
			return
		}
	}
}

// stableSession is how long a session must have lasted for its end to
// reset the reconnect backoff even when the manager refused its data
// (resetsBackoff). A session that long had its data taken: its first
// snapshot and, at DefaultResyncMax, several full resyncs. A refusal after
// it is over what changed since, and the next try should come soon; were
// the backoff kept, one refusal long ago left every later reconnect at
// BackoffMax (review-s10-edge L-E2). It is ten times
// DefaultBackoffMax, so an edge refused this late every time costs the
// manager one full snapshot per stableSession at most.
const stableSession = 5 * time.Minute

// resetsBackoff reports whether a session that ended with err resets the
// reconnect backoff: it was welcomed, and either it lasted stableSession
// or it ended neither with the manager refusing the data the edge sent
// (refusesData of its peerReject) nor with the edge refusing the
// manager's messages (its own RejectError). The second repeats as the
// first does: a manager that sends what this edge refuses (a newer
// message type, a binary frame from a proxy) sends it in the next session
// too, and, reset, every such edge sent it a full snapshot twice a second
// (review-s11 E1).
func resetsBackoff(welcomed bool, err error, lasted time.Duration) bool {
	var own *RejectError
	return welcomed && (lasted >= stableSession || !refusesData(peerReject(err)) && !errors.As(err, &own))
}

// peerReject returns the reject the manager ended the session with (its
// Reject message, or the reason of its close frame), and nil for any other
// end, including a reject the edge raised itself over the manager's
// messages (a RejectError): that one says nothing of the edge's data
// (review-s10-edge L-E1).
func peerReject(err error) *Reject {
	var r *Reject
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// refusesData reports whether the manager ended a session (rej, nil for
// none) over the data the edge sent (a row over a quota, a snapshot too
// large, a message the manager found invalid or malformed, a row of
// another cluster). The next session sends the same data, from a full
// snapshot, and would end the same way, so the backoff is not reset: it
// keeps growing to BackoffMax. Reset, a welcomed session's next try came
// after BackoffInitial (about 0.5 s) every time, and the manager decoded
// the cluster's whole snapshot twice a second (review-s10 H1). The edge
// skips the rows the manager's per-row quotas refuse, so this only matters
// if the two sides' checks ever disagree. The Hub asks the same of the
// reject it ends a session with: such a cluster's RBAC rows are withheld
// (session.withholdPolicy), since the refusal keeps its revocations out.
func refusesData(rej *Reject) bool {
	if rej == nil {
		return false
	}
	switch rej.Reason {
	case ReasonQuota, ReasonOversize, ReasonInvalid, ReasonMalformed, ReasonWrongCluster:
		return true
	}
	return false
}

// session dials the manager, says hello, and streams until the session
// fails. It reports whether the manager welcomed it.
func (a *Agent) session(ctx context.Context) (bool, error) {
	token, err := a.opts.Token()
	if err != nil {
		return false, fmt.Errorf("edge token: %w", err)
	}
	conn := newConn()
	dialCtx, cancel := context.WithTimeout(ctx, DefaultHelloTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dialCtx, a.url, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, DialContext: a.opts.Dial, TLSClientConfig: a.opts.TLS,
		}},
		Subprotocols:    []string{Subprotocol},
		CompressionMode: websocket.CompressionNoContextTakeover,
		OnPongReceived:  conn.pong,
	})
	if err != nil {
		if resp != nil {
			return false, fmt.Errorf("connect to %s: HTTP %s: %w", a.url, resp.Status, err)
		}
		return false, fmt.Errorf("connect to %s: %w", a.url, err)
	}
	conn.ws = ws
	defer conn.closeNow() // idempotent; the session closed it already unless the handshake failed

	hello := &Message{Type: TypeHello, Seq: 1, Time: time.Now(), Hello: &Hello{
		Version: ProtocolVersion, Cluster: a.opts.Cluster, Instance: a.opts.Instance, Token: token,
		Metadata: a.currentMetadata(), Features: features,
	}}
	if _, err := conn.write(hello); err != nil {
		return false, err
	}
	m, _, err := conn.read(DefaultMaxMessageBytes, DefaultHelloTimeout)
	if err != nil {
		if rej, ok := closeReason(err); ok {
			return false, rej
		}
		return false, fmt.Errorf("waiting for welcome: %w", err)
	}
	switch {
	case m.Type == TypeReject:
		return false, m.Reject
	case m.Type != TypeWelcome || m.Seq != 1:
		return false, fmt.Errorf("%w: expected welcome with seq 1, got %s seq %d", ErrProtocol, m.Type, m.Seq)
	case m.Welcome.MaxMessageBytes < 4096 || m.Welcome.Window < 1:
		return false, fmt.Errorf("%w: welcome with unusable limits %+v", ErrProtocol, m.Welcome)
	}
	a.stats.sessions.Add(1)
	a.log.Info("connected to the manager", "session", m.Welcome.Session)
	s := newAgentSession(a, conn, m.Welcome)
	return true, s.run(ctx)
}
