package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
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
// executing its selection is only writing the selected fields. The fast
// path is a root-field interceptor that does exactly that for
// Query.objects: it converts the arguments with the generated models, calls
// the same service method as the generated resolver, and writes the
// selection with gqlgen's own field collection (aliases, fragments,
// @skip/@include) and scalar marshalers, so the bytes are the ones gqlgen
// would write; fast_test.go checks them against the generated path.
//
// What it may write comes from the schema: the types and fields under
// Query.objects, their fragment type conditions and the defaults of the
// input types are read from it, and fastWriters says how to write each
// field. A selected field without a writer (one added to the schema later),
// an argument it does not know, or a failing resolver send the field back
// to the generated path, which is always correct.
//
// It runs no field middleware, so it is only installed when no extension
// intercepts fields (see NewHandler): a tracing extension added later sees
// every field, on the generated path.
type fastPath struct {
	svc     *service
	schema  *ast.Schema
	off     bool         // tests: serve objects through gqlgen's generated code
	served  atomic.Int64 // queries the fast path answered
	buffers sync.Pool    // *[]byte
}

func newFastPath(svc *service, schema *ast.Schema) *fastPath {
	f := &fastPath{svc: svc, schema: schema}
	f.buffers.New = func() any { b := make([]byte, 0, 64<<10); return &b }
	return f
}

// firstExtension returns the name of the first extension that implements
// T: an extension that intercepts fields (graphql.FieldInterceptor) turns
// off the fast paths, which run no field middleware, and one that
// intercepts responses (graphql.ResponseInterceptor) turns off subscription
// events written to the websocket directly (wsevents.go), which are not
// responses.
func firstExtension[T any](exts []graphql.HandlerExtension) (string, bool) {
	for _, e := range exts {
		if _, ok := e.(T); ok {
			return e.ExtensionName(), true
		}
	}
	return "", false
}

// middleware returns the root field interceptor.
func (f *fastPath) middleware() graphql.RootFieldMiddleware {
	return func(ctx context.Context, next graphql.RootResolver) graphql.Marshaler {
		rfc := graphql.GetRootFieldContext(ctx)
		// gqlgen puts the field name, not the type, in rfc.Object.
		if f.off || rfc == nil || rfc.Field.Name != "objects" || rfc.Field.ObjectDefinition == nil ||
			rfc.Field.ObjectDefinition.Name != "Query" {
			return next(ctx)
		}
		opCtx := graphql.GetOperationContext(ctx)
		args, ok := f.objectsArgs(rfc.Field.Definition, rfc.Field.ArgumentMap(opCtx.Variables))
		if !ok {
			return next(ctx)
		}
		pl, ok := f.plan(opCtx, rfc.Field.Selections, rfc.Field.Definition.Type.Name())
		if !ok {
			return next(ctx)
		}
		total, edgeCursors := selected(opCtx, rfc.Field.Selections)
		page, err := f.svc.queryObjects(ctx, args.Filter, args.OrderBy, args.First, args.After, total, edgeCursors)
		if err != nil {
			return next(ctx)
		}
		f.served.Add(1)
		return graphql.WriterFunc(func(w io.Writer) {
			f.write(w, pl, page)
		})
	}
}

// objectsArguments are the arguments of Query.objects, named as in the
// schema.
type objectsArguments struct {
	Filter  *model.ObjectFilter `json:"filter"`
	OrderBy *model.ObjectOrder  `json:"orderBy"`
	First   *int                `json:"first"`
	After   *string             `json:"after"`
}

// objectsArgs converts validated argument values (variables substituted)
// into the resolver's argument types through the generated models (whose
// enums check their values), after filling in the schema's defaults for
// input fields. ok is false for an argument or input field the models do
// not know, which sends the query down the generated path.
func (f *fastPath) objectsArgs(def *ast.FieldDefinition, m map[string]any) (a objectsArguments, ok bool) {
	for _, arg := range def.Arguments {
		if v, present := m[arg.Name]; present {
			m[arg.Name] = f.withDefaults(arg.Type, v)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return a, false
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&a); err != nil {
		return a, false
	}
	return a, true
}

// withDefaults returns an input value with the default values the schema
// gives its input object's missing fields, as the generated unmarshalers
// apply them.
func (f *fastPath) withDefaults(t *ast.Type, v any) any {
	def := f.schema.Types[t.Name()]
	switch v := v.(type) {
	case []any:
		if t.Elem == nil {
			return v
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = f.withDefaults(t.Elem, e)
		}
		return out
	case map[string]any:
		if def == nil || def.Kind != ast.InputObject {
			return v
		}
		out := make(map[string]any, len(def.Fields))
		for k, e := range v {
			out[k] = e
		}
		for _, fd := range def.Fields {
			if e, present := out[fd.Name]; present {
				out[fd.Name] = f.withDefaults(fd.Type, e)
			} else if fd.DefaultValue != nil {
				if dv, err := fd.DefaultValue.Value(nil); err == nil {
					out[fd.Name] = dv
				}
			}
		}
		return out
	}
	return v
}

// fieldWriter appends the value of one field of the object in v.
type fieldWriter func(b []byte, f *fieldPlan, v *fastValue) []byte

// fastValue is what the writers read: the page, and where in it the
// writer is.
type fastValue struct {
	page  *objectsPage
	edges []index.Edge
	edge  *index.Edge
	label [2]string // key, value
	owner *index.OwnerRef

	change *index.ObjectChange // ObjectChangeEvent (fastevents.go)
	cursor string              // its cursor
}

// fastWriters says, per type under Query.objects, how to write each field.
// The schema says which types and fields there are; TestFastWritersCoverTheSchema
// fails when one of them has no writer here.
// ObjectChangeEvent, under Subscription.objectChanges, is written by the
// events fast path (fastevents.go) with the same writers below it.
var fastWriters = map[string]map[string]fieldWriter{
	"ObjectChangeEvent": objectChangeEventWriters,
	"ObjectConnection": {
		"edges": func(b []byte, f *fieldPlan, v *fastValue) []byte {
			return appendList(b, len(v.edges), func(b []byte, i int) []byte {
				v.edge = &v.edges[i]
				return f.sub.object(b, v)
			})
		},
		"pageInfo": func(b []byte, f *fieldPlan, v *fastValue) []byte { return f.sub.object(b, v) },
		"totalCount": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			return strconv.AppendInt(b, int64(v.page.TotalCount), 10)
		},
		"staleClusters": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			return appendList(b, len(v.page.StaleClusters), func(b []byte, i int) []byte { return appendGQLString(b, v.page.StaleClusters[i]) })
		},
		"changesCursor": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.page.changes) },
	},
	"PageInfo": {
		"hasNextPage":     func(b []byte, _ *fieldPlan, v *fastValue) []byte { return strconv.AppendBool(b, v.page.hasNextPage()) },
		"hasPreviousPage": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return strconv.AppendBool(b, v.page.hasAfter) },
		"startCursor": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			if len(v.edges) == 0 {
				return append(b, "null"...)
			}
			return appendGQLString(b, v.edges[0].Cursor)
		},
		"endCursor": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			if len(v.edges) == 0 {
				return append(b, "null"...)
			}
			return appendGQLString(b, v.edges[len(v.edges)-1].Cursor)
		},
	},
	"ObjectEdge": {
		"cursor": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Cursor) },
		"node":   func(b []byte, f *fieldPlan, v *fastValue) []byte { return f.sub.object(b, v) },
	},
	// An Object is written from its index row as toObject and the
	// generated marshalers would: empty optional strings and zero times
	// are null, labels are sorted by key.
	"Object": {
		"id": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			k := v.edge.Object.Key()
			b = append(b, '"')
			for i, part := range [...]string{k.Cluster, k.Group, k.Kind, k.Namespace, k.Name} {
				if i > 0 {
					b = append(b, '/')
				}
				b = appendEscaped(b, part)
			}
			return append(b, '"')
		},
		"cluster":   func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Cluster) },
		"namespace": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendNonEmpty(b, v.edge.Object.Namespace) },
		"group":     func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Group) },
		"version":   func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Version) },
		"kind":      func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Kind) },
		"resource":  func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Resource) },
		"name":      func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.Name) },
		"uid":       func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.edge.Object.UID) },
		"status": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			return strconv.AppendQuote(b, string(v.edge.Object.Status)) // as the generated enum marshaler
		},
		"message": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendNonEmpty(b, v.edge.Object.Message) },
		"labels": func(b []byte, f *fieldPlan, v *fastValue) []byte {
			labels := v.edge.Object.Labels
			return appendList(b, labels.Len(), func(b []byte, i int) []byte {
				v.label[0], v.label[1] = labels.At(i)
				return f.sub.object(b, v)
			})
		},
		"ownerReferences": func(b []byte, f *fieldPlan, v *fastValue) []byte {
			refs := v.edge.Object.OwnerRefs
			return appendList(b, len(refs), func(b []byte, i int) []byte {
				v.owner = &refs[i]
				return f.sub.object(b, v)
			})
		},
		"createdAt": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendTime(b, v.edge.Object.CreatedAt) },
		"updatedAt": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendTime(b, v.edge.Object.UpdatedAt) },
		"resourceVersion": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			return appendNonEmpty(b, v.edge.Object.ResourceVersion)
		},
		"summary": func(b []byte, _ *fieldPlan, v *fastValue) []byte {
			if len(v.edge.Object.Summary) == 0 {
				return append(b, "null"...)
			}
			return append(b, v.edge.Object.Summary...)
		},
		"stale": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return strconv.AppendBool(b, v.edge.Stale) },
	},
	"Label": {
		"key":   func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.label[0]) },
		"value": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.label[1]) },
	},
	"OwnerReference": {
		"kind": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.owner.Kind) },
		"name": func(b []byte, _ *fieldPlan, v *fastValue) []byte { return appendGQLString(b, v.owner.Name) },
	},
}

// selPlan is a selection set of one type, collected once per request: the
// fields in response order, each with its key ("alias":) already encoded.
type selPlan struct {
	typeName string
	fields   []fieldPlan
}

type fieldPlan struct {
	key   []byte
	name  string      // the field's name in the schema
	write fieldWriter // nil for __typename
	sub   *selPlan    // for object and list-of-object fields
}

// plan collects sel for the named type, with the fragment type conditions
// the schema gives it. ok is false when a field has no writer.
func (f *fastPath) plan(op *graphql.OperationContext, sel ast.SelectionSet, typeName string) (p *selPlan, ok bool) {
	def, writers := f.schema.Types[typeName], fastWriters[typeName]
	if def == nil || def.Kind != ast.Object || writers == nil {
		return nil, false
	}
	// Fresh each time: gqlgen's field collection keeps the slice.
	satisfies := append([]string{def.Name}, def.Interfaces...)
	p = &selPlan{typeName: typeName}
	for _, c := range graphql.CollectFields(op, sel, satisfies) {
		fp := fieldPlan{key: append(appendGQLString(nil, c.Alias), ':'), name: c.Name}
		if c.Name != "__typename" {
			if fp.write = writers[c.Name]; fp.write == nil || c.Definition == nil {
				return nil, false
			}
			if t := f.schema.Types[c.Definition.Type.Name()]; t != nil && t.Kind == ast.Object {
				if fp.sub, ok = f.plan(op, c.Selections, t.Name); !ok {
					return nil, false
				}
			}
		}
		p.fields = append(p.fields, fp)
	}
	return p, true
}

// write writes the selection of an ObjectConnection.
func (f *fastPath) write(w io.Writer, pl *selPlan, p *objectsPage) {
	buf := f.buffers.Get().(*[]byte)
	defer f.buffers.Put(buf)
	v := fastValue{page: p, edges: p.edges()}
	b := pl.object((*buf)[:0], &v)
	_, _ = w.Write(b)
	*buf = b[:0]
}

// object writes {"key":value,...} for the value in v, and answers
// __typename itself.
func (p *selPlan) object(b []byte, v *fastValue) []byte {
	b = append(b, '{')
	for i := range p.fields {
		f := &p.fields[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, f.key...)
		if f.write == nil {
			b = appendGQLString(b, p.typeName)
			continue
		}
		b = f.write(b, f, v)
	}
	return append(b, '}')
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
