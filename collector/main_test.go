package collector

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// The collector's reflectors and rediscovery run against real clusters in
// connection's tests and in TestRelistKeepsTheWatchRunning; this guard
// covers the goroutines of its own tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}
