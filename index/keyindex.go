package index

import (
	"fmt"
	"hash/maphash"
)

// keyIndex maps object keys to row ids. It holds the ids by a 64-bit hash
// of the key rather than the key strings, so that it holds no pointers:
// the garbage collector skips it instead of checking a million key strings
// on every cycle. The rows a hash names are checked against the key, so
// keys whose hashes collide need nothing else. An idTable holds the ids in
// about 13 bytes each; the map[uint64]uint32 before it took about 39 MB at
// 1M objects.
//
// It is not safe for concurrent use; the Store's lock guards it.
type keyIndex struct {
	ids  idTable
	seed maphash.Seed
	mask uint64 // ^0; tests narrow it to force collisions
}

func newKeyIndex() *keyIndex {
	return &keyIndex{seed: maphash.MakeSeed(), mask: ^uint64(0)}
}

// get returns the row id of key; rows are the rows by id.
func (k *keyIndex) get(key string, rows []*objRow) (uint32, bool) {
	return k.ids.find(maphash.String(k.seed, key)&k.mask, func(rid uint32) bool { return rows[rid].key() == key })
}

// getBytes is get for a key built in a buffer; it does not allocate.
func (k *keyIndex) getBytes(key []byte, rows []*objRow) (uint32, bool) {
	return k.getHashed(k.hash(key), key, rows)
}

// hash returns the hash of a key as getHashed wants it.
func (k *keyIndex) hash(key []byte) uint64 { return maphash.Bytes(k.seed, key) & k.mask }

// getHashed is getBytes with the key's hash already computed.
func (k *keyIndex) getHashed(h uint64, key []byte, rows []*objRow) (uint32, bool) {
	return k.ids.find(h, func(rid uint32) bool { return rows[rid].key() == string(key) })
}

// put adds key, which is not stored, as row rid.
func (k *keyIndex) put(key string, rid uint32) {
	k.ids.add(maphash.String(k.seed, key)&k.mask, rid)
}

// delete removes key, stored as row rid.
func (k *keyIndex) delete(key string, rid uint32) {
	if !k.ids.remove(maphash.String(k.seed, key)&k.mask, rid) {
		// The caller found the row by this key: a miss means the table
		// and the rows disagree, and a later lookup would fail far from
		// the cause.
		panic(fmt.Sprintf("index: key index has no row %d for key %q", rid, key))
	}
}

// len returns the number of keys.
func (k *keyIndex) len() int { return k.ids.len() }
