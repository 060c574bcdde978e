package index

import (
	"fmt"
	"testing"
)

// TestKeyIndexCollisions narrows the hash to two bits, so that most keys
// collide, and checks that every stored key is found, removed keys are
// not, and the byte and string lookups agree.
func TestKeyIndexCollisions(t *testing.T) {
	k := newKeyIndex()
	k.mask = 3
	var rows []*objRow
	stored := map[string]uint32{}
	add := func(key string) {
		rid := uint32(len(rows))
		rows = append(rows, &objRow{data: key, keyLen: uint16(len(key)), rid: rid})
		k.put(key, rid)
		stored[key] = rid
	}
	check := func(when string) {
		t.Helper()
		if k.len() != len(stored) {
			t.Fatalf("%s: len %d, want %d", when, k.len(), len(stored))
		}
		for i := range 60 {
			key := fmt.Sprintf("key-%d", i)
			want, ok := stored[key]
			got, found := k.get(key, rows)
			gotB, foundB := k.getBytes([]byte(key), rows)
			if found != ok || (ok && got != want) || foundB != found || gotB != got {
				t.Fatalf("%s: %s: get %d,%v getBytes %d,%v, want %d,%v", when, key, got, found, gotB, foundB, want, ok)
			}
		}
	}
	for i := range 40 {
		add(fmt.Sprintf("key-%d", i))
	}
	check("after adding")
	hashes := map[uint64]bool{}
	for key := range stored {
		hashes[k.hash([]byte(key))] = true
	}
	if len(hashes) == len(stored) {
		t.Fatal("no key collided: the test does not cover collisions")
	}
	for i := 0; i < 40; i += 3 {
		key := fmt.Sprintf("key-%d", i)
		k.delete(key, stored[key])
		rows[stored[key]] = &objRow{data: "gone", keyLen: 4} // as a freed and reused id
		delete(stored, key)
	}
	check("after removing")
	for i := 40; i < 60; i++ {
		add(fmt.Sprintf("key-%d", i))
	}
	check("after adding again")
}
