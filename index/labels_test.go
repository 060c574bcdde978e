package index_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestLabels checks that LabelsOf copies a map into key order, and that
// each accessor answers as the map would.
func TestLabels(t *testing.T) {
	m := map[string]string{"tier": "web", "app": "shop", "a.b": "", "app.kubernetes.io/name": "x", "Z": "upper"}
	src := maps.Clone(m)
	l := index.LabelsOf(src)
	src["tier"] = "changed after"
	if l.Get("tier") != "web" {
		t.Fatal("changing the map changed its Labels")
	}
	want := []string{"Z", "a.b", "app", "app.kubernetes.io/name", "tier"}
	var keys []string
	for k, v := range l.All() {
		keys = append(keys, k)
		if v != m[k] {
			t.Errorf("All: %s=%q, want %q", k, v, m[k])
		}
	}
	if !slices.Equal(keys, want) || l.Len() != len(want) {
		t.Fatalf("keys %q (Len %d), want %q", keys, l.Len(), want)
	}
	for i, k := range want {
		if gk, gv := l.At(i); gk != k || gv != m[k] {
			t.Errorf("At(%d) = %s=%q, want %s=%q", i, gk, gv, k, m[k])
		}
	}
	for _, k := range []string{"Z", "a.b", "app", "app.kubernetes.io/name", "tier", "", "a", "apq", "zz", "tie"} {
		v, ok := m[k]
		if gv, gok := l.Lookup(k); gv != v || gok != ok {
			t.Errorf("Lookup(%q) = %q, %v, want %q, %v", k, gv, gok, v, ok)
		}
		if l.Get(k) != v || l.Has(k) != ok {
			t.Errorf("Get(%q) = %q, Has = %v, want %q, %v", k, l.Get(k), l.Has(k), v, ok)
		}
	}
	c := l.Map()
	if !maps.Equal(c, m) {
		t.Errorf("Map = %v, want %v", c, m)
	}
	c["app"] = "mutated"
	if l.Get("app") != "shop" {
		t.Error("changing Map's map changed the labels")
	}
	if !l.Equal(index.LabelsOf(m)) || l.Equal(index.LabelsOf(c)) || l.Equal(index.Labels{}) {
		t.Error("Equal does not compare the labels")
	}
	if got, want := l.String(), "Z=upper,a.b=,app=shop,app.kubernetes.io/name=x,tier=web"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	for _, empty := range []index.Labels{index.LabelsOf(nil), index.LabelsOf(map[string]string{}), {}} {
		if empty.Len() != 0 || !empty.IsZero() || empty.Has("") || !empty.Equal(index.Labels{}) || len(empty.Map()) != 0 {
			t.Errorf("empty labels %v: Len %d", empty, empty.Len())
		}
	}
	sel, err := labels.Parse("app=shop,tier in (web,api),!missing,a.b")
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(l) || sel.Matches(index.LabelsOf(map[string]string{"app": "shop", "tier": "db", "a.b": ""})) {
		t.Errorf("selector %s does not match as it does a map", sel)
	}
}

// mapObject is Object as it was with a map of labels, for the JSON it
// gave.
type mapObject struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Status string            `json:"status"`
}

type labelsObject struct {
	Name   string       `json:"name"`
	Labels index.Labels `json:"labels,omitzero"`
	Status string       `json:"status"`
}

// jsonLabelCases are label maps whose JSON takes every escape rule:
// quotes, backslashes, control characters, HTML characters, U+2028 and
// U+2029, invalid UTF-8, keys that sort differently as bytes than as
// runes.
func jsonLabelCases() []map[string]string {
	cases := []map[string]string{
		nil,
		{},
		{"app": "web"},
		{"b": "2", "a\"": "1\\", "ü": "ß", "Z": "<script>&amp;</script>", "\u2028": "\u2029x\u2028"},
		{"bad\xff": "\xfe\xc3(", "\xed\xa0\x80": "surrogate", "tab\t": "nl\n\r\b\f", "\x7f": "\x00\x01\x1f"},
		{"é": "1", "z": "2", "\U0001F600": "emoji", "": "empty key"},
	}
	var all strings.Builder
	for c := range 256 {
		all.WriteByte(byte(c))
		cases = append(cases, map[string]string{string(rune(c)): string([]byte{byte(c)}), "k" + string([]byte{byte(c)}): "v"})
	}
	return append(cases, map[string]string{all.String(): all.String()})
}

// TestLabelsJSON checks that Labels marshal to the bytes a map of them
// did (in an Object, omitted when empty; with and without HTML escaping)
// and unmarshal back to the same labels, and that unmarshaling accepts and
// rejects what the map did, keeping a duplicate key's last value.
func TestLabelsJSON(t *testing.T) {
	for _, m := range jsonLabelCases() {
		for _, escapeHTML := range []bool{true, false} {
			want := encodeJSON(t, mapObject{Name: "n", Labels: m, Status: "s"}, escapeHTML)
			got := encodeJSON(t, labelsObject{Name: "n", Labels: index.LabelsOf(m), Status: "s"}, escapeHTML)
			if !bytes.Equal(got, want) {
				t.Errorf("labels %q, escapeHTML %v: JSON\n%s\nwant\n%s", m, escapeHTML, got, want)
			}
			if len(m) > 0 {
				want = encodeJSON(t, m, escapeHTML)
				if got := encodeJSON(t, index.LabelsOf(m), escapeHTML); !bytes.Equal(got, want) {
					t.Errorf("labels %q alone, escapeHTML %v: JSON\n%s\nwant\n%s", m, escapeHTML, got, want)
				}
			}
			var back labelsObject
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatal(err)
			}
			var backMap mapObject
			if err := json.Unmarshal(want, &backMap); err != nil {
				t.Fatal(err)
			}
			if !back.Labels.Equal(index.LabelsOf(backMap.Labels)) {
				t.Errorf("labels %q: unmarshaled %v, want %v", m, back.Labels, backMap.Labels)
			}
		}
	}
	if got, _ := json.Marshal(index.Labels{}); string(got) != "{}" {
		t.Errorf("the zero Labels marshal to %s, want {}", got)
	}
	for _, in := range unmarshalLabelCases {
		checkUnmarshalLikeMap(t, []byte(in))
	}
	l := index.LabelsOf(map[string]string{"old": "x"})
	if err := json.Unmarshal([]byte(`null`), &l); err != nil || !l.IsZero() {
		t.Errorf("null: labels %v, %v, want none (as a map is set to nil)", l, err)
	}
}

// unmarshalLabelCases are JSON values that decode into labels or fail to,
// each as a map[string]string does: objects Labels decode themselves
// (plain, whitespace, non-ASCII) or hand to a map (duplicate keys,
// escapes, control characters, invalid UTF-8), and input the map
// refuses. The first is BenchmarkLabelsUnmarshalJSON's labels.
var unmarshalLabelCases = []string{
	`{"app":"shop","tier":"web","app.kubernetes.io/name":"shop","team":"a","env":"prod"}`,
	`{"a":"1","b":"2","a":"3"}`, `{"b":"1","a":"2","b":"3","a":"4","b":"5"}`, ` { "a" : "1" , "b":"" } `, "\t{\n}\r",
	`{}`, `null`, ` null `, `{"é":"ü","日本":"語"}`, `{"":""}`,
	`{"a":null}`, `{"\ud800":"\udfff x","b\u00e9":"\u2028"}`, "{\"\xff\":\"\xfe\"}", "{\"a\":\"\x01\"}", `{"a":"\"q\""}`,
	`{"a":1}`, `{"a":{}}`, `[]`, `"x"`, `{"a":"1"`, `{"a" "1"}`, `true`, `{"a":"\x"}`, `{"a":["b"]}`,
	`{"a":"1",}`, `{,}`, `{"a":"1"}x`, `{"a":"1"} {}`, `nul`, `nullx`, ``, ` `, `{"a":"1" "b":"2"}`, `{"a":"1"}}`,
	`{"a":"1"},"labels":{"b":"2"}`,
}

// hostileLabels are labels a hostile edge could send in a row of a
// message of up to 4 MiB (review-s11 L1), for
// TestLabelsUnmarshalJSONHostile and BenchmarkLabelsUnmarshalJSONHostile:
// one key given 700k times, a 1 MiB value replaced by the last, and
// distinct keys at, just over and far over maxDirectLabels (1024).
func hostileLabels() []struct {
	name string
	in   []byte
	dup  bool // a key given twice
} {
	distinct := func(n int) []byte {
		b := []byte{'{'}
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `"a%d":""`, i)
		}
		return append(b, '}')
	}
	return []struct {
		name string
		in   []byte
		dup  bool
	}{
		{"one key 700k times", []byte(`{` + strings.Repeat(`"":"",`, 700_000) + `"":"last"}`), true},
		{"a big value replaced", []byte(`{"a":"` + strings.Repeat("x", 1<<20) + `","a":""}`), true},
		{"1024 keys", distinct(1024), false},
		{"1025 keys", distinct(1025), false},
		{"200k keys", distinct(200_000), false},
	}
}

// TestLabelsUnmarshalJSONHostile checks that labels a hostile edge could
// send decode as a map does, and that decoding them holds no more memory
// than the labels themselves: not a pair per member, nor the bytes of
// values given before the last (review-s11 L1). Where a key is given
// twice it checks too that all decoding allocates, garbage included, is
// a few times the input, not the 5 times of a 32-byte pair per 6-byte
// member. It does not bound the allocations of distinct keys past 1024:
// those go through a map, which costs about 13 times the input, as every
// row did before review-s10-index L7; the labels quota then rejects the
// row.
func TestLabelsUnmarshalJSONHostile(t *testing.T) {
	for _, c := range hostileLabels() {
		t.Run(c.name, func(t *testing.T) {
			checkUnmarshalLikeMap(t, c.in)
			var before, decoded, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var l index.Labels
			if err := l.UnmarshalJSON(c.in); err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&decoded)
			runtime.GC()
			runtime.ReadMemStats(&after)
			held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
			allocated := int64(decoded.TotalAlloc - before.TotalAlloc)
			// What the labels need: a 32-byte pair and the bytes of each
			// string, twice over for size classes and the like.
			need := int64(0)
			for k, v := range l.All() {
				need += 32 + int64(len(k)+len(v))
			}
			const slack = 256 << 10
			t.Logf("%d bytes in, %d labels: %d bytes allocated, %d held", len(c.in), l.Len(), allocated, held)
			if held > 2*need+slack {
				t.Errorf("decoding holds %d bytes for %d labels of %d bytes", held, l.Len(), need)
			}
			if c.dup && allocated > 4*int64(len(c.in))+slack {
				t.Errorf("decoding %d bytes allocates %d bytes", len(c.in), allocated)
			}
			runtime.KeepAlive(l)
		})
	}
}

// checkUnmarshalLikeMap checks that Labels decode in, called directly (so
// that input encoding/json would not have passed reaches UnmarshalJSON
// too), through json.Unmarshal and (when it is one JSON value) as an
// Object's labels, as a map[string]string does: the same class of error
// when the map's decoding fails, else the same labels, which marshal
// back to the bytes the map marshals to.
func checkUnmarshalLikeMap(t *testing.T, in []byte) {
	t.Helper()
	var m map[string]string
	mapErr := json.Unmarshal(in, &m)
	var direct, viaJSON index.Labels
	directErr := direct.UnmarshalJSON(in)
	viaErr := json.Unmarshal(in, &viaJSON)
	for _, got := range []struct {
		how    string
		labels index.Labels
		err    error
	}{{"UnmarshalJSON", direct, directErr}, {"json.Unmarshal", viaJSON, viaErr}} {
		if jsonErrorClass(got.err) != jsonErrorClass(mapErr) {
			t.Fatalf("%q: %s: error %v, the map's %v", in, got.how, got.err, mapErr)
		}
		if got.err == nil && !got.labels.Equal(index.LabelsOf(m)) {
			t.Fatalf("%q: %s: labels %v, the map's %v", in, got.how, got.labels, m)
		}
	}
	if mapErr == nil && len(m) > 0 {
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := json.Marshal(direct); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%q: marshaled back to %s (%v), the map to %s", in, got, err, want)
		}
	}
	if !json.Valid(in) {
		// Not one value: embedded, it could name the labels twice, and a
		// second object adds to a map where it replaces Labels (see
		// UnmarshalJSON).
		return
	}
	row := append(append([]byte(`{"name":"n","labels":`), in...), `,"status":"s"}`...)
	var mo mapObject
	mapErr = json.Unmarshal(row, &mo)
	var lo labelsObject
	err := json.Unmarshal(row, &lo)
	if jsonErrorClass(err) != jsonErrorClass(mapErr) {
		t.Fatalf("%q: error %v, the map's %v", row, err, mapErr)
	}
	if err == nil && (!lo.Labels.Equal(index.LabelsOf(mo.Labels)) || lo.Name != mo.Name || lo.Status != mo.Status) {
		t.Fatalf("%q: %+v, the map's %+v", row, lo, mo)
	}
}

// FuzzLabelsUnmarshalJSON checks that arbitrary bytes decode into Labels,
// alone and as an Object's labels, as into a map[string]string: the same
// class of error for what the map refuses, else the same labels
// (checkUnmarshalLikeMap).
func FuzzLabelsUnmarshalJSON(f *testing.F) {
	for _, in := range unmarshalLabelCases {
		f.Add([]byte(in))
	}
	for _, m := range jsonLabelCases() {
		data, err := json.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkUnmarshalLikeMap(t, in) })
}

// FuzzLabelsJSON checks that one label marshals as a map of it did.
func FuzzLabelsJSON(f *testing.F) {
	for _, m := range jsonLabelCases() {
		for k, v := range m {
			f.Add(k, v)
		}
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		m := map[string]string{k: v, "a": v, "z": k}
		for _, escapeHTML := range []bool{true, false} {
			want := encodeJSON(t, mapObject{Labels: m}, escapeHTML)
			if got := encodeJSON(t, labelsObject{Labels: index.LabelsOf(m)}, escapeHTML); !bytes.Equal(got, want) {
				t.Errorf("labels %q, escapeHTML %v: JSON\n%s\nwant\n%s", m, escapeHTML, got, want)
			}
		}
	})
}

// jsonErrorClass names the kind of a decoding error: none, a syntax
// error, a type mismatch, or another.
func jsonErrorClass(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		return "none"
	case errors.As(err, &syntax):
		return "syntax"
	case errors.As(err, &typ):
		return "type"
	}
	return fmt.Sprintf("other (%T)", err)
}

// encodeJSON encodes v as an Encoder does, escaping HTML or not.
func encodeJSON(t testing.TB, v any, escapeHTML bool) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
