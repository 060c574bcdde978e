package graph

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// This file converts between index rows and GraphQL models. Conversions
// are plain copies: the index shares its rows, so nothing here mutates
// them.

// toFilter converts a GraphQL filter into an index filter.
func toFilter(f *model.ObjectFilter) index.Filter {
	if f == nil {
		return index.Filter{}
	}
	out := index.Filter{
		Clusters:   f.Clusters,
		Namespaces: f.Namespaces,
		Kinds:      f.Kinds,
	}
	for _, st := range f.Statuses {
		out.Statuses = append(out.Statuses, index.Status(st))
	}
	if f.NameContains != nil {
		out.NameContains = *f.NameContains
	}
	if f.LabelSelector != nil {
		out.LabelSelector = *f.LabelSelector
	}
	if f.ClusterLabelSelector != nil {
		out.ClusterSelector = *f.ClusterLabelSelector
	}
	return out
}

// toOrder converts a GraphQL order; the field names are the index's.
func toOrder(o *model.ObjectOrder) index.Order {
	if o == nil {
		return index.Order{Field: index.OrderName}
	}
	return index.Order{Field: index.OrderField(o.Field), Desc: o.Direction == model.OrderDirectionDesc}
}

// toObject converts an object row. stale says whether its cluster's rows
// are last-known state.
func toObject(o *index.Object, stale bool) *model.Object {
	m := &model.Object{
		ID:              o.Key().String(),
		Cluster:         o.Cluster,
		Namespace:       optString(o.Namespace),
		Group:           o.Group,
		Version:         o.Version,
		Kind:            o.Kind,
		Resource:        o.Resource,
		Name:            o.Name,
		UID:             o.UID,
		Status:          model.ObjectStatus(o.Status),
		Message:         optString(o.Message),
		Labels:          toLabels(o.Labels),
		OwnerReferences: make([]*model.OwnerReference, len(o.OwnerRefs)),
		CreatedAt:       optTime(o.CreatedAt),
		UpdatedAt:       optTime(o.UpdatedAt),
		ResourceVersion: optString(o.ResourceVersion),
		Summary:         model.JSON(o.Summary),
		Stale:           stale,
	}
	for i, r := range o.OwnerRefs {
		m.OwnerReferences[i] = &model.OwnerReference{Kind: r.Kind, Name: r.Name}
	}
	return m
}

// toLabels returns the labels in key order, so answers are
// deterministic, in two allocations.
func toLabels(l index.Labels) []*model.Label {
	out, labels := make([]*model.Label, l.Len()), make([]model.Label, l.Len())
	for i := range out {
		k, v := l.At(i)
		labels[i] = model.Label{Key: k, Value: v}
		out[i] = &labels[i]
	}
	return out
}

// toCluster converts a cluster row; Sync is resolved separately, on
// demand.
func toCluster(c *index.Cluster) *model.Cluster {
	return &model.Cluster{
		Name:   c.Name,
		Labels: toLabels(index.LabelsOf(c.Labels)),
		Mode:   model.SyncMode(c.Mode),
		Connection: &model.ClusterConnection{
			State:     toState(c.State),
			Since:     c.Since,
			LastSeen:  optTime(c.LastSeen),
			LastError: optString(c.LastError),
		},
		Metadata: toLabels(index.LabelsOf(c.Metadata)),
		Stale:    c.Stale(),
	}
}

// toState maps a connection state; an empty state (a cluster row written
// before its first probe) reads as CONNECTING.
func toState(s index.ConnectionState) model.ConnectionState {
	if s == "" {
		return model.ConnectionStateConnecting
	}
	return model.ConnectionState(s)
}

// toFleetStatus converts the fleet's rebuild progress ("Rebuilding
// indices... 35/100 clusters"), which the index computes.
func toFleetStatus(f index.FleetStatus) *model.FleetStatus {
	return &model.FleetStatus{ClustersTotal: f.ClustersTotal, ClustersSynced: f.ClustersSynced, Rebuilding: f.Rebuilding, Message: f.Message}
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Change cursors are opaque to clients. Inside they are a format version,
// the handler's epoch and the index's sequence number. The epoch is random
// per handler, so a cursor saved before a server restart (whose sequence
// numbers start again from zero) is recognized as stale instead of resuming
// at an unrelated position.
const changeCursorVersion = "c1"

func (s *service) encodeChangeCursor(seq uint64) string {
	b := make([]byte, 0, 48)
	b = append(b, changeCursorVersion...)
	b = append(b, ':')
	b = strconv.AppendUint(b, s.epoch, 36)
	b = append(b, ':')
	b = strconv.AppendUint(b, seq, 10)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *service) decodeChangeCursor(c string) (uint64, error) {
	bad := newError(CodeBadUserInput, nil, "malformed change cursor")
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, bad
	}
	parts := strings.Split(string(b), ":")
	if len(parts) != 3 || parts[0] != changeCursorVersion {
		return 0, bad
	}
	epoch, err1 := strconv.ParseUint(parts[1], 36, 64)
	seq, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, bad
	}
	if epoch != s.epoch {
		return 0, newError(CodeResyncRequired, nil, "the change cursor belongs to another server instance; query objects again and subscribe with its changesCursor")
	}
	return seq, nil
}
