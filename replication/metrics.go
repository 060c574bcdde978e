package replication

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node's Prometheus metrics. They exist without a
// registerer, so tests can read them.
type metrics struct {
	applied        prometheus.Counter
	lag            prometheus.Histogram
	caughtUp       prometheus.Gauge
	pending        prometheus.Gauge
	ignored        *prometheus.CounterVec
	restores       prometheus.Counter
	published      prometheus.Counter
	publishedBytes prometheus.Counter
	publishRetries prometheus.Counter
	snapshots      prometheus.Counter
	owned          prometheus.Gauge
	fenced         prometheus.Counter
	dropped        prometheus.Counter
	streamBytes    prometheus.Gauge
	streamMessages prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_messages_read_total", Help: "Messages of the stream this process read and applied (or skipped).",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetgraph_replication_lag_seconds",
			Help:    "Time from a write on the cluster's owner to its application on this replica, once caught up (the clocks of both are used).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		caughtUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_caught_up", Help: "1 once this replica has applied every message the stream held when it started reading.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_pending_messages", Help: "Messages of the stream this replica has not read yet.",
		}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_replication_ignored_messages_total",
			Help: "Messages not applied: stale_owner (fenced), gap, awaiting_snapshot, invalid, undecodable, wrong_subject.",
		}, []string{"reason"}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_snapshots_applied_total", Help: "Cluster snapshots this replica loaded.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_published_messages_total", Help: "Messages this owner wrote to the stream.",
		}),
		publishedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_published_bytes_total", Help: "Bytes this owner wrote to the stream.",
		}),
		publishRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_publish_retries_total", Help: "Publishes retried after a failure other than fencing.",
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_snapshots_published_total", Help: "Cluster snapshots this owner wrote (takeovers and compactions).",
		}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_owned_clusters", Help: "Clusters this process owns (collects and publishes).",
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_fenced_total", Help: "Clusters this process lost because another owner took them over.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_dropped_writes_total", Help: "Writes for clusters this process does not own, dropped (fencing).",
		}),
		streamBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_stream_bytes", Help: "Bytes in the stream (refreshed every 15 s).",
		}),
		streamMessages: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_stream_messages", Help: "Messages in the stream (refreshed every 15 s).",
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		m.applied, m.lag, m.caughtUp, m.pending, m.ignored, m.restores, m.published, m.publishedBytes,
		m.publishRetries, m.snapshots, m.owned, m.fenced, m.dropped, m.streamBytes, m.streamMessages,
	} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("register replication metrics: %w", err)
		}
	}
	return nil
}
