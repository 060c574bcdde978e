package graph

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/fleetgraph/fleetgraph/index"
)

// metrics are the package's Prometheus metrics. Label values are bounded:
// operations are named by their root fields (schema names, never
// client-chosen operation names), outcomes and reasons are fixed sets.
type metrics struct {
	operations    *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	active        *prometheus.GaugeVec
	started       *prometheus.CounterVec
	ended         *prometheus.CounterVec
	deliveredC    map[subKind]prometheus.Counter
	authFailures  *prometheus.CounterVec
	httpRejected  *prometheus.CounterVec
	wsConnections prometheus.Gauge
	reads         *prometheus.GaugeVec
	readsDone     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, store *index.Store) (*metrics, error) {
	const ns = "fleetgraph"
	m := &metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "operations_total",
			Help: "GraphQL queries and subscription starts by operation (root fields), type and outcome (ok, error, rejected).",
		}, []string{"operation", "type", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: "graphql", Name: "operation_duration_seconds",
			Help:    "Time from reading a GraphQL query to its response, by operation (root fields).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"operation", "type"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "graphql", Name: "subscriptions_active",
			Help: "Open subscriptions by field.",
		}, []string{"subscription"}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "subscriptions_started_total",
			Help: "Subscriptions started by field.",
		}, []string{"subscription"}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "subscriptions_ended_total",
			Help: "Subscriptions ended by field and reason (completed, slow_consumer, resync, shutdown, error).",
		}, []string{"subscription", "reason"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "authentication_failures_total",
			Help: "Requests and websockets rejected because authentication failed, by transport.",
		}, []string{"transport"}),
		httpRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "http_rejected_total",
			Help: "HTTP requests rejected before GraphQL execution, by reason (body_too_large, origin, method).",
		}, []string{"reason"}),
		wsConnections: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "graphql", Name: "websocket_connections",
			Help: "Open GraphQL websocket connections.",
		}),
		reads: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: "graphql", Name: "expensive_reads",
			Help: "Scans (label selector, name search, an order other than name) and live object reads, running or waiting for a slot (see Limits).",
		}, []string{"kind", "state"}),
		readsDone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "graphql", Name: "expensive_reads_total",
			Help: "Scans and live object reads that ran (to their end or until stopped), by kind.",
		}, []string{"kind"}),
		deliveredC: map[subKind]prometheus.Counter{},
	}
	delivered := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "graphql", Name: "subscription_events_total",
		Help: "Events delivered to subscriptions, by field.",
	}, []string{"subscription"})
	for _, k := range []subKind{subObjects, subClusters, subFleet} {
		m.deliveredC[k] = delivered.WithLabelValues(fieldOf(k))
		m.active.WithLabelValues(fieldOf(k))
	}
	for _, c := range []prometheus.Collector{
		m.operations, m.latency, m.active, m.started, m.ended, delivered, newStreamCollector(store),
		m.authFailures, m.httpRejected, m.wsConnections, m.reads, m.readsDone, newClusterCollector(store),
		newDictionaryCollector(store),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("graph: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) subscriptionStarted(k subKind) {
	m.active.WithLabelValues(fieldOf(k)).Inc()
	m.started.WithLabelValues(fieldOf(k)).Inc()
}

func (m *metrics) subscriptionEnded(k subKind, reason string) {
	m.active.WithLabelValues(fieldOf(k)).Dec()
	m.ended.WithLabelValues(fieldOf(k), reason).Inc()
}

func (m *metrics) delivered(k subKind)       { m.deliveredC[k].Inc() }
func (m *metrics) rejected(reason string)    { m.httpRejected.WithLabelValues(reason).Inc() }
func (m *metrics) wsConnected(delta float64) { m.wsConnections.Add(delta) }

// subKind is a subscription field, as metrics label it: the kind of index
// stream it reads.
type subKind = index.StreamKind

// The subscription fields.
const (
	subObjects  = index.StreamObjects
	subClusters = index.StreamClusters
	subFleet    = index.StreamFleet
)

// fieldOf returns the GraphQL field of a stream kind, the metrics label.
func fieldOf(k subKind) string {
	switch k {
	case subObjects:
		return "objectChanges"
	case subClusters:
		return "clusterConnection"
	case subFleet:
		return "fleet"
	}
	return k.String()
}

// streamCollector reports the index's stream counters
// (index.Store.StreamStats) at scrape time: catch-ups and dropped events
// by field, and the streams the fan-out routes to.
type streamCollector struct {
	store                     *index.Store
	catchUps, dropped, fanout *prometheus.Desc
}

func newStreamCollector(store *index.Store) *streamCollector {
	const ns, sub = "fleetgraph", "graphql"
	return &streamCollector{
		store: store,
		catchUps: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "subscription_catchups_total"),
			"Times a subscription's queue filled and it caught up from the change feed's replay ring instead, by field.", []string{"subscription"}, nil),
		dropped: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "subscription_events_dropped_total"),
			"Change events never delivered because their subscription fell out of the replay ring and was ended with SLOW_CONSUMER, by field.", []string{"subscription"}, nil),
		fanout: prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "fanout_subscribers"),
			"Subscriptions registered with the index's change-feed fan-out.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.catchUps
	ch <- c.dropped
	ch <- c.fanout
}

// Collect implements prometheus.Collector.
func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.StreamStats()
	for _, k := range []subKind{subObjects, subClusters, subFleet} {
		ch <- prometheus.MustNewConstMetric(c.catchUps, prometheus.CounterValue, float64(st.CatchUps[k]), fieldOf(k))
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.Dropped[k]), fieldOf(k))
	}
	ch <- prometheus.MustNewConstMetric(c.fanout, prometheus.GaugeValue, float64(st.Streams))
}

// clusterCollector reports the cluster rows at scrape time, so the gauges
// can never drift from them: fleetgraph_clusters{state}, and per cluster
// fleetgraph_cluster_up (1 while CONNECTED or DEGRADED: its rows are live)
// and fleetgraph_cluster_last_seen_timestamp_seconds (its rows are as of
// then), which the chart's alerts for lost clusters and stale data use.
type clusterCollector struct {
	store                  *index.Store
	desc, up, seen, errors *prometheus.Desc
}

func newClusterCollector(store *index.Store) *clusterCollector {
	return &clusterCollector{
		store: store,
		desc:  prometheus.NewDesc("fleetgraph_clusters", "Member clusters by connection state.", []string{"state"}, nil),
		up: prometheus.NewDesc("fleetgraph_cluster_up",
			"1 while the cluster is CONNECTED or DEGRADED (its rows are live), 0 while its rows are last-known state.", []string{"cluster"}, nil),
		seen: prometheus.NewDesc("fleetgraph_cluster_last_seen_timestamp_seconds",
			"When the cluster last answered (Unix time); its rows are at least this fresh.", []string{"cluster"}, nil),
		errors: prometheus.NewDesc("fleetgraph_cluster_kind_errors",
			"Kinds of the cluster that fail to collect now.", []string{"cluster"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.up
	ch <- c.seen
	ch <- c.errors
}

// Collect implements prometheus.Collector.
func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[index.ConnectionState]int{
		index.StateConnecting: 0, index.StateConnected: 0, index.StateDegraded: 0, index.StateDisconnected: 0,
	}
	for _, cl := range c.store.ListClusters(nil) {
		st := cl.State
		if st == "" {
			st = index.StateConnecting
		}
		counts[st]++
		up := 0.0
		if !cl.Stale() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, cl.Name)
		if !cl.LastSeen.IsZero() {
			ch <- prometheus.MustNewConstMetric(c.seen, prometheus.GaugeValue, float64(cl.LastSeen.UnixNano())/1e9, cl.Name)
		}
		ch <- prometheus.MustNewConstMetric(c.errors, prometheus.GaugeValue, float64(len(c.store.KindErrors(nil, cl.Name))), cl.Name)
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(st))
	}
}

// dictionaryCollector reports the sizes of the index's string
// dictionaries at scrape time (index.Store.DictionaryStats): under churn
// they follow the live rows, and one that keeps growing means strings are
// not given back.
type dictionaryCollector struct {
	store *index.Store
	desc  *prometheus.Desc
}

func newDictionaryCollector(store *index.Store) *dictionaryCollector {
	return &dictionaryCollector{store: store, desc: prometheus.NewDesc("fleetgraph_index_dictionary_strings",
		"Distinct strings the index holds for its rows (in use, or unused and waiting to be reclaimed), by dictionary.",
		[]string{"dictionary"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *dictionaryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *dictionaryCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store.DictionaryStats()
	for _, d := range []struct {
		name string
		n    int
	}{
		{"clusters", st.Clusters},
		{"kinds", st.Kinds},
		{"namespaces", st.Namespaces},
		{"label_keys", st.LabelKeys},
		{"label_values", st.LabelValues},
		{"label_pairs", st.LabelPairs},
	} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(d.n), d.name)
	}
}

// operationMetrics is a gqlgen response interceptor that counts and times
// queries. Subscriptions are counted when their pump starts and ends.
type operationMetrics struct{ m *metrics }

var _ interface {
	graphql.HandlerExtension
	graphql.ResponseInterceptor
} = operationMetrics{}

// ExtensionName implements graphql.HandlerExtension.
func (operationMetrics) ExtensionName() string { return "fleetgraph.Metrics" }

// Validate implements graphql.HandlerExtension.
func (operationMetrics) Validate(graphql.ExecutableSchema) error { return nil }

// InterceptResponse implements graphql.ResponseInterceptor.
func (om operationMetrics) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp == nil {
		return nil
	}
	name, typ := "invalid", "unknown"
	var opCtx *graphql.OperationContext
	if graphql.HasOperationContext(ctx) {
		opCtx = graphql.GetOperationContext(ctx)
		if op := opCtx.Operation; op != nil {
			name, typ = operationName(op), string(op.Operation)
		}
	}
	outcome := outcomeOf(resp)
	if typ == string(ast.Subscription) && outcome != "rejected" {
		return resp // events of a running subscription
	}
	om.m.operations.WithLabelValues(name, typ, outcome).Inc()
	if opCtx != nil && !opCtx.Stats.OperationStart.IsZero() {
		om.m.latency.WithLabelValues(name, typ).Observe(graphql.Now().Sub(opCtx.Stats.OperationStart).Seconds())
	}
	return resp
}

// operationName names an operation by its sorted root fields, e.g.
// "facets,objects"; introspection is "introspection".
func operationName(op *ast.OperationDefinition) string {
	var names []string
	for _, sel := range op.SelectionSet {
		f, ok := sel.(*ast.Field)
		if !ok {
			return "fragment"
		}
		n := f.Name
		if strings.HasPrefix(n, "__") {
			if n == "__typename" {
				continue
			}
			n = "introspection"
		}
		names = append(names, n)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return "__typename"
	}
	return strings.Join(names, ",")
}

// outcomeOf classifies a response: rejected documents (parse, validation
// and limit errors, no data), errors, or ok.
func outcomeOf(resp *graphql.Response) string {
	if len(resp.Errors) == 0 {
		return "ok"
	}
	for _, e := range resp.Errors {
		switch e.Extensions["code"] {
		case codeValidationFailed, "GRAPHQL_PARSE_FAILED", "COMPLEXITY_LIMIT_EXCEEDED":
			return "rejected"
		}
	}
	return "error"
}
