package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// hubMetrics are the manager side's Prometheus metrics. They exist even
// without a registerer, so tests can read them.
type hubMetrics struct {
	sessions      prometheus.Gauge
	handshakes    *prometheus.CounterVec
	rejects       *prometheus.CounterVec
	messages      *prometheus.CounterVec
	bytesIn       *prometheus.CounterVec
	bytesOut      *prometheus.CounterVec
	lag           prometheus.Histogram
	snapshotApply prometheus.Histogram
	pendingBytes  prometheus.Gauge
	transitions   *prometheus.CounterVec
	details       *prometheus.CounterVec
}

func newHubMetrics() *hubMetrics {
	return &hubMetrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_edge_sessions", Help: "Edge sessions open now.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_handshakes_total", Help: "Edge hellos, by result (welcome or reject).",
		}, []string{"result"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_rejects_total", Help: "Hellos refused and sessions ended by the manager, by reason.",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_messages_total", Help: "Messages received from edges, by cluster and type.",
		}, []string{"cluster", "type"}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_received_bytes_total", Help: "Message bytes received from edges, after decompression.",
		}, []string{"cluster"}),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_sent_bytes_total", Help: "Message bytes sent to edges, before compression.",
		}, []string{"cluster"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleetgraph_edge_message_lag_seconds", Help: "Time from an edge sending a message to the manager applying it (includes clock skew).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		snapshotApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleetgraph_edge_snapshot_apply_seconds", Help: "Time to apply a complete snapshot to the index.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		pendingBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_edge_pending_snapshot_bytes",
			Help: "Bytes held for edge snapshots whose final part has not come: their decoded rows and what deltas wrote meanwhile, as MaxSnapshotBytes counts them.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_state_transitions_total", Help: "Push-mode cluster state transitions, by the state entered.",
		}, []string{"cluster", "state"}),
		details: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_edge_detail_requests_total", Help: "Object detail requests tunnelled to edges, by result.",
		}, []string{"cluster", "result"}),
	}
}

func (m *hubMetrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		m.sessions, m.handshakes, m.rejects, m.messages, m.bytesIn, m.bytesOut,
		m.lag, m.snapshotApply, m.pendingBytes, m.transitions, m.details,
	} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("register edge metrics: %w", err)
		}
	}
	return nil
}
