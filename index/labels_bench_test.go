package index_test

import (
	"encoding/json"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

// labelsBenchSink keeps BenchmarkLabelsUnmarshalJSON's results alive.
var labelsBenchSink index.Labels

// BenchmarkLabelsUnmarshalJSON decodes the labels of one row of five
// labels: as the edge hub decodes a row (json.Unmarshal of an
// index.Object, row), the labels alone (labels), and the labels through
// a map and LabelsOf (map), the way UnmarshalJSON went before
// review-s10-index L7.
func BenchmarkLabelsUnmarshalJSON(b *testing.B) {
	labels := []byte(unmarshalLabelCases[0])
	row := []byte(`{"cluster":"c","group":"apps","version":"v1","kind":"Deployment","resource":"deployments","namespace":"ns","name":"shop","uid":"u","labels":` +
		string(labels) + `,"resourceVersion":"1","status":"Current"}`)
	b.Run("row", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var o index.Object
			if err := json.Unmarshal(row, &o); err != nil {
				b.Fatal(err)
			}
			labelsBenchSink = o.Labels
		}
	})
	b.Run("labels", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var l index.Labels
			if err := l.UnmarshalJSON(labels); err != nil {
				b.Fatal(err)
			}
			labelsBenchSink = l
		}
	})
	b.Run("map", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var m map[string]string
			if err := json.Unmarshal(labels, &m); err != nil {
				b.Fatal(err)
			}
			labelsBenchSink = index.LabelsOf(m)
		}
	})
}

// BenchmarkLabelsUnmarshalJSONHostile decodes each of hostileLabels, for
// the bytes and allocations of decoding what a hostile edge could send.
func BenchmarkLabelsUnmarshalJSONHostile(b *testing.B) {
	for _, c := range hostileLabels() {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.in)))
			for b.Loop() {
				var l index.Labels
				if err := l.UnmarshalJSON(c.in); err != nil {
					b.Fatal(err)
				}
				labelsBenchSink = l
			}
		})
	}
}
