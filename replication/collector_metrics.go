package replication

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// collectorMetrics are a Collector's Prometheus metrics.
type collectorMetrics struct {
	takeovers *prometheus.CounterVec
	owned     *prometheus.GaugeVec
	lost      prometheus.Counter
	renewals  prometheus.Counter
	checks    *prometheus.CounterVec
}

func newCollectorMetrics() *collectorMetrics {
	return &collectorMetrics{
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_replication_takeovers_total",
			Help: "Clusters this collector took: first (a new cluster), handover (released by its previous collector), failover (its previous collector stopped renewing its lease).",
		}, []string{"reason"}),
		owned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetgraph_replication_cluster_owned", Help: "1 for each cluster this collector holds the lease of and collects.",
		}, []string{"cluster", "mode"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_clusters_lost_total", Help: "Clusters another collector took from this one while it held them (fencing).",
		}),
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetgraph_replication_lease_renewals_total", Help: "Renewals of this collector's lease.",
		}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetgraph_replication_lease_checks_total",
			Help: "Collectors whose lease this collector's cache showed unchanged for a lease duration, by what a read from the API server found: dead, or alive (the cache was behind: this process was paused or its lease watch stalled).",
		}, []string{"verdict"}),
	}
}

func (m *collectorMetrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.takeovers, m.owned, m.lost, m.renewals, m.checks} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("register collector metrics: %w", err)
		}
	}
	return nil
}
