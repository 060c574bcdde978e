package edge

import "time"

// partWindow paces the parts of a periodic full resync (review-s7-edge
// M1). Pacing exists so that a delta sent between two parts queues on the
// manager behind a few parts, not behind a whole window of them; parts
// still on the wire delay nobody, since a delta travels behind them at
// the link's speed anyway. So the window covers the round trip and keeps
// a small, fixed queue on the manager, as TCP Vegas does: a fixed two
// parts in flight moved a resync at two parts per round trip, which on a
// 150 ms link made a large cluster's resync last longer than the resync
// interval.
//
// Each acknowledged part gives a sample: the time from its send to its
// ack, which is the round trip plus its wait in the manager's queue plus
// its apply. base is the smallest sample of the session (no queue: the
// round trip and one apply). size x (1 - base/sample) estimates how many
// parts wait on the manager: under one, the window grows by a part; over
// two, it shrinks by one. A change shows in the samples a round trip
// later, so the window changes at most once per round trip, except while
// a resync ramps up (slow start): it grows on every sample until one
// shows a queue. On a LAN the round trip is small against the apply, so
// the window stays near two parts, as before; on a long link it grows
// until the manager is busy again. TestPartWindowOverALink gives the
// review's scenario (150 ms, 20 ms per part, 1,000 parts): 85 s with two
// parts in flight, 20.4 s adaptive, with at most two parts waiting on the
// manager.
//
// Owned by the session's run goroutine.
type partWindow struct {
	size    int           // parts allowed unacknowledged
	most    int           // at most: the manager's window less one, left for a delta, and at least two
	base    time.Duration // smallest sample of the session; 0 before the first
	unacked []sentPart    // parts sent and not yet acknowledged, oldest first
	// last is the last part sent; after an adjustment, samples of parts up
	// to mark (sent before it took effect) are ignored: one per round trip.
	last, mark uint64
	// ramping: the window grows on every sample until one shows a queue,
	// as slow start does, then once per round trip.
	ramping bool
}

// sentPart is a part's sequence number and the session time it was sent.
type sentPart struct {
	seq uint64
	at  time.Duration
}

// Bounds of the window, in parts.
const (
	// resyncPartsInFlight is where a resync's window starts and the least
	// it shrinks to: two keep the edge encoding a part while the manager
	// decodes the one before.
	resyncPartsInFlight = 2
	// queueLow and queueHigh bound the parts the window aims to keep
	// waiting on the manager: a delta between parts queues behind at most
	// about two.
	queueLow, queueHigh = 1, 2
)

// newPartWindow returns a window for a manager that holds window
// messages unacknowledged (one of them stays free for a delta), capped at
// limit parts when limit > 0 (AgentOptions.MaxResyncParts). It never
// allows fewer than resyncPartsInFlight parts, whatever window and limit
// say: a limit of 1 acts as 2, and with a window of 2 or less a resync's
// parts can take every slot, so a delta between them waits for an ack
// (review-s10 L1; the hub's default window is 16).
func newPartWindow(window, limit int) *partWindow {
	most := window - 1
	if limit > 0 {
		most = min(most, limit)
	}
	return &partWindow{size: resyncPartsInFlight, most: max(resyncPartsInFlight, most), ramping: true}
}

// start begins a resync: the window starts small again, since the
// manager's load may have changed since the last one; base is kept (the
// link is the same).
func (w *partWindow) start() {
	w.size = resyncPartsInFlight
	w.unacked = w.unacked[:0]
	w.mark, w.ramping = w.last, true
}

// sent records a part sent at session time at. at must be taken before
// the part is written, not after: run may be descheduled between the write
// and reading the clock for longer than the round trip, and a send time
// later than the ack gives a sample of nothing that pins base near zero,
// and the window at two parts for the session's life (review-s10 M1).
func (w *partWindow) sent(seq uint64, at time.Duration) {
	w.unacked = append(w.unacked, sentPart{seq: seq, at: at})
	w.last = seq
}

// acked takes the parts up to seq as acknowledged at session time at,
// adapting the window to each one's sample. A part whose ack is not
// after its send gives no sample: the two times were read on different
// goroutines, and such a sample would only say that one of them is late,
// not how long the round trip is.
func (w *partWindow) acked(seq uint64, at time.Duration) {
	n := 0
	for _, p := range w.unacked {
		if p.seq > seq {
			break
		}
		if at > p.at {
			w.sample(p.seq, at-p.at)
		}
		n++
	}
	w.unacked = w.unacked[:copy(w.unacked, w.unacked[n:])]
}

// sample adapts the window to part seq's time from send to ack (> 0).
func (w *partWindow) sample(seq uint64, rtt time.Duration) {
	if w.base == 0 || rtt < w.base {
		w.base = rtt
	}
	if seq <= w.mark && !w.ramping {
		return
	}
	queued := float64(w.size) * (1 - float64(w.base)/float64(rtt))
	size := w.size
	switch {
	case queued < queueLow:
		size = min(w.size+1, w.most)
	case queued > queueHigh:
		size = max(w.size-1, resyncPartsInFlight)
		w.ramping = false
	default:
		w.ramping = false
	}
	if size != w.size {
		w.size, w.mark = size, w.last
	}
}

// full reports whether the window allows no more parts now.
func (w *partWindow) full() bool { return len(w.unacked) >= w.size }
