package connection

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/index"
)

// TestRelistFailureIsCountedNotSignalled checks that a failed anti-entropy
// relist adds to fleetgraph_cluster_relist_failures_total and sends the
// connection nothing (a signal would kick a probe, as a failed watch
// does), while the collector's other events still reach the connection.
func TestRelistFailureIsCountedNotSignalled(t *testing.T) {
	c := &cluster{m: &Manager{metrics: newMetrics()}, spec: Spec{Name: "c1"}, signals: make(chan signal, signalBuffer)}
	pods := index.Kind{Version: "v1", Kind: "Pod", Resource: "pods"}
	failures := c.m.metrics.relistFailures.WithLabelValues("c1", pods.GroupKind())

	c.collectorEvent(1, collector.Event{Type: collector.RelistFailed, Kind: pods, Err: errors.New("continue token expired")})
	c.collectorEvent(1, collector.Event{Type: collector.RelistFailed, Kind: pods, Err: errors.New("continue token expired")})
	if got := testutil.ToFloat64(failures); got != 2 {
		t.Errorf("relist failures counted %v, want 2", got)
	}
	select {
	case s := <-c.signals:
		t.Errorf("a failed relist signalled the connection: %+v", s)
	default:
	}

	c.collectorEvent(1, collector.Event{Type: collector.WatchFailed, Kind: pods, Err: errors.New("stream closed")})
	select {
	case s := <-c.signals:
		if s.typ != sigWatchFailed {
			t.Errorf("a failed watch sent signal %v, want sigWatchFailed", s.typ)
		}
	default:
		t.Error("a failed watch sent the connection no signal")
	}
	if got := testutil.ToFloat64(failures); got != 2 {
		t.Errorf("relist failures counted %v after a failed watch, want 2", got)
	}
}
