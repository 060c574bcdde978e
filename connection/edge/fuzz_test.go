package edge

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// FuzzDecodeMessage feeds arbitrary frames to the manager's decoding of
// edge messages, as a hostile or broken edge could send them: the message
// envelope, then each row of a snapshot or delta as the session decodes it
// for its cluster. Every refusal is a RejectError whose reason the session
// closes with (malformed; a row of another cluster; a row over a quota; a
// row whose key the index refuses, invalid); an accepted message
// carries exactly the body its type names and encodes back to itself.
func FuzzDecodeMessage(f *testing.F) {
	row := func(cluster, name string) json.RawMessage {
		data, err := json.Marshal(index.Object{
			Cluster: cluster, Namespace: "ns", Version: "v1", Kind: "Pod", Resource: "pods", Name: name,
			Labels: index.LabelsOf(map[string]string{"app": "web"}), Status: index.StatusHealthy, CreatedAt: time.Unix(1, 0).UTC(),
		})
		if err != nil {
			f.Fatal(err)
		}
		return data
	}
	pods := index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, m := range []Message{
		{Type: TypeHello, Seq: 1, Time: at, Hello: &Hello{Version: ProtocolVersion, Cluster: "edge-a", Instance: "i-1", Token: "tok-a", Metadata: map[string]string{"region": "eu"}}},
		{Type: TypeWelcome, Seq: 1, Time: at, Welcome: &Welcome{Version: ProtocolVersion, Session: "s", MaxMessageBytes: DefaultMaxMessageBytes, Window: 8}},
		{Type: TypeReject, Seq: 2, Time: at, Reject: &Reject{Reason: ReasonGracePeriod, Message: "wait", RetryAfterMillis: 3000}},
		{Type: TypeSnapshot, Seq: 2, Time: at, Snapshot: &Snapshot{ID: 1, Final: true, Full: true, Kinds: []KindState{{Kind: pods, Synced: true}}, Rows: []json.RawMessage{row("edge-a", "p1"), row("edge-b", "p2")}}},
		{Type: TypeDelta, Seq: 3, Time: at, Delta: &Delta{Upserts: []json.RawMessage{row("edge-a", "p3")}, Deletes: []index.Key{{Cluster: "edge-a", Kind: "Pod", Namespace: "ns", Name: "p1"}}, Kinds: []KindState{{Kind: pods, Error: "forbidden", Failing: true}}}},
		{Type: TypeAck, Seq: 4, Time: at, Ack: &Ack{Seq: 3}},
		{Type: TypeDetailRequest, Seq: 5, Time: at, DetailRequest: &DetailRequest{ID: 1, Method: http.MethodGet, Path: "/api/v1/namespaces/ns/pods/p1", Header: http.Header{"Impersonate-User": {"alice"}}}},
		{Type: TypeDetailResponse, Seq: 6, Time: at, DetailResponse: &DetailResponse{ID: 1, Status: http.StatusOK, Body: []byte(`{"kind":"Pod"}`)}},
	} {
		data, err := json.Marshal(&m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"type":"hello"}`, `{"type":"ack","ack":{"seq":1},"hello":{}}`, `{"type":"nope","ack":{}}`,
		`{"type":"delta","delta":{"upserts":[1,"x",{"cluster":7}]}}`, `{"type":"snapshot","snapshot":{"rows":[{"cluster":"edge-a","labels":[]}]}}`,
		`{"type":"snapshot","snapshot":{"rows":[{"Cluster":"edge-a"},{"Cluster":"edge-a","Kind":"Pod","Name":"a\u0000b"}]}}`,
		`{"type":"ack","seq":-1,"ack":{"seq":1e400}}`, `{"type":"ack","ts":"yesterday","ack":{}}`, `{"type":"ack","ack":{}}` + "\x00",
	} {
		f.Add([]byte(s))
	}
	hub := &Hub{}
	hub.opts.setDefaults()
	s := &session{cluster: "edge-a", h: hub}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMessage(data)
		if err != nil {
			if r := rejectOf(t, err); r.Reason != ReasonMalformed {
				t.Fatalf("%q: reason %s, want %s", data, r.Reason, ReasonMalformed)
			}
			return
		}
		if err := m.validate(); err != nil {
			t.Fatalf("%q: decoded a message that does not validate: %v", data, err)
		}
		encoded, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("%q: decoded message does not encode: %v", data, err)
		}
		again, err := decodeMessage(encoded)
		if err != nil {
			t.Fatalf("%q: re-encoded as %q, which does not decode: %v", data, encoded, err)
		}
		if reencoded, _ := json.Marshal(again); !bytes.Equal(reencoded, encoded) {
			t.Fatalf("%q: encodes as %q, then as %q", data, encoded, reencoded)
		}
		var rows []json.RawMessage
		if m.Snapshot != nil {
			rows = m.Snapshot.Rows
		}
		if m.Delta != nil {
			rows = m.Delta.Upserts
		}
		for _, raw := range rows {
			o, _, err := s.decodeRow(raw)
			if err != nil {
				if r := rejectOf(t, err); r.Reason != ReasonMalformed && r.Reason != ReasonWrongCluster && r.Reason != ReasonQuota && r.Reason != ReasonInvalid {
					t.Fatalf("row %q: reason %s", raw, r.Reason)
				}
				continue
			}
			if o.Cluster != s.cluster {
				t.Fatalf("row %q of cluster %q accepted for %q", raw, o.Cluster, s.cluster)
			}
		}
	})
}

// rejectOf returns err as a RejectError, failing the test when it is not
// one (the session could not say why it closes).
func rejectOf(t *testing.T, err error) *RejectError {
	t.Helper()
	var r *RejectError
	if !errors.As(err, &r) || !errors.Is(err, ErrProtocol) {
		t.Fatalf("error %v is not a protocol RejectError", err)
	}
	return r
}
