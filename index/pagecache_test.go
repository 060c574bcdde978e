package index

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"unsafe"
)

// TestPageLabels checks that the Labels of a page's new rows, which
// share one array, and of a Get are each row's own, in key order where
// the rows' pair ids are not (a pair interned earlier has a lower id).
func TestPageLabels(t *testing.T) {
	s, _ := newTestStore(t)
	rows := []Object{
		pod("c0", "ns0", "a", StatusHealthy, map[string]string{"tier": "front"}),
		pod("c0", "ns0", "b", StatusHealthy, map[string]string{"tier": "front", "app": "web", "b": "1"}),
		pod("c0", "ns0", "c", StatusHealthy, nil),
		pod("c0", "ns0", "d", StatusHealthy, map[string]string{"app": "db", "zone": "z", "a": "0"}),
	}
	for _, o := range rows {
		mustNoErr(t, s.Upsert(ctxb, o))
	}
	p, err := s.Query(ctxb, Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}})
	mustNoErr(t, err)
	if len(p.Edges) != len(rows) {
		t.Fatalf("a page of %d edges, want %d", len(p.Edges), len(rows))
	}
	for i, e := range p.Edges {
		o, ok := s.Get(e.Object.Key())
		for _, got := range []Labels{e.Object.Labels, o.Labels} {
			if !ok || !got.Equal(rows[i].Labels) || !maps.Equal(got.Map(), rows[i].Labels.Map()) {
				t.Errorf("%s: labels %v, want %v", e.Object.Name, got, rows[i].Labels)
			}
			if !slices.IsSorted(labelKeys(got)) {
				t.Errorf("%s: labels %v not in key order", e.Object.Name, got)
			}
		}
	}
}

// labelKeys returns the keys of l in its order.
func labelKeys(l Labels) []string {
	var keys []string
	for k := range l.All() {
		keys = append(keys, k)
	}
	return keys
}

// TestPageLabelsAfterPairReuse churns rows whose labels are their own, so
// that label pair ids are reclaimed and reused for other pairs, reading a
// page after every write: each page shows every row's labels as written,
// never labels of the pair ids' earlier meaning.
func TestPageLabelsAfterPairReuse(t *testing.T) {
	const (
		live  = 4
		churn = 400
	)
	s, _ := newTestStore(t, WithReplayBuffer(8))
	row := func(i int) Object {
		return pod("c0", "ns0", fmt.Sprintf("p-%04d", i), StatusHealthy,
			map[string]string{"app": fmt.Sprintf("v-%d", i), fmt.Sprintf("k-%d", i): "x", "tier": "web"})
	}
	q := Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}}
	for i := range churn {
		mustNoErr(t, s.Upsert(ctxb, row(i)))
		if i >= live {
			old := row(i - live)
			mustNoErr(t, s.Delete(ctxb, old.Key()))
		}
		page, err := s.Query(ctxb, q)
		mustNoErr(t, err)
		for _, e := range page.Edges {
			var n int
			if _, err := fmt.Sscanf(e.Object.Name, "p-%d", &n); err != nil {
				t.Fatal(err)
			}
			if want := row(n).Labels; !e.Object.Labels.Equal(want) {
				t.Fatalf("after write %d: %s has labels %v, want %v", i, e.Object.Name, e.Object.Labels, want)
			}
		}
	}
	if n := s.x.labels.pairs.len(); n > churn {
		t.Fatalf("label pair id space %d after %d rows of 2 own pairs: the test needs ids reused", n, churn)
	}
}

// TestPageObjectsShared checks that pages hand out one Object per row: a
// row read by two pages gets the same Object; a row updated in between
// gets a new one showing the update, while the earlier page's Object is
// unchanged; a single Get builds its own.
func TestPageObjectsShared(t *testing.T) {
	s, _ := newTestStore(t)
	for _, name := range []string{"a", "b", "c"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", name, StatusHealthy, map[string]string{"app": name})))
	}
	q := Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}}
	page := func() []Edge {
		t.Helper()
		p, err := s.Query(ctxb, q)
		mustNoErr(t, err)
		if len(p.Edges) != 3 {
			t.Fatalf("%d edges, want 3", len(p.Edges))
		}
		return p.Edges
	}
	p1, p2 := page(), page()
	for i := range p1 {
		if p1[i].Object != p2[i].Object {
			t.Errorf("%s: an Object of its own in the second page, want the first page's", p1[i].Object.Name)
		}
	}
	b := pod("c0", "ns0", "b", StatusUnhealthy, map[string]string{"app": "b2"})
	mustNoErr(t, s.Upsert(ctxb, b))
	p3 := page()
	for i, e := range p3 {
		if (e.Object == p1[i].Object) == (e.Object.Name == "b") {
			t.Errorf("%s: shares the first page's Object %v, want %v", e.Object.Name, e.Object == p1[i].Object, e.Object.Name != "b")
		}
	}
	if o := p3[1].Object; o.Status != StatusUnhealthy || !o.Labels.Equal(b.Labels) {
		t.Errorf("b after its update: %s %v, want %s %v", o.Status, o.Labels, StatusUnhealthy, b.Labels)
	}
	if o := p1[1].Object; o.Status != StatusHealthy || o.Labels.Get("app") != "b" {
		t.Errorf("the first page's b changed: %s %v", o.Status, o.Labels)
	}
	if o, ok := s.Get(p1[0].Object.Key()); !ok || o == p1[0].Object || o.Name != "a" {
		t.Errorf("Get: the page's Object %v, want one of its own", o == p1[0].Object)
	}
}

// TestPageObjectsBounded keeps Objects the worst way for memory: pages of
// MaxPageSize new rows, each followed by a page of one row of every slab
// built so far, so that old slabs stay reachable through one Object each.
// The slabs the table keeps alive stay within its bound, and each slab's
// count of entries is right.
func TestPageObjectsBounded(t *testing.T) {
	const slabs = 40
	var c pageCache
	var rows [][]*objRow
	bound := pageObjectsBytes + MaxPageSize*int(unsafe.Sizeof(Object{}))
	for k := range slabs {
		slab := &objSlab{objs: make([]Object, MaxPageSize)}
		block := make([]*objRow, MaxPageSize)
		for i := range block {
			block[i] = &objRow{rid: uint32(k*MaxPageSize + i)}
			c.putObject(pageObject{r: block[i], o: &slab.objs[i], slab: slab})
		}
		rows = append(rows, block)
		for j := range k {
			if r := rows[j][0]; c.object(r) == nil {
				c.putObject(pageObject{r: r, o: new(Object), slab: &objSlab{objs: make([]Object, 1)}})
			}
		}
		kept := map[*objSlab]int{}
		for _, po := range c.objs {
			if po.slab != nil {
				kept[po.slab]++
			}
		}
		n := 0
		for s, entries := range kept {
			n += s.bytes()
			if s.kept != entries {
				t.Fatalf("after slab %d: a slab counts %d entries, the table holds %d", k, s.kept, entries)
			}
		}
		if n != c.slabBytes || n > bound {
			t.Fatalf("after slab %d: the kept Objects hold %d bytes of slabs alive (counted %d), want at most %d", k, n, c.slabBytes, bound)
		}
	}
}

// TestPageObjectsConcurrent reads overlapping pages from several
// goroutines while a writer changes rows (with the race detector, the
// check that kept Objects are published safely): every Object a page
// shows is one row's, whole: its labels and message were written together.
func TestPageObjectsConcurrent(t *testing.T) {
	const (
		rows    = 300
		readers = 3
		writes  = 600
	)
	s, _ := newTestStore(t, WithReplayBuffer(16))
	row := func(i, rev int) Object {
		name := fmt.Sprintf("p-%03d", i)
		o := pod("c0", fmt.Sprintf("ns%d", i%3), name, StatusHealthy, map[string]string{"name": name, "rev": fmt.Sprint(rev)})
		o.Message = fmt.Sprint(rev)
		return o
	}
	for i := range rows {
		mustNoErr(t, s.Upsert(ctxb, row(i, 0)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	done := make(chan struct{})
	for g := range readers {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				q := Query{Filter: Filter{Namespaces: []string{fmt.Sprintf("ns%d", (g+n)%3)}}, First: 50 + 25*g, Access: &Access{All: true}}
				p, err := s.Query(ctxb, q)
				if err != nil {
					errs <- err
					return
				}
				for _, e := range p.Edges {
					if o := e.Object; o.Labels.Get("name") != o.Name || o.Labels.Get("rev") != o.Message {
						errs <- fmt.Errorf("%s: labels %v with message %q", o.Name, o.Labels, o.Message)
						return
					}
				}
			}
		})
	}
	for n := range writes {
		mustNoErr(t, s.Upsert(ctxb, row(n%rows, n+1)))
	}
	close(done)
	wg.Wait()
	for range readers {
		mustNoErr(t, <-errs)
	}
}

// TestPageObjectsDroppedWithCluster pages through a cluster's rows and
// removes the cluster: the page cache keeps no Object of its rows, which
// would otherwise keep their data alive until other pages evicted them.
func TestPageObjectsDroppedWithCluster(t *testing.T) {
	s, _ := newTestStore(t)
	for _, c := range []string{"c0", "c1"} {
		for i := range 50 {
			mustNoErr(t, s.Upsert(ctxb, pod(c, "ns0", fmt.Sprintf("p-%02d", i), StatusHealthy, map[string]string{"app": "web"})))
		}
	}
	page, err := s.Query(ctxb, Query{Filter: Filter{Kinds: []string{"Pod"}}, First: MaxPageSize, Access: &Access{All: true}})
	mustNoErr(t, err)
	if len(page.Edges) != 100 {
		t.Fatalf("a page of %d edges, want 100", len(page.Edges))
	}
	kept := func(cluster string) int {
		c := &s.x.labels.cache
		c.mu.Lock()
		defer c.mu.Unlock()
		n := 0
		for _, po := range c.objs {
			if po.o != nil && po.o.Cluster == cluster {
				n++
			}
		}
		return n
	}
	if n := kept("c0"); n != 50 {
		t.Fatalf("the cache keeps %d Objects of c0 before its removal, want 50 (the test needs them kept)", n)
	}
	mustNoErr(t, s.RemoveCluster(ctxb, "c0"))
	if n := kept("c0"); n != 0 {
		t.Errorf("the cache keeps %d Objects of the removed cluster c0, want 0", n)
	}
	if c := &s.x.labels.cache; c.slabBytes != 0 {
		t.Errorf("the cache counts %d bytes of slabs after dropping its Objects, want 0", c.slabBytes)
	}
}
