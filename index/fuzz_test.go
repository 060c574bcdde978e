package index

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// fuzzFleet is the small fleet both fuzz targets query: names, namespaces,
// kinds and label values chosen so that cursors and selectors land
// between, on and around stored values, including numbers for gt and lt
// that are not plain integers.
func fuzzFleet(tb testing.TB) (*Store, []Object) {
	s, clk := newTestStore(tb)
	values := []string{"", "a", "b", "05", "-3", "12", "+7", "x.y", "9999999999999999999"}
	var objs []Object
	for i := range 40 {
		k := []Kind{podKind, flux, nodeKind}[i%3]
		o := Object{
			Cluster: fmt.Sprintf("c%d", i%3), Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource,
			Name: fmt.Sprintf("%s-%d", []string{"a", "ab", "b", "A", "abcdefghijklmnopqrstuvwxyz"}[i%5], i%7),
			UID:  fmt.Sprint("u", i), Status: Statuses[i%len(Statuses)],
			CreatedAt: time.Unix(int64(1000+i%4), int64(i%2)).UTC(),
		}
		labels := map[string]string{}
		if k.Namespaced {
			o.Namespace = fmt.Sprintf("ns%d", i%2)
		}
		for j, key := range []string{"n", "app", "example.com/tier", "x"} {
			if (i+j)%3 != 0 {
				labels[key] = values[(i*3+j)%len(values)]
			}
		}
		o.Labels = LabelsOf(labels)
		clk.Advance(time.Duration(i%3) * time.Millisecond)
		mustNoErr(tb, s.Upsert(ctxb, o))
		stored, _ := s.Get(o.Key())
		objs = append(objs, *stored)
	}
	return s, objs
}

// FuzzCursor feeds arbitrary strings to Query as the After cursor, in
// every order. A string that does not decode is ErrInvalidQuery; one that
// decodes encodes back to itself and resumes exactly after the position
// it names, as a brute-force sort of the fleet has it, even when no row
// sits at that position.
func FuzzCursor(f *testing.F) {
	s, objs := fuzzFleet(f)
	for i, field := range allOrders {
		for _, desc := range []bool{false, true} {
			p, err := s.Query(ctxb, Query{Order: Order{Field: field, Desc: desc}, First: 3 + i, Access: &Access{All: true}})
			mustNoErr(f, err)
			f.Add(p.Edges[len(p.Edges)-1].Cursor, uint8(i), desc)
		}
	}
	for _, c := range []string{"", "!!!", "AQ", "AQAA", "AQAAAAAA", "AQYAAgAA", "AQAAAAFhAWE", "AQAAAAVhLTEtMAVhLTEtMA"} {
		f.Add(c, uint8(0), false)
	}
	f.Fuzz(func(t *testing.T, after string, fieldIndex uint8, desc bool) {
		order := Order{Field: allOrders[int(fieldIndex)%len(allOrders)], Desc: desc}
		q := Query{Order: order, After: after, First: 4, Access: &Access{All: true}}
		c, err := decodeCursor(after, order)
		p, qerr := s.Query(ctxb, q)
		if err != nil {
			if !errors.Is(err, ErrInvalidQuery) || !errors.Is(qerr, ErrInvalidQuery) {
				t.Fatalf("cursor %q: decode error %v, query error %v; want ErrInvalidQuery", after, err, qerr)
			}
			return
		}
		if qerr != nil {
			t.Fatalf("cursor %q decodes but the query fails: %v", after, qerr)
		}
		want := slices.Clone(objs)
		slices.SortFunc(want, func(x, y Object) int { return refCompare(order, &x, &y) })
		if c != nil {
			if again, err := decodeCursor(string(appendCursor(nil, *c)), order); err != nil || *again != *c {
				t.Fatalf("cursor %q = %+v encodes to one that decodes to %+v, %v", after, *c, again, err)
			}
			want = slices.DeleteFunc(want, func(o Object) bool {
				d := compareToCursor(order.Field, &o, c)
				return d == 0 || (d < 0) != order.Desc
			})
		}
		if p.TotalCount != len(objs) || len(p.Edges) != min(4, len(want)) || p.HasNextPage != (len(want) > 4) {
			t.Fatalf("cursor %+v: total %d, %d edges, more %v; want %d, %d, %v", c, p.TotalCount, len(p.Edges), p.HasNextPage, len(objs), min(4, len(want)), len(want) > 4)
		}
		for i, e := range p.Edges {
			if e.Object.Key() != want[i].Key() {
				t.Fatalf("cursor %+v: row %d = %s, want %s", c, i, e.Object.Key(), want[i].Key())
			}
		}
	})
}

// compareToCursor compares o with a cursor's position in an order, from
// the definition of the position: the order's value (a string or a
// number), then the object key.
func compareToCursor(f OrderField, o *Object, c *cursor) int {
	var str string
	var num int64
	switch f {
	case OrderName:
		str = o.Name
	case OrderNamespace:
		str = o.Namespace
	case OrderKind:
		str = o.Kind
	case OrderStatus:
		num = int64(statusIndex(o.Status))
	case OrderCreatedAt:
		num = o.CreatedAt.UnixNano()
	case OrderUpdatedAt:
		num = o.UpdatedAt.UnixNano()
	}
	return cmp.Or(cmp.Compare(str, c.Str), cmp.Compare(num, c.Num), cmp.Compare(objectKey(o.Key()), objectKey(c.Key)))
}

// FuzzLabelSelector runs arbitrary label selectors through Query, Facets
// and Matcher and compares them with apimachinery's own parser and
// matcher: a selector it rejects is ErrInvalidQuery everywhere, and one
// it accepts selects exactly the objects whose labels it matches.
func FuzzLabelSelector(f *testing.F) {
	s, objs := fuzzFleet(f)
	for _, sel := range []string{
		"", "n", "!n", "n=a", "n==a", "n!=a", "n in (a,b)", "n notin (a,05)", "n>4", "n<0", "n>-4", "n<+8", "n>a",
		"app=b,n", "example.com/tier in (x.y)", "x,!app", "n in ()", "n=", "a in ((b)", "=", "n>", "n>1,n<20",
		" n = a ", "n in (a),,", "!", "x=9999999999999999999", "x>9999999999999999998",
	} {
		f.Add(sel)
	}
	all := &Access{All: true}
	f.Fuzz(func(t *testing.T, selector string) {
		filter := Filter{LabelSelector: selector}
		p, qerr := s.Query(ctxb, Query{Filter: filter, First: MaxPageSize, Access: all})
		fc, ferr := s.Facets(ctxb, filter, all)
		m, merr := NewMatcher(filter, all)
		sel, err := labels.Parse(selector)
		if err != nil {
			for _, e := range []error{qerr, ferr, merr} {
				if !errors.Is(e, ErrInvalidQuery) {
					t.Fatalf("selector %q that apimachinery rejects (%v): got %v, want ErrInvalidQuery", selector, err, e)
				}
			}
			return
		}
		if qerr != nil || ferr != nil || merr != nil {
			t.Fatalf("selector %q: query %v, facets %v, matcher %v", selector, qerr, ferr, merr)
		}
		want := map[Key]bool{}
		for i := range objs {
			if sel.Matches(objs[i].Labels) {
				want[objs[i].Key()] = true
			}
			if got := m.Match(&objs[i]); got != want[objs[i].Key()] {
				t.Fatalf("selector %q: Matcher.Match(%s with %v) = %v", selector, objs[i].Key(), objs[i].Labels, got)
			}
		}
		if p.TotalCount != len(want) || len(p.Edges) != len(want) || fc.Total != len(want) {
			t.Fatalf("selector %q: query total %d (%d rows), facets total %d; want %d", selector, p.TotalCount, len(p.Edges), fc.Total, len(want))
		}
		for _, e := range p.Edges {
			if !want[e.Object.Key()] {
				t.Fatalf("selector %q selected %s with labels %v", selector, e.Object.Key(), e.Object.Labels)
			}
		}
	})
}
