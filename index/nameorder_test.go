package index

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestNameOrder checks the name order against a sorted reference while
// rows come and go in writes of random size (so runs merge and compact),
// with names that share long prefixes (so comparisons fall through to the
// keys) and repeat across clusters, kinds and namespaces (so they fall
// through to each part of the key), keys removed and added again within
// one write, and seeks from present and removed rows in both directions.
func TestNameOrder(t *testing.T) {
	x := newObjIndex()
	x.byName.maxRun = 256 // so that runs also stop merging
	rnd := rand.New(rand.NewPCG(1, 2))
	prefixes := []string{"a", "pod", "endpointslice-12", "endpointslice-12-x", "requestauthentication-7"}
	newObject := func() *Object {
		name := prefixes[rnd.IntN(len(prefixes))] + fmt.Sprintf("-%d", rnd.IntN(300))
		if rnd.IntN(10) == 0 {
			name = strings.Repeat("z", rnd.IntN(20)+1)
		}
		o := pod(fmt.Sprintf("c%d", rnd.IntN(2)), fmt.Sprintf("ns-%d", rnd.IntN(5)), name, StatusHealthy, nil)
		switch rnd.IntN(4) {
		case 0:
			o.Group = "apps" // another kind of the same name
		case 1:
			o.Kind, o.Resource = "Service", "services"
		}
		return &o
	}
	live := map[Key]*objRow{}
	var gone []Key // keys of removed rows, for seeks
	for range 300 {
		for range rnd.IntN(40) + 1 {
			o := newObject()
			key := o.Key()
			if old := live[key]; old != nil {
				x.remove(old)
				delete(live, key)
				gone = append(gone, key)
				if rnd.IntN(2) == 0 {
					continue // else add it again in the same write
				}
			}
			r := x.buildRow(o, nil)
			x.insertRow(r)
			live[key] = r
		}
		x.byName.flush()
	}
	var want []*objRow
	for _, r := range live {
		want = append(want, r)
	}
	slices.SortFunc(want, refByName(x))
	if x.byName.len() != len(want) {
		t.Fatalf("len %d, want %d", x.byName.len(), len(want))
	}
	if len(x.byName.runs) < 5 {
		t.Fatalf("%d runs: the test should leave several", len(x.byName.runs))
	}
	collect := func(pivot *nameSeek, desc bool) []*objRow {
		var got []*objRow
		x.byName.walk(pivot, nil, desc, func(rid uint32) bool {
			got = append(got, x.rows[rid])
			return true
		})
		return got
	}
	if got := collect(nil, false); !slices.Equal(got, want) {
		t.Fatalf("ascending walk differs from the sorted rows")
	}
	if got := collect(nil, true); !slices.Equal(got, reversed(want)) {
		t.Fatalf("descending walk differs from the sorted rows")
	}
	for i := 0; i < len(want); i += 29 {
		r := want[i]
		pivot := &nameSeek{pfx: namePrefix(r.name()), key: x.keyOf(r)}
		if got := collect(pivot, false); !slices.Equal(got, want[i:]) {
			t.Fatalf("ascending from %s: wrong rows", pivot.key)
		}
		if got := collect(pivot, true); !slices.Equal(got, reversed(want[:i+1])) {
			t.Fatalf("descending from %s: wrong rows", pivot.key)
		}
	}
	for j, key := range gone {
		if j%5 != 0 || live[key] != nil {
			continue
		}
		pivot := &nameSeek{pfx: namePrefix(key.Name), key: key}
		i, _ := slices.BinarySearchFunc(want, key, func(r *objRow, k Key) int {
			return cmp.Or(strings.Compare(r.name(), k.Name), strings.Compare(objectKey(x.keyOf(r)), objectKey(k)))
		})
		if got := collect(pivot, false); !slices.Equal(got, want[i:]) {
			t.Fatalf("ascending from removed %s: wrong rows", key)
		}
		if got := collect(pivot, true); !slices.Equal(got, reversed(want[:i])) {
			t.Fatalf("descending from removed %s: wrong rows", key)
		}
	}
	if len(x.byName.dead) == 0 {
		t.Fatal("no dead items: the test does not compare with removed rows")
	}
	x.byName.compact()
	if len(x.byName.dead) != 0 || x.byName.items != len(want) {
		t.Fatalf("after compact: %d dead, %d items, want %d", len(x.byName.dead), x.byName.items, len(want))
	}
	if got := collect(nil, false); !slices.Equal(got, want) {
		t.Fatalf("after compact: ascending walk differs from the sorted rows")
	}
}

func TestNamePrefixOrdersLikeNames(t *testing.T) {
	names := []string{"", "a", "a-", "a-b", "ab", "abcdefghijklmnop", "abcdefghijklmnopq", "abcdefghijklmnoz", "b", "\xff"}
	for i, a := range names {
		for _, b := range names[i+1:] {
			if c := namePrefix(a).compare(namePrefix(b)); c > 0 {
				t.Errorf("prefix of %q sorts after %q", a, b)
			} else if c == 0 && len(a) <= 16 && len(b) <= 16 {
				t.Errorf("distinct short names %q and %q share a prefix", a, b)
			}
		}
	}
}

// TestMessagesReleased checks that the message dictionary counts every
// stored row and forgets a message when its last row changes or goes.
func TestMessagesReleased(t *testing.T) {
	s, _ := newTestStore(t)
	rows := []Object{pod("c1", "ns", "a", StatusHealthy, nil), pod("c1", "ns", "b", StatusHealthy, nil)}
	rows[0].Message, rows[1].Message = "shared", "shared"
	mustNoErr(t, s.Replace(ctxb, "c1", podKind, rows))
	if n, e := s.x.msgs.len(), s.x.msgs.m["shared"]; n != 1 || e == nil || e.n != 2 {
		t.Fatalf("after two rows: %d messages, entry %+v", n, e)
	}
	rows[0].Message = "own"
	mustNoErr(t, s.Upsert(ctxb, rows[0]))
	if s.x.msgs.m["shared"].n != 1 || s.x.msgs.m["own"].n != 1 {
		t.Fatalf("after a change: %+v %+v", s.x.msgs.m["shared"], s.x.msgs.m["own"])
	}
	o, _ := s.Get(rows[0].Key())
	if o.Message != "own" {
		t.Fatalf("message %q", o.Message)
	}
	mustNoErr(t, s.Replace(ctxb, "c1", podKind, nil))
	if n := s.x.msgs.len(); n != 0 {
		t.Fatalf("%d messages left after every row was deleted", n)
	}
}

func reversed[S ~[]E, E any](s S) S {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}

// refByName orders rows by name, then by their whole keys' encodings:
// the name order's definition, independent of compareRows.
func refByName(x *objIndex) func(a, b *objRow) int {
	return func(a, b *objRow) int {
		return cmp.Or(strings.Compare(a.name(), b.name()), strings.Compare(objectKey(x.keyOf(a)), objectKey(x.keyOf(b))))
	}
}

// objectKey returns the encoding of k that cursors carry and the key
// index hashes; its byte order is the key order.
func objectKey(k Key) string { return string(appendObjectKey(nil, k)) }

// TestNameOrderDeadItemsOfReusedNamespaces pages through the name order
// while its dead items belong to namespaces whose ids the dictionary has
// reclaimed and given to other namespaces: the case of kube-root-ca.crt
// and default in every namespace, with CI namespaces created and
// deleted. A dead item must still compare under the namespace it had
// (deadRow.ns); under its id's new string, runs merged after the reuse
// are out of order and pages skip or repeat rows.
func TestNameOrderDeadItemsOfReusedNamespaces(t *testing.T) {
	const live, churn = 20, 400 // namespaces alive at any time, created
	s, _ := newTestStore(t, WithReplayBuffer(8))
	x := s.x
	x.byName.minCompact = 1 << 20 // dead items stay until the end
	// Namespaces are named out of creation order, so that a reused id's
	// new string sorts anywhere against the old one.
	ns := func(i int) string { return fmt.Sprintf("ns-%03d", i*7919%churn) }
	names := []string{"default", "kube-root-ca.crt"}
	for i := range churn {
		for _, name := range names {
			mustNoErr(t, s.Upsert(ctxb, pod("c0", ns(i), name, StatusHealthy, nil)))
			if i >= live {
				mustNoErr(t, s.Delete(ctxb, Key{Cluster: "c0", Kind: "Pod", Namespace: ns(i - live), Name: name}))
			}
		}
	}
	reused := 0
	for _, d := range x.byName.dead {
		if now := x.namespaces.str(d.r.nsid); now != "" && now != d.ns {
			reused++
		}
	}
	if len(x.byName.dead) == 0 || reused == 0 {
		t.Fatalf("%d dead items, %d of them in a namespace whose id names another: the test needs some", len(x.byName.dead), reused)
	}
	var want []Object
	for i := churn - live; i < churn; i++ {
		for _, name := range names {
			want = append(want, pod("c0", ns(i), name, StatusHealthy, nil))
		}
	}
	for _, desc := range []bool{false, true} {
		order := Order{Field: OrderName, Desc: desc}
		slices.SortFunc(want, func(a, b Object) int { return refCompare(order, &a, &b) })
		for _, first := range []int{1, 3, 7} {
			checkPaged(t, s, Query{Order: order, First: first, Access: &Access{All: true}}, want,
				fmt.Sprintf("desc=%v first=%d, %d dead items, %d in reused namespaces", desc, first, len(x.byName.dead), reused))
		}
	}
}
