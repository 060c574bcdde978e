package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// agentMetric is one of the agent's counters (AgentStats) as a Prometheus
// metric.
type agentMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(AgentStats) uint64
}

// agentMetrics are the edge agent's Prometheus metrics. They are read from
// the agent's counters (Stats) at each scrape, so the counters stay the
// one record and the metrics cannot drift from what tests and logs see.
var agentMetrics = []agentMetric{
	agentCounter("sessions_total", "Sessions the manager welcomed; each after the first is a reconnect.", func(s AgentStats) uint64 { return s.Sessions }),
	agentCounter("rejects_total", "Hellos refused and sessions ended by the manager.", func(s AgentStats) uint64 { return s.Rejects }),
	agentCounter("messages_sent_total", "Messages sent to the manager.", func(s AgentStats) uint64 { return s.Messages }),
	agentCounter("sent_bytes_total", "Message bytes sent to the manager, before compression.", func(s AgentStats) uint64 { return s.Bytes }),
	agentCounter("snapshots_sent_total", "Snapshots (full resyncs) sent.", func(s AgentStats) uint64 { return s.Snapshots }),
	agentCounter("snapshot_parts_sent_total", "Parts of snapshots sent.", func(s AgentStats) uint64 { return s.Parts }),
	agentCounter("snapshot_rows_sent_total", "Rows sent in snapshots.", func(s AgentStats) uint64 { return s.Rows }),
	agentCounter("rows_too_big_total", "Rows not sent because no message could carry them.", func(s AgentStats) uint64 { return s.TooBig }),
	agentCounter("rows_over_quota_total", "Rows not sent because they are over one of the manager's per-row quotas or the index's rules, or do not encode; counted each time such a row goes into a snapshot or a delta.", func(s AgentStats) uint64 { return s.OverQuota }),
	agentCounter("placeholders_sent_total", "Placeholders (status Unknown, not synced) encoded for sending in place of rows too big or over a quota: one each time such a row goes into a snapshot or a delta, counted when encoded, so one whose send then fails counts too.", func(s AgentStats) uint64 { return s.Placeholders }),
	agentCounter("deltas_in_snapshot_total", "Deltas sent between the parts of a snapshot.", func(s AgentStats) uint64 { return s.DeltasInSnapshot }),
	agentCounter("delta_budget_spent_total", "Snapshots during which deltas waited for the snapshot's end, the manager's allowance for them spent.", func(s AgentStats) uint64 { return s.DeltaBudgetSpent }),
	agentCounter("coalesced_changes_total", "Changes merged in the buffer with one not yet sent.", func(s AgentStats) uint64 { return s.Coalesced }),
	agentCounter("buffer_overflows_total", "Times the buffer of changes overflowed (a full resync follows).", func(s AgentStats) uint64 { return s.Overflows }),
	{
		desc: prometheus.NewDesc("fleetgraph_edge_agent_most_parts_in_flight", "The most parts of a periodic resync unacknowledged at once.", nil, nil),
		typ:  prometheus.GaugeValue, value: func(s AgentStats) uint64 { return s.MostPartsInFlight },
	},
}

// agentCounter is a counter of agentMetrics, named
// fleetgraph_edge_agent_<name> (the manager's edge metrics are
// fleetgraph_edge_<name>).
func agentCounter(name, help string, value func(AgentStats) uint64) agentMetric {
	return agentMetric{desc: prometheus.NewDesc("fleetgraph_edge_agent_"+name, help, nil, nil), typ: prometheus.CounterValue, value: value}
}

// agentCollector collects an agent's agentMetrics.
type agentCollector struct{ a *Agent }

// Describe implements prometheus.Collector.
func (c agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range agentMetrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector.
func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.a.Stats()
	for _, m := range agentMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, float64(m.value(s)))
	}
}

// registerMetrics registers the agent's metrics with r.
func (a *Agent) registerMetrics(r prometheus.Registerer) error {
	if err := r.Register(agentCollector{a}); err != nil {
		return fmt.Errorf("register edge agent metrics: %w", err)
	}
	return nil
}
