package testcluster

import (
	"sync"
	"testing"
)

// StartAll starts clusters concurrently for a test and registers their
// cleanup, which shows each cluster's log tail when the test failed. It
// fails the test if any does not become ready.
func StartAll(t testing.TB, opts ...Options) []*Cluster {
	t.Helper()
	out := make([]*Cluster, len(opts))
	var wg sync.WaitGroup
	for i, o := range opts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := New(t.Context(), o)
			if err != nil {
				t.Errorf("testcluster: start %s: %v", o.Name, err)
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
				t.Logf("testcluster %s: last log lines:\n%s", c.Name, c.LogTail(30))
			}
			if err := c.Close(); err != nil {
				t.Errorf("testcluster %s: close: %v", c.Name, err)
			}
		})
	}
	if t.Failed() {
		t.FailNow()
	}
	return out
}
