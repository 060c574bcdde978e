package main

import (
	"runtime/metrics"
	"testing"
)

// garbageSink keeps the compiler from dropping TestBaselineRSSReturnsGarbage's
// allocation.
var garbageSink []byte

// TestBaselineRSSReturnsGarbage: garbage made before a measurement is
// returned to the OS by baselineRSS, not kept by the runtime as free heap
// pages the measured load would then reuse without growing the process
// (review-s10-rest L4). The check is the runtime's own count of heap pages
// that are free but still held (/memory/classes/heap/free:bytes): 64 MiB
// of touched garbage would be there after a collection alone.
func TestBaselineRSSReturnsGarbage(t *testing.T) {
	const garbage = 64 << 20
	garbageSink = make([]byte, garbage)
	for i := range garbageSink {
		garbageSink[i] = byte(i)
	}
	garbageSink = nil
	rss, err := baselineRSS()
	if err != nil {
		t.Fatal(err)
	}
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	free := s[0].Value.Uint64()
	if free >= garbage/4 {
		t.Errorf("after baselineRSS the runtime holds %d MiB of free heap pages (64 MiB of garbage made before it): not returned to the OS", free>>20)
	}
	if rss <= 0 {
		t.Errorf("baselineRSS returned RSS %d", rss)
	}
	t.Logf("RSS %d MiB, free heap pages held %d KiB", rss>>20, free>>10)
}
