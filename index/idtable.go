package index

// idTable maps 64-bit hashes to uint32 ids, for indexes whose ids name
// something the caller can check (a row's key, a label pair's key and
// value ids): find calls the caller back for each id stored under the
// hash's upper 32 bits, so equal and colliding hashes need no other map.
//
// It is an open-addressing table of 8-byte slots (32 bits of the hash, then
// the id) with linear probing, in 256 shards that grow independently by
// half, so that growing rehashes 1/256 of the ids at a time under the
// write lock, never all of them. A slot costs 8 bytes at a load between
// 1/2 and 3/4, about 13 bytes an id; the map[uint64]uint32 it replaced
// costs 16-byte slots at a lower load: at 1M objects the key index and the
// label pairs' map (1.7M pairs) took 78 MB as maps. It holds no pointers.
// Go's map keyed by 32 bits of the hash (with a small map beside it for
// the hashes that collide in them, about n²/2³³ ids) gets most of the
// way: measured with Go 1.26 (heap after GC, one table of n random ids),
// map[uint32]uint32 holds 1M ids in 19.5 MB and 2.7M (as many as the two
// tables hold at 1M objects) in 39.0 MB, idTable 14.7 and 33.6 MB: about
// 5 MB, or 5 bytes of the 450 an object costs, is what this file buys.
// The map would bring the runtime's detector of concurrent writes, which
// idTable lacks (the Store's lock is its only guard).
//
// It is not safe for concurrent use; the Store's lock guards it.
type idTable struct {
	shards [idTableShards]idShard
}

// idShard is one shard of an idTable. A slot is 0 when empty; tags are
// odd, so no stored slot is 0. A slot's home is a function of its tag
// (home), which lets remove shift the slots after it back instead of
// leaving tombstones.
type idShard struct {
	slots []uint64 // tag<<32 | id
	n     int
}

const idTableShards = 256

// idSlot returns the shard of hash h and the slot it stores id under.
func idSlot(h uint64, id uint32) (shard int, slot uint64) {
	tag := uint32(h>>32) | 1
	return int(h % idTableShards), uint64(tag)<<32 | uint64(id)
}

// home returns the first slot to probe for a slot value v.
func (s *idShard) home(v uint64) int {
	return int((v >> 32) * uint64(len(s.slots)) >> 32)
}

func (s *idShard) next(i int) int {
	if i++; i == len(s.slots) {
		return 0
	}
	return i
}

// find returns the first id stored under h for which eq reports true.
func (t *idTable) find(h uint64, eq func(id uint32) bool) (uint32, bool) {
	si, want := idSlot(h, 0)
	s := &t.shards[si]
	if s.n == 0 {
		return 0, false
	}
	for i := s.home(want); ; i = s.next(i) {
		v := s.slots[i]
		if v == 0 {
			return 0, false
		}
		if v>>32 == want>>32 && eq(uint32(v)) {
			return uint32(v), true
		}
	}
}

// add stores id under h. It does not look for an equal id: the caller
// knows there is none.
func (t *idTable) add(h uint64, id uint32) {
	si, v := idSlot(h, id)
	s := &t.shards[si]
	if (s.n+1)*4 > len(s.slots)*3 {
		s.grow()
	}
	s.put(v)
	s.n++
}

func (s *idShard) put(v uint64) {
	i := s.home(v)
	for s.slots[i] != 0 {
		i = s.next(i)
	}
	s.slots[i] = v
}

// grow rehashes the shard into half as many slots again (16 at first).
func (s *idShard) grow() {
	old := s.slots
	s.slots = make([]uint64, max(16, len(old)+len(old)/2))
	for _, v := range old {
		if v != 0 {
			s.put(v)
		}
	}
}

// remove deletes id, stored under h, and reports whether it was stored.
func (t *idTable) remove(h uint64, id uint32) bool {
	si, want := idSlot(h, id)
	s := &t.shards[si]
	if s.n == 0 {
		return false
	}
	i := s.home(want)
	for ; s.slots[i] != want; i = s.next(i) {
		if s.slots[i] == 0 {
			return false
		}
	}
	// Shift back every later slot of the probe run that may live at i:
	// one whose home is not cyclically in (i, j].
	for j := s.next(i); s.slots[j] != 0; j = s.next(j) {
		k := s.home(s.slots[j])
		if (i <= j && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = 0
	s.n--
	return true
}

// len returns how many ids the table holds, adding up its shards' counts
// (only tests ask).
func (t *idTable) len() int {
	n := 0
	for i := range t.shards {
		n += t.shards[i].n
	}
	return n
}

// mix64 spreads the bits of x (splitmix64's finalizer), for ids made of
// small numbers.
func mix64(x uint64) uint64 {
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
