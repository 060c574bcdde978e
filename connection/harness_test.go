package connection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon and client-go's process-wide watchers
		// start on first use and live for the process.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Type).updateUnfinishedWorkLoop"),
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.BackoffUntilWithContext.func1"),
	)
}

// transition is one recorded state change of a cluster.
type transition struct {
	cluster string
	state   index.ConnectionState
	at      time.Time
	err     string
}

// recorder follows the index change feed, as a subscriber would, and
// records every cluster state transition.
type recorder struct {
	mu     sync.Mutex
	events []transition
	wake   chan struct{}
}

func newRecorder(t *testing.T, store *index.Store) *recorder {
	r := &recorder{wake: make(chan struct{}, 1)}
	sub, err := store.Subscribe(store.LastSeq())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sub.Close()
		var buf []*index.Event
		for {
			evs, err := sub.Next(ctx, buf[:0])
			if err != nil {
				return
			}
			buf = evs
			for _, e := range evs {
				if e.Type != index.EventCluster {
					continue
				}
				if e.PreviousCluster != nil && e.PreviousCluster.State == e.ClusterRow.State {
					continue
				}
				r.mu.Lock()
				r.events = append(r.events, transition{e.Cluster, e.ClusterRow.State, time.Now(), e.ClusterRow.LastError})
				r.mu.Unlock()
				select {
				case r.wake <- struct{}{}:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// waitFor waits for the n-th transition of cluster into state (counting
// from 1) and returns when it happened.
func (r *recorder) waitFor(t *testing.T, cluster string, state index.ConnectionState, n int, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		seen := 0
		for _, e := range r.events {
			if e.cluster == cluster && e.state == state {
				seen++
				if seen == n {
					r.mu.Unlock()
					return e.at
				}
			}
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("cluster %s: no %s transition #%d within %s; transitions: %v", cluster, state, n, timeout, r.of(cluster))
		}
	}
}

func (r *recorder) count(cluster string, state index.ConnectionState) int {
	n := 0
	for _, e := range r.of(cluster) {
		if e.state == state {
			n++
		}
	}
	return n
}

func (r *recorder) of(cluster string) []transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []transition
	for _, e := range r.events {
		if e.cluster == cluster {
			out = append(out, e)
		}
	}
	return out
}

// harness runs a Manager over real clusters for one test.
type harness struct {
	store *index.Store
	mgr   *Manager
	rec   *recorder
}

func specFor(c *testcluster.Cluster) Spec {
	return Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}
}

func newHarness(t *testing.T, opts Options, specs ...Spec) *harness {
	t.Helper()
	h := &harness{store: index.New()}
	opts.Store = h.store
	mgr, err := NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.mgr = mgr
	h.rec = newRecorder(t, h.store)
	for _, s := range specs {
		if err := mgr.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return h
}

// startClusters starts clusters concurrently.
func startClusters(t *testing.T, opts ...testcluster.Options) []*testcluster.Cluster {
	t.Helper()
	out := make([]*testcluster.Cluster, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := testcluster.New(t.Context(), o)
			if err != nil {
				t.Errorf("start %s: %v", o.Name, err)
				return
			}
			out[i] = c
		}()
	}
	wg.Wait()
	for _, c := range out {
		if c == nil {
			continue
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("cluster %s log tail:\n%s", c.Name, c.LogTail(30))
			}
			if err := c.Close(); err != nil {
				t.Errorf("close %s: %v", c.Name, err)
			}
		})
	}
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// rows returns every row of a cluster in the index, keyed by
// kind/namespace/name, with its resource version.
func rows(t *testing.T, store *index.Store, cluster string) map[string]string {
	t.Helper()
	out := map[string]string{}
	after := ""
	for {
		page, err := store.Query(context.Background(), index.Query{
			Filter: index.Filter{Clusters: []string{cluster}}, First: index.MaxPageSize, After: after,
			Access: &index.Access{All: true},
		})
		if err != nil {
			t.Fatalf("query: %v", err)
		}
		for _, e := range page.Edges {
			o := e.Object
			k := fmt.Sprintf("%s.%s/%s/%s", o.Kind, o.Group, o.Namespace, o.Name)
			if _, dup := out[k]; dup {
				t.Fatalf("row %s listed twice", k)
			}
			out[k] = o.ResourceVersion
		}
		if !page.HasNextPage {
			return out
		}
		after = page.Edges[len(page.Edges)-1].Cursor
	}
}

// eventually retries check until it returns nil or timeout passes, and
// returns how long it took.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < timeout {
		if err = check(); err == nil {
			return time.Since(start)
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("%s: not true within %s: %v", what, timeout, err)
	return 0
}

func diffKeys(want, got map[string]string) error {
	var missing, extra, changed []string
	for k, v := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing = append(missing, k)
		case g != v:
			changed = append(changed, fmt.Sprintf("%s rv %s!=%s", k, g, v))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(extra)+len(changed) == 0 {
		return nil
	}
	slices.Sort(missing)
	slices.Sort(extra)
	slices.Sort(changed)
	return errors.New(fmt.Sprint("missing ", head(missing), " extra ", head(extra), " stale ", head(changed)))
}

func head(s []string) string {
	if len(s) > 5 {
		return fmt.Sprintf("%v... (%d)", s[:5], len(s))
	}
	return fmt.Sprint(s)
}
