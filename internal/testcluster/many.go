package testcluster

import (
	"errors"
	"sync"
	"testing"
)

// StartAll starts clusters concurrently for a test and registers their
// cleanup, which shows each cluster's log tail when the test failed. It
// skips the test as Require does, and fails it if any cluster does not
// become ready (closing the ones that did).
func StartAll(t testing.TB, opts ...Options) []*Cluster {
	t.Helper()
	for _, o := range opts {
		if o.Binary == "" {
			Require(t)
		}
	}
	out := make([]*Cluster, len(opts))
	errs := make([]error, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Go(func() { out[i], errs[i] = New(t.Context(), o) })
	}
	wg.Wait()
	for _, c := range out {
		if c != nil {
			cleanupOnEnd(t, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	return out
}
