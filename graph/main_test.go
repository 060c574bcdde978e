package graph

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testcluster.LeakOptions()...)
}
