package edge

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAgentMetrics gives each of the agent's counters a value of its own
// and wants each metric NewAgent registers to show its counter's value:
// a metric reading the wrong counter, or one missing, fails.
func TestAgentMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, err := NewAgent(AgentOptions{
		Manager: "https://manager.invalid", Cluster: "edge-a", Token: func() (string, error) { return "tok", nil }, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &a.stats
	s.sessions.Store(1)
	s.rejects.Store(2)
	s.messages.Store(3)
	s.bytes.Store(4)
	s.snapshots.Store(5)
	s.parts.Store(6)
	s.rows.Store(7)
	s.tooBig.Store(8)
	s.overQuota.Store(9)
	s.deltasInSnapshot.Store(10)
	s.deltaBudgetSpent.Store(11)
	a.buf.coalesced.Store(12)
	a.buf.overflows.Store(13)
	s.notePartsInFlight(14)
	s.placeholders.Store(15)
	want := map[string]float64{
		"fleetgraph_edge_agent_sessions_total":            1,
		"fleetgraph_edge_agent_rejects_total":             2,
		"fleetgraph_edge_agent_messages_sent_total":       3,
		"fleetgraph_edge_agent_sent_bytes_total":          4,
		"fleetgraph_edge_agent_snapshots_sent_total":      5,
		"fleetgraph_edge_agent_snapshot_parts_sent_total": 6,
		"fleetgraph_edge_agent_snapshot_rows_sent_total":  7,
		"fleetgraph_edge_agent_rows_too_big_total":        8,
		"fleetgraph_edge_agent_rows_over_quota_total":     9,
		"fleetgraph_edge_agent_deltas_in_snapshot_total":  10,
		"fleetgraph_edge_agent_delta_budget_spent_total":  11,
		"fleetgraph_edge_agent_coalesced_changes_total":   12,
		"fleetgraph_edge_agent_buffer_overflows_total":    13,
		"fleetgraph_edge_agent_most_parts_in_flight":      14,
		"fleetgraph_edge_agent_placeholders_sent_total":   15,
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				got[f.GetName()] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("agent metrics\n%v\nwant\n%v", got, want)
	}
}
