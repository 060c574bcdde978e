package index

import "hash/maphash"

// keyIndex maps object keys to row ids. It is a map from a 64-bit hash of
// the key rather than from the key string, so that it holds no pointers:
// the garbage collector skips it instead of checking a million key strings
// on every cycle, and an entry takes about 19 bytes instead of 29. The row
// a hash names is checked against the key; keys whose hash is already taken
// by another key (about never, but possible) live in a small map by
// string.
//
// It is not safe for concurrent use; the Store's lock guards it.
type keyIndex struct {
	byHash map[uint64]uint32
	other  map[string]uint32
	seed   maphash.Seed
	mask   uint64 // ^0; tests narrow it to force collisions
}

func newKeyIndex() *keyIndex {
	return &keyIndex{byHash: map[uint64]uint32{}, other: map[string]uint32{}, seed: maphash.MakeSeed(), mask: ^uint64(0)}
}

// get returns the row id of key; rows are the rows by id.
func (k *keyIndex) get(key string, rows []*objRow) (uint32, bool) {
	if rid, ok := k.byHash[maphash.String(k.seed, key)&k.mask]; ok && rows[rid].key() == key {
		return rid, true
	}
	if len(k.other) == 0 {
		return 0, false
	}
	rid, ok := k.other[key]
	return rid, ok
}

// getBytes is get for a key built in a buffer; it does not allocate.
func (k *keyIndex) getBytes(key []byte, rows []*objRow) (uint32, bool) {
	return k.getHashed(k.hash(key), key, rows)
}

// hash returns the hash of a key as getHashed wants it.
func (k *keyIndex) hash(key []byte) uint64 { return maphash.Bytes(k.seed, key) & k.mask }

// getHashed is getBytes with the key's hash already computed.
func (k *keyIndex) getHashed(h uint64, key []byte, rows []*objRow) (uint32, bool) {
	if rid, ok := k.byHash[h]; ok && rows[rid].key() == string(key) {
		return rid, true
	}
	if len(k.other) == 0 {
		return 0, false
	}
	rid, ok := k.other[string(key)]
	return rid, ok
}

// put adds key, which is not stored, as row rid.
func (k *keyIndex) put(key string, rid uint32) {
	h := maphash.String(k.seed, key) & k.mask
	if _, taken := k.byHash[h]; taken {
		k.other[key] = rid
		return
	}
	k.byHash[h] = rid
}

// delete removes key, stored as row rid.
func (k *keyIndex) delete(key string, rid uint32) {
	h := maphash.String(k.seed, key) & k.mask
	if got, ok := k.byHash[h]; ok && got == rid {
		delete(k.byHash, h)
		return
	}
	delete(k.other, key)
}

// len returns the number of keys.
func (k *keyIndex) len() int { return len(k.byHash) + len(k.other) }
