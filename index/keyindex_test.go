package index

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// keyUniverse returns every key over two clusters, three kinds (two of one
// name in different groups), three namespaces (one empty) and two names:
// each key has others that differ from it in one part only.
func keyUniverse() []Key {
	var keys []Key
	for _, c := range []string{"c0", "c1"} {
		for _, gk := range [][2]string{{"", "Pod"}, {"apps", "Pod"}, {"", "Service"}} {
			for _, ns := range []string{"", "ns-a", "ns-b"} {
				for _, n := range []string{"n0", "n1"} {
					keys = append(keys, Key{Cluster: c, Group: gk[0], Kind: gk[1], Namespace: ns, Name: n})
				}
			}
		}
	}
	return keys
}

// universeObject returns an Object with key k.
func universeObject(k Key) *Object {
	return &Object{
		Cluster: k.Cluster, Group: k.Group, Version: "v1", Kind: k.Kind, Resource: strings.ToLower(k.Kind) + "s",
		Namespace: k.Namespace, Name: k.Name,
	}
}

// TestKeyIndexCollisions narrows the hash to two bits, so that every key
// collides with a quarter of the others, and checks that every stored key
// is found, and keys not stored (each differing from a stored one in one
// part) and removed keys are not: the rows' keys, rebuilt from their ids,
// tell colliding keys apart.
func TestKeyIndexCollisions(t *testing.T) {
	x := newObjIndex()
	x.byKey.mask = 3
	rnd := rand.New(rand.NewPCG(3, 4))
	keys := keyUniverse()
	stored := map[Key]*objRow{}
	check := func(when string) {
		t.Helper()
		if x.byKey.len() != len(stored) {
			t.Fatalf("%s: len %d, want %d", when, x.byKey.len(), len(stored))
		}
		for _, k := range keys {
			if got, want := x.lookup(&k), stored[k]; got != want {
				t.Fatalf("%s: lookup %s = %p, want %p", when, k, got, want)
			}
		}
	}
	for round := range 6 {
		for _, k := range keys {
			switch r := stored[k]; {
			case r == nil && rnd.IntN(2) == 0:
				r = x.buildRow(universeObject(k), nil)
				x.insertRow(r)
				stored[k] = r
			case r != nil && rnd.IntN(3) == 0:
				x.remove(r)
				delete(stored, k)
			}
		}
		check(fmt.Sprintf("round %d", round))
	}
	hashes := map[uint64]bool{}
	for _, k := range keys {
		hashes[x.byKey.hash(&k)] = true
	}
	if len(hashes) > 4 {
		t.Fatalf("%d hashes: the test does not force collisions", len(hashes))
	}
}

// TestCompareKeys checks compareKeys, compareRowKey and compareRows, which
// compare keys part by part and ids first, against the byte order of the
// keys' encodings (the order cursors were made in), and parseObjectKey
// against appendObjectKey.
func TestCompareKeys(t *testing.T) {
	x := newObjIndex()
	keys := keyUniverse()
	keys = append(keys, Key{Cluster: "c", Kind: "K", Name: "a"}, Key{Cluster: "c", Kind: "K", Name: "ab"},
		Key{Cluster: "c", Kind: "K", Namespace: "a", Name: "b"}, Key{Cluster: "ca", Kind: "K", Name: "a"})
	rows := make([]*objRow, len(keys))
	for i, k := range keys {
		rows[i] = x.buildRow(universeObject(k), nil)
	}
	sign := func(c int) int { return min(max(c, -1), 1) }
	for i, a := range keys {
		if got, ok := parseObjectKey(objectKey(a)); !ok || got != a {
			t.Fatalf("parseObjectKey(%q) = %s, %v", objectKey(a), got, ok)
		}
		for j, b := range keys {
			want := strings.Compare(objectKey(a), objectKey(b))
			if got := sign(compareKeys(&a, &b)); got != want {
				t.Fatalf("compareKeys(%s, %s) = %d, want %d", a, b, got, want)
			}
			if got := sign(x.compareRowKey(rows[i], &b)); got != want {
				t.Fatalf("compareRowKey(%s, %s) = %d, want %d", a, b, got, want)
			}
			if got := sign(x.compareRows(rows[i], rows[j])); got != want {
				t.Fatalf("compareRows(%s, %s) = %d, want %d", a, b, got, want)
			}
		}
	}
	// The same keys under a second kindInfo of each group and kind (another
	// resource, as a cluster that reports another plural makes): the key
	// has no resource, so compareRows must order by the group and kind
	// strings alone when the descriptions differ (review-s9-b L7).
	for i, a := range keys {
		o := universeObject(a)
		o.Version, o.Resource = "v2", o.Resource+"-alt"
		alt := x.buildRow(o, nil)
		if alt.kind == rows[i].kind {
			t.Fatalf("%s: the second resource shares the kindInfo of the first", a)
		}
		for j, b := range keys {
			want := strings.Compare(objectKey(a), objectKey(b))
			if got := sign(x.compareRows(alt, rows[j])); got != want {
				t.Fatalf("compareRows(%s as %s, %s) = %d, want %d", a, o.Resource, b, got, want)
			}
			if got := sign(x.compareRows(rows[j], alt)); got != -want {
				t.Fatalf("compareRows(%s, %s as %s) = %d, want %d", b, a, o.Resource, got, -want)
			}
		}
	}
	for _, bad := range []string{"", "c\x00g\x00k\x00ns\x00", "c\x00g\x00k\x00ns\x00n", "c\x00g\x00k\x00ns\x00n\x00x", "c\x00g\x00k\x00ns\x00n\x00\x00"} {
		if k, ok := parseObjectKey(bad); ok {
			t.Fatalf("parseObjectKey(%q) = %s, want not a key", bad, k)
		}
	}
}
