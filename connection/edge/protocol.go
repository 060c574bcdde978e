package edge

// This file is the whole wire protocol between an edge agent and the
// manager: every message type, its fields, the reject reasons and their
// websocket close codes, and the limits both sides agree on. Nothing else in
// the package defines what travels over the socket.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/index"
)

// ProtocolVersion is the version of the protocol in this file. A manager
// rejects a Hello of a version it does not speak with ReasonInvalid, so an
// edge that is too old or too new says why it cannot connect instead of
// failing on the first message it misreads.
const ProtocolVersion = 1

// Features are optional parts of the protocol that both sides must speak
// before either uses them. The edge lists the ones it speaks in Hello; the
// manager answers in Welcome with those of them it speaks too, and only
// those are used in the session. A manager from before a feature ignores
// the Hello field (JSON decoding skips unknown fields) and lists nothing,
// and an edge from before it lists nothing, so old and new peers keep
// speaking version 1 without the feature rather than failing on it.
const (
	// FeatureDeltasInSnapshot: deltas may travel between the parts of a
	// snapshot, so a periodic resync of a large cluster does not hold
	// every change behind it for as long as the snapshot takes. The
	// manager applies such a delta at once and keeps, until the snapshot's
	// final part, what it wrote for each key; at the commit those rows win
	// over the snapshot's (older) rows of the same keys, and a key a delta
	// wrote is not removed because the snapshot omits it. Such a delta
	// carries only keys of the kinds the snapshot syncs (see Snapshot).
	FeatureDeltasInSnapshot = "deltasInSnapshot"
)

// Subprotocol is the websocket subprotocol both sides ask for. It names the
// protocol version, so a proxy log or a packet capture shows what speaks.
const Subprotocol = "fleetgraph-edge.v1"

// DefaultMaxMessageBytes is the largest message either side accepts,
// measured after decompression (docs/design.md: 4 MiB). Snapshots larger than
// this are sent in parts.
const DefaultMaxMessageBytes = 4 << 20

// MessageType says which body a Message carries.
type MessageType string

// The message types. The edge sends Hello, Snapshot, Delta and
// DetailResponse; the manager sends Welcome, Reject, Ack and DetailRequest.
// Either side may end a session with a Reject.
const (
	TypeHello          MessageType = "hello"
	TypeWelcome        MessageType = "welcome"
	TypeReject         MessageType = "reject"
	TypeSnapshot       MessageType = "snapshot"
	TypeDelta          MessageType = "delta"
	TypeAck            MessageType = "ack"
	TypeDetailRequest  MessageType = "detailRequest"
	TypeDetailResponse MessageType = "detailResponse"
)

// Message is one websocket text message: a JSON envelope with a sequence
// number, a timestamp and exactly one body, the one Type names.
//
// Seq starts at 1 in each direction of each session and grows by one per
// message; a receiver that sees any other number ends the session with
// ReasonSequenceGap, because a lost or reordered delta would leave the
// index silently wrong. Time is the sender's clock when it sent the
// message; the manager uses it for the lag metric only, never for ordering.
type Message struct {
	Type MessageType `json:"type"`
	Seq  uint64      `json:"seq"`
	Time time.Time   `json:"ts"`

	Hello          *Hello          `json:"hello,omitempty"`
	Welcome        *Welcome        `json:"welcome,omitempty"`
	Reject         *Reject         `json:"reject,omitempty"`
	Snapshot       *Snapshot       `json:"snapshot,omitempty"`
	Delta          *Delta          `json:"delta,omitempty"`
	Ack            *Ack            `json:"ack,omitempty"`
	DetailRequest  *DetailRequest  `json:"detailRequest,omitempty"`
	DetailResponse *DetailResponse `json:"detailResponse,omitempty"`
}

// Hello is the edge's first message: which cluster it claims, which process
// it is, facts about the cluster, and the cluster's token.
type Hello struct {
	Version int    `json:"version"`
	Cluster string `json:"cluster"`
	// Instance identifies one edge process. After a disconnect only the
	// same instance may reclaim the cluster during the grace period, so
	// a restarted edge (a new instance) waits while a reconnecting one
	// does not.
	Instance string `json:"instance"`
	Token    string `json:"token"`
	// Metadata holds region, environment, Kubernetes and Istio versions
	// and the like; it becomes the cluster row's metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Features lists the optional features the edge speaks; names the
	// manager does not know are ignored.
	Features []string `json:"features,omitempty"`
}

// Welcome accepts a Hello. It tells the edge the manager's limits, which
// the edge must respect for the rest of the session.
type Welcome struct {
	Version int    `json:"version"`
	Session string `json:"session"`
	// MaxMessageBytes is the largest message the manager reads, after
	// decompression.
	MaxMessageBytes int `json:"maxMessageBytes"`
	// Window is how many messages the edge may have sent without an Ack.
	// It is the manager's bound on what it buffers per session.
	Window int `json:"window"`
	// Features lists the features of the Hello the manager speaks too:
	// the ones the session uses.
	Features []string `json:"features,omitempty"`
	// MaxSnapshotDeltaBytes is the most the manager keeps of the deltas
	// sent between one snapshot's parts (FeatureDeltasInSnapshot): for
	// each distinct key they wrote, the decoded row it was last written
	// with (or, for a delete, the key) and a fixed cost per key. Past it
	// the session ends with ReasonOversize. An edge sends no more deltas
	// between a snapshot's parts once they would make the manager keep
	// over half of it; its other changes wait for the snapshot's end.
	// Zero (a manager from before the field, which ignores it as every
	// JSON field it does not know): the edge assumes
	// LegacyMaxSnapshotDeltaBytes.
	MaxSnapshotDeltaBytes int `json:"maxSnapshotDeltaBytes,omitempty"`
	// MaxLabelsPerRow and MaxStringBytes are the manager's per-row quotas
	// (Quotas.LabelsPerRow and Quotas.StringBytes): a row with more labels,
	// or with a longer string (as the manager decodes it), ends the session
	// with ReasonQuota. The edge holds each row to them before sending it
	// and skips the rows over them, so that one object over a quota is all
	// the manager misses of its cluster (AgentStats.OverQuota). Zero (a
	// manager from before the fields): the edge assumes the defaults,
	// DefaultLabelsPerRow and DefaultStringBytes, the quotas every manager
	// had before they were announced.
	MaxLabelsPerRow int `json:"maxLabelsPerRow,omitempty"`
	MaxStringBytes  int `json:"maxStringBytes,omitempty"`
}

// LegacyMaxSnapshotDeltaBytes is the allowance an edge assumes for the
// deltas between a snapshot's parts when the Welcome does not give one. A
// manager from before Welcome.MaxSnapshotDeltaBytes allows an eighth of
// its snapshot limit (64 MiB at the default of 512 MiB); assuming 8 MiB
// keeps an edge safe against such a manager configured down to a 64 MiB
// snapshot limit. The cost of assuming too little is small: the changes
// that do not fit wait for the snapshot's end, as every change did
// before FeatureDeltasInSnapshot. This holds for managers from 7a0ca63
// on; the untagged builds from 6e15fb2 to it counted the deltas inside
// the snapshot's limit (docs/edge-protocol.md; review-s9-a L8).
const LegacyMaxSnapshotDeltaBytes = 8 << 20

// Reason is why a session was refused or ended.
type Reason string

// The reasons. The first four refuse a Hello; the others end a session
// that was welcomed.
const (
	// ReasonAlreadyClaimed: another edge holds the cluster now.
	ReasonAlreadyClaimed Reason = "already_claimed"
	// ReasonGracePeriod: the cluster's last edge left recently, and only
	// that instance may reclaim it until RetryAfter passes.
	ReasonGracePeriod Reason = "grace_period"
	// ReasonUnauthorized: the token is unknown or not for this cluster,
	// or (ending a session) was removed or now names another cluster.
	ReasonUnauthorized Reason = "unauthorized"
	// ReasonInvalid: a Hello or message the protocol does not allow (a
	// bad version, an empty cluster, a delta inside a snapshot of a
	// session without FeatureDeltasInSnapshot, or with kinds, or with a
	// key of a kind the snapshot does not sync, a row the index refuses,
	// a snapshot whose final part has not come within the manager's
	// HubOptions.MaxSnapshotPending).
	ReasonInvalid Reason = "invalid"
	// ReasonMalformed: a frame that is not a JSON message of this
	// protocol.
	ReasonMalformed Reason = "malformed"
	// ReasonWrongCluster: a row or key of a cluster other than the one
	// the session claimed.
	ReasonWrongCluster Reason = "wrong_cluster"
	// ReasonOversize: a message over MaxMessageBytes, a snapshot over
	// the manager's snapshot limit, or what deltas wrote during it over
	// their share of that limit.
	ReasonOversize Reason = "oversize"
	// ReasonSequenceGap: a message whose Seq is not the previous plus one.
	ReasonSequenceGap Reason = "sequence_gap"
	// ReasonQuota: the edge would make the manager hold more of its
	// cluster than the manager's quotas allow (rows, kinds, labels per
	// row, bytes per string); the message says which. The rows already
	// indexed stay.
	ReasonQuota Reason = "quota"
	// ReasonSuperseded: the same edge instance connected again, so this
	// older session of it is closed.
	ReasonSuperseded Reason = "superseded"
	// ReasonShutdown: the manager is stopping.
	ReasonShutdown Reason = "shutdown"
)

// closeCodes maps each reason to the websocket close code sent with it.
// Codes 4000-4999 are for applications (RFC 6455 7.4.2); oversize and
// shutdown have standard codes that proxies and tools already understand.
var closeCodes = map[Reason]int{
	ReasonUnauthorized:   4001,
	ReasonAlreadyClaimed: 4002,
	ReasonGracePeriod:    4003,
	ReasonInvalid:        4004,
	ReasonMalformed:      4005,
	ReasonWrongCluster:   4006,
	ReasonSequenceGap:    4007,
	ReasonSuperseded:     4008,
	ReasonQuota:          4009,
	ReasonOversize:       int(websocket.StatusMessageTooBig),
	ReasonShutdown:       int(websocket.StatusGoingAway),
}

// CloseCode returns the websocket close code sent with a reason.
func CloseCode(r Reason) int {
	if c, ok := closeCodes[r]; ok {
		return c
	}
	return int(websocket.StatusPolicyViolation)
}

// Reject refuses a Hello or ends a session. The connection is closed right
// after it, with CloseCode(Reason) and "reason: message" as close text, so
// even a client that does not read the message sees why.
type Reject struct {
	Reason  Reason `json:"reason"`
	Message string `json:"message"`
	// RetryAfterMillis, when set, is when a new Hello can succeed (the
	// end of a grace period).
	RetryAfterMillis int64 `json:"retryAfterMillis,omitempty"`
}

// Error makes a Reject usable as an error on the side that receives it.
func (r *Reject) Error() string { return fmt.Sprintf("rejected: %s: %s", r.Reason, r.Message) }

// KindState is what the edge knows about one kind of its cluster.
type KindState struct {
	Kind index.Kind `json:"kind"`
	// Synced says the message carries every row of the kind: the
	// manager replaces the kind's rows with them (index.Sink.Replace).
	Synced bool `json:"synced,omitempty"`
	// Error, when set, is why the kind cannot be collected now
	// (index.Sink.ReportKindError); the kind's rows stay as last known.
	Error string `json:"error,omitempty"`
	// Failing says the error is a failing list or watch, which makes the
	// cluster DEGRADED, rather than a kind the cluster does not serve (a
	// CRD that is not installed), which does not.
	Failing bool `json:"failing,omitempty"`
}

// Snapshot carries complete rows of some kinds, in one or more parts. The
// manager applies nothing until the part with Final arrives, then replaces
// every synced kind and records every kind error in one index commit
// (index.Sink.ApplySnapshot), so a snapshot cut short by a lost connection,
// or refused for a bad row in its last part, changes nothing, and no reader
// sees some of its kinds applied and not others. A Full snapshot also
// retires the kinds the cluster had that it no longer lists.
//
// Parts of one snapshot share ID, count Part up from 0, and are sent with
// nothing in between but deltas, and deltas only when the session uses
// FeatureDeltasInSnapshot. Part 0 carries Kinds (and Metadata); Rows may be
// spread over every part.
//
// A delta between the parts is newer than every row of the snapshot (the
// edge took the snapshot's rows before it took the delta's changes), so
// the manager applies it at once and, at the commit, lets it win: for a
// key of a synced kind that a delta upserted or deleted meanwhile, the
// kind ends with the delta's row (or without the key), whatever the
// snapshot says of it; every other key ends as the snapshot says, and one
// the snapshot omits is removed. Such a delta carries only upserts and
// deletes of keys of the kinds the snapshot lists as synced (ReasonInvalid
// otherwise): kind states, and changes of other kinds, wait for the
// snapshot's end, because the snapshot would overrule them (a kind it does
// not list is retired by a full snapshot's commit; a kind snapshot that
// follows carries rows older than the change). What the manager keeps of
// these deltas has its own limit, which the Welcome announces
// (MaxSnapshotDeltaBytes; ReasonOversize past it).
//
// Readers see a delta between the parts before the snapshot's commit,
// also during a session's first full snapshot, while the cluster is still
// CONNECTING; the snapshot's own rows stay all or nothing.
type Snapshot struct {
	ID    uint64 `json:"id"`
	Part  int    `json:"part"`
	Final bool   `json:"final,omitempty"`
	// Full says the snapshot covers every kind of the cluster. The first
	// full snapshot of a session is what makes the cluster CONNECTED.
	Full     bool              `json:"full,omitempty"`
	Kinds    []KindState       `json:"kinds,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Rows are index.Object values in JSON. They stay raw on the wire
	// type so that the edge can measure each row when it cuts parts, and
	// the manager can say which row was bad.
	Rows []json.RawMessage `json:"rows"`
}

// Delta carries changes since the last message: rows to upsert (the latest
// state of each object; intermediate states are coalesced away), keys to
// delete, and kinds whose error changed. Inside a snapshot (see Snapshot)
// it may not carry Kinds.
type Delta struct {
	Upserts []json.RawMessage `json:"upserts,omitempty"`
	Deletes []index.Key       `json:"deletes,omitempty"`
	Kinds   []KindState       `json:"kinds,omitempty"`
}

// Ack acknowledges every message up to and including Seq, after the
// manager applied them to the index. Acks free the edge's window.
type Ack struct {
	Seq uint64 `json:"seq"`
}

// DetailRequest asks the edge to perform a read on its local API server,
// impersonating the viewer: it is how object(...) reaches a push-mode
// cluster (docs/design.md). Only GET and HEAD on /api and /apis are allowed.
type DetailRequest struct {
	ID     uint64      `json:"id"`
	Method string      `json:"method"`
	Path   string      `json:"path"` // path and query
	Header http.Header `json:"header,omitempty"`
}

// DetailResponse answers a DetailRequest with the local API server's
// response, or with Error when the edge could not ask it.
type DetailResponse struct {
	ID     uint64      `json:"id"`
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
	Error  string      `json:"error,omitempty"`
}

// features are the optional features this side speaks.
var features = []string{FeatureDeltasInSnapshot}

// sharedFeatures returns the features of asked that ours has too, each
// once, in our order; unknown names are ignored, so a newer peer's features
// never fail a session.
func sharedFeatures(ours, asked []string) []string {
	var out []string
	for _, f := range ours {
		if slices.Contains(asked, f) {
			out = append(out, f)
		}
	}
	return out
}

// ErrProtocol marks a message that breaks the protocol. A RejectError
// carries the reason.
var ErrProtocol = errors.New("edge protocol violation")

// RejectError is a protocol violation with the reason the session ends with.
type RejectError struct {
	Reason  Reason
	Message string
	// retryAfter is sent as Reject.RetryAfterMillis.
	retryAfter time.Duration
}

func (e *RejectError) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Message) }

// Unwrap makes every RejectError match ErrProtocol.
func (e *RejectError) Unwrap() error { return ErrProtocol }

func rejectf(r Reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// validate checks that a message carries exactly the body its type names.
func (m *Message) validate() error {
	bodies := map[MessageType]bool{
		TypeHello: m.Hello != nil, TypeWelcome: m.Welcome != nil, TypeReject: m.Reject != nil,
		TypeSnapshot: m.Snapshot != nil, TypeDelta: m.Delta != nil, TypeAck: m.Ack != nil,
		TypeDetailRequest: m.DetailRequest != nil, TypeDetailResponse: m.DetailResponse != nil,
	}
	present, known := bodies[m.Type]
	if !known {
		return rejectf(ReasonMalformed, "unknown message type %q", m.Type)
	}
	if !present {
		return rejectf(ReasonMalformed, "%s message without a %s body", m.Type, m.Type)
	}
	for t, p := range bodies {
		if p && t != m.Type {
			return rejectf(ReasonMalformed, "%s message with a %s body too", m.Type, t)
		}
	}
	return nil
}

// decodeMessage parses and validates one message.
func decodeMessage(data []byte) (*Message, error) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, rejectf(ReasonMalformed, "not a JSON message: %v", err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// closeText is the close frame text for a reject: at most 123 bytes, as
// RFC 6455 allows.
func closeText(r *Reject) string {
	s := string(r.Reason) + ": " + r.Message
	const maxCloseText = 123
	if len(s) > maxCloseText {
		s = s[:maxCloseText]
		for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
			s = s[:len(s)-1]
		}
	}
	return s
}
