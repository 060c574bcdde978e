package index

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Matcher decides whether single objects pass a Filter and an Access. It
// is the per-event check of filtered subscriptions: it works on Objects,
// needs no lock, and is safe for concurrent use. Queries use compiled plans
// instead; both follow the same rules, which the reference tests check.
type Matcher struct {
	f      Filter
	access *Access
	sel    labels.Selector
	name   string
}

// NewMatcher compiles f for a viewer with access a.
func NewMatcher(f Filter, a *Access) (*Matcher, error) {
	m := &Matcher{f: f, access: a, name: strings.ToLower(f.NameContains)}
	for _, st := range f.Statuses {
		if Statuses[statusIndex(st)] != st {
			return nil, fmt.Errorf("%w: unknown status %q", ErrInvalidQuery, st)
		}
	}
	if f.LabelSelector != "" {
		sel, err := labels.Parse(f.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("%w: label selector %q: %w", ErrInvalidQuery, f.LabelSelector, err)
		}
		m.sel = sel
	}
	return m, nil
}

// Match reports whether o is visible and passes the filter.
func (m *Matcher) Match(o *Object) bool {
	if o == nil || !m.access.Allows(o.Cluster, GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name) {
		return false
	}
	f := &m.f
	if len(f.Clusters) > 0 && !slices.Contains(f.Clusters, o.Cluster) {
		return false
	}
	if len(f.Namespaces) > 0 && !slices.Contains(f.Namespaces, o.Namespace) {
		return false
	}
	if len(f.Kinds) > 0 && !slices.ContainsFunc(f.Kinds, func(k string) bool {
		name, group, qualified := strings.Cut(k, ".")
		return (strings.EqualFold(name, o.Kind) || strings.EqualFold(name, o.Resource)) && (!qualified || group == o.Group)
	}) {
		return false
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, o.Status) {
		return false
	}
	if m.name != "" && !containsFold(o.Name, m.name) {
		return false
	}
	return m.sel == nil || m.sel.Matches(labels.Set(o.Labels))
}

// Classify returns how an object event looks through the matcher: an
// object that starts matching is ADDED, one that stops matching is DELETED,
// and ok is false when the viewer should not see the event at all.
// Non-object events are not classified.
func (m *Matcher) Classify(e *Event) (t EventType, ok bool) {
	switch e.Type {
	case EventAdded, EventDeleted:
		return e.Type, m.Match(e.Object())
	case EventModified:
		now, before := m.Match(e.Object()), m.Match(e.Previous())
		switch {
		case now && before:
			return EventModified, true
		case now:
			return EventAdded, true
		case before:
			return EventDeleted, true
		}
	}
	return 0, false
}
