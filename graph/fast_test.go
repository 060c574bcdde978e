package graph

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"

	"github.com/fleetgraph/fleetgraph/graph/generated"
	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// TestObjectsFastPathMatchesGeneratedCode runs queries through the objects
// fast path and through gqlgen's generated code and wants the same bytes.
func TestObjectsFastPathMatchesGeneratedCode(t *testing.T) {
	f := newFixture(t)
	// Objects with the optional fields empty and full.
	ctx := context.Background()
	owned := testObject(podKind, "east", "team-a", "owned", index.StatusTerminating)
	owned.OwnerRefs = []index.OwnerRef{{Kind: "ReplicaSet", Name: "rs-1"}, {Kind: "Node", Name: "n\"1<>&"}}
	owned.Message = "quotes \" and \\ and <html> & \u2028 and \t tabs \r\n \x01\x1f and a bad byte \xff é"
	owned.Labels = index.LabelsOf(map[string]string{"a\"b": "c\\d\x02", "ü": "ß"})
	owned.ResourceVersion = "42"
	bare := index.Object{Cluster: "east", Namespace: "team-a", Version: "v1", Kind: "Pod", Resource: "pods", Name: "bare", UID: "u", Status: index.StatusUnknown}
	must(t, f.store.Upsert(ctx, owned))
	must(t, f.store.Upsert(ctx, bare))

	queries := []struct {
		name  string
		query string
		vars  map[string]any
		fails bool // the resolver fails: the generated path answers
	}{
		{"every field", objectsQuery, map[string]any{"first": 50}, false},
		{"aliases and typename", `{ a: objects(first: 3) { __typename n: totalCount e: edges { __typename c: cursor n: node { __typename i: id l: labels { __typename k: key } } } p: pageInfo { __typename h: hasNextPage } } }`, nil, false},
		{"fragments", `query { objects(first: 4, orderBy: {field: CREATED_AT, direction: DESC}) { ...C } }
			fragment C on ObjectConnection { totalCount edges { ... on ObjectEdge { node { ...O } } } }
			fragment O on Object { name labels { value } ownerReferences { kind name } }`, nil, false},
		{"skip and include", `query($s: Boolean!, $i: Boolean!) { objects(first: 2) { totalCount @skip(if: $s) edges @include(if: $i) { cursor node { name @skip(if: $i) kind } } } }`, map[string]any{"s": true, "i": true}, false},
		{"repeated fields merge", `{ objects(first: 2) { edges { node { name } } edges { node { kind name } } } }`, nil, false},
		{
			"filter variables", `query($f: ObjectFilter, $o: ObjectOrder, $n: Int, $a: String) { objects(filter: $f, orderBy: $o, first: $n, after: $a) { totalCount staleClusters changesCursor pageInfo { startCursor endCursor hasNextPage hasPreviousPage } edges { node { id status message resourceVersion summary createdAt updatedAt } } } }`,
			map[string]any{"f": map[string]any{"kinds": []string{"Pod"}, "statuses": []string{"UNHEALTHY", "TERMINATING", "UNKNOWN"}, "labelSelector": "team", "nameContains": ""}, "o": map[string]any{"field": "STATUS"}, "n": 2},
			false,
		},
		{"literal filter", `{ objects(filter: {clusters: ["east"], namespaces: ["team-a"]}, first: 0) { totalCount pageInfo { hasNextPage } } }`, nil, false},
		{"input defaults", `{ objects(orderBy: {field: KIND}, first: 7) { edges { node { kind name } } } }`, nil, false},
		{"input defaults in variables", `query($o: ObjectOrder) { objects(orderBy: $o, first: 7) { edges { node { kind name } } } }`, map[string]any{"o": map[string]any{"direction": "DESC"}}, false},
		{"cluster label selector", `query($f: ObjectFilter) { objects(filter: $f, first: 3) { totalCount staleClusters edges { node { id cluster } } } }`, map[string]any{"f": map[string]any{"clusterLabelSelector": "region in (west,north)"}}, false},
		{"error", `{ objects(first: 5000) { totalCount } }`, nil, true},
		{"bad cursor", `{ objects(after: "nope") { totalCount } }`, nil, true},
		{"other root fields", `{ viewer { username } objects(first: 1) { totalCount } facets { total } }`, nil, false},
	}
	for _, tc := range queries {
		t.Run(tc.name, func(t *testing.T) {
			for _, user := range []string{"admin", "alice"} {
				f.h.fast.off = true
				slowStatus, slow := f.rawPost(user, tc.query, tc.vars)
				f.h.fast.off = false
				served := f.h.fast.served.Load()
				fastStatus, fast := f.rawPost(user, tc.query, tc.vars)
				if used := f.h.fast.served.Load() > served; used == tc.fails {
					t.Errorf("%s: fast path used: %v", user, used)
				}
				if slowStatus != fastStatus || !bytes.Equal(slow, fast) {
					t.Errorf("%s:\ngenerated %d %s\nfast      %d %s", user, slowStatus, slow, fastStatus, fast)
				}
			}
		})
	}
}

// TestAppendEscapedMatchesGqlgen compares the escaping with gqlgen's String
// marshaler on strings mixing clean runs, every escaped byte, multi-byte
// UTF-8 and invalid bytes, at every alignment.
func TestAppendEscapedMatchesGqlgen(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", "/", "é", "\u2028", "\xff", "\"", "\\", "\t", "\n", "\r", "\x00", "\x01", "\x1f", "\x7f", "<>&"}
	for range 5000 {
		var sb strings.Builder
		for range rnd.IntN(40) {
			if rnd.IntN(3) == 0 {
				sb.WriteString("clean run of text ")
			}
			sb.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		s := sb.String()
		var want bytes.Buffer
		graphql.MarshalString(s).MarshalGQL(&want)
		if got := appendGQLString(nil, s); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("%q: got %s, want %s", s, got, want.Bytes())
		}
	}
}

// TestFastWritersCoverTheSchema fails when a type under Query.objects or
// Subscription.objectChanges (any object type reachable from their results) gains a field that the fast path
// has no writer for: queries selecting it would fall back to the generated
// path, correct but slow.
func TestFastWritersCoverTheSchema(t *testing.T) {
	schema := generated.NewExecutableSchema(generated.Config{}).Schema()
	seen := map[string]bool{}
	var walk func(typ string)
	walk = func(typ string) {
		def := schema.Types[typ]
		if def == nil || def.Kind != ast.Object || seen[typ] {
			return
		}
		seen[typ] = true
		var fields []string
		for _, f := range def.Fields {
			if !strings.HasPrefix(f.Name, "__") {
				fields = append(fields, f.Name)
				walk(f.Type.Name())
			}
		}
		var got []string
		for name := range fastWriters[typ] {
			got = append(got, name)
		}
		slices.Sort(fields)
		slices.Sort(got)
		if !slices.Equal(got, fields) {
			t.Errorf("%s: the fast path writes %v, the schema has %v", typ, got, fields)
		}
	}
	walk(schema.Query.Fields.ForName("objects").Type.Name())
	walk(schema.Subscription.Fields.ForName("objectChanges").Type.Name()) // fastevents.go
	if len(seen) < 7 {
		t.Errorf("walked %d types under Query.objects and Subscription.objectChanges, want at least the 7 of today", len(seen))
	}
	for typ := range fastWriters {
		if !seen[typ] {
			t.Errorf("fastWriters has %s, which is not under Query.objects or Subscription.objectChanges", typ)
		}
	}
}

// TestFastArgsStepAsideForUnknownInput: an argument or input field the
// generated models do not know sends the query down the generated path.
func TestFastArgsStepAsideForUnknownInput(t *testing.T) {
	f := newFixture(t)
	def := f.h.fast.schema.Query.Fields.ForName("objects")
	for name, m := range map[string]map[string]any{
		"unknown argument":    {"first": int64(3), "last": int64(3)},
		"unknown input field": {"filter": map[string]any{"clusters": []any{"east"}, "owner": "x"}},
		"unknown enum value":  {"orderBy": map[string]any{"field": "COLOR"}},
	} {
		if _, ok := f.h.fast.objectsArgs(def, m); ok {
			t.Errorf("%s: converted, want the generated path", name)
		}
	}
	a, ok := f.h.fast.objectsArgs(def, map[string]any{"orderBy": map[string]any{"field": "KIND"}, "first": int64(3)})
	if !ok || a.OrderBy == nil || a.OrderBy.Direction != model.OrderDirectionAsc || *a.First != 3 {
		t.Errorf("orderBy without direction: %+v %v, want the schema's default direction ASC", a.OrderBy, ok)
	}
}

// fieldCounter is a field middleware, as a tracing extension is: it counts
// the fields it sees by Type.field.
type fieldCounter struct {
	mu   sync.Mutex
	seen map[string]int
}

func (*fieldCounter) ExtensionName() string                   { return "fieldCounter" }
func (*fieldCounter) Validate(graphql.ExecutableSchema) error { return nil }
func (c *fieldCounter) InterceptField(ctx context.Context, next graphql.Resolver) (any, error) {
	fc := graphql.GetFieldContext(ctx)
	c.mu.Lock()
	c.seen[fc.Object+"."+fc.Field.Name]++
	c.mu.Unlock()
	return next(ctx)
}

// TestObjectsFastPathStepsAsideForFieldMiddleware: with an extension that
// intercepts fields installed, Query.objects is served by the generated
// code, so the extension sees every field, and the answer is the same.
func TestObjectsFastPathStepsAsideForFieldMiddleware(t *testing.T) {
	counter := &fieldCounter{seen: map[string]int{}}
	traced := newFixture(t, func(o *Options) { o.Extensions = []graphql.HandlerExtension{counter} })
	plain := newFixture(t)
	if traced.h.fast != nil || plain.h.fast == nil {
		t.Fatalf("fast path installed: with field middleware %v, without %v", traced.h.fast != nil, plain.h.fast != nil)
	}
	const q = `{ objects(first: 20) { totalCount edges { node { name labels { key } } } } }`
	_, want := plain.rawPost("alice", q, nil)
	_, got := traced.rawPost("alice", q, nil)
	if !bytes.Equal(got, want) {
		t.Errorf("with field middleware:\n%s\nwithout:\n%s", got, want)
	}
	var r struct {
		Objects struct {
			Edges []struct{ Node struct{ Labels []any } }
		}
	}
	traced.query("alice", q, nil, &r)
	labels := 0
	for _, e := range r.Objects.Edges {
		labels += len(e.Node.Labels)
	}
	n := len(r.Objects.Edges)
	counter.mu.Lock()
	defer counter.mu.Unlock()
	// Two queries ran through the traced handler.
	if counter.seen["Object.name"] != 2*n || counter.seen["Label.key"] != 2*labels || n == 0 || labels == 0 {
		t.Errorf("field middleware saw %v; want Object.name %d times and Label.key %d times", counter.seen, 2*n, 2*labels)
	}
}

// objectsSelection parses query and returns its operation and the
// selection of its first field, Query.objects.
func objectsSelection(t *testing.T, query string, vars map[string]any) (*graphql.OperationContext, ast.SelectionSet) {
	t.Helper()
	doc, err := parser.ParseQuery(&ast.Source{Input: query})
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return &graphql.OperationContext{Doc: doc, Variables: vars}, doc.Operations[0].SelectionSet[0].(*ast.Field).SelectionSet
}

// TestSelectsEdgeCursor checks which Query.objects selections make the
// index encode every edge's cursor (index.Query.NoEdgeCursors unset):
// those that select edges' cursor, however they are spelled; pageInfo's
// cursors are the first and last edges', which the index always encodes.
func TestSelectsEdgeCursor(t *testing.T) {
	for _, tc := range []struct {
		query string
		vars  map[string]any
		want  bool
	}{
		{`{ objects { edges { node { name } } pageInfo { startCursor endCursor } totalCount } }`, nil, false},
		{`{ objects { cursor: totalCount edges { node { cursor: name } } } }`, nil, false},
		{`{ objects { edges { cursor node { name } } } }`, nil, true},
		{`{ objects { edges { c: cursor } } }`, nil, true},
		{`{ objects { ...C } } fragment C on ObjectConnection { edges { ...E } } fragment E on ObjectEdge { cursor }`, nil, true},
		{`{ objects { edges { ... on ObjectEdge { cursor } } } }`, nil, true},
		{`{ objects { e: edges { node { name } } edges { cursor } } }`, nil, true},
		{`query($s: Boolean!) { objects { edges { cursor @skip(if: $s) node { name } } } }`, map[string]any{"s": true}, false},
		{`query($s: Boolean!) { objects { edges { cursor @skip(if: $s) node { name } } } }`, map[string]any{"s": false}, true},
	} {
		if _, got := selected(objectsSelection(t, tc.query, tc.vars)); got != tc.want {
			t.Errorf("%s %v: selected edgeCursors = %v, want %v", tc.query, tc.vars, got, tc.want)
		}
	}
}

// TestSelectsTotal checks which Query.objects selections make the index
// count the matches (index.Query.NoTotal unset): those that select
// totalCount or staleClusters, however they are spelled.
func TestSelectsTotal(t *testing.T) {
	for _, tc := range []struct {
		query string
		vars  map[string]any
		want  bool
	}{
		{`{ objects { edges { cursor node { name labels { key value } } } pageInfo { hasNextPage endCursor } } }`, nil, false},
		{`{ objects { changesCursor __typename } }`, nil, false},
		{`{ objects { totalCount } }`, nil, true},
		{`{ objects { n: totalCount edges { cursor } } }`, nil, true},
		{`{ objects { staleClusters } }`, nil, true},
		{`{ objects { ...C } } fragment C on ObjectConnection { edges { cursor } totalCount }`, nil, true},
		{`{ objects { ... on ObjectConnection { staleClusters } } }`, nil, true},
		{`query($s: Boolean!) { objects { totalCount @skip(if: $s) edges { cursor } } }`, map[string]any{"s": true}, false},
		{`query($s: Boolean!) { objects { totalCount @skip(if: $s) edges { cursor } } }`, map[string]any{"s": false}, true},
	} {
		if got, _ := selected(objectsSelection(t, tc.query, tc.vars)); got != tc.want {
			t.Errorf("%s %v: selected total = %v, want %v", tc.query, tc.vars, got, tc.want)
		}
	}
}
