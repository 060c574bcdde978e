package graph

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// The objects fast path.
//
// gqlgen executes every field of a response through its generic field
// machinery: a field context, a context value, closures, boxing and a
// marshaler per field, about 18 allocations each. A page of 100 objects
// with labels is over 2,000 fields and 40,000 allocations; measured on the
// 1M-object fleet, that machinery and the garbage collection it causes
// (over a heap that holds the whole fleet) were three quarters of a Q3
// query's CPU.
//
// Every type under Query.objects (ObjectConnection, PageInfo, ObjectEdge,
// Object, Label, OwnerReference) is plain data without resolvers, so
// executing its selection is only writing the selected fields. fastObjects
// is a root-field interceptor that does exactly that for Query.objects: it
// converts the arguments, calls the same service method as the generated
// resolver, and writes the selection with gqlgen's own field collection
// (aliases, fragments, @skip/@include) and scalar marshalers, so the bytes
// are the ones gqlgen would write; fast_test.go checks them against the
// generated path. When the resolver fails, it hands the field back to the
// generated path, which reports the error the usual way. It assumes no
// field middleware (AroundFields) is installed, since it runs none.

// fastObjects returns the root field interceptor.
func (s *service) fastObjects() graphql.RootFieldMiddleware {
	return func(ctx context.Context, next graphql.RootResolver) graphql.Marshaler {
		rfc := graphql.GetRootFieldContext(ctx)
		// gqlgen puts the field name, not the type, in rfc.Object.
		if s.noFastPath || rfc == nil || rfc.Field.Name != "objects" || rfc.Field.ObjectDefinition == nil ||
			rfc.Field.ObjectDefinition.Name != "Query" {
			return next(ctx)
		}
		opCtx := graphql.GetOperationContext(ctx)
		args, ok := objectsArgs(rfc.Field.ArgumentMap(opCtx.Variables))
		if !ok {
			return next(ctx)
		}
		pl, ok := plan(opCtx, rfc.Field.Selections, connectionTypes(), subTypes("ObjectConnection"))
		if !ok {
			return next(ctx)
		}
		page, err := s.queryObjects(ctx, args.filter, args.order, args.first, args.after)
		if err != nil {
			return next(ctx)
		}
		s.fastServed.Add(1)
		return graphql.WriterFunc(func(w io.Writer) {
			s.writeConnection(w, pl, page)
		})
	}
}

// objectsArguments are the arguments of Query.objects.
type objectsArguments struct {
	filter *model.ObjectFilter
	order  *model.ObjectOrder
	first  *int
	after  *string
}

// objectsArgs converts validated argument values (variables substituted)
// into the resolver's argument types. ok is false for a shape it does not
// expect, which sends the query down the generated path.
func objectsArgs(m map[string]any) (a objectsArguments, ok bool) {
	defer func() {
		if recover() != nil { // a value of an unexpected type
			ok = false
		}
	}()
	if f, _ := m["filter"].(map[string]any); f != nil {
		a.filter = &model.ObjectFilter{
			Clusters:      stringList(f["clusters"]),
			Namespaces:    stringList(f["namespaces"]),
			Kinds:         stringList(f["kinds"]),
			NameContains:  optStr(f["nameContains"]),
			LabelSelector: optStr(f["labelSelector"]),
		}
		for _, st := range stringList(f["statuses"]) {
			a.filter.Statuses = append(a.filter.Statuses, model.ObjectStatus(st))
		}
	} else if m["filter"] != nil {
		return a, false
	}
	if o, _ := m["orderBy"].(map[string]any); o != nil {
		a.order = &model.ObjectOrder{Field: model.ObjectOrderFieldName, Direction: model.OrderDirectionAsc}
		if v, _ := o["field"].(string); v != "" {
			a.order.Field = model.ObjectOrderField(v)
		}
		if v, _ := o["direction"].(string); v != "" {
			a.order.Direction = model.OrderDirection(v)
		}
	} else if m["orderBy"] != nil {
		return a, false
	}
	if v, present := m["first"]; present && v != nil {
		n, ok := toInt(v)
		if !ok {
			return a, false
		}
		a.first = &n
	}
	a.after = optStr(m["after"])
	return a, true
}

// stringList converts a list value; nil stays nil.
func stringList(v any) []string {
	list, _ := v.([]any)
	if list == nil {
		return nil
	}
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.(string)
	}
	return out
}

func optStr(v any) *string {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	return &s
}

// toInt converts an Int argument, which arrives as int64 from literals and
// as json.Number or int64 from variables.
func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case json.Number:
		i, err := strconv.Atoi(string(n))
		return i, err == nil
	case float64:
		return int(n), float64(int(n)) == n
	}
	return 0, false
}

// The implementors of each type, for fragment type conditions, as gqlgen
// generates them. They are returned fresh because gqlgen's field
// collection keeps them.
func connectionTypes() []string { return []string{"ObjectConnection"} }
func pageInfoTypes() []string   { return []string{"PageInfo"} }
func edgeTypes() []string       { return []string{"ObjectEdge"} }
func objectTypes() []string     { return []string{"Object"} }
func labelTypes() []string      { return []string{"Label"} }
func ownerTypes() []string      { return []string{"OwnerReference"} }

// fastFields lists, per type, the fields the fast path writes. A
// selection of any other field (one added to the schema later) sends the
// query down the generated path; TestFastFieldsCoverTheSchema fails until
// the field is added here and to the writer.
func fastFields(typeName string) []string {
	switch typeName {
	case "ObjectConnection":
		return []string{"edges", "pageInfo", "totalCount", "staleClusters", "changesCursor"}
	case "PageInfo":
		return []string{"hasNextPage", "hasPreviousPage", "startCursor", "endCursor"}
	case "ObjectEdge":
		return []string{"cursor", "node"}
	case "Object":
		return []string{
			"id", "cluster", "namespace", "group", "version", "kind", "resource", "name", "uid", "status", "message",
			"labels", "ownerReferences", "createdAt", "updatedAt", "resourceVersion", "summary", "stale",
		}
	case "Label":
		return []string{"key", "value"}
	case "OwnerReference":
		return []string{"kind", "name"}
	}
	return nil
}

// selPlan is a selection set of one type, collected once per request: the
// fields in response order, each with its key ("alias":) already encoded.
type selPlan struct {
	typeName string
	fields   []fieldPlan
}

type fieldPlan struct {
	key  []byte
	name string
	sub  *selPlan // for object and list-of-object fields
}

// plan collects sel for a type; sub says which fields have selections of
// their own and of which type. ok is false when a field is not one the
// fast path writes.
func plan(op *graphql.OperationContext, sel ast.SelectionSet, types []string, sub func(name string) []string) (p *selPlan, ok bool) {
	p = &selPlan{typeName: types[0]}
	known := fastFields(types[0])
	for _, c := range graphql.CollectFields(op, sel, types) {
		if c.Name != "__typename" && !slices.Contains(known, c.Name) {
			return nil, false
		}
		fp := fieldPlan{name: c.Name, key: append(appendGQLString(nil, c.Alias), ':')}
		if sub != nil {
			if t := sub(c.Name); t != nil {
				if fp.sub, ok = plan(op, c.Selections, t, subTypes(t[0])); !ok {
					return nil, false
				}
			}
		}
		p.fields = append(p.fields, fp)
	}
	return p, true
}

// subTypes returns, for a type, the types of its object-valued fields.
func subTypes(typeName string) func(string) []string {
	switch typeName {
	case "ObjectConnection":
		return func(f string) []string {
			switch f {
			case "edges":
				return edgeTypes()
			case "pageInfo":
				return pageInfoTypes()
			}
			return nil
		}
	case "ObjectEdge":
		return func(f string) []string {
			if f == "node" {
				return objectTypes()
			}
			return nil
		}
	case "Object":
		return func(f string) []string {
			switch f {
			case "labels":
				return labelTypes()
			case "ownerReferences":
				return ownerTypes()
			}
			return nil
		}
	}
	return nil
}

// writeConnection writes the selection of an ObjectConnection.
func (s *service) writeConnection(w io.Writer, pl *selPlan, p *objectsPage) {
	edges := p.edges()
	buf := s.buffers.Get().(*[]byte)
	defer s.buffers.Put(buf)
	b := (*buf)[:0]
	defer func() { *buf = b[:0] }()
	var scratch []string // label keys, reused across objects
	b = pl.object(b, func(b []byte, f *fieldPlan) []byte {
		switch f.name {
		case "edges":
			return appendList(b, len(edges), func(b []byte, i int) []byte { return f.sub.edge(b, &edges[i], &scratch) })
		case "pageInfo":
			return f.sub.pageInfo(b, p, edges)
		case "totalCount":
			return strconv.AppendInt(b, int64(p.TotalCount), 10)
		case "staleClusters":
			return appendList(b, len(p.StaleClusters), func(b []byte, i int) []byte { return appendGQLString(b, p.StaleClusters[i]) })
		case "changesCursor":
			return appendGQLString(b, p.changes)
		}
		return append(b, "null"...)
	})
	_, _ = w.Write(b)
}

// object writes {"key":value,...}, with value appended by field, and
// answers __typename itself.
func (p *selPlan) object(b []byte, field func(b []byte, f *fieldPlan) []byte) []byte {
	b = append(b, '{')
	for i := range p.fields {
		f := &p.fields[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, f.key...)
		if f.name == "__typename" {
			b = appendGQLString(b, p.typeName)
			continue
		}
		b = field(b, f)
	}
	return append(b, '}')
}

func (p *selPlan) pageInfo(b []byte, page *objectsPage, edges []index.Edge) []byte {
	return p.object(b, func(b []byte, f *fieldPlan) []byte {
		switch f.name {
		case "hasNextPage":
			return strconv.AppendBool(b, page.hasNextPage())
		case "hasPreviousPage":
			return strconv.AppendBool(b, page.hasAfter)
		case "startCursor":
			if len(edges) == 0 {
				return append(b, "null"...)
			}
			return appendGQLString(b, edges[0].Cursor)
		case "endCursor":
			if len(edges) == 0 {
				return append(b, "null"...)
			}
			return appendGQLString(b, edges[len(edges)-1].Cursor)
		}
		return append(b, "null"...)
	})
}

func (p *selPlan) edge(b []byte, e *index.Edge, scratch *[]string) []byte {
	return p.object(b, func(b []byte, f *fieldPlan) []byte {
		switch f.name {
		case "cursor":
			return appendGQLString(b, e.Cursor)
		case "node":
			return f.sub.node(b, e.Object, e.Stale, scratch)
		}
		return append(b, "null"...)
	})
}

// node writes an Object from its index row, as toObject and the generated
// marshalers would: empty optional strings and zero times are null, labels
// are sorted by key.
func (p *selPlan) node(b []byte, o *index.Object, stale bool, scratch *[]string) []byte {
	return p.object(b, func(b []byte, f *fieldPlan) []byte {
		switch f.name {
		case "id":
			k := o.Key()
			b = append(b, '"')
			for i, part := range [...]string{k.Cluster, k.Group, k.Kind, k.Namespace, k.Name} {
				if i > 0 {
					b = append(b, '/')
				}
				b = appendEscaped(b, part)
			}
			return append(b, '"')
		case "cluster":
			return appendGQLString(b, o.Cluster)
		case "namespace":
			return appendNonEmpty(b, o.Namespace)
		case "group":
			return appendGQLString(b, o.Group)
		case "version":
			return appendGQLString(b, o.Version)
		case "kind":
			return appendGQLString(b, o.Kind)
		case "resource":
			return appendGQLString(b, o.Resource)
		case "name":
			return appendGQLString(b, o.Name)
		case "uid":
			return appendGQLString(b, o.UID)
		case "status":
			return strconv.AppendQuote(b, string(o.Status)) // as the generated enum marshaler
		case "message":
			return appendNonEmpty(b, o.Message)
		case "labels":
			keys := (*scratch)[:0]
			for k := range o.Labels {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			*scratch = keys
			return appendList(b, len(keys), func(b []byte, i int) []byte {
				return f.sub.pair(b, "key", keys[i], "value", o.Labels[keys[i]])
			})
		case "ownerReferences":
			return appendList(b, len(o.OwnerRefs), func(b []byte, i int) []byte {
				return f.sub.pair(b, "kind", o.OwnerRefs[i].Kind, "name", o.OwnerRefs[i].Name)
			})
		case "createdAt":
			return appendTime(b, o.CreatedAt)
		case "updatedAt":
			return appendTime(b, o.UpdatedAt)
		case "resourceVersion":
			return appendNonEmpty(b, o.ResourceVersion)
		case "summary":
			if len(o.Summary) == 0 {
				return append(b, "null"...)
			}
			return append(b, o.Summary...)
		case "stale":
			return strconv.AppendBool(b, stale)
		}
		return append(b, "null"...)
	})
}

// pair writes a Label or OwnerReference: two string fields.
func (p *selPlan) pair(b []byte, n1, v1, n2, v2 string) []byte {
	return p.object(b, func(b []byte, f *fieldPlan) []byte {
		switch f.name {
		case n1:
			return appendGQLString(b, v1)
		case n2:
			return appendGQLString(b, v2)
		}
		return append(b, "null"...)
	})
}

// appendGQLString quotes s exactly as gqlgen's String marshaler does:
// only control characters, backslash and double quote are escaped (\t,
// \r, \n by name, others as \u00XX), everything else is copied as is.
// Scanning bytes finds the same characters as scanning runes, since no
// byte of a multi-byte UTF-8 sequence is below 0x80.
func appendGQLString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// appendEscaped is appendGQLString without the quotes. Most strings need
// no escaping at all, so it skips clean runs eight bytes at a time.
func appendEscaped(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	start := 0
	for i := 0; i < len(s); {
		if i+8 <= len(s) && !needsEscape8(load8(s[i:i+8])) {
			i += 8
			continue
		}
		c := s[i]
		if c >= 0x20 && c != '\\' && c != '"' {
			i++
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		case '\n':
			b = append(b, '\\', 'n')
		case '\\', '"':
			b = append(b, '\\', c)
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	return append(b, s[start:]...)
}

// load8 reads eight bytes as a little-endian word; the compiler turns
// this pattern into one load.
func load8(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// needsEscape8 reports whether any of eight bytes is a control character,
// a double quote or a backslash, with the usual SWAR tests for a zero or
// small byte (false positives are impossible for these constants; a true
// result only sends the caller to the byte-wise check).
func needsEscape8(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	hasLess := func(v uint64, n uint64) uint64 { return (v - ones*n) & ^v & highs }
	hasZero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	return hasLess(x, 0x20)|hasZero(x^(ones*'"'))|hasZero(x^(ones*'\\')) != 0
}

// appendList writes a JSON array of n elements written by elem.
func appendList(b []byte, n int, elem func(b []byte, i int) []byte) []byte {
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = elem(b, i)
	}
	return append(b, ']')
}

// appendNonEmpty writes a string that is null when empty.
func appendNonEmpty(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendGQLString(b, s)
}

// appendTime writes a Time as gqlgen's Time marshaler does; zero is null.
// RFC 3339 text has nothing to escape, so quoting it is adding quotes.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
