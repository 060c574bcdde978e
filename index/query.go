package index

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/go-memdb"
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
}

// Page is one page of a query result.
type Page struct {
	Edges []Edge
	// TotalCount counts every visible object matching the filter.
	TotalCount  int
	HasNextPage bool
	// StaleClusters lists, in name order, the clusters in the query's scope
	// (filter and access) whose rows are last-known state (Cluster.Stale).
	StaleClusters []string
	// Seq is the change feed position the page reflects: Subscribe(Seq)
	// delivers exactly the changes after it.
	Seq uint64
}

// Edge is one object of a page.
type Edge struct {
	Object *Object
	// Cursor resumes the query after this object.
	Cursor string
	// Stale is true when the object's cluster is stale.
	Stale bool
}

// cursor is the decoded form of an opaque cursor: the sort value and the
// key of the last row returned.
type cursor struct {
	Field OrderField `json:"o"`
	Desc  bool       `json:"d,omitempty"`
	Str   string     `json:"s,omitempty"`
	Num   int64      `json:"n,omitempty"`
	Key   string     `json:"k"`
}

func encodeCursor(c cursor) string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("index: encoding cursor: %v", err))
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string, o Order) (*cursor, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed cursor: %w", ErrInvalidQuery, err)
	}
	var c cursor
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%w: malformed cursor: %w", ErrInvalidQuery, err)
	}
	if c.Field != o.Field || c.Desc != o.Desc || c.Key == "" {
		return nil, fmt.Errorf("%w: cursor belongs to another order", ErrInvalidQuery)
	}
	if c.Field == OrderName && (!strings.HasSuffix(c.Key, "\x00"+c.Str+"\x00") || len(c.Key) > maxKeyLen+8) {
		return nil, fmt.Errorf("%w: malformed cursor", ErrInvalidQuery)
	}
	return &c, nil
}

// sortKey is a row's position in an order, comparable with a cursor.
type sortKey struct {
	str string
	num int64
	key string
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
	k := sortKey{key: r.key}
	switch f {
	case OrderName:
		k.str = r.name()
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

func compareSortKeys(a, b sortKey) int {
	if c := cmp.Compare(a.str, b.str); c != 0 {
		return c
	}
	if c := cmp.Compare(a.num, b.num); c != 0 {
		return c
	}
	return cmp.Compare(a.key, b.key)
}

// Query returns one page of visible objects matching q, with the total
// count, in q.Order.
//
// The planner picks the cheapest candidate source: the posting list of the
// kinds and statuses, of the clusters and namespaces, of a label
// requirement, the namespaces the viewer may see, or every row. When the
// best source is still large and the order has an index (name, cluster),
// walks that index from the cursor instead and counts separately, from
// the count cells when the filter allows. Every row is checked against the
// whole filter and the access, so sources only bound the work.
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
	txn := s.db.Txn(false)
	p, err := s.x.compile(txn, &q.Filter, q.Access)
	if err != nil {
		return nil, err
	}
	stale := staleClusters(txn)
	page := &Page{Seq: s.seq, StaleClusters: p.staleInScope(stale), Edges: []Edge{}}
	if p.empty {
		return page, nil
	}
	var after *sortKey
	if cur != nil {
		after = &sortKey{str: cur.Str, num: cur.Num, key: cur.Key}
	}
	rows, more, total := p.run(q.Order, after, first)
	page.TotalCount, page.HasNextPage = total, more
	for _, r := range rows {
		sk := s.x.sortKeyOf(q.Order.Field, r)
		page.Edges = append(page.Edges, Edge{
			Object: s.x.object(r),
			Cursor: encodeCursor(cursor{Field: q.Order.Field, Desc: q.Order.Desc, Str: sk.str, Num: sk.num, Key: sk.key}),
			Stale:  stale[s.x.clusters.str(r.cid)],
		})
	}
	return page, nil
}

// run returns the page rows, whether more follow, and the total.
func (p *plan) run(o Order, after *sortKey, first int) ([]*objRow, bool, int) {
	src := p.bestSource()
	live := len(p.x.rows) - len(p.x.free)
	if o.Field == OrderName && src.est > 4*first && src.est*src.est >= first*live {
		// Matches are plentiful: walking the order from the cursor finds
		// a page after about first*live/matches rows, fewer than the
		// source holds. Give up (and collect) past twice the source size.
		if rows, more, ok := p.walk(o, after, first, 2*src.est+first); ok {
			return rows, more, p.count(src)
		}
	}
	return p.collect(src, o, after, first)
}

// collect scans a source: it counts every match and keeps the first rows
// after the cursor in a bounded heap.
func (p *plan) collect(src source, o Order, after *sortKey, first int) ([]*objRow, bool, int) {
	h := &topK{x: p.x, field: o.Field, desc: o.Desc, limit: first + 1}
	total := 0
	src.each(func(r *objRow) bool {
		if !src.exact && !p.match(r) {
			return true
		}
		total++
		if after != nil {
			c := compareSortKeys(p.x.sortKeyOf(o.Field, r), *after)
			if (!o.Desc && c <= 0) || (o.Desc && c >= 0) {
				return true
			}
		}
		h.offer(r)
		return true
	})
	rows := h.sorted()
	more := len(rows) > first
	if more {
		rows = rows[:first]
	}
	return rows, more, total
}

// count returns the number of visible matches, from the count cells when
// that is cheaper than scanning the source.
func (p *plan) count(src source) int {
	if src.exact {
		return src.est
	}
	if p.aggregatable() {
		if t, ok := p.tally(false, src.est); ok {
			return t.total
		}
	}
	n := 0
	src.each(func(r *objRow) bool {
		if p.match(r) {
			n++
		}
		return true
	})
	return n
}

// walk reads rows in order from the cursor, keeping matches, until it has
// first+1 or has visited budget rows (then ok is false). Only the name
// order has an index to walk.
func (p *plan) walk(o Order, after *sortKey, first, budget int) (rows []*objRow, more, ok bool) {
	x := p.x
	var pivot *nameItem
	if after != nil {
		// Start at the cursor's row, or where its name prefix starts (or
		// ends) when the row is gone; rows up to the cursor are skipped
		// below.
		pivot = &nameItem{pfx: namePrefix(after.str), rid: seekLow}
		if o.Desc {
			pivot.rid = seekHigh
		}
		if rid, ok := x.byKey[after.key]; ok {
			pivot.rid = rid
		}
	}
	x.byName.walk(pivot, o.Desc, func(rid uint32) bool {
		budget--
		if budget < 0 {
			return false
		}
		r := x.rows[rid]
		if after != nil {
			c := compareSortKeys(x.sortKeyOf(o.Field, r), *after)
			if (!o.Desc && c <= 0) || (o.Desc && c >= 0) {
				return true
			}
		}
		if p.match(r) {
			rows = append(rows, r)
		}
		return len(rows) <= first
	})
	if budget < 0 {
		return nil, false, false
	}
	more = len(rows) > first
	if more {
		rows = rows[:first]
	}
	return rows, more, true
}

// topK keeps the limit smallest rows of an order in a max-heap.
type topK struct {
	x     *objIndex
	field OrderField
	desc  bool
	limit int
	items []topItem
}

type topItem struct {
	r  *objRow
	sk sortKey
}

func (h *topK) less(a, b sortKey) bool {
	c := compareSortKeys(a, b)
	if h.desc {
		return c > 0
	}
	return c < 0
}

// heap.Interface over items as a max-heap of the order.
func (h *topK) Len() int           { return len(h.items) }
func (h *topK) Less(i, j int) bool { return h.less(h.items[j].sk, h.items[i].sk) }
func (h *topK) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *topK) Push(v any)         { h.items = append(h.items, v.(topItem)) }
func (h *topK) Pop() any {
	v := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return v
}

func (h *topK) offer(r *objRow) {
	sk := h.x.sortKeyOf(h.field, r)
	if len(h.items) < h.limit {
		heap.Push(h, topItem{r: r, sk: sk})
		return
	}
	if !h.less(sk, h.items[0].sk) {
		return
	}
	h.items[0] = topItem{r: r, sk: sk}
	heap.Fix(h, 0)
}

func (h *topK) sorted() []*objRow {
	slices.SortFunc(h.items, func(a, b topItem) int {
		c := compareSortKeys(a.sk, b.sk)
		if h.desc {
			return -c
		}
		return c
	})
	out := make([]*objRow, len(h.items))
	for i, it := range h.items {
		out[i] = it.r
	}
	return out
}

// staleClusters returns the names of stale clusters.
func staleClusters(txn *memdb.Txn) map[string]bool {
	it, err := txn.Get(tableClusters, indexIDPrefix, memKey(""))
	must(err)
	out := map[string]bool{}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if c := raw.(*Cluster); c.Stale() {
			out[c.Name] = true
		}
	}
	return out
}

// staleInScope returns, sorted, the stale clusters the filter and access
// could show.
func (p *plan) staleInScope(stale map[string]bool) []string {
	out := []string{}
	for name := range stale {
		if cid, ok := p.x.clusters.lookup(name); ok && p.clusters != nil && !p.clusters[cid] {
			continue
		} else if !ok && p.clusters != nil {
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
