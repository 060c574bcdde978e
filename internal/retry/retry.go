package retry

import (
	"math/rand/v2"
	"time"
)

// Jitter returns d plus or minus up to fraction of it, uniformly.
func Jitter(d time.Duration, fraction float64) time.Duration {
	return time.Duration(float64(d) * (1 + fraction*(2*rand.Float64()-1)))
}
