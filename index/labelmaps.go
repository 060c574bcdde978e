package index

import "sync"

// labelMaps keeps the Labels maps of the rows pages returned lately, by
// label set (objRow.labelBytes: equal strings mean equal labels), so that
// a page of rows seen recently builds no maps. Building one cost about
// half the CPU of a page of 100 rows at 1M objects (a map and its group
// allocated per row, and a pair, key and value lookup per label, each a
// likely cache miss); rows with equal labels (the pods of one ReplicaSet)
// share one map.
//
// The maps are shared by every Object that got them, so callers must not
// mutate them (see Object). Two generations of at most labelMapsGen sets
// each bound the memory: a set found only in the older one moves to the
// newer, and a full newer generation becomes the older, dropping the
// older. A key is a slice of its row's string bytes, which it keeps alive
// until dropped. Pair ids are recycled, so a set's bytes can come to mean
// other labels: pids marks the pair ids of the sets kept since the last
// reset, and a commit that reclaims a marked pair drops every map
// (labelDict.recycle, under the write lock, when no read can hold a row
// with the pair). Pairs of labels nobody paged lately are reclaimed on
// nearly every commit under label churn, and drop nothing.
//
// Reads hold the Store's read lock and may run at once, so labelMaps has
// its own mutex, taken twice per page: to look up, then, after building
// the missing maps outside it, to keep them (or take one kept meanwhile).
type labelMaps struct {
	mu       sync.Mutex
	cur, old map[string]map[string]string
	// pids has a bit per pair id, set for the ids of the kept sets (and
	// of sets dropped since the last reset).
	pids []uint64
}

// labelMapsGen bounds the label sets of one generation (4,000): a few
// pages of MaxPageSize.
const labelMapsGen = 4 * MaxPageSize

// fill sets the Labels of objs[i] to the labels of rows[i], from the
// cache or built by d.
func (c *labelMaps) fill(d *labelDict, objs []Object, rows []*objRow) {
	var missBuf [128]int32
	miss := missBuf[:0]
	c.mu.Lock()
	for i, r := range rows {
		if r.numLabels() == 0 {
			continue
		}
		if m := c.get(r.labelBytes()); m != nil {
			objs[i].Labels = m
		} else {
			miss = append(miss, int32(i))
		}
	}
	c.mu.Unlock()
	if len(miss) == 0 {
		return
	}
	for _, i := range miss {
		objs[i].Labels = d.labelMap(rows[i])
	}
	c.mu.Lock()
	for _, i := range miss {
		// An earlier row of the page, or another page meanwhile, may
		// have kept a map of the same set: share that one.
		if m := c.get(rows[i].labelBytes()); m != nil {
			objs[i].Labels = m
		} else {
			c.mark(rows[i])
			c.put(rows[i].labelBytes(), objs[i].Labels)
		}
	}
	c.mu.Unlock()
}

// get returns the map of a label set, nil when it is not kept.
func (c *labelMaps) get(set string) map[string]string {
	if m, ok := c.cur[set]; ok {
		return m
	}
	m, ok := c.old[set]
	if ok {
		c.put(set, m)
	}
	return m
}

func (c *labelMaps) put(set string, m map[string]string) {
	if len(c.cur) >= labelMapsGen {
		c.old, c.cur = c.cur, nil
	}
	if c.cur == nil {
		// Not sized: a generation dropped by a reset may have grown by a
		// page or two only.
		c.cur = map[string]map[string]string{}
	}
	c.cur[set] = m
}

// mark sets the bits of the pair ids of r's labels.
func (c *labelMaps) mark(r *objRow) {
	for i := range r.numLabels() {
		pid := r.label(i)
		w := int(pid >> 6)
		if w >= len(c.pids) {
			c.pids = append(c.pids, make([]uint64, w+1-len(c.pids))...)
		}
		c.pids[w] |= 1 << (pid & 63)
	}
}

// holds reports whether a kept set may have pair pid, under the write
// lock.
func (c *labelMaps) holds(pid uint32) bool {
	w := int(pid >> 6)
	return w < len(c.pids) && c.pids[w]&(1<<(pid&63)) != 0
}

// reset drops every map.
func (c *labelMaps) reset() {
	c.mu.Lock()
	c.cur, c.old = nil, nil
	clear(c.pids)
	c.mu.Unlock()
}
