package index

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"
)

// OrderField is what a query sorts by. The object id (its key,
// cluster/group/kind/namespace/name) breaks ties, so orders are total and
// cursors stay stable.
type OrderField string

// The sort orders.
const (
	OrderName      OrderField = "NAME"
	OrderNamespace OrderField = "NAMESPACE"
	OrderCluster   OrderField = "CLUSTER"
	OrderKind      OrderField = "KIND"
	OrderStatus    OrderField = "STATUS" // in the order of Statuses
	OrderCreatedAt OrderField = "CREATED_AT"
	OrderUpdatedAt OrderField = "UPDATED_AT"
)

// Order is a sort order; the zero value is by name, ascending.
type Order struct {
	Field OrderField
	Desc  bool
}

// Page sizes.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// Query is one list request.
type Query struct {
	Filter Filter
	Order  Order
	// First is the page size: DefaultPageSize when 0, at most MaxPageSize.
	First int
	// After is the cursor of the last edge of the previous page.
	After string
	// Access is the viewer's access; nil sees nothing.
	Access *Access
	// NoTotal leaves Page.TotalCount and Page.StaleClusters unset (0 and
	// nil). Counting every match costs more than the page itself when the
	// matches are many (a scan of the source, or a pass over the count
	// cells per cluster for a restricted viewer), so a caller that shows
	// neither, such as a GraphQL query that selects neither field, asks
	// for the page alone. The edges and HasNextPage do not change.
	NoTotal bool
	// NoEdgeCursors leaves Edge.Cursor empty on every edge but the first
	// and the last: what a Relay connection's startCursor and endCursor
	// show, and the After of the next page. A cursor is encoded per edge
	// (base64 of the sort value and the key), which cost about a third of
	// the CPU of a 100-row page once its labels were shared, so a caller
	// that shows no edge's own cursor, such as a GraphQL query that does
	// not select it, asks for these two alone. Nothing else changes.
	NoEdgeCursors bool
}

// Page is one page of a query result.
type Page struct {
	Edges []Edge
	// TotalCount counts every visible object matching the filter (0 when
	// the query set NoTotal).
	TotalCount  int
	HasNextPage bool
	// StaleClusters lists, in name order, the clusters in the query's scope
	// (filter and access) whose rows are last-known state (Cluster.Stale);
	// nil when the query set NoTotal.
	StaleClusters []string
	// Seq is the change feed position the page reflects: Subscribe(Seq)
	// delivers exactly the changes after it.
	Seq uint64
}

// Edge is one object of a page.
type Edge struct {
	// Object must not be mutated: it is shared with other pages (see
	// Object).
	Object *Object
	// Cursor resumes the query after this object.
	Cursor string
	// Stale is true when the object's cluster is stale.
	Stale bool
}

// cursor is the decoded form of an opaque cursor: the sort value and the
// key of the last row returned.
type cursor struct {
	Field OrderField
	Desc  bool
	Str   string
	Num   int64
	Key   Key
}

// orderFields numbers the order fields in cursors.
var orderFields = []OrderField{OrderName, OrderNamespace, OrderCluster, OrderKind, OrderStatus, OrderCreatedAt, OrderUpdatedAt}

// cursorVersion is the first byte of every cursor, so that a change of
// format is told apart from a corrupt cursor.
const cursorVersion = 1

// maxCursorLen bounds the length of a cursor Query hands out, so that
// decodeCursor refuses a longer one before decoding it: the three leading
// bytes, three varints, and the sort value and the key, each at most
// maxKeyLen (the key with its five terminators), in unpadded base64,
// which is a third longer (a bound of 2*maxKeyLen+64 forgot that, and
// refused the cursors of rows with names over about 3 KiB).
const (
	maxCursorBytes = 3 + 3*binary.MaxVarintLen64 + 2*maxKeyLen + 5
	maxCursorLen   = (maxCursorBytes*4 + 2) / 3
)

// appendCursor appends the opaque form of c to dst: base64url (unpadded)
// of the version, the field's index in orderFields, a flags byte (1:
// descending), Num as a varint, then Str and Key, each a uvarint length and
// the bytes. A page encodes a cursor per edge, so this is hand-rolled (JSON
// took about a third of the CPU of a page and most of its garbage), and a
// page's cursors share one buffer.
func appendCursor(dst []byte, c cursor) []byte {
	var buf [256]byte // on the stack unless the key is long
	b := append(buf[:0], cursorVersion, byte(slices.Index(orderFields, c.Field)), 0)
	if c.Desc {
		b[2] = 1
	}
	b = binary.AppendVarint(b, c.Num)
	b = binary.AppendUvarint(b, uint64(len(c.Str)))
	b = append(b, c.Str...)
	b = binary.AppendUvarint(b, uint64(objectKeyLen(&c.Key)))
	b = appendObjectKey(b, c.Key)
	return base64.RawURLEncoding.AppendEncode(dst, b)
}

func decodeCursor(s string, o Order) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	malformed := fmt.Errorf("%w: malformed cursor", ErrInvalidQuery)
	if len(s) > maxCursorLen {
		return nil, malformed
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed cursor: %w", ErrInvalidQuery, err)
	}
	if len(b) < 3 || b[0] != cursorVersion || int(b[1]) >= len(orderFields) || b[2] > 1 {
		return nil, malformed
	}
	c := cursor{Field: orderFields[b[1]], Desc: b[2] == 1}
	b = b[3:]
	num, n := binary.Varint(b)
	if n <= 0 {
		return nil, malformed
	}
	c.Num, b = num, b[n:]
	var key string
	for _, dst := range []*string{&c.Str, &key} {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return nil, malformed
		}
		*dst, b = string(b[n:n+int(l)]), b[n+int(l):]
	}
	var ok bool
	if c.Key, ok = parseObjectKey(key); !ok || len(b) != 0 {
		return nil, malformed
	}
	if c.Field != o.Field || c.Desc != o.Desc {
		return nil, fmt.Errorf("%w: cursor belongs to another order", ErrInvalidQuery)
	}
	if c.Field == OrderName && (c.Key.Name != c.Str || len(key) > maxKeyLen+8) {
		return nil, malformed
	}
	// A position holds only what its order sorts by (see sortKeyOf): no
	// number in a string order, no string in a numeric one, neither in
	// cluster order. Every cursor Query hands out is so; another would
	// name a position no row can have.
	switch c.Field {
	case OrderName, OrderNamespace, OrderKind:
		if c.Num != 0 {
			return nil, malformed
		}
	case OrderCluster:
		if c.Num != 0 || c.Str != "" {
			return nil, malformed
		}
	default:
		if c.Str != "" {
			return nil, malformed
		}
	}
	return &c, nil
}

// sortKey is a row's position in an order, comparable with a cursor. In
// the name order pfx is the name's prefix, which decides most comparisons
// without the name. The key that breaks ties is the row's (row), or for a
// position no row holds (a cursor's) key; rows' keys are read only when
// the rest ties.
type sortKey struct {
	pfx namePfx
	str string
	num int64
	row *objRow
	key *Key // when row is nil
	// rowName says that the order is by name and str is not set: the
	// name is row's, read only when the prefixes tie (see
	// collector.visit).
	rowName bool
}

// text returns the string k sorts by after its prefix.
func (k *sortKey) text() string {
	if k.rowName {
		return k.row.name()
	}
	return k.str
}

func validOrder(f OrderField) bool {
	switch f {
	case OrderName, OrderNamespace, OrderCluster, OrderKind, OrderStatus, OrderCreatedAt, OrderUpdatedAt:
		return true
	}
	return false
}

// sortKeyOf returns r's sort key in order f.
func (x *objIndex) sortKeyOf(f OrderField, r *objRow) sortKey {
	k := sortKey{row: r}
	switch f {
	case OrderName:
		k.pfx, k.str = x.pfx[r.rid], r.name()
	case OrderNamespace:
		k.str = x.namespaces.str(r.nsid)
	case OrderCluster:
		// The key starts with the cluster: key order is cluster order.
	case OrderKind:
		k.str = r.kind.Kind.Kind
	case OrderStatus:
		k.num = int64(r.status)
	case OrderCreatedAt:
		k.num = r.created
	case OrderUpdatedAt:
		k.num = r.updated
	}
	return k
}

// compareSortKeys orders two positions; their rows must be readable
// (the lock held since they were taken).
func (x *objIndex) compareSortKeys(a, b *sortKey) int {
	if c := a.pfx.compare(b.pfx); c != 0 {
		return c
	}
	if c := cmp.Compare(a.text(), b.text()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.num, b.num); c != 0 {
		return c
	}
	switch {
	case a.row != nil && b.row != nil:
		return x.compareRows(a.row, b.row)
	case a.row != nil:
		return x.compareRowKey(a.row, b.key)
	case b.row != nil:
		return -x.compareRowKey(b.row, a.key)
	}
	return compareKeys(a.key, b.key)
}

// pinKey makes k hold its row's key rather than the row, for a position
// kept across a pause.
func (x *objIndex) pinKey(k *sortKey) {
	if k.row != nil {
		key := x.keyOf(k.row)
		k.row, k.key = nil, &key
	}
}

// Query returns one page of visible objects matching q, with the total
// count unless q.NoTotal, in q.Order.
//
// The planner picks the cheapest candidate source: the posting list of the
// kinds and statuses, of the clusters and namespaces, of a label
// requirement, the namespaces the viewer may see, or every row. When the
// best source is still large and the order has an index (name, cluster),
// walks that index from the cursor instead and counts separately, from
// the count cells when the filter allows. Every row is checked against the
// whole filter and the access, so sources only bound the work.
//
// The page's Objects are shared: a row that a recent page returned comes
// back as the same *Object (see pageCache), so callers read them and
// never mutate them; copy one to change it (its Labels are immutable).
func (s *Store) Query(ctx context.Context, q Query) (*Page, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("index: query: %w", err)
	}
	if q.Order.Field == "" {
		q.Order.Field = OrderName
	}
	if !validOrder(q.Order.Field) {
		return nil, fmt.Errorf("%w: unknown order %q", ErrInvalidQuery, q.Order.Field)
	}
	first := q.First
	if first <= 0 {
		first = DefaultPageSize
	}
	first = min(first, MaxPageSize)
	cur, err := decodeCursor(q.After, q.Order)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, err := s.x.compile(s.db, &q.Filter, q.Access)
	if err != nil {
		return nil, err
	}
	p.paced(s, ctx)
	defer p.end() // after the last use of rows, which are p's
	stale := s.stale
	page := &Page{Seq: s.seq, Edges: []Edge{}}
	if !q.NoTotal {
		page.StaleClusters = p.staleInScope(stale)
	}
	if p.empty {
		return page, nil
	}
	var after *sortKey
	if cur != nil {
		after = &sortKey{str: cur.Str, num: cur.Num, key: &cur.Key}
		if cur.Field == OrderName {
			after.pfx = namePrefix(cur.Str)
		}
	}
	rows, more, total, err := p.run(q.Order, after, first, !q.NoTotal)
	if err != nil {
		return nil, err
	}
	page.TotalCount, page.HasNextPage = total, more
	page.Edges = make([]Edge, len(rows))
	s.x.pageObjects(page.Edges, rows)
	// The cursors are encoded into one buffer (one allocation instead of
	// one per edge) and each edge's cursor is a string of its bytes:
	// appending writes only past them, and a buffer an append outgrew is
	// not written again.
	var cursors []byte
	encoded := len(rows)
	if q.NoEdgeCursors {
		encoded = min(encoded, 2)
	}
	for i, r := range rows {
		page.Edges[i].Stale = stale[s.x.clusters.str(r.cid)]
		if q.NoEdgeCursors && i != 0 && i != len(rows)-1 {
			continue // an empty cursor
		}
		sk, key := s.x.sortKeyOf(q.Order.Field, r), s.x.keyOf(r)
		if cursors == nil {
			cursors = make([]byte, 0, encoded*base64.RawURLEncoding.EncodedLen(objectKeyLen(&key)+len(sk.str)+16))
		}
		start := len(cursors)
		cursors = appendCursor(cursors, cursor{Field: q.Order.Field, Desc: q.Order.Desc, Str: sk.str, Num: sk.num, Key: key})
		page.Edges[i].Cursor = unsafe.String(unsafe.SliceData(cursors[start:]), len(cursors)-start)
	}
	return page, nil
}

// exactScanRatio is how many rows of an exact source collect scans in the
// time walk visits one row (measured at 1M rows: about 30 ns, a cache miss
// on the prefix array, against about 300 ns for merging the name order's
// runs, loading the row and checking the filter).
const exactScanRatio = 10

// run returns the page rows, whether more follow, and the total (0 when
// not counted).
func (p *plan) run(o Order, after *sortKey, first int, counted bool) ([]*objRow, bool, int, error) {
	src := p.bestSource()
	if budget := p.walkPlan(&src, first); o.Field == OrderName && budget > 0 {
		rows, more, ok, err := p.walk(src, o, after, first, budget)
		if err != nil {
			return nil, false, 0, err
		}
		if ok && !counted {
			return rows, more, 0, nil
		}
		if ok {
			total, err := p.count(src)
			return rows, more, total, err
		}
	}
	rows, more, total, err := p.collect(src, o, after, first)
	if !counted {
		total = 0
	}
	return rows, more, total, err
}

// walkPlan returns how many items a walk of the name order for src may
// visit before it gives up and collects, or 0 when collecting is cheaper.
// It clears src.orders when the walk is to be of the whole index's order.
func (p *plan) walkPlan(src *source, first int) int {
	if src.exact && src.orders != nil {
		// The page is the source's first rows after the cursor in its
		// lists' name orders, and the total its size.
		return src.est + first + 1
	}
	src.orders = nil
	live := len(p.x.rows) - len(p.x.free)
	// Walking the name order from the cursor finds a page after about
	// first*live/matches rows, each loaded and checked. Collecting visits
	// the whole source, but an exact source costs only a prefix comparison
	// per row, about exactScanRatio times less than a row visit.
	ratio := 1
	if src.exact {
		ratio = exactScanRatio
	}
	if src.est <= 4*first || src.est*src.est < ratio*first*live {
		return 0
	}
	// Matches are plentiful enough for the walk to be cheaper, if they
	// are spread over the order. They need not be: names often start with
	// their kind or app, so a kind's rows can be one stretch of the order,
	// far from its start (on the 1M-object fleet, a page of Pods walked
	// the half million rows named before "pod-" and took over a second).
	// So the walk gives up, and collects, once it has cost what collecting
	// would: never more than twice a collect.
	return walkBudget(*src, first)
}

// walkBudget is how many items a walk visits before it gives up: what
// collecting src would cost, in walk visits.
func walkBudget(src source, first int) int {
	if src.exact {
		return src.est/exactScanRatio + first
	}
	return src.est + first
}

// collect scans a source: it counts every match and keeps the first rows
// after the cursor in a bounded heap. In the name order, the prefix array
// places most rows before or after the cursor and the heap's last row
// without loading them, so an exact source costs a few nanoseconds a row.
func (p *plan) collect(src source, o Order, after *sortKey, first int) ([]*objRow, bool, int, error) {
	// The scan's visitor escapes (sources call it through a func value),
	// and with it whatever it captures: a closure would cost an allocation,
	// and one for each variable it captures. The collector is the plan's
	// (a plan collects at most once), so it costs none.
	c := &p.coll
	*c = collector{p: p, o: o, after: after}
	c.h.init(p.x, o.Desc, first+1, src.est, p.slots)
	if err := p.scan(src, c); err != nil {
		return nil, false, 0, err
	}
	p.rows = c.h.sorted(p.rows)
	p.slots = c.h.slots
	rows := p.rows
	more := len(rows) > first
	if more {
		rows = rows[:first]
	}
	return rows, more, c.total, nil
}

// collector is collect's state: it counts the matches and keeps the first
// rows after the cursor.
type collector struct {
	p     *plan
	o     Order
	after *sortKey
	h     topK
	total int
}

// beyond reports whether a row whose key compares c with a bound is past
// it in the order.
func (c *collector) beyond(cmp int) bool {
	return (!c.o.Desc && cmp > 0) || (c.o.Desc && cmp < 0)
}

// visit is the scan's callback for one row id.
func (c *collector) visit(rid uint32, exact bool) bool {
	x := c.p.x
	var r *objRow
	if !exact {
		if r = x.rows[rid]; !c.p.match(r) {
			return true
		}
	}
	c.total++
	if c.o.Field == OrderName {
		pfx := x.pfx[rid]
		if c.after != nil && c.beyond(c.after.pfx.compare(pfx)) {
			return true
		}
		if c.h.full() && c.beyond(pfx.compare(c.h.last().pfx)) {
			return true
		}
	}
	if r == nil {
		r = x.rows[rid]
	}
	var sk sortKey
	if c.o.Field == OrderName {
		// The prefix decides most comparisons: the row's name (its
		// data, two dependent cache misses at 1M rows) is read only
		// when it does not. The page's Objects read the rows they build
		// in one pass, whose misses overlap (see pageObjects), where
		// reading each name here cost the scan them one after another.
		sk = sortKey{pfx: x.pfx[rid], row: r, rowName: true}
	} else {
		sk = x.sortKeyOf(c.o.Field, r)
	}
	if c.after != nil && !c.beyond(x.compareSortKeys(&sk, c.after)) {
		return true
	}
	c.h.offer(r, sk)
	return true
}

// count returns the number of visible matches, from the count cells when
// that is cheaper than scanning the source.
func (p *plan) count(src source) (int, error) {
	if src.exact && (p.pace == nil || !p.pace.paused) {
		return src.est, nil
	}
	if p.aggregatable() {
		if t, ok := p.tally(false, src.est); ok {
			return t.total, nil
		}
	}
	n := 0
	err := p.scan(src, visitFunc(func(rid uint32, exact bool) bool {
		if exact || p.match(p.x.rows[rid]) {
			n++
		}
		return true
	}))
	return n, err
}

// walk reads rows in order from the cursor, keeping matches, until it has
// first+1 or has visited budget rows (then ok is false). Only the name
// order has an index to walk: the whole index's, or src.orders, its
// lists' own. Rows outside src are skipped without being loaded when src
// can test membership; rows of an exact source need no filter check.
// Every walkChunk rows it pauses (see pacer) and resumes after the last
// row it visited; a walk of src.orders gives up instead (ok false), as
// writers may have changed the orders meanwhile.
func (p *plan) walk(src source, o Order, after *sortKey, first, budget int) (rows []*objRow, more, ok bool, err error) {
	x := p.x
	rows = make([]*objRow, 0, max(0, min(first+1, src.est)))
	for {
		var pivot *nameSeek
		if after != nil {
			pivot = &nameSeek{pfx: namePrefix(after.str), key: *after.key}
		}
		exact := src.exact && (src.canTest() || src.orders != nil) && (p.pace == nil || !p.pace.paused)
		visited, last, stopped := 0, uint32(0), false
		walk := func(visit func(rid uint32) bool) { x.byName.walk(pivot, p.kindNames(), o.Desc, visit) }
		if src.orders != nil {
			walk = func(visit func(rid uint32) bool) { walkOrders(src.orders, pivot, nil, o.Desc, visit) }
		}
		walk(func(rid uint32) bool {
			if p.pace != nil && visited == walkChunk {
				if p.pace.due() {
					stopped = true
					return false
				}
				visited = 0 // nobody waits: walk on without re-seeking
			}
			visited++
			last = rid
			budget--
			if budget < 0 {
				return false
			}
			if src.orders == nil && src.canTest() && !src.contains(rid) {
				return true
			}
			r := x.rows[rid]
			if after != nil {
				sk := x.sortKeyOf(o.Field, r)
				c := x.compareSortKeys(&sk, after)
				if (!o.Desc && c <= 0) || (o.Desc && c >= 0) {
					return true
				}
			}
			if exact || p.match(r) {
				rows = append(rows, r)
			}
			return len(rows) <= first
		})
		if budget < 0 {
			return nil, false, false, nil
		}
		if !stopped {
			break
		}
		if src.orders != nil {
			return nil, false, false, nil
		}
		// The chunk ended: resume after its last row once others ran.
		sk := x.sortKeyOf(OrderName, x.rows[last])
		x.pinKey(&sk)
		after = &sk
		if err := p.pace.pause(); err != nil {
			return nil, false, false, err
		}
	}
	more = len(rows) > first
	if more {
		rows = rows[:first]
	}
	return rows, more, true, nil
}

// kindNames returns the range of name prefixes that holds every row of
// the filter's kinds, or nil when the filter has no kinds. Names often
// start with their kind, so a kind's rows can be one stretch of the name
// order, far from its ends: a walk for them starts and ends there.
func (p *plan) kindNames() *pfxRange {
	if p.kids == nil {
		return nil
	}
	var r pfxRange
	for kid, in := range p.kids {
		if kr := p.x.kindNamesOf(uint32(kid)); in && kr.set {
			r.widen(kr.lo)
			r.widen(kr.hi)
		}
	}
	if !r.set {
		return nil // no row of these kinds: the source is empty
	}
	return &r
}

// topK keeps the limit first rows of an order. It is a max-heap of
// indexes into its slots' items, so sifting moves small integers rather
// than sort keys (whose strings would need write barriers while the
// collector runs), and a row that displaces the last one takes over its
// slot. The heap's k-th index is kept in slot k beside the k-th item: both
// grow by one per row until the heap is full, so they are one allocation.
type topK struct {
	x     *objIndex
	limit int32 // at most MaxPageSize+1
	desc  bool
	slots []topSlot
}

type topSlot struct {
	r    *objRow
	sk   sortKey
	heap int32 // the heap's entry at this slot's position, an index of slots; slots[0].heap indexes the last row of the page so far
}

// init makes h keep the limit first of at most est rows, in buf's array
// when it is large enough.
func (h *topK) init(x *objIndex, desc bool, limit, est int, buf []topSlot) {
	n := max(0, min(limit, est))
	*h = topK{x: x, desc: desc, limit: int32(limit), slots: slices.Grow(buf[:0], n)}
}

// after reports whether the item of slot i comes after that of slot j in
// the order.
func (h *topK) after(i, j int32) bool {
	c := h.x.compareSortKeys(&h.slots[i].sk, &h.slots[j].sk)
	return (!h.desc && c > 0) || (h.desc && c < 0)
}

// full reports whether the heap holds limit rows; last is then the last
// row of the page.
func (h *topK) full() bool { return len(h.slots) >= int(h.limit) }

func (h *topK) last() *sortKey { return &h.slots[h.slots[0].heap].sk }

// offer adds r, whose sort key is sk, if it is among the limit first.
func (h *topK) offer(r *objRow, sk sortKey) {
	if !h.full() {
		n := int32(len(h.slots))
		h.slots = append(h.slots, topSlot{r: r, sk: sk, heap: n})
		for i := n; i > 0; {
			parent := (i - 1) / 2
			hi, hp := &h.slots[i].heap, &h.slots[parent].heap
			if !h.after(*hi, *hp) {
				break
			}
			*hi, *hp = *hp, *hi
			i = parent
		}
		return
	}
	c := h.x.compareSortKeys(&sk, h.last())
	if (!h.desc && c >= 0) || (h.desc && c <= 0) {
		return
	}
	top := &h.slots[h.slots[0].heap]
	top.r, top.sk = r, sk
	h.siftDown(len(h.slots))
}

// siftDown restores the heap order of the heap's first n entries after
// the first one changed.
func (h *topK) siftDown(n int) {
	for i := 0; ; {
		j := 2*i + 1
		if j >= n {
			return
		}
		if k := j + 1; k < n && h.after(h.slots[k].heap, h.slots[j].heap) {
			j = k
		}
		hi, hj := &h.slots[i].heap, &h.slots[j].heap
		if !h.after(*hj, *hi) {
			return
		}
		*hi, *hj = *hj, *hi
		i = j
	}
}

// sorted returns the rows in order, in buf's array when it is large
// enough, taking each last row off the heap in turn (a heapsort: no index
// slice or comparison closure to allocate). It empties the heap, and
// clears its slots, so that they keep no row alive.
func (h *topK) sorted(buf []*objRow) []*objRow {
	out := slices.Grow(buf[:0], len(h.slots))[:len(h.slots)]
	for n := len(h.slots); n > 0; n-- {
		out[n-1] = h.slots[h.slots[0].heap].r
		h.slots[0].heap = h.slots[n-1].heap
		h.siftDown(n - 1)
	}
	clear(h.slots)
	h.slots = h.slots[:0]
	return out
}

// staleInScope returns, sorted, the stale clusters the filter and access
// could show.
func (p *plan) staleInScope(stale map[string]bool) []string {
	out := []string{}
	for name := range stale {
		if cid, ok := p.x.clusters.lookup(name); p.clusters.on && (!ok || !p.clusters.has(cid)) {
			continue
		}
		if p.access == nil || (!p.access.All && p.access.Clusters[name] == nil) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
