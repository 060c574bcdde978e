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
	// clusterSel is the compiled ClusterSelector, evaluated against the
	// labels clusterLabels returns for an event's cluster.
	clusterSel    labels.Selector
	clusterLabels func(cluster string) map[string]string
}

// NewMatcher compiles f for a viewer with access a. It knows no cluster
// labels: a ClusterSelector is evaluated against none, so "env=prod"
// matches nothing. Store.NewMatcher evaluates it against the clusters' rows.
func NewMatcher(f Filter, a *Access) (*Matcher, error) {
	return newMatcher(f, a, func(string) map[string]string { return nil })
}

// NewMatcher compiles f for a viewer with access a, evaluating its
// ClusterSelector against each event's cluster row as it is when the event
// is matched.
func (s *Store) NewMatcher(f Filter, a *Access) (*Matcher, error) {
	return newMatcher(f, a, func(cluster string) map[string]string {
		if c, ok := s.GetCluster(nil, cluster); ok {
			return c.Labels
		}
		return nil
	})
}

func newMatcher(f Filter, a *Access, clusterLabels func(string) map[string]string) (*Matcher, error) {
	m := &Matcher{f: f, access: a, name: strings.ToLower(f.NameContains), clusterLabels: clusterLabels}
	for _, st := range f.Statuses {
		if Statuses[statusIndex(st)] != st {
			return nil, fmt.Errorf("%w: unknown status %q", ErrInvalidQuery, st)
		}
	}
	if f.LabelSelector != "" {
		sel, err := parseSelector("label selector", f.LabelSelector)
		if err != nil {
			return nil, err
		}
		m.sel = sel
	}
	if f.ClusterSelector != "" {
		sel, err := parseSelector("cluster selector", f.ClusterSelector)
		if err != nil {
			return nil, err
		}
		m.clusterSel = sel
	}
	return m, nil
}

// Match reports whether o is visible and passes the filter.
func (m *Matcher) Match(o *Object) bool {
	return o != nil && m.visible(o) && m.passes(o)
}

// visible reports whether the viewer may see o.
func (m *Matcher) visible(o *Object) bool {
	return m.access.Allows(o.Cluster, GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name)
}

// sameAccessKey reports whether a and b are the same object as access
// sees it: Access.Allows reads only these fields.
func sameAccessKey(a, b *Object) bool {
	return a.Cluster == b.Cluster && a.Group == b.Group && a.Resource == b.Resource && a.Namespace == b.Namespace && a.Name == b.Name
}

// passes reports whether o passes the filter.
func (m *Matcher) passes(o *Object) bool {
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
	if m.clusterSel != nil && !m.clusterSel.Matches(labels.Set(m.clusterLabels(o.Cluster))) {
		return false
	}
	return m.sel == nil || m.sel.Matches(&o.Labels) // a pointer: a Labels value would be boxed, an allocation per event
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
		o, prev := e.Object(), e.Previous()
		var now, before bool
		if o != nil && prev != nil && sameAccessKey(o, prev) {
			// One object's two states: the access check is the same.
			if !m.visible(o) {
				return 0, false
			}
			now, before = m.passes(o), m.passes(prev)
		} else {
			now, before = m.Match(o), m.Match(prev)
		}
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
