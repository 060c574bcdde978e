package connection

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the manager's Prometheus metrics. They exist even when no
// registerer is given, so tests can read them.
type metrics struct {
	probes         *prometheus.CounterVec
	probeFailures  *prometheus.CounterVec
	transitions    *prometheus.CounterVec
	staleSignals   *prometheus.CounterVec
	signalsDropped *prometheus.CounterVec
	forgiven       *prometheus.CounterVec
	waitingToSync  prometheus.Gauge
	syncing        prometheus.Gauge
	relistFailures *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_probes_total", Help: "Readiness probes sent to each cluster's API server.",
		}, []string{"cluster"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_probe_failures_total", Help: "Readiness probes that failed or timed out.",
		}, []string{"cluster"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_state_transitions_total", Help: "Connection state transitions, by the state entered.",
		}, []string{"cluster", "state"}),
		staleSignals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_stale_signals_total", Help: "Signals from an older connection, ignored by generation.",
		}, []string{"cluster"}),
		signalsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_signals_dropped_total", Help: "Lifecycle signals dropped because the lifecycle was busy.",
		}, []string{"cluster"}),
		forgiven: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_probe_timeouts_forgiven_total",
			Help: "Readiness probes that timed out but did not count as failures, because the cluster's lists and watches delivered data meanwhile.",
		}, []string{"cluster"}),
		waitingToSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_clusters_waiting_to_sync", Help: "Clusters waiting for their turn to start an initial sync (MaxConcurrentSyncs).",
		}),
		syncing: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetgraph_clusters_syncing", Help: "Clusters in an initial sync: listing every kind after connecting or reconnecting.",
		}),
		relistFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_cluster_relist_failures_total",
			Help: "Anti-entropy relists of a kind that failed. The kind's watch keeps its rows, but what it missed is not repaired; a kind that counts up at every --relist never gets repaired (a list longer than etcd's compaction interval, say).",
		}, []string{"cluster", "kind"}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		m.probes, m.probeFailures, m.transitions, m.staleSignals, m.signalsDropped, m.forgiven, m.waitingToSync, m.syncing, m.relistFailures,
	} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("register connection metrics: %w", err)
		}
	}
	return nil
}
