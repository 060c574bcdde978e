package collector

import (
	"testing"

	"go.uber.org/goleak"
)

// The collector's reflectors and rediscovery run against real clusters in
// connection's tests; this guard covers the goroutines of its own tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
