package graph

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/99designs/gqlgen/graphql"

	"github.com/fleetgraph/fleetgraph/graph/generated"

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
	owned.Labels = map[string]string{"a\"b": "c\\d\x02", "ü": "ß"}
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
		{"error", `{ objects(first: 5000) { totalCount } }`, nil, true},
		{"bad cursor", `{ objects(after: "nope") { totalCount } }`, nil, true},
		{"other root fields", `{ viewer { username } objects(first: 1) { totalCount } facets { total } }`, nil, false},
	}
	for _, tc := range queries {
		t.Run(tc.name, func(t *testing.T) {
			for _, user := range []string{"admin", "alice"} {
				f.h.svc.noFastPath = true
				slowStatus, slow := f.rawPost(user, tc.query, tc.vars)
				f.h.svc.noFastPath = false
				served := f.h.svc.fastServed.Load()
				fastStatus, fast := f.rawPost(user, tc.query, tc.vars)
				if used := f.h.svc.fastServed.Load() > served; used == tc.fails {
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

// TestFastFieldsCoverTheSchema fails when a type under Query.objects gains
// a field that the fast path does not write (it would fall back to the
// generated path for queries selecting it, correct but slow).
func TestFastFieldsCoverTheSchema(t *testing.T) {
	schema := generated.NewExecutableSchema(generated.Config{}).Schema()
	for _, typ := range []string{"ObjectConnection", "PageInfo", "ObjectEdge", "Object", "Label", "OwnerReference"} {
		var fields []string
		for _, f := range schema.Types[typ].Fields {
			if !strings.HasPrefix(f.Name, "__") {
				fields = append(fields, f.Name)
			}
		}
		got := fastFields(typ)
		slices.Sort(fields)
		slices.Sort(got)
		if !slices.Equal(got, fields) {
			t.Errorf("%s: the fast path writes %v, the schema has %v", typ, got, fields)
		}
	}
}
