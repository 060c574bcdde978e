package querypath

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine running (the
// handler's pumps, the server's connections).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
