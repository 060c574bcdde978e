package index

import (
	"fmt"
	"hash/maphash"
)

// keyIndex maps object keys to row ids. It holds the ids by a 64-bit hash
// of the key rather than the key strings, so that it holds no pointers:
// the garbage collector skips it instead of checking a million key strings
// on every cycle. The rows a hash names are checked against the key (the
// caller's is function), so keys whose hashes collide need nothing else.
// An idTable holds the ids in about 13 bytes each; the map[uint64]uint32
// before it took about 39 MB at 1M objects.
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

// hash returns the hash of key: of its appendObjectKey encoding, built on
// the stack unless the key is long.
func (k *keyIndex) hash(key *Key) uint64 {
	var buf [256]byte
	return maphash.Bytes(k.seed, appendObjectKey(buf[:0], *key)) & k.mask
}

// get returns the row id stored under hash h for which is reports true.
func (k *keyIndex) get(h uint64, is func(rid uint32) bool) (uint32, bool) {
	return k.ids.find(h, is)
}

// put adds row rid, whose key is not stored.
func (k *keyIndex) put(key *Key, rid uint32) {
	k.ids.add(k.hash(key), rid)
}

// delete removes row rid, stored with its key.
func (k *keyIndex) delete(key *Key, rid uint32) {
	if !k.ids.remove(k.hash(key), rid) {
		// The caller found the row by its key: a miss means the table
		// and the rows disagree, and a later lookup would fail far from
		// the cause.
		panic(fmt.Sprintf("index: key index has no row %d for key %s", rid, key))
	}
}

// len returns the number of keys.
func (k *keyIndex) len() int { return k.ids.len() }
