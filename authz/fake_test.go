package authz

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fleetgraph/fleetgraph/index"
)

// fakeStore is an in-memory PolicySource for unit tests. Every mutation
// bumps the cluster's revision and closes the fleet's channel, as the index
// does.
type fakeStore struct {
	mu       sync.RWMutex
	clusters map[string]*fakeCluster
	changed  chan struct{} // closed and replaced at every bump
	// listCalls counts full-policy reads per cluster, to observe compiles.
	listCalls map[string]*atomic.Int64
}

type fakeCluster struct {
	f            *fakeStore
	rev          uint64
	roles        map[[2]string]*index.Role // namespace, name ("" namespace: ClusterRole)
	bindings     []*index.Binding
	kinds        []index.Kind
	clusterRoles map[string]*index.Role
}

func (c *fakeCluster) bump() {
	c.rev++
	close(c.f.changed)
	c.f.changed = make(chan struct{})
}

func newFakeStore() *fakeStore {
	return &fakeStore{clusters: map[string]*fakeCluster{}, listCalls: map[string]*atomic.Int64{}, changed: make(chan struct{})}
}

// removeCluster drops a cluster, as index.Store.RemoveCluster does.
func (f *fakeStore) removeCluster(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.clusters, name)
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeStore) cluster(name string) *fakeCluster {
	c, ok := f.clusters[name]
	if !ok {
		c = &fakeCluster{f: f, roles: map[[2]string]*index.Role{}, clusterRoles: map[string]*index.Role{}}
		f.clusters[name] = c
		f.listCalls[name] = &atomic.Int64{}
	}
	return c
}

func (f *fakeStore) addRole(cluster string, r *index.Role) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster(cluster)
	if r.Namespace == "" {
		c.clusterRoles[r.Name] = r
	} else {
		c.roles[[2]string{r.Namespace, r.Name}] = r
	}
	c.bump()
}

func (f *fakeStore) deleteRole(cluster, namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster(cluster)
	if namespace == "" {
		delete(c.clusterRoles, name)
	} else {
		delete(c.roles, [2]string{namespace, name})
	}
	c.bump()
}

func (f *fakeStore) addBinding(cluster string, b *index.Binding) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster(cluster)
	c.bindings = append(c.bindings, b)
	c.bump()
}

func (f *fakeStore) deleteBinding(cluster, namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster(cluster)
	out := c.bindings[:0:0]
	for _, b := range c.bindings {
		if b.Namespace != namespace || b.Name != name {
			out = append(out, b)
		}
	}
	c.bindings = out
	c.bump()
}

func (f *fakeStore) setKinds(cluster string, kinds []index.Kind) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.cluster(cluster)
	c.kinds = kinds
	c.bump()
}

func (f *fakeStore) GetRole(cluster, namespace, name string) (*index.Role, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.clusters[cluster]
	if !ok {
		return nil, false
	}
	r, ok := c.roles[[2]string{namespace, name}]
	return r, ok
}

func (f *fakeStore) GetClusterRole(cluster, name string) (*index.Role, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.clusters[cluster]
	if !ok {
		return nil, false
	}
	r, ok := c.clusterRoles[name]
	return r, ok
}

func (f *fakeStore) ListRoleBindings(cluster, namespace string) []*index.Binding {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.clusters[cluster]
	if !ok {
		return nil
	}
	if namespace == "" {
		f.listCalls[cluster].Add(1)
	}
	var out []*index.Binding
	for _, b := range c.bindings {
		if b.Namespace != "" && (namespace == "" || b.Namespace == namespace) {
			out = append(out, b)
		}
	}
	return out
}

func (f *fakeStore) ListClusterRoleBindings(cluster string) []*index.Binding {
	f.mu.RLock()
	defer f.mu.RUnlock()
	c, ok := f.clusters[cluster]
	if !ok {
		return nil
	}
	var out []*index.Binding
	for _, b := range c.bindings {
		if b.Namespace == "" {
			out = append(out, b)
		}
	}
	return out
}

func (f *fakeStore) WatchPolicies() index.PolicyRevisions {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := index.PolicyRevisions{Clusters: map[string]uint64{}, Changed: f.changed}
	for name, c := range f.clusters {
		out.Clusters[name] = c.rev
	}
	return out
}

func (f *fakeStore) Kinds(cluster string) []index.Kind {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if c, ok := f.clusters[cluster]; ok {
		return c.kinds
	}
	return nil
}

func (f *fakeStore) compiles(cluster string) int64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if n, ok := f.listCalls[cluster]; ok {
		return n.Load()
	}
	return 0
}

// Helpers that keep test tables short.

func list(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// rule builds a rule from comma-separated lists; "-" for groups means the
// core group only ("").
func rule(verbs, groups, resources string, names ...string) index.PolicyRule {
	r := index.PolicyRule{Verbs: list(verbs), Resources: list(resources), ResourceNames: names}
	if groups == "-" {
		r.APIGroups = []string{""}
	} else {
		r.APIGroups = list(groups)
	}
	return r
}

func urlRule(verbs, urls string) index.PolicyRule {
	return index.PolicyRule{Verbs: list(verbs), NonResourceURLs: list(urls)}
}

// subjects parses "User:alice", "Group:devs", "ServiceAccount:ns/name" or
// "ServiceAccount:name" (namespace left to default).
func subjects(specs ...string) []index.Subject {
	out := make([]index.Subject, 0, len(specs))
	for _, s := range specs {
		kind, name, _ := strings.Cut(s, ":")
		sub := index.Subject{Kind: kind, Name: name}
		if kind == SubjectServiceAccount {
			if ns, n, ok := strings.Cut(name, "/"); ok {
				sub.Namespace, sub.Name = ns, n
			}
		}
		out = append(out, sub)
	}
	return out
}

func roleBinding(ns, name, refKind, refName string, subs ...string) *index.Binding {
	return &index.Binding{Namespace: ns, Name: name, RoleRef: index.RoleRef{Kind: refKind, Name: refName}, Subjects: subjects(subs...)}
}

func clusterRoleBinding(name, refName string, subs ...string) *index.Binding {
	return roleBinding("", name, RoleRefClusterRole, refName, subs...)
}

// testKinds is a small discovery result with namespaced and
// cluster-scoped kinds and one plural shared by two groups.
func testKinds() []index.Kind {
	return []index.Kind{
		{Group: "", Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Service", Resource: "services", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Secret", Resource: "secrets", Namespaced: true},
		{Group: "", Version: "v1", Kind: "Namespace", Resource: "namespaces"},
		{Group: "", Version: "v1", Kind: "Node", Resource: "nodes"},
		{Group: "apps", Version: "v1", Kind: "Deployment", Resource: "deployments", Namespaced: true},
		{Group: "metrics.k8s.io", Version: "v1beta1", Kind: "PodMetrics", Resource: "pods", Namespaced: true},
		{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true},
		{Group: "kustomize.toolkit.fluxcd.io", Version: "v1beta2", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole", Resource: "clusterroles"},
	}
}

// compiledPolicy returns the cluster's current compiled policy, for
// benchmarks that time one step of an answer.
func (a *Authorizer) compiledPolicy(cluster string) *compiledPolicy {
	return a.state().clusters[cluster].compiled(a.src, cluster)
}
