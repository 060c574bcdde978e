package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestNameOrder checks the name order against a sorted reference while
// rows come and go, with names that share long prefixes (so comparisons
// fall through to the rows) and seeks from present and missing rows in
// both directions.
func TestNameOrder(t *testing.T) {
	x := newObjIndex()
	rnd := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "pod", "endpointslice-12", "endpointslice-12-x", "requestauthentication-7", ""}
	newRow := func(i int) *objRow {
		name := names[rnd.IntN(len(names)-1)] + fmt.Sprintf("-%d", rnd.IntN(50))
		if rnd.IntN(10) == 0 {
			name = strings.Repeat("z", rnd.IntN(20)+1)
		}
		ns := fmt.Sprintf("ns-%d", i%7)
		return &objRow{key: compoundKey("c", "", "Pod", ns, name), nameOff: uint16(len("c\x00\x00Pod\x00" + ns + "\x00"))}
	}
	live := map[string]*objRow{}
	for i := range 3000 {
		r := newRow(i)
		if old := live[r.key]; old != nil || (len(live) > 0 && rnd.IntN(4) == 0) {
			if old == nil {
				for _, o := range live {
					old = o
					break
				}
			}
			x.byName.remove(x.pfx[old.rid], old.rid)
			x.rows[old.rid] = nil
			x.free = append(x.free, old.rid)
			delete(live, old.key)
			continue
		}
		pfx := namePrefix(r.name())
		if n := len(x.free); n > 0 {
			r.rid, x.free = x.free[n-1], x.free[:n-1]
			x.rows[r.rid], x.pfx[r.rid] = r, pfx
		} else {
			r.rid = uint32(len(x.rows))
			x.rows, x.pfx = append(x.rows, r), append(x.pfx, pfx)
		}
		x.byName.insert(pfx, r.rid)
		live[r.key] = r
	}
	var want []*objRow
	for _, r := range live {
		want = append(want, r)
	}
	slices.SortFunc(want, compareByName)
	if x.byName.len() != len(want) {
		t.Fatalf("len %d, want %d", x.byName.len(), len(want))
	}
	collect := func(pivot *nameItem, desc bool) []*objRow {
		var got []*objRow
		x.byName.walk(pivot, desc, func(rid uint32) bool {
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
	for i := 0; i < len(want); i += 37 {
		r := want[i]
		exact := &nameItem{pfx: namePrefix(r.name()), rid: r.rid}
		if got := collect(exact, false); !slices.Equal(got, want[i:]) {
			t.Fatalf("ascending from %q: wrong rows", r.key)
		}
		if got := collect(exact, true); !slices.Equal(got, reversed(want[:i+1])) {
			t.Fatalf("descending from %q: wrong rows", r.key)
		}
		// A missing row seeks to its prefix: the walk starts at or
		// before where the row would be, never after it.
		low := &nameItem{pfx: namePrefix(r.name()), rid: seekLow}
		if got := collect(low, false); len(got) < len(want)-i || !slices.Equal(got[len(got)-(len(want)-i):], want[i:]) {
			t.Fatalf("ascending from the prefix of %q: wrong rows", r.key)
		}
		high := &nameItem{pfx: namePrefix(r.name()), rid: seekHigh}
		if got := collect(high, true); len(got) < i+1 || !slices.Equal(got[len(got)-(i+1):], reversed(want[:i+1])) {
			t.Fatalf("descending from the prefix of %q: wrong rows", r.key)
		}
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
