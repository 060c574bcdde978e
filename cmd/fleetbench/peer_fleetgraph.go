package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// fleetgraphPeer is the index in process: index.Store's Query, Get and
// Facets, the calls the GraphQL resolvers make.
type fleetgraphPeer struct {
	s     *index.Store
	admin *index.Access
	// scopes get RoleBindings after the load (and its measurement), for
	// the viewers of fleetgraph_http.
	scopes []*scope
	// rss0 is the process's RSS right before the load; rssAfter and
	// peakAfter its RSS and peak RSS right after it; heap the live heap
	// the load added. allocBefore is what the process had allocated on
	// the heap before the load, loadAlloc what the load allocated.
	rss0, rssAfter, peakAfter int64
	heap                      int64
	allocBefore, loadAlloc    uint64
	objects                   int
}

// newFleetgraph returns an empty store.
func newFleetgraph(scopes ...*scope) *fleetgraphPeer {
	return &fleetgraphPeer{s: index.New(memtables.Open), admin: &index.Access{All: true}, scopes: scopes}
}

func (p *fleetgraphPeer) name() string { return "fleetgraph" }

func (p *fleetgraphPeer) version() string {
	return "fleetgraph index (this commit), " + runtime.Version()
}

func (p *fleetgraphPeer) schema() string {
	return "index.Store in process: rows, posting lists per (kind, status), cluster, (cluster, namespace) and label pair, name-ordered runs, count cells (see index/doc.go). Q6 passes the viewer's index.Access."
}

// load syncs the fleet the way the collector's first sync does: per
// cluster, one Replace per kind (which also records the cluster's kinds,
// as discovery would, for authz).
//
// Its memory is measured from the process's RSS right before the load, with
// the garbage collected and returned to the OS and the peak (VmHWM) reset
// to it (baselineRSS), to the peak over the load: what the load grew the
// process by, garbage collector's headroom included (see size).
func (p *fleetgraphPeer) load(ctx context.Context, f indextest.Fleet, _ int) error {
	heapBefore := measure.LiveHeap()
	p.allocBefore = heapAllocs()
	var err error
	if p.rss0, err = baselineRSS(); err != nil {
		return err
	}
	perCluster := f.Namespaces * f.PerNamespace
	byKind := make([][]index.Object, len(indextest.Kinds))
	err = f.Each(perCluster, func(rows []index.Object) error {
		cluster := rows[0].Cluster
		for k := range byKind {
			byKind[k] = byKind[k][:0]
		}
		for i := range rows {
			k := kindIndex(rows[i].Kind)
			byKind[k] = append(byKind[k], rows[i])
		}
		for k, kr := range byKind {
			if err := p.s.Replace(ctx, cluster, indextest.Kinds[k], kr); err != nil {
				return err
			}
		}
		return p.s.UpsertCluster(ctx, index.Cluster{Name: cluster, State: index.StateConnected, Mode: index.ModePull})
	})
	if err != nil {
		return err
	}
	clear(byKind)
	p.loadAlloc = heapAllocs() - p.allocBefore
	if p.rssAfter, p.peakAfter, err = procRSS(os.Getpid()); err != nil {
		return err
	}
	p.objects = f.Size()
	p.heap = measure.LiveHeap() - heapBefore
	return loadPolicy(ctx, p.s, f, p.scopes)
}

// kindIndex returns the index in indextest.Kinds of a kind name.
func kindIndex(kind string) int {
	return slices.IndexFunc(indextest.Kinds, func(k index.Kind) bool { return k.Kind == kind })
}

// size is the process's peak RSS over the load less its RSS right before
// it: the heap with the garbage collector's headroom, as a server holds it
// (the generator's garbage included). compare measures each size in a
// process of its own and loads fleetgraph there before any other store, so
// nothing but the load itself is in that growth. The RSS right after the
// load and the live heap are reported beside it: the heap grows beyond the
// live heap by the garbage collector's headroom (GOGC 100: up to twice the
// live heap; the policy fleetgraph serve runs, which fleetbench runs too:
// max(16 MiB, 50%)), and the runtime keeps what it grew to (see
// BENCHMARKS.md's memory paragraph).
func (p *fleetgraphPeer) size(context.Context) (int64, string, error) {
	n := max(p.objects, 1)
	return p.peakAfter - p.rss0, fmt.Sprintf("peak RSS (VmHWM, reset before the load) over the load less the RSS right before it (%d MiB, garbage returned to the OS first), in a process that has loaded no other store; RSS (VmRSS) right after the load: %d B/object; live heap after it: %d B/object (%d MiB)",
		p.rss0>>20, (p.rssAfter-p.rss0)/int64(n), p.heap/int64(n), p.heap>>20), nil
}

func (p *fleetgraphPeer) get(_ context.Context, k index.Key) (string, error) {
	o, ok := p.s.Get(k)
	if !ok {
		return "", nil
	}
	return keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name), nil
}

func (p *fleetgraphPeer) query(q pageQuery) index.Query {
	// NoTotal: no peer counts the matches of a page query (see workloads).
	// NoEdgeCursors: no peer encodes a cursor per row; the next page starts
	// after the last row, whose cursor the page still has.
	iq := index.Query{First: q.first, Access: p.admin, Order: index.Order{Field: index.OrderName}, NoTotal: true, NoEdgeCursors: true}
	if q.scope != nil {
		iq.Access = q.scope.access
	}
	if q.cluster != "" {
		iq.Filter.Clusters = []string{q.cluster}
	}
	if q.namespace != "" {
		iq.Filter.Namespaces = []string{q.namespace}
	}
	if q.kind != "" {
		iq.Filter.Kinds = []string{q.kind}
	}
	if q.status != "" {
		iq.Filter.Statuses = []index.Status{q.status}
	}
	if q.labelKey != "" {
		iq.Filter.LabelSelector = q.labelKey + "=" + q.labelValue
	}
	return iq
}

func (p *fleetgraphPeer) page(ctx context.Context, q pageQuery) (pageAnswer, error) {
	pg, err := p.s.Query(ctx, p.query(q))
	if err != nil {
		return nil, err
	}
	return rows[index.Edge]{list: pg.Edges, key: edgeKey}, nil
}

func edgeKey(e *index.Edge) string {
	o := e.Object
	return keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name)
}

func (p *fleetgraphPeer) facets(ctx context.Context) (facetAnswer, error) {
	fc, err := p.s.Facets(ctx, index.Filter{}, p.admin)
	if err != nil {
		return nil, err
	}
	return facetLists{fc.Statuses, fc.Kinds, fc.Clusters, fc.Namespaces}, nil
}

// facetLists is a facetAnswer of fleetgraph's facet lists, in the order
// of facetDims: status, kind, cluster, namespace.
type facetLists [4][]index.FacetCount

var facetDims = [4]string{"status", "kind", "cluster", "namespace"}

func (f facetLists) len() int {
	n := 0
	for _, l := range f {
		for _, c := range l {
			if c.Count > 0 {
				n++
			}
		}
	}
	return n
}

func (f facetLists) counts() facetCounts {
	out := facetCounts{}
	for d, l := range f {
		for _, c := range l {
			if c.Count > 0 {
				v, _, _ := strings.Cut(c.Value, ".") // "Kind.group": the fleet's kind names are unique
				out[facetDims[d]+"/"+v] = c.Count
			}
		}
	}
	return out
}

func (p *fleetgraphPeer) update(ctx context.Context, objs []index.Object) error {
	return p.s.UpsertBatch(ctx, objs)
}

func (p *fleetgraphPeer) close() {}

// fleetgraphHTTP sends the workloads to the GraphQL API over loopback HTTP,
// served by graph.Handler on the in-process store, with bearer tokens: a
// fleet admin, and viewers whose access comes from RoleBindings in the
// store, as authz computes it for real users.
type fleetgraphHTTP struct {
	ref    *fleetgraphPeer
	srv    *http.Server
	url    string
	client *http.Client
	tokens map[string]string // scope id ("" for the admin) -> token
}

// The selection every page request asks for: what a list view shows.
const gqlPage = `query($f: ObjectFilter, $n: Int) { objects(filter: $f, first: $n) { totalCount
  edges { cursor node { cluster namespace group kind name uid status message labels { key value } createdAt resourceVersion } } } }`

const gqlGet = `query($f: ObjectFilter) { objects(filter: $f, first: 5) { edges { node { cluster namespace group kind name uid status message labels { key value } createdAt resourceVersion } } } }`

const gqlFacets = `{ facets { total statuses { value count } kinds { value count } clusters { value count } namespaces { value count } } }`

func newFleetgraphHTTP(ref *fleetgraphPeer) (*fleetgraphHTTP, error) {
	scopes := ref.scopes
	var csv strings.Builder
	csv.WriteString("admin-token,bench-admin,uid-admin,fleet-admins\n")
	h := &fleetgraphHTTP{ref: ref, tokens: map[string]string{"": "admin-token"}}
	for _, s := range scopes {
		fmt.Fprintf(&csv, "token-%s,viewer-%s,uid-%s\n", s.id, s.id, s.id)
		h.tokens[s.id] = "token-" + s.id
	}
	st, err := authz.ParseStaticTokens(strings.NewReader(csv.String()), "fleetbench tokens", authz.Naming{})
	if err != nil {
		return nil, err
	}
	handler, err := graph.NewHandler(graph.Options{
		Store: ref.s, Authorizer: authz.NewAuthorizer(ref.s, authz.Options{}),
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{st}},
		AdminGroups:   []string{"fleet-admins"},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = h.srv.Serve(l) }()
	h.url = "http://" + l.Addr().String() + "/graphql"
	h.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2}}
	return h, nil
}

func (h *fleetgraphHTTP) name() string { return "fleetgraph_http" }

func (h *fleetgraphHTTP) load(context.Context, indextest.Fleet, int) error { return nil }

func (h *fleetgraphHTTP) size(context.Context) (int64, string, error) { return 0, "", nil }

func (h *fleetgraphHTTP) update(context.Context, []index.Object) error {
	return errors.New("fleetgraph_http serves the in-process store: churn it there")
}

func (h *fleetgraphHTTP) close() {
	_ = h.srv.Close()
	h.client.CloseIdleConnections()
}

// post sends one GraphQL request and decodes the answer into out. The
// clock of a timed run covers the request, the answer and its decoding.
func (h *fleetgraphHTTP) post(ctx context.Context, token, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	var r struct {
		Data   json.RawMessage
		Errors []struct{ Message string }
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK || len(r.Errors) > 0 {
		return fmt.Errorf("status %d: %+v", resp.StatusCode, r.Errors)
	}
	return json.Unmarshal(r.Data, out)
}

type gqlNode struct {
	Cluster, Namespace, Group, Kind, Name string
}

type gqlObjects struct {
	Objects struct {
		TotalCount int
		Edges      []gqlEdge
	}
}

type gqlEdge struct{ Node gqlNode }

func (h *fleetgraphHTTP) filter(q pageQuery) map[string]any {
	f := map[string]any{}
	if q.cluster != "" {
		f["clusters"] = []string{q.cluster}
	}
	if q.namespace != "" {
		f["namespaces"] = []string{q.namespace}
	}
	if q.kind != "" {
		f["kinds"] = []string{q.kind}
	}
	if q.status != "" {
		f["statuses"] = []string{string(q.status)}
	}
	if q.labelKey != "" {
		f["labelSelector"] = q.labelKey + "=" + q.labelValue
	}
	return f
}

func (h *fleetgraphHTTP) get(ctx context.Context, k index.Key) (string, error) {
	var r gqlObjects
	f := map[string]any{"clusters": []string{k.Cluster}, "namespaces": []string{k.Namespace}, "kinds": []string{k.Kind}, "nameContains": k.Name}
	if err := h.post(ctx, h.tokens[""], gqlGet, map[string]any{"f": f}, &r); err != nil {
		return "", err
	}
	for _, e := range r.Objects.Edges {
		if n := e.Node; n.Name == k.Name && n.Group == k.Group {
			return keyString(n.Cluster, n.Group, n.Kind, n.Namespace, n.Name), nil
		}
	}
	return "", nil
}

func (h *fleetgraphHTTP) page(ctx context.Context, q pageQuery) (pageAnswer, error) {
	token := h.tokens[""]
	if q.scope != nil {
		token = h.tokens[q.scope.id]
	}
	var r gqlObjects
	if err := h.post(ctx, token, gqlPage, map[string]any{"f": h.filter(q), "n": q.first}, &r); err != nil {
		return nil, err
	}
	return rows[gqlEdge]{list: r.Objects.Edges, key: func(e *gqlEdge) string {
		n := &e.Node
		return keyString(n.Cluster, n.Group, n.Kind, n.Namespace, n.Name)
	}}, nil
}

func (h *fleetgraphHTTP) facets(ctx context.Context) (facetAnswer, error) {
	var r struct{ Facets index.Facets }
	if err := h.post(ctx, h.tokens[""], gqlFacets, nil, &r); err != nil {
		return nil, err
	}
	f := r.Facets
	return facetLists{f.Statuses, f.Kinds, f.Clusters, f.Namespaces}, nil
}

// loadPolicy gives each scope's viewer its access the way a cluster would:
// a ClusterRole that reads every fleet kind, and a RoleBinding to it in
// each namespace of the scope.
func loadPolicy(ctx context.Context, s *index.Store, f indextest.Fleet, scopes []*scope) error {
	if len(scopes) == 0 {
		return nil
	}
	role := &index.Policy{Rules: indextest.ReadRules()}
	policyRow := func(cluster, kind, namespace, name string, p *index.Policy) index.Object {
		return index.Object{
			Cluster: cluster, Namespace: namespace, Group: index.RBACGroup, Version: "v1", Kind: kind,
			Resource: strings.ToLower(kind) + "s", Name: name, UID: cluster + "/" + namespace + "/" + name,
			Status: index.StatusHealthy, Policy: p,
		}
	}
	bindings := map[string][]index.Object{}
	for _, sc := range scopes {
		for i, c := range sc.clusters {
			bindings[c] = append(bindings[c], policyRow(c, index.KindRoleBinding, sc.namespaces[i], "fleetbench-"+sc.id, &index.Policy{
				RoleRef:  index.RoleRef{APIGroup: index.RBACGroup, Kind: index.KindClusterRole, Name: "fleetbench-view"},
				Subjects: []index.Subject{{Kind: "User", Name: "viewer-" + sc.id}},
			}))
		}
	}
	for c := range f.Clusters {
		name := indextest.ClusterName(c)
		if err := s.Replace(ctx, name, policyKind(index.KindClusterRole, false), []index.Object{policyRow(name, index.KindClusterRole, "", "fleetbench-view", role)}); err != nil {
			return err
		}
		if err := s.Replace(ctx, name, policyKind(index.KindRoleBinding, true), bindings[name]); err != nil {
			return err
		}
	}
	return nil
}

func policyKind(kind string, namespaced bool) index.Kind {
	return index.Kind{Group: index.RBACGroup, Version: "v1", Kind: kind, Resource: strings.ToLower(kind) + "s", Namespaced: namespaced}
}
