package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Names on the NATS side. Every subject starts with the prefix (default
// "fleetgraph"); each cluster has one subject in the stream, the log of
// its operations and snapshots, and two core NATS subjects for requests
// to its owner.
const (
	DefaultStream = "FLEETGRAPH"
	DefaultPrefix = "fleetgraph"
)

// subjects builds the subjects of one prefix.
type subjects struct{ prefix string }

// all is the stream's subject filter.
func (s subjects) all() string { return s.prefix + ".c.>" }

// cluster is the stream subject of a cluster's log.
func (s subjects) cluster(name string) string { return s.prefix + ".c." + subjectToken(name) }

// detail is where a cluster's owner answers object detail requests.
func (s subjects) detail(name string) string { return s.prefix + ".detail." + subjectToken(name) }

// resync is where a cluster's owner takes requests for a fresh snapshot,
// from replicas that missed part of its log.
func (s subjects) resync(name string) string { return s.prefix + ".resync." + subjectToken(name) }

// resyncAll is the wildcard an owner subscribes to for resync requests.
func (s subjects) resyncAll() string { return s.prefix + ".resync.*" }

// subjectToken turns a cluster name into one subject token: letters,
// digits, '-' and '_' stay, every other byte (the '.' that separates
// tokens, wildcards, spaces, '~') becomes "~xx" in hex. The mapping is
// one to one and keeps common names readable.
func subjectToken(name string) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		default:
			b.WriteByte('~')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// DuplicateWindow is how long the stream remembers message ids: a publish
// retried after a lost acknowledgement within it is recognized and not
// stored twice.
const DuplicateWindow = 2 * time.Minute

// ensureStream creates the stream, or updates its replica count, and
// returns it. Every node calls it at start; creating an existing stream
// with the same configuration is not an error.
func ensureStream(ctx context.Context, js jetstream.JetStream, name string, subj subjects, replicas int) (jetstream.Stream, error) {
	cfg := jetstream.StreamConfig{
		Name:        name,
		Description: "fleetgraph: each cluster's index operations and snapshots (see docs/scale-out.md)",
		Subjects:    []string{subj.all()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    replicas,
		Duplicates:  DuplicateWindow,
		// Owners read the last message of a subject when they take a
		// cluster over; direct gets answer that from any replica.
		AllowDirect: true,
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("replication: stream %s: %w", name, err)
	}
	return s, nil
}

// lastOnSubject returns the stream sequence of the last message on a
// subject, 0 when it has none.
func lastOnSubject(ctx context.Context, s jetstream.Stream, subject string) (uint64, string, error) {
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("replication: last message of %s: %w", subject, err)
	}
	return m.Sequence, m.Header.Get(msgIDHeader), nil
}

// msgIDHeader is JetStream's message id header (Nats-Msg-Id).
const msgIDHeader = "Nats-Msg-Id"

// wrongLastSequence reports whether a publish failed because the subject's
// last message was not the expected one: another owner wrote since.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
