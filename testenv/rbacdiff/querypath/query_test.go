package querypath

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/testenv/rbacdiff"
)

// The query-path differential test (TestQueryPathDifferential) puts random
// policies, converted by the collector, and random objects into an
// index.Store, serves it with graph's real handler over HTTP and
// websockets, and for random viewers requires objects (every page),
// totalCount, facets, clusters and an objectChanges subscription to show
// exactly the objects the Kubernetes RBAC authorizer lets each viewer read
// under the visibility rule (OracleVisible), cluster by cluster.

// queryPairsDefault is what `make test` runs; make test-rbac-full sets
// RBACDIFF_QUERY_PAIRS=1000000.
const queryPairsDefault = 10000

// viewersPerRound is how many random viewers query each round's fleet.
const viewersPerRound = 8

// queryCluster is one cluster of the test fleet: its name and the kinds
// its discovery reports. The clusters map kinds to resources differently
// (Widget.example.com is widgets in alpha, gadgets in beta and
// cluster-scoped in gamma; beta's Gadget is widgets; gamma's Deployment is
// in extensions), so an access set that took one cluster's mapping for
// another's shows the wrong rows.
type queryCluster struct {
	name  string
	kinds []index.Kind
}

var (
	kPod        = index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
	kService    = index.Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}
	kSecret     = index.Kind{Version: "v1", Kind: "Secret", Resource: "secrets", Namespaced: true}
	kConfigMap  = index.Kind{Version: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}
	kNamespace  = index.Kind{Version: "v1", Kind: "Namespace", Resource: "namespaces"}
	kNode       = index.Kind{Version: "v1", Kind: "Node", Resource: "nodes"}
	kDeployment = index.Kind{Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments", Namespaced: true}
	kPodMetrics = index.Kind{Group: "metrics.k8s.io", Version: "v1beta1", Kind: "PodMetrics", Resource: "pods", Namespaced: true}
	kKs         = index.Kind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true}
	kBeacon     = index.Kind{Group: "fleetgraph.test", Version: "v1", Kind: "Beacon", Resource: "beacons"}
)

func widget(kind, resource string, namespaced bool) index.Kind {
	return index.Kind{Group: "example.com", Version: "v1", Kind: kind, Resource: resource, Namespaced: namespaced}
}

var queryClusters = []queryCluster{
	{"alpha", []index.Kind{kPod, kService, kSecret, kConfigMap, kNamespace, kNode, kDeployment, kPodMetrics, kKs, widget("Widget", "widgets", true)}},
	{"beta", []index.Kind{kPod, kService, kConfigMap, kNamespace, kNode, kDeployment, kKs, widget("Widget", "gadgets", true), widget("Gadget", "widgets", true)}},
	{"gamma", []index.Kind{
		kPod, kSecret, kNamespace, kPodMetrics, widget("Widget", "widgets", false),
		{Group: "extensions", Version: "v1beta1", Kind: "Deployment", Resource: "deployments", Namespaced: true},
	}},
}

// beaconCluster holds one object every viewer may read (its policy binds
// system:authenticated, system:unauthenticated and system:anonymous, which
// the authenticated-group adder leaves without either group, so it is
// visible to every identity Kubernetes can form). Touched last in each round, it
// tells a subscription that every earlier change has been delivered.
const beaconCluster = "zbeacon"

// Namespaces and names of the objects a cluster may hold: every namespace
// and name the generator's rules and bindings use, and one they never
// name. Each round, each object is present with probability 1/2.
var (
	objectNamespaces = []string{"ns1", "ns2", "kube-system", "default", "other"}
	objectNames      = []string{"a", "b", "ns1", "default", "cm1", "zz"}
)

// possible returns every object a cluster with these kinds may hold that
// its policy could name: the fixed namespaces and names, plus every name of
// a rule's resourceNames and every namespace of a RoleBinding or Role.
func possible(kinds []index.Kind, p *rbacdiff.Policy) []index.Key {
	names, namespaces := slices.Clone(objectNames), slices.Clone(objectNamespaces)
	add := func(list []string, v string) []string {
		if v == "" || slices.Contains(list, v) {
			return list
		}
		return append(list, v)
	}
	rules := func(rs []rbacv1.PolicyRule) {
		for _, r := range rs {
			for _, n := range r.ResourceNames {
				names = add(names, n)
				namespaces = add(namespaces, n) // a Namespace's name is its namespace
			}
		}
	}
	if p != nil {
		for _, r := range p.Roles {
			namespaces = add(namespaces, r.Namespace)
			rules(r.Rules)
		}
		for _, r := range p.ClusterRoles {
			rules(r.Rules)
		}
		for _, b := range p.RoleBindings {
			namespaces = add(namespaces, b.Namespace)
		}
	}
	var out []index.Key
	for _, k := range kinds {
		kindNames := names
		if k.Group == "" && k.Resource == "namespaces" {
			kindNames = namespaces
		}
		kindNamespaces := []string{""}
		if k.Namespaced {
			kindNamespaces = namespaces
		}
		for _, ns := range kindNamespaces {
			for _, n := range kindNames {
				out = append(out, index.Key{Group: k.Group, Kind: k.Kind, Namespace: ns, Name: n})
			}
		}
	}
	return out
}

var rbacKinds = map[string]index.Kind{
	index.KindRole:               {Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles", Namespaced: true},
	index.KindClusterRole:        {Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"},
	index.KindRoleBinding:        {Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true},
	index.KindClusterRoleBinding: {Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings"},
}

// unique returns p without the objects whose name (and namespace) an
// earlier one has: a cluster cannot hold both, and the oracle's resolver
// would take the first.
func unique(p *rbacdiff.Policy) *rbacdiff.Policy {
	out := &rbacdiff.Policy{}
	seen := map[string]bool{}
	first := func(kind, ns, name string) bool {
		k := kind + "/" + ns + "/" + name
		if seen[k] {
			return false
		}
		seen[k] = true
		return true
	}
	for _, r := range p.Roles {
		if first("r", r.Namespace, r.Name) {
			out.Roles = append(out.Roles, r)
		}
	}
	for _, r := range p.ClusterRoles {
		if first("cr", "", r.Name) {
			out.ClusterRoles = append(out.ClusterRoles, r)
		}
	}
	for _, b := range p.RoleBindings {
		if first("rb", b.Namespace, b.Name) {
			out.RoleBindings = append(out.RoleBindings, b)
		}
	}
	for _, b := range p.ClusterRoleBindings {
		if first("crb", "", b.Name) {
			out.ClusterRoleBindings = append(out.ClusterRoleBindings, b)
		}
	}
	return out
}

// readable returns p with its roles made likelier to show objects (in
// copies: seed roles are shared): half of the rules gain "get" or "list",
// and three roles in four gain a rule that reads one kind of the cluster,
// sometimes by name. The generator draws verbs from fourteen and resources
// from twenty-odd, so without this most viewers would see nothing.
func readable(p *rbacdiff.Policy, kinds []index.Kind, r *rand.Rand) *rbacdiff.Policy {
	read := func() string { return []string{"get", "list"}[r.IntN(2)] }
	rules := func(in []rbacv1.PolicyRule) []rbacv1.PolicyRule {
		out := make([]rbacv1.PolicyRule, len(in), len(in)+1)
		for i, rule := range in {
			out[i] = *rule.DeepCopy()
			if r.IntN(2) == 0 {
				out[i].Verbs = append(out[i].Verbs, read())
			}
		}
		if r.IntN(4) != 0 {
			k := kinds[r.IntN(len(kinds))]
			rule := rbacv1.PolicyRule{Verbs: []string{read()}, APIGroups: []string{k.Group}, Resources: []string{k.Resource}}
			if r.IntN(3) == 0 {
				rule.ResourceNames = []string{objectNames[r.IntN(len(objectNames))]}
			}
			out = append(out, rule)
		}
		return out
	}
	out := *p
	out.Roles = make([]*rbacv1.Role, len(p.Roles))
	for i, role := range p.Roles {
		c := *role
		c.Rules = rules(role.Rules)
		out.Roles[i] = &c
	}
	out.ClusterRoles = make([]*rbacv1.ClusterRole, len(p.ClusterRoles))
	for i, role := range p.ClusterRoles {
		c := *role
		c.Rules = rules(role.Rules)
		out.ClusterRoles[i] = &c
	}
	return &out
}

// writePolicy converts p with the collector's RBAC normalizers and
// replaces the cluster's RBAC rows with the result.
func writePolicy(ctx context.Context, reg *collector.Registry, s *index.Store, cluster string, p *rbacdiff.Policy) error {
	objs := map[string][]runtime.Object{}
	for _, r := range p.Roles {
		objs[index.KindRole] = append(objs[index.KindRole], r)
	}
	for _, r := range p.ClusterRoles {
		objs[index.KindClusterRole] = append(objs[index.KindClusterRole], r)
	}
	for _, b := range p.RoleBindings {
		objs[index.KindRoleBinding] = append(objs[index.KindRoleBinding], b)
	}
	for _, b := range p.ClusterRoleBindings {
		objs[index.KindClusterRoleBinding] = append(objs[index.KindClusterRoleBinding], b)
	}
	for _, name := range slices.Sorted(maps.Keys(rbacKinds)) {
		kind := rbacKinds[name]
		rows := []index.Object{}
		for _, o := range objs[name] {
			row, err := reg.Row(cluster, kind, o)
			if err != nil {
				return err
			}
			rows = append(rows, row)
		}
		if err := s.Replace(ctx, cluster, kind, rows); err != nil {
			return fmt.Errorf("%s %s: %w", cluster, name, err)
		}
	}
	return nil
}

// bound returns u made a subject of a random binding of p whose role
// exists, or u when there is none: the generator's users often match only
// bindings to missing roles or subjects of a bad kind.
func bound(p *rbacdiff.Policy, r *rand.Rand, u user.Info) user.Info {
	type binding struct {
		namespace string
		subjects  []rbacv1.Subject
	}
	var bs []binding
	for _, b := range p.RoleBindings {
		if exists(p, b.Namespace, b.RoleRef) {
			bs = append(bs, binding{b.Namespace, b.Subjects})
		}
	}
	for _, b := range p.ClusterRoleBindings {
		if exists(p, "", b.RoleRef) {
			bs = append(bs, binding{"", b.Subjects})
		}
	}
	if len(bs) == 0 {
		return u
	}
	b := bs[r.IntN(len(bs))]
	out := &user.DefaultInfo{Name: u.GetName(), Groups: slices.Clone(u.GetGroups())}
	for _, i := range r.Perm(len(b.subjects)) {
		if rbacdiff.Become(out, b.subjects[i], b.namespace) {
			return out
		}
	}
	return u
}

// exists reports whether a binding in namespace refers to a role of p.
func exists(p *rbacdiff.Policy, namespace string, ref rbacv1.RoleRef) bool {
	switch ref.Kind {
	case "ClusterRole":
		return slices.ContainsFunc(p.ClusterRoles, func(r *rbacv1.ClusterRole) bool { return r.Name == ref.Name })
	case "Role":
		return slices.ContainsFunc(p.Roles, func(r *rbacv1.Role) bool { return r.Namespace == namespace && r.Name == ref.Name })
	}
	return false
}

// kubeUser is the identity a cluster's kube-apiserver would evaluate for
// a viewer, formed with Kubernetes' own code: the ServiceAccount groups for
// a ServiceAccount username (as its token authenticator adds them), then
// the authenticated-group adder every request passes through.
func kubeUser(u user.Info) user.Info {
	groups := slices.Clone(u.GetGroups())
	if ns, name, err := serviceaccount.SplitUsername(u.GetName()); err == nil {
		for _, g := range serviceaccount.UserInfo(ns, name, "").GetGroups() {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	in := &user.DefaultInfo{Name: u.GetName(), Groups: groups}
	adder := group.NewAuthenticatedGroupAdder(authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: in}, true, nil
	}))
	resp, _, err := adder.AuthenticateRequest(&http.Request{})
	if err != nil {
		panic(err)
	}
	return resp.User
}

// viewers authenticates the round's viewers by token.
type viewers struct {
	mu    sync.Mutex
	users map[string]user.Info
}

func (v *viewers) Authenticate(_ context.Context, c authz.Credentials) (user.Info, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	u, ok := v.users[c.Token]
	if !ok {
		return nil, errors.New("unknown token")
	}
	return u, nil
}

func (v *viewers) set(users map[string]user.Info) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.users = users
}

// expectation is what one viewer must see: the visible objects present
// (by id, with what facets count), and the clusters the viewer can see
// any possible object in.
type expectation struct {
	objects  map[string]index.Object
	clusters []string
}

func objectID(o index.Object) string {
	return o.Cluster + "/" + o.Group + "/" + o.Kind + "/" + o.Namespace + "/" + o.Name
}

// queryFleet is the fleet of one run: the store, its handler on a real
// HTTP server, and the collector registry the policies go through.
type queryFleet struct {
	t     *testing.T
	ctx   context.Context
	store *index.Store
	srv   *httptest.Server
	auth  *viewers
	reg   *collector.Registry
	// policies holds each cluster's current policy (beacon included),
	// rows its current objects.
	policies map[string]*rbacdiff.Policy
	oracles  map[string]*rbac.RBACAuthorizer
	rows     map[string][]index.Object
	round    int
}

func newQueryFleet(t *testing.T) *queryFleet {
	t.Helper()
	ctx := t.Context()
	store := index.New(memtables.Open, index.WithReplayBuffer(1<<14))
	auth := &viewers{}
	h, err := graph.NewHandler(graph.Options{
		Store:         store,
		Authorizer:    authz.NewAuthorizer(store, authz.Options{}),
		Authenticator: auth,
		AdminGroups:   []string{"rbacdiff-fleet-admins"}, // a group no viewer has
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.Close(cctx); err != nil {
			t.Errorf("closing handler: %v", err)
		}
		srv.Close()
	})
	f := &queryFleet{
		t: t, ctx: ctx, store: store, srv: srv, auth: auth, reg: collector.NewRegistry(),
		policies: map[string]*rbacdiff.Policy{}, oracles: map[string]*rbac.RBACAuthorizer{}, rows: map[string][]index.Object{},
	}
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range append(slices.Clone(queryClusters), queryCluster{beaconCluster, []index.Kind{kBeacon}}) {
		must(t, store.UpsertCluster(ctx, index.Cluster{Name: c.name, Mode: index.ModePull, State: index.StateConnected, Since: since, LastSeen: since, Synced: true}))
	}
	beacon := &rbacdiff.Policy{
		ClusterRoles: []*rbacv1.ClusterRole{{
			ObjectMeta: metav1.ObjectMeta{Name: "beacon"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, APIGroups: []string{kBeacon.Group}, Resources: []string{kBeacon.Resource}}},
		}},
		ClusterRoleBindings: []*rbacv1.ClusterRoleBinding{{
			ObjectMeta: metav1.ObjectMeta{Name: "beacon"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "beacon"},
			Subjects: []rbacv1.Subject{
				{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: user.AllAuthenticated},
				{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: user.AllUnauthenticated},
				{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user.Anonymous},
			},
		}},
	}
	f.setPolicy(beaconCluster, beacon)
	f.rows[beaconCluster] = []index.Object{f.object(beaconCluster, kBeacon, "", "beacon", index.StatusHealthy)}
	must(t, store.Replace(ctx, beaconCluster, kBeacon, f.rows[beaconCluster]))
	return f
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (f *queryFleet) setPolicy(cluster string, p *rbacdiff.Policy) {
	must(f.t, writePolicy(f.ctx, f.reg, f.store, cluster, p))
	f.policies[cluster] = p
	f.oracles[cluster] = p.Oracle()
}

func (f *queryFleet) object(cluster string, k index.Kind, ns, name string, status index.Status) index.Object {
	return index.Object{
		Cluster: cluster, Namespace: ns, Group: k.Group, Version: k.Version, Kind: k.Kind, Resource: k.Resource,
		Name: name, UID: fmt.Sprintf("uid-%s-%s-%s-%s-%s", cluster, k.Group, k.Kind, ns, name), Status: status,
		Labels: index.LabelsOf(map[string]string{"round": fmt.Sprint(f.round)}),
	}
}

var statuses = []index.Status{index.StatusHealthy, index.StatusHealthy, index.StatusProgressing, index.StatusUnhealthy, index.StatusTerminating, index.StatusUnknown}

// newRound gives every cluster a new random policy and new random objects.
func (f *queryFleet) newRound(g *rbacdiff.Gen, r *rand.Rand) {
	f.round++
	for _, c := range queryClusters {
		f.setPolicy(c.name, readable(unique(g.Policy()), c.kinds, r))
		byKind := map[index.Kind][]index.Object{}
		for _, key := range possible(c.kinds, nil) {
			if r.IntN(2) == 0 {
				continue
			}
			k := kindOf(c, key)
			byKind[k] = append(byKind[k], f.object(c.name, k, key.Namespace, key.Name, statuses[r.IntN(len(statuses))]))
		}
		f.rows[c.name] = nil
		for _, k := range c.kinds {
			rows := byKind[k]
			if rows == nil {
				rows = []index.Object{}
			}
			must(f.t, f.store.Replace(f.ctx, c.name, k, rows))
			f.rows[c.name] = append(f.rows[c.name], rows...)
		}
	}
}

func kindOf(c queryCluster, key index.Key) index.Kind {
	for _, k := range c.kinds {
		if k.Group == key.Group && k.Kind == key.Kind {
			return k
		}
	}
	panic("no kind for " + key.Kind)
}

// kindsOf returns the kinds of a cluster (the beacon included).
func kindsOf(cluster string) []index.Kind {
	if cluster == beaconCluster {
		return []index.Kind{kBeacon}
	}
	for _, c := range queryClusters {
		if c.name == cluster {
			return c.kinds
		}
	}
	return nil
}

// expect asks the oracle what u may see.
func (f *queryFleet) expect(u user.Info) expectation {
	ku := kubeUser(u)
	e := expectation{objects: map[string]index.Object{}}
	for _, cluster := range slices.Sorted(maps.Keys(f.policies)) {
		oracle := f.oracles[cluster]
		kinds := kindsOf(cluster)
		visible := func(group, kind, ns, name string) bool {
			for _, k := range kinds {
				if k.Group == group && k.Kind == kind {
					return rbacdiff.OracleVisible(f.ctx, oracle, ku, rbacdiff.Object{
						GR: index.GroupResource{Group: k.Group, Resource: k.Resource}, Namespaced: k.Namespaced, Namespace: ns, Name: name,
					})
				}
			}
			return false
		}
		for _, key := range possible(kinds, f.policies[cluster]) {
			if visible(key.Group, key.Kind, key.Namespace, key.Name) {
				e.clusters = append(e.clusters, cluster)
				break
			}
		}
		for _, o := range f.rows[cluster] {
			if visible(o.Group, o.Kind, o.Namespace, o.Name) {
				e.objects[objectID(o)] = o
			}
		}
	}
	return e
}

// gql posts a query as the viewer with token tok.
func (f *queryFleet) gql(tok, query string, vars map[string]any, out any) error {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(f.ctx, http.MethodPost, f.srv.URL+"/graphql", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Data   json.RawMessage   `json:"data"`
		Errors []json.RawMessage `json:"errors"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("status %d: %q: %w", resp.StatusCode, b, err)
	}
	if resp.StatusCode != http.StatusOK || len(r.Errors) > 0 {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return json.Unmarshal(r.Data, out)
}

type gqlObject struct {
	Cluster   string  `json:"cluster"`
	Group     string  `json:"group"`
	Kind      string  `json:"kind"`
	Namespace *string `json:"namespace"`
	Name      string  `json:"name"`
}

func (o gqlObject) id() string {
	ns := ""
	if o.Namespace != nil {
		ns = *o.Namespace
	}
	return o.Cluster + "/" + o.Group + "/" + o.Kind + "/" + ns + "/" + o.Name
}

type facetCount struct {
	Value string `json:"value"`
	Count int    `json:"count"`
}

type connection struct {
	TotalCount    int    `json:"totalCount"`
	ChangesCursor string `json:"changesCursor"`
	PageInfo      struct {
		HasNextPage bool   `json:"hasNextPage"`
		EndCursor   string `json:"endCursor"`
	} `json:"pageInfo"`
	Edges []struct {
		Node gqlObject `json:"node"`
	} `json:"edges"`
}

const objectFields = `cluster group kind namespace name`

// firstPageQuery also asks for the objects of every status: a status
// filter makes the index consider its restricted-viewer source of the
// clusters' (kind, status) lists filtered by namespace
// (index.accessCellSource), which an unfiltered page never uses.
const firstPageQuery = `query($first: Int) {
  objects(first: $first) { totalCount changesCursor pageInfo { hasNextPage endCursor } edges { node { ` + objectFields + ` } } }
  byStatus: objects(first: 1000, filter: {statuses: [HEALTHY, PROGRESSING, UNHEALTHY, TERMINATING, UNKNOWN]}) { totalCount pageInfo { hasNextPage } edges { node { ` + objectFields + ` } } }
  facets { total statuses { value count } kinds { value count } clusters { value count } namespaces { value count } }
  clusters { name }
}`

const nextPageQuery = `query($first: Int, $after: String) {
  objects(first: $first, after: $after) { totalCount pageInfo { hasNextPage endCursor } edges { node { ` + objectFields + ` } } }
}`

// answer is what the API showed one viewer.
type answer struct {
	objects    []string // ids in page order, every page
	pageTotals []int    // totalCount on each page
	pageSizes  []int
	facets     facets
	clusters   []string
	cursor     string
	// byStatus is the first page of the objects of every status.
	byStatus connection
}

type facets struct {
	Total      int          `json:"total"`
	Statuses   []facetCount `json:"statuses"`
	Kinds      []facetCount `json:"kinds"`
	Clusters   []facetCount `json:"clusters"`
	Namespaces []facetCount `json:"namespaces"`
}

// ask runs the viewer's queries: the first page with facets and clusters,
// then every following page.
func (f *queryFleet) ask(tok string, pageSize int) (*answer, error) {
	var first struct {
		Objects  connection `json:"objects"`
		ByStatus connection `json:"byStatus"`
		Facets   facets     `json:"facets"`
		Clusters []struct {
			Name string `json:"name"`
		} `json:"clusters"`
	}
	if err := f.gql(tok, firstPageQuery, map[string]any{"first": pageSize}, &first); err != nil {
		return nil, err
	}
	a := &answer{facets: first.Facets, cursor: first.Objects.ChangesCursor, byStatus: first.ByStatus}
	for _, c := range first.Clusters {
		a.clusters = append(a.clusters, c.Name)
	}
	page := first.Objects
	for {
		a.pageTotals = append(a.pageTotals, page.TotalCount)
		a.pageSizes = append(a.pageSizes, len(page.Edges))
		for _, e := range page.Edges {
			a.objects = append(a.objects, e.Node.id())
		}
		if !page.PageInfo.HasNextPage {
			return a, nil
		}
		if len(a.objects) > 10000 {
			return nil, errors.New("more than 10,000 objects: the pages never end")
		}
		var next struct {
			Objects connection `json:"objects"`
		}
		if err := f.gql(tok, nextPageQuery, map[string]any{"first": pageSize, "after": page.PageInfo.EndCursor}, &next); err != nil {
			return nil, err
		}
		page = next.Objects
	}
}

// compare returns how the answer differs from the expectation, or nothing.
func compare(e expectation, a *answer, pageSize int) []string {
	var diffs []string
	want := slices.Sorted(maps.Keys(e.objects))
	seen := map[string]bool{}
	for _, id := range a.objects {
		if seen[id] {
			diffs = append(diffs, "objects: "+id+" on two pages")
		}
		seen[id] = true
	}
	got := slices.Sorted(maps.Keys(seen))
	if extra, missing := setDiff(got, want); len(extra)+len(missing) > 0 {
		diffs = append(diffs, fmt.Sprintf("objects: shown but not visible %q; visible but not shown %q", extra, missing))
	}
	for i, n := range a.pageTotals {
		if n != len(want) {
			diffs = append(diffs, fmt.Sprintf("totalCount on page %d is %d, %d visible", i+1, n, len(want)))
		}
	}
	for i, n := range a.pageSizes[:len(a.pageSizes)-1] {
		if n != pageSize {
			diffs = append(diffs, fmt.Sprintf("page %d of %d holds %d rows, want %d (only the last may be short)", i+1, len(a.pageSizes), n, pageSize))
		}
	}
	if a.byStatus.TotalCount != len(want) {
		diffs = append(diffs, fmt.Sprintf("totalCount of every status is %d, %d visible", a.byStatus.TotalCount, len(want)))
	}
	var byStatusIDs []string
	for _, e := range a.byStatus.Edges {
		byStatusIDs = append(byStatusIDs, e.Node.id())
	}
	slices.Sort(byStatusIDs)
	if extra, missing := setDiff(byStatusIDs, want); len(extra) > 0 || (len(missing) > 0 && !a.byStatus.PageInfo.HasNextPage) {
		diffs = append(diffs, fmt.Sprintf("objects of every status: shown but not visible %q; visible but not shown %q", extra, missing))
	}
	byStatus, byKind, byCluster, byNS := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	for _, o := range e.objects {
		byStatus[string(o.Status)]++
		byKind[index.Kind{Group: o.Group, Kind: o.Kind}.GroupKind()]++
		byCluster[o.Cluster]++
		if o.Namespace != "" {
			byNS[o.Namespace]++
		}
	}
	if a.facets.Total != len(want) {
		diffs = append(diffs, fmt.Sprintf("facets.total is %d, %d visible", a.facets.Total, len(want)))
	}
	for _, fc := range []struct {
		name string
		got  []facetCount
		want map[string]int
	}{
		{"statuses", a.facets.Statuses, byStatus},
		{"kinds", a.facets.Kinds, byKind},
		{"clusters", a.facets.Clusters, byCluster},
		{"namespaces", a.facets.Namespaces, byNS},
	} {
		got := map[string]int{}
		for _, c := range fc.got {
			if c.Count != 0 {
				got[c.Value] = c.Count
			}
		}
		if !maps.Equal(got, fc.want) {
			diffs = append(diffs, fmt.Sprintf("facets.%s is %v, visible objects give %v", fc.name, got, fc.want))
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(a.clusters)), e.clusters) {
		diffs = append(diffs, fmt.Sprintf("clusters is %q, the viewer can see objects in %q", a.clusters, e.clusters))
	}
	return diffs
}

// setDiff returns the elements of a not in b, and of b not in a; both
// sorted.
func setDiff(a, b []string) (onlyA, onlyB []string) {
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			onlyA = append(onlyA, x)
		}
	}
	for _, x := range b {
		if _, ok := slices.BinarySearch(a, x); !ok {
			onlyB = append(onlyB, x)
		}
	}
	return onlyA, onlyB
}

// touch changes every object of the round's clusters once (a new label,
// so each is a real change), then the beacon.
func (f *queryFleet) touch() {
	var all []index.Object
	for _, c := range queryClusters {
		for _, o := range f.rows[c.name] {
			o.Labels = index.LabelsOf(map[string]string{"round": fmt.Sprint(f.round), "touched": "yes"})
			all = append(all, o)
		}
	}
	must(f.t, f.store.UpsertBatch(f.ctx, all))
	b := f.rows[beaconCluster][0]
	b.Labels = index.LabelsOf(map[string]string{"round": fmt.Sprint(f.round)})
	must(f.t, f.store.Upsert(f.ctx, b))
}

type wsMessage struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// changes subscribes to objectChanges after cursor as the viewer and
// returns the ids of the objects changed before the beacon's change, in
// order.
func (f *queryFleet) changes(tok, cursor string) ([]string, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(f.srv.URL, "http")+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return nil, err
	}
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer func() { _ = c.CloseNow() }()
	c.SetReadLimit(1 << 20)
	send := func(m wsMessage) error {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		return c.Write(ctx, websocket.MessageText, b)
	}
	read := func() (wsMessage, error) {
		var m wsMessage
		_, b, err := c.Read(ctx)
		if err != nil {
			return m, err
		}
		return m, json.Unmarshal(b, &m)
	}
	init, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + tok})
	if err := send(wsMessage{Type: "connection_init", Payload: init}); err != nil {
		return nil, err
	}
	m, err := read()
	if err != nil {
		return nil, fmt.Errorf("connection_init: %w", err)
	}
	if m.Type != "connection_ack" {
		return nil, fmt.Errorf("connection_init: got %+v", m)
	}
	sub, _ := json.Marshal(map[string]any{
		"query":     `subscription($after: String) { objectChanges(after: $after) { type object { ` + objectFields + ` } } }`,
		"variables": map[string]any{"after": cursor},
	})
	if err := send(wsMessage{ID: "1", Type: "subscribe", Payload: sub}); err != nil {
		return nil, err
	}
	var ids []string
	for {
		m, err := read()
		if err != nil {
			return nil, fmt.Errorf("after %d events: %w", len(ids), err)
		}
		switch m.Type {
		case "ping":
			if err := send(wsMessage{Type: "pong"}); err != nil {
				return nil, err
			}
			continue
		case "next":
		default:
			return nil, fmt.Errorf("after %d events: %s %s", len(ids), m.Type, m.Payload)
		}
		var p struct {
			Data struct {
				ObjectChanges struct {
					Type   string    `json:"type"`
					Object gqlObject `json:"object"`
				} `json:"objectChanges"`
			} `json:"data"`
			Errors []json.RawMessage `json:"errors"`
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return nil, err
		}
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("after %d events: %s", len(ids), m.Payload)
		}
		ch := p.Data.ObjectChanges
		if ch.Object.Cluster == beaconCluster {
			_ = send(wsMessage{ID: "1", Type: "complete"})
			return ids, nil
		}
		if ch.Type != "MODIFIED" {
			return nil, fmt.Errorf("%s %s: only MODIFIED was written", ch.Type, ch.Object.id())
		}
		ids = append(ids, ch.Object.id())
	}
}

// TestQueryPathDifferential: see the comment at the top of the file.
// RBACDIFF_QUERY_PAIRS counts (cluster policy, viewer) pairs: each viewer
// of a round is checked against the random policy of each of the three
// clusters at once.
func TestQueryPathDifferential(t *testing.T) {
	pairs := rbacdiff.EnvCount(t, "RBACDIFF_QUERY_PAIRS", queryPairsDefault)
	seed := uint64(pairs)
	r := rand.New(rand.NewPCG(seed, 11))
	g := rbacdiff.NewGen(rbacdiff.RandChooser{R: rand.New(rand.NewPCG(seed, 12))}, nil, rbacdiff.Seeds())
	f := newQueryFleet(t)
	perRound := viewersPerRound * len(queryClusters)
	var checked, rounds, disagreements, visibleObjects, emptyViewers, subscribed int
	start := time.Now()
	for checked < pairs {
		f.newRound(g, r)
		rounds++
		type viewer struct {
			tok      string
			u        user.Info
			e        expectation
			a        *answer
			pageSize int
		}
		vs := make([]*viewer, viewersPerRound)
		users := map[string]user.Info{}
		for i := range vs {
			p := f.policies[queryClusters[r.IntN(len(queryClusters))].name]
			u := g.User(p)
			if r.IntN(3) != 0 {
				u = bound(p, r, u)
			}
			if u.GetName() == "" {
				u = &user.DefaultInfo{Name: "nobody", Groups: u.GetGroups()}
			}
			tok := fmt.Sprintf("token-%d-%d", rounds, i)
			users[tok] = u
			vs[i] = &viewer{tok: tok, u: u, e: f.expect(u), pageSize: []int{7, 50, 100, 1000}[r.IntN(4)]}
		}
		f.auth.set(users)
		fail := func(v *viewer, diffs []string) {
			disagreements++
			if disagreements > 3 {
				return
			}
			var b strings.Builder
			fmt.Fprintf(&b, "round %d: viewer %q groups %q (as Kubernetes sees it: groups %q), page size %d:\n  %s\n",
				rounds, v.u.GetName(), v.u.GetGroups(), kubeUser(v.u).GetGroups(), v.pageSize, strings.Join(diffs, "\n  "))
			for _, c := range queryClusters {
				d := rbacdiff.DumpPolicy(f.policies[c.name])
				if len(d) > 6000 {
					d = d[:6000] + "...\n"
				}
				fmt.Fprintf(&b, "cluster %s policy:\n%s", c.name, d)
			}
			t.Error(b.String())
		}
		for _, v := range vs {
			a, err := f.ask(v.tok, v.pageSize)
			if err != nil {
				t.Fatalf("round %d: queries as %q: %v", rounds, v.u.GetName(), err)
			}
			v.a = a
			if diffs := compare(v.e, a, v.pageSize); len(diffs) > 0 {
				fail(v, diffs)
			}
			visibleObjects += len(v.e.objects)
			if len(v.e.objects) == 1 { // the beacon only
				emptyViewers++
			}
		}
		f.touch()
		for _, v := range vs {
			ids, err := f.changes(v.tok, v.a.cursor)
			if err != nil {
				t.Fatalf("round %d: objectChanges as %q %q (expecting %d): %v", rounds, v.u.GetName(), v.u.GetGroups(), len(v.e.objects), err)
			}
			subscribed++
			want := slices.Sorted(maps.Keys(v.e.objects))
			want = slices.DeleteFunc(want, func(id string) bool { return strings.HasPrefix(id, beaconCluster+"/") })
			got := slices.Sorted(slices.Values(ids))
			if !slices.Equal(got, want) {
				extra, missing := setDiff(slices.Compact(got), want)
				fail(v, []string{fmt.Sprintf("objectChanges: %d events; changed but not visible %q; visible but not delivered %q", len(ids), extra, missing)})
			}
		}
		checked += perRound
		if disagreements > 3 {
			break
		}
	}
	t.Logf("rbacdiff query path: pairs=%d rounds=%d viewers=%d subscriptions=%d disagreements=%d visible_objects=%d viewers_seeing_only_the_beacon=%d in %v",
		checked, rounds, rounds*viewersPerRound, subscribed, disagreements, visibleObjects, emptyViewers, time.Since(start).Round(time.Millisecond))
	if disagreements > 0 {
		t.Fatalf("%d disagreements", disagreements)
	}
	if emptyViewers > rounds*viewersPerRound/2 {
		t.Errorf("%d of %d viewers see nothing but the beacon: the generator is too weak to test anything", emptyViewers, rounds*viewersPerRound)
	}
}
