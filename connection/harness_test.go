package connection

import (
	"context"
	"testing"

	"go.uber.org/goleak"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}

// harness runs a Manager over real clusters for one test.
type harness struct {
	store *index.Store
	mgr   *Manager
	rec   *conntest.Recorder
}

func specFor(c *testcluster.Cluster) Spec {
	return Spec{Name: c.Name, Config: func(context.Context) (*rest.Config, error) { return rest.CopyConfig(c.Config), nil }}
}

func newHarness(t *testing.T, opts Options, specs ...Spec) *harness {
	t.Helper()
	h := &harness{store: index.New(memtables.Open)}
	opts.Store = h.store
	mgr, err := NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.mgr = mgr
	h.rec = conntest.NewRecorder(t, h.store)
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
	return testcluster.StartAll(t, opts...)
}
