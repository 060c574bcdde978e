package index

import (
	"fmt"
	"maps"
	"reflect"
	"sync"
	"testing"
	"unsafe"
)

// TestPageLabelsShared checks that pages hand out one Labels map per label
// set: a row read by two pages, and two rows with equal labels, share it;
// a single Get builds its own.
func TestPageLabelsShared(t *testing.T) {
	s, _ := newTestStore(t)
	labels := map[string]string{"app": "web", "tier": "front"}
	for _, name := range []string{"a", "b"} {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", name, StatusHealthy, labels)))
	}
	q := Query{Filter: Filter{Kinds: []string{"Pod"}}, Access: &Access{All: true}}
	p1, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	p2, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	if len(p1.Edges) != 2 || len(p2.Edges) != 2 {
		t.Fatalf("pages of %d and %d edges, want 2", len(p1.Edges), len(p2.Edges))
	}
	mapID := func(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }
	first := mapID(p1.Edges[0].Object.Labels)
	for _, e := range append(p1.Edges, p2.Edges...) {
		if !maps.Equal(e.Object.Labels, labels) {
			t.Errorf("%s: labels %v, want %v", e.Object.Name, e.Object.Labels, labels)
		}
		if mapID(e.Object.Labels) != first {
			t.Errorf("%s: a Labels map of its own, want the page's shared one", e.Object.Name)
		}
	}
	o, ok := s.Get(p1.Edges[0].Object.Key())
	if !ok || !maps.Equal(o.Labels, labels) || mapID(o.Labels) == first {
		t.Errorf("Get: labels %v (shared %v), want %v in a map of its own", o.Labels, mapID(o.Labels) == first, labels)
	}
}

// TestPageLabelsAfterPairReuse churns rows whose labels are their own, so
// that label pair ids are reclaimed and reused for other pairs, reading a
// page after every write: each page shows every row's labels as written,
// never a map kept for the pair ids' earlier meaning.
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
			if want := row(n).Labels; !maps.Equal(e.Object.Labels, want) {
				t.Fatalf("after write %d: %s has labels %v, want %v", i, e.Object.Name, e.Object.Labels, want)
			}
		}
	}
	if n := s.x.labels.pairs.len(); n > churn {
		t.Fatalf("label pair id space %d after %d rows of 2 own pairs: the test needs ids reused", n, churn)
	}
}

// TestPageLabelsKeptAcrossReclaim churns the labels of a row no page
// read, so that commits reclaim pair ids nobody paged: the maps pages
// share survive them.
func TestPageLabelsKeptAcrossReclaim(t *testing.T) {
	const churn = 64
	s, _ := newTestStore(t, WithReplayBuffer(8))
	mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", "a", StatusHealthy, map[string]string{"app": "web"})))
	q := Query{Filter: Filter{Namespaces: []string{"ns0"}}, Access: &Access{All: true}}
	p1, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	for i := range churn {
		mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns1", "b", StatusHealthy, map[string]string{"rev": fmt.Sprint(i)})))
	}
	if n := s.x.labels.pairs.len(); n >= churn {
		t.Fatalf("label pair id space %d after %d values: the test needs ids reclaimed", n, churn)
	}
	// A new row with the same labels: its Object is built, its Labels map
	// is the kept one.
	mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", "a2", StatusHealthy, map[string]string{"app": "web"})))
	p2, err := s.Query(ctxb, q)
	mustNoErr(t, err)
	mapID := func(m map[string]string) uintptr { return reflect.ValueOf(m).Pointer() }
	if len(p1.Edges) != 1 || len(p2.Edges) != 2 || mapID(p1.Edges[0].Object.Labels) != mapID(p2.Edges[1].Object.Labels) {
		t.Fatalf("the page's Labels map was built again after commits that reclaimed only pairs no page read")
	}
}

// pagedLabelRow pages a store of one row labelled app=web, and returns
// the label-map table and the row, whose map the page kept.
func pagedLabelRow(t *testing.T) (*pageCache, *objRow) {
	t.Helper()
	s, _ := newTestStore(t)
	mustNoErr(t, s.Upsert(ctxb, pod("c0", "ns0", "a", StatusHealthy, map[string]string{"app": "web"})))
	p, err := s.Query(ctxb, Query{Access: &Access{All: true}})
	mustNoErr(t, err)
	k := p.Edges[0].Object.Key()
	r := s.x.lookup(&k)
	if s.x.labels.cache.set(r.labelBytes()) == nil {
		t.Fatal("the page kept no label map")
	}
	return &s.x.labels.cache, r
}

// TestPageLabelsEpochWrap checks that a label map kept in an epoch is not
// found again when the epoch counter comes back to it after 2^32 resets.
func TestPageLabelsEpochWrap(t *testing.T) {
	c, r := pagedLabelRow(t)
	c.resetSets()
	if c.set(r.labelBytes()) != nil {
		t.Fatal("a label map is found after a reset")
	}
	c.epoch = ^uint32(0) - 1 // two resets before the epoch wraps back to 0, the map's
	c.resetSets()
	c.resetSets()
	if c.set(r.labelBytes()) != nil {
		t.Fatal("a label map kept 2^32 resets ago is found again")
	}
}

// TestPageLabelsTable checks the label-map table's two rules that no
// page exercises for sure: a map is found only by its whole label bytes
// (a forged entry with the same hash and another set is not returned),
// and keeping a map evicts an entry of an earlier epoch before a current
// one.
func TestPageLabelsTable(t *testing.T) {
	c, r := pagedLabelRow(t)
	set := r.labelBytes()

	es, h := c.labelSet(set)
	saved := [2]pageSet{es[0], es[1]}
	wrong := map[string]string{"app": "other"}
	es[0] = pageSet{hash: h, epoch: c.epoch, set: "forged", m: wrong}
	es[1] = es[0]
	if m := c.set(set); m != nil {
		t.Fatalf("a forged entry with the same hash is found: %v", m)
	}
	es[0], es[1] = saved[0], saved[1]

	c.resetSets() // the kept map is now of an earlier epoch, in es[0]
	other := pageSet{hash: h + 1, epoch: c.epoch, set: "current", m: wrong}
	es[1] = other
	m := map[string]string{"app": "web"}
	if got := c.keepSet(r, m); !maps.Equal(got, m) {
		t.Fatalf("keepSet = %v, want %v", got, m)
	}
	if es[1].set != "current" || es[0].set != set || es[0].epoch != c.epoch {
		t.Errorf("after keepSet the set holds %q (epoch %d) and %q: want the new map first and the current entry kept",
			es[0].set, es[0].epoch, es[1].set)
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
	if o := p3[1].Object; o.Status != StatusUnhealthy || !maps.Equal(o.Labels, b.Labels) {
		t.Errorf("b after its update: %s %v, want %s %v", o.Status, o.Labels, StatusUnhealthy, b.Labels)
	}
	if o := p1[1].Object; o.Status != StatusHealthy || o.Labels["app"] != "b" {
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
					if o := e.Object; o.Labels["name"] != o.Name || o.Labels["rev"] != o.Message {
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
