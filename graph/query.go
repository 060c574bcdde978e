package graph

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// service is what resolvers delegate to: queries over the index through the
// viewer's access set, live reads through LeafClients, and subscriptions
// through the index's streams. It holds no per-request state.
type service struct {
	store       *index.Store
	authz       *authz.Authorizer
	authn       authz.Authenticator
	leaf        LeafClients
	adminGroups []string
	allAccess   *index.Access
	streams     *openStreams
	metrics     *metrics
	log         *slog.Logger
	subBuffer   int
	limits      Limits
	admission   *admission
	epoch       uint64     // random per handler; part of change cursors
	events      *eventPath // nil when an extension intercepts fields
	now         func() time.Time
}

// indexError maps an index error: invalid queries are the client's
// mistake, anything else is ours.
func indexError(err error) error {
	switch {
	case errors.Is(err, index.ErrInvalidQuery):
		return newError(CodeBadUserInput, err, "invalid query")
	case errors.Is(err, context.DeadlineExceeded):
		return newError(CodeDeadlineExceeded, nil, "the query ran past its deadline and was stopped")
	case errors.Is(err, context.Canceled):
		return newError(CodeCanceled, nil, "the query was canceled (the client went away or the server is shutting down)")
	}
	return err
}

// admitScan waits for a scan slot when a read over f in order o is a scan
// (see isScan); release is a no-op otherwise.
func (s *service) admitScan(ctx context.Context, v *viewer, f *model.ObjectFilter, o *model.ObjectOrder) (release func(), err error) {
	if !isScan(f, o) {
		return func() {}, nil
	}
	return s.admission.scan(ctx, v)
}

// objectsPage is one page of Query.objects before conversion: the index's
// page and what the client asked for.
type objectsPage struct {
	*index.Page
	first    int  // edges requested; 0 asks for counts only
	hasAfter bool // the request carried a cursor
	changes  string
}

// edges returns the edges to answer with.
func (p *objectsPage) edges() []index.Edge {
	if p.first == 0 {
		return nil
	}
	return p.Edges
}

// hasNextPage is PageInfo.hasNextPage.
func (p *objectsPage) hasNextPage() bool {
	if p.first == 0 {
		return len(p.Edges) > 0
	}
	return p.HasNextPage
}

// queryObjects runs Query.objects: one page of visible objects, filtered
// through the viewer's access before pagination and counting. The index
// counts the matches and lists the stale clusters only when total is set
// (see selected): otherwise totalCount and staleClusters are not in
// the answer, and counting can cost more than the page. It encodes every
// edge's cursor only when edgeCursors is set (see selected);
// otherwise the first and last, which pageInfo shows.
func (s *service) queryObjects(ctx context.Context, filter *model.ObjectFilter, orderBy *model.ObjectOrder, first *int, after *string, total, edgeCursors bool) (*objectsPage, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	n := index.DefaultPageSize
	if first != nil {
		if *first < 0 || *first > index.MaxPageSize {
			return nil, newError(CodeBadUserInput, nil, "first must be between 0 and %d", index.MaxPageSize)
		}
		n = *first
	}
	f, err := s.filterOf(filter)
	if err != nil {
		return nil, err
	}
	release, err := s.admitScan(ctx, v, filter, orderBy)
	if err != nil {
		return nil, err
	}
	defer release()
	q := index.Query{Filter: f, Order: toOrder(orderBy), First: max(n, 1), Access: s.access(v), NoTotal: !total, NoEdgeCursors: !edgeCursors}
	if after != nil {
		q.After = *after
	}
	page, err := s.store.Query(ctx, q)
	if err != nil {
		return nil, indexError(err)
	}
	return &objectsPage{Page: page, first: n, hasAfter: q.After != "", changes: s.encodeChangeCursor(page.Seq)}, nil
}

// selected reports what a selection of an ObjectConnection asks the
// index for (aliases, fragments and @skip/@include applied): total, a
// field computed with the total count (totalCount or staleClusters);
// edgeCursors, the cursor of its edges.
func selected(op *graphql.OperationContext, sel ast.SelectionSet) (total, edgeCursors bool) {
	for _, c := range graphql.CollectFields(op, sel, []string{"ObjectConnection"}) {
		switch c.Name {
		case "totalCount", "staleClusters":
			total = true
		case "edges":
			for _, e := range graphql.CollectFields(op, c.Selections, []string{"ObjectEdge"}) {
				if e.Name == "cursor" {
					edgeCursors = true
				}
			}
		}
	}
	return total, edgeCursors
}

// objects answers Query.objects through gqlgen's generated code (the fast
// path, fast.go, writes the same page directly).
func (s *service) objects(ctx context.Context, filter *model.ObjectFilter, orderBy *model.ObjectOrder, first *int, after *string) (*model.ObjectConnection, error) {
	total, edgeCursors := true, true // no field context: answer every field
	if fc := graphql.GetFieldContext(ctx); fc != nil {
		total, edgeCursors = selected(graphql.GetOperationContext(ctx), fc.Field.Selections)
	}
	p, err := s.queryObjects(ctx, filter, orderBy, first, after, total, edgeCursors)
	if err != nil {
		return nil, err
	}
	edges := p.edges()
	out := &model.ObjectConnection{
		Edges:         make([]*model.ObjectEdge, 0, len(edges)),
		TotalCount:    p.TotalCount,
		StaleClusters: nonNil(p.StaleClusters),
		ChangesCursor: p.changes,
		PageInfo:      &model.PageInfo{HasNextPage: p.hasNextPage(), HasPreviousPage: p.hasAfter},
	}
	for _, e := range edges {
		out.Edges = append(out.Edges, &model.ObjectEdge{Cursor: e.Cursor, Node: toObject(e.Object, e.Stale)})
	}
	if len(out.Edges) > 0 {
		out.PageInfo.StartCursor = &out.Edges[0].Cursor
		out.PageInfo.EndCursor = &out.Edges[len(out.Edges)-1].Cursor
	}
	return out, nil
}

// facets answers Query.facets from the index's count cells.
func (s *service) facets(ctx context.Context, filter *model.ObjectFilter) (*model.Facets, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	filt, err := s.filterOf(filter)
	if err != nil {
		return nil, err
	}
	release, err := s.admitScan(ctx, v, filter, nil)
	if err != nil {
		return nil, err
	}
	defer release()
	f, err := s.store.Facets(ctx, filt, s.access(v))
	if err != nil {
		return nil, indexError(err)
	}
	counts := func(in []index.FacetCount) []*model.FacetCount {
		out := make([]*model.FacetCount, len(in))
		for i, c := range in {
			out[i] = &model.FacetCount{Value: c.Value, Count: c.Count}
		}
		return out
	}
	return &model.Facets{
		Total:         f.Total,
		Statuses:      counts(f.Statuses),
		Kinds:         counts(f.Kinds),
		Clusters:      counts(f.Clusters),
		Namespaces:    counts(f.Namespaces),
		StaleClusters: nonNil(f.StaleClusters),
	}, nil
}

// visibleClusters returns the cluster rows v may be told about, in name
// order.
func (s *service) visibleClusters(v *viewer) []*index.Cluster {
	all := s.store.ListClusters(nil)
	if v.admin {
		return all
	}
	out := all[:0:0]
	for _, c := range all {
		if s.clusterVisible(v, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// clusters answers Query.clusters: the visible clusters whose labels match
// labelSelector, when given.
func (s *service) clusters(ctx context.Context, labelSelector *string) ([]*model.Cluster, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	sel := labels.Everything()
	if labelSelector != nil {
		if err := s.limits.checkSelector("labelSelector", *labelSelector); err != nil {
			return nil, err
		}
		if sel, err = labels.Parse(*labelSelector); err != nil {
			return nil, newError(CodeBadUserInput, err, "label selector %q: %v", *labelSelector, err)
		}
	}
	out := []*model.Cluster{}
	for _, c := range s.visibleClusters(v) {
		if sel.Matches(labels.Set(c.Labels)) {
			out = append(out, toCluster(c))
		}
	}
	return out, nil
}

// cluster answers Query.cluster. A cluster the viewer cannot see is
// reported exactly like one that does not exist.
func (s *service) cluster(ctx context.Context, name string) (*model.Cluster, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	c, ok := s.store.GetCluster(nil, name)
	if !ok || !s.clusterVisible(v, name) {
		return nil, nil
	}
	return toCluster(c), nil
}

// clusterSync answers Cluster.sync: the synced flag, the kinds collected
// and the kinds failing.
func (s *service) clusterSync(_ context.Context, c *model.Cluster) (*model.ClusterSync, error) {
	row, ok := s.store.GetCluster(nil, c.Name)
	out := &model.ClusterSync{Synced: ok && row.Synced, Kinds: len(s.store.Kinds(c.Name)), KindErrors: []*model.KindError{}}
	for _, ke := range s.store.KindErrors(nil, c.Name) {
		out.KindErrors = append(out.KindErrors, &model.KindError{
			Kind:     ke.Kind.GroupKind(),
			Group:    ke.Kind.Group,
			Version:  ke.Kind.Version,
			Resource: ke.Kind.Resource,
			Error:    ke.Error,
			Since:    ke.Since,
		})
	}
	return out, nil
}

// fleet answers Query.fleet for the viewer's clusters.
func (s *service) fleet(ctx context.Context) (*model.FleetStatus, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	return toFleetStatus(s.store.Fleet(s.access(v))), nil
}

// viewer answers Query.viewer with the identity as authenticated, before
// any per-cluster mapping.
func (s *service) viewer(ctx context.Context) (*model.Viewer, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	u := v.id.User()
	return &model.Viewer{Username: u.GetName(), Groups: nonNil(u.GetGroups())}, nil
}

// nonNil returns s, or an empty slice for nil, for non-null GraphQL lists.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
