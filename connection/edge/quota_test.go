package edge

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestRowCost checks that rowCost names the string that is over, and that
// it allocates nothing for a row within the limits: the edge calls it for
// every key it takes under the buffer's lock, and the manager for every
// row it decodes.
func TestRowCost(t *testing.T) {
	row := index.Object{
		Cluster: "c", Namespace: "ns", Version: "v1", Kind: "Pod", Resource: "pods", Name: "web-0",
		UID: "8a6c2f0e-0000-4000-8000-000000000000", Summary: []byte(`{"phase":"Running"}`),
	}
	for i := range 10 {
		row.Labels = withLabel(row.Labels, fmt.Sprintf("label-%d", i), fmt.Sprintf("value-%d", i))
	}
	cost, over := rowCost(&row, 64)
	if over != "" || cost <= len(row.Name)+len(row.UID)+len(row.Summary) {
		t.Fatalf("rowCost = %d, %q: want a cost over the row's bytes and nothing over", cost, over)
	}
	if n := testing.AllocsPerRun(100, func() { rowCost(&row, 64) }); n != 0 {
		t.Errorf("rowCost allocates %v times a row within the limits, want 0", n)
	}

	row.Labels = withLabel(row.Labels, "label-3", strings.Repeat("x", 65))
	if _, over := rowCost(&row, 64); over != "the value of label label-3 is 65 bytes" {
		t.Errorf("over = %q, want the value of label label-3 named", over)
	}
	row.Summary = []byte(strings.Repeat("y", 70))
	if _, over := rowCost(&row, 64); over != "summary is 70 bytes" {
		t.Errorf("over = %q, want the summary named first", over)
	}
}

// TestJSONLen: jsonLen is the length of a string after the JSON round
// trip from the edge to the manager, invalid UTF-8 included.
func TestJSONLen(t *testing.T) {
	for _, s := range []string{
		"", "plain", "héllo ✓", "\uFFFD", // a real U+FFFD stays three bytes
		"\xff", "\xff\xfe\xfd", "a\xffb", "\xe2\x9c", // a truncated sequence: each byte is replaced
		"\xed\xa0\x80", // an encoded surrogate is invalid UTF-8
	} {
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var decoded string
		if err := json.Unmarshal(data, &decoded); err != nil {
			t.Fatal(err)
		}
		if got := jsonLen(s); got != len(decoded) {
			t.Errorf("jsonLen(%q) = %d, want %d", s, got, len(decoded))
		}
	}
}
