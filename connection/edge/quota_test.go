package edge

import (
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
		UID: "8a6c2f0e-0000-4000-8000-000000000000", Summary: []byte(`{"phase":"Running"}`), Labels: map[string]string{},
	}
	for i := range 10 {
		row.Labels[fmt.Sprintf("label-%d", i)] = fmt.Sprintf("value-%d", i)
	}
	cost, over := rowCost(&row, 64)
	if over != "" || cost <= len(row.Name)+len(row.UID)+len(row.Summary) {
		t.Fatalf("rowCost = %d, %q: want a cost over the row's bytes and nothing over", cost, over)
	}
	if n := testing.AllocsPerRun(100, func() { rowCost(&row, 64) }); n != 0 {
		t.Errorf("rowCost allocates %v times a row within the limits, want 0", n)
	}

	row.Labels["label-3"] = strings.Repeat("x", 65)
	if _, over := rowCost(&row, 64); over != "the value of label label-3 is 65 bytes" {
		t.Errorf("over = %q, want the value of label label-3 named", over)
	}
	row.Summary = []byte(strings.Repeat("y", 70))
	if _, over := rowCost(&row, 64); over != "summary is 70 bytes" {
		t.Errorf("over = %q, want the summary named first", over)
	}
}
