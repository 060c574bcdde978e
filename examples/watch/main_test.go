package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/examples/internal/exampletest"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// TestWatchOutage runs the program against fleetgraph serving a real
// cluster, stops the cluster's API server long enough for several
// reconnect attempts to fail, and starts it again: the program prints
// exactly one DISCONNECTED line, with the reason, and one CONNECTED line.
func TestWatchOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := testcluster.Start(t, testcluster.Options{Name: "east"})
	fleet := exampletest.Serve(t, []exampletest.Cluster{{Cluster: c}}, "alice")
	fleet.WaitConnected(t, 2*time.Minute, index.StateConnected, "east")

	transitions := func() float64 {
		n := 0.0
		for _, s := range []index.ConnectionState{index.StateConnecting, index.StateConnected, index.StateDegraded, index.StateDisconnected} {
			n += fleet.Metric(t, "fleetgraph_cluster_state_transitions_total", map[string]string{"cluster": "east", "state": string(s)})
		}
		return n
	}
	before := transitions()
	w := startWatch(t, fleet, fleet.Token("admin"), "-clusters", "east")
	stopped := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	down := w.next(t, 2*time.Minute)
	// Several reconnect attempts fail meanwhile; none prints a line.
	failures := fleet.Metric(t, "fleetgraph_cluster_probe_failures_total", map[string]string{"cluster": "east"})
	exampletest.Eventually(t, time.Minute, "three more failed probes", func() error {
		if n := fleet.Metric(t, "fleetgraph_cluster_probe_failures_total", map[string]string{"cluster": "east"}); n < failures+3 {
			return fmt.Errorf("%v failed probes", n)
		}
		return nil
	})
	started := time.Now()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	up := w.next(t, 2*time.Minute)
	// Nothing else comes: the cluster stays connected.
	fleet.WaitConnected(t, time.Minute, index.StateConnected, "east")
	lines := w.stop(t)

	if !regexp.MustCompile(`^\S+ east CONNECTED -> DISCONNECTED: .+`).MatchString(down) {
		t.Errorf("first line %q, want east CONNECTED -> DISCONNECTED with the reason", down)
	}
	if !regexp.MustCompile(`^\S+ east DISCONNECTED -> CONNECTED$`).MatchString(up) {
		t.Errorf("second line %q, want east DISCONNECTED -> CONNECTED", up)
	}
	if len(lines) > 0 {
		t.Errorf("more lines after CONNECTED: %q", lines)
	}
	if n := transitions() - before; n != 2 {
		t.Errorf("the server counted %v transitions of east, want 2", n)
	}
	for _, l := range []struct {
		line  string
		after time.Time
	}{{down, stopped}, {up, started}} {
		at, err := time.Parse(time.RFC3339, strings.Fields(l.line)[0])
		if err != nil || at.Before(l.after.Truncate(time.Second)) {
			t.Errorf("line %q: time %v (%v), want after %v", l.line, at, err, l.after)
		}
	}
}

// TestWatchRefused: the program says why when the server refuses it.
func TestWatchRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := testcluster.Start(t, testcluster.Options{Name: "east"})
	fleet := exampletest.Serve(t, []exampletest.Cluster{{Cluster: c}})
	for _, tc := range []struct {
		token string
		args  []string
		want  string
	}{
		{"", []string{"-url", fleet.URL}, "set FLEETGRAPH_TOKEN"},
		{"wrong", []string{"-url", fleet.URL}, "the server closed the connection: 4403 Forbidden"},
		{"x", []string{"-url", "ftp://example"}, "want http or https"},
	} {
		err := run(t.Context(), tc.args, tc.token, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: %v, want an error with %q", tc.token, tc.args, err, tc.want)
		}
	}
}

// watch is the program running in the test.
type watch struct {
	cancel context.CancelFunc
	done   chan error
	lines  chan string
	out    *io.PipeWriter
	wg     sync.WaitGroup
}

// startWatch runs the program until stop, and returns once its
// subscription is open on the server, so that no transition after it can
// be missed.
func startWatch(t *testing.T, fleet *exampletest.Fleet, token string, args ...string) *watch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, out := io.Pipe()
	w := &watch{cancel: cancel, done: make(chan error, 1), lines: make(chan string, 100), out: out}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer close(w.lines)
		s := bufio.NewScanner(r)
		for s.Scan() {
			t.Logf("watch: %s", s.Text())
			w.lines <- s.Text()
		}
	}()
	go func() { w.done <- run(ctx, append([]string{"-url", fleet.URL}, args...), token, out, io.Discard) }()
	t.Cleanup(func() { w.stop(t) })
	exampletest.Eventually(t, 30*time.Second, "the subscription open", func() error {
		select {
		case err := <-w.done:
			t.Fatalf("watch ended: %v", err)
		default:
		}
		if n := fleet.Metric(t, "fleetgraph_graphql_subscriptions_active", map[string]string{"subscription": "clusterConnection"}); n != 1 {
			return fmt.Errorf("%v clusterConnection subscriptions", n)
		}
		return nil
	})
	return w
}

// next returns the next line, failing the test after timeout.
func (w *watch) next(t *testing.T, timeout time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			t.Fatal("watch ended its output")
		}
		return l
	case <-time.After(timeout):
		t.Fatalf("no line from watch within %s", timeout)
		return ""
	}
}

// stop interrupts the program, checks that it exits cleanly, and returns
// the lines it printed that were not read yet.
func (w *watch) stop(t *testing.T) []string {
	t.Helper()
	if w.cancel == nil {
		return nil
	}
	w.cancel()
	w.cancel = nil
	if err := <-w.done; err != nil {
		t.Errorf("watch: %v", err)
	}
	_ = w.out.Close()
	w.wg.Wait()
	var rest []string
	for l := range w.lines {
		rest = append(rest, l)
	}
	return rest
}
