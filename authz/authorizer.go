package authz

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// DefaultMaxIdentities is the default bound on the viewers whose access the
// Authorizer caches. An access set of a user bound in thousands of
// namespaces is tens of kilobytes; a few thousand active viewers is plenty,
// and the bound keeps a flood of distinct identities from growing memory
// without limit.
const DefaultMaxIdentities = 4096

// Options configures an Authorizer.
type Options struct {
	// Mappings holds the identity mapping of each cluster that needs one.
	Mappings map[string]Mapping
	// DefaultMapping applies to clusters not in Mappings.
	DefaultMapping Mapping
	// MaxIdentities bounds the viewers whose access is cached; when it is
	// exceeded the cache starts over. Zero means DefaultMaxIdentities.
	MaxIdentities int
}

// Authorizer answers "what may this identity read" for the whole fleet, and
// single RBAC questions.
//
// It owns fleetgraph's one cache of access: per identity, the fleet-wide
// *index.Access that Access returns, which the index applies to queries,
// facets and subscriptions and which nobody else keeps a copy of. Each
// cluster's part is computed from that cluster's own RBAC rows and kinds,
// compiled once per policy revision (compiledPolicy), so an answer never
// costs more because the viewer has many bindings.
//
// Freshness: the cache holds for one index.PolicyRevisions of the source.
// Every call polls its Changed channel, a non-blocking receive; once it has
// closed (an RBAC row or the kinds of some cluster changed, or a cluster
// entered or left the fleet) the revisions are read again, a cluster whose
// revision moved is compiled again on first use, and each identity's
// answer is rebuilt on its next request, keeping the parts of clusters
// whose policy did not move. So a revoked binding is effective on the
// first call after the index stores the change, with no time-based expiry,
// and a change in one cluster costs the others nothing but a map copy.
//
// Lookups: an answer is found by the identity's key (Identity.Key), so
// every Identity of one viewer shares it; an Identity also remembers where
// its answer is (a pointer into this cache, honoured only while the state
// it was read from is current), so the repeated lookups of a websocket
// cost a few pointer compares.
//
// Concurrency: Authorizer is safe for concurrent use and starts no
// goroutines. Cached reads take no lock; refreshes are serialized, and a
// cluster's policy is compiled once, by the first caller that needs it.
type Authorizer struct {
	src    PolicySource
	eval   *Evaluator
	opts   Options
	maxIDs int64
	empty  *index.ClusterAccess // the one shared "sees nothing in this cluster" answer

	mu  sync.Mutex // serializes refresh
	cur atomic.Pointer[fleetState]
}

// fleetState is the fleet's policy at one set of revisions and the answers
// built from it.
type fleetState struct {
	changed  <-chan struct{}
	revs     map[string]uint64
	clusters map[string]*clusterPolicy
	views    atomic.Pointer[viewCache]
	// prev is the state with other revisions that this one replaced: a
	// rebuilt answer takes from it the parts of clusters whose policy did
	// not change. Only one generation is kept.
	prev atomic.Pointer[fleetState]
}

// clusterPolicy is one cluster's policy at one revision, compiled on first
// use.
type clusterPolicy struct {
	rev    uint64
	once   sync.Once
	policy *compiledPolicy
}

// viewCache holds the answers of one fleetState by identity.
type viewCache struct {
	entries sync.Map // Identity.anyKey → *index.Access
	n       atomic.Int64
}

// NewAuthorizer returns an Authorizer that reads RBAC rows, kinds and
// policy revisions from src, which is normally *index.Store.
func NewAuthorizer(src PolicySource, opts Options) *Authorizer {
	a := &Authorizer{src: src, eval: NewEvaluator(src), opts: opts, maxIDs: int64(opts.MaxIdentities), empty: &index.ClusterAccess{}}
	if a.maxIDs <= 0 {
		a.maxIDs = DefaultMaxIdentities
	}
	return a
}

// Mapping returns the identity mapping of a cluster.
func (a *Authorizer) Mapping(cluster string) Mapping {
	if m, ok := a.opts.Mappings[cluster]; ok {
		return m
	}
	return a.opts.DefaultMapping
}

// MappedUser returns the identity as the cluster sees it (see Mapping.Map).
// Use it, for example, to impersonate the viewer on the cluster.
func (a *Authorizer) MappedUser(cluster string, id *Identity) user.Info {
	return a.Mapping(cluster).Map(id.User())
}

// Authorize decides one request in one cluster for the viewer, after
// mapping the identity for that cluster. It reads the RBAC rows directly
// and caches nothing, so it suits one-off checks such as a detail view;
// use Access for filtering many objects.
func (a *Authorizer) Authorize(ctx context.Context, cluster string, id *Identity, attrs Attributes) (Decision, error) {
	attrs.User = a.MappedUser(cluster, id)
	return a.eval.Authorize(ctx, cluster, &attrs)
}

// Access returns what the viewer may see in the whole fleet: one
// *index.ClusterAccess per cluster where the viewer sees something
// (clusters where nothing is visible are left out, so the index does not
// visit them). The result is shared and must not be mutated. On a cache
// hit it costs a channel poll and one map lookup, whatever the number of
// clusters and bindings.
func (a *Authorizer) Access(id *Identity) *index.Access {
	st := a.state()
	if h := id.last.Load(); h != nil && h.a == a && h.st == st {
		return h.acc
	}
	acc := a.lookup(st, id)
	id.last.Store(&identityHit{a: a, st: st, acc: acc})
	return acc
}

// lookup returns the viewer's answer in st from the cache, building and
// caching it on a miss.
func (a *Authorizer) lookup(st *fleetState, id *Identity) *index.Access {
	vc := st.views.Load()
	if v, ok := vc.entries.Load(id.anyKey); ok {
		return v.(*index.Access)
	}
	acc := a.build(st, id)
	if vc.n.Add(1) > a.maxIDs {
		// Start over rather than track recency: the next callers rebuild
		// what they need, mostly from compiled policies.
		st.views.CompareAndSwap(vc, &viewCache{})
		return acc
	}
	if v, loaded := vc.entries.LoadOrStore(id.anyKey, acc); loaded {
		return v.(*index.Access)
	}
	return acc
}

// ClusterAccess returns what the viewer may see in one cluster: the part of
// Access for that cluster, or an empty ClusterAccess. The result is shared
// and must not be mutated.
func (a *Authorizer) ClusterAccess(cluster string, id *Identity) *index.ClusterAccess {
	if ca := a.Access(id).Clusters[cluster]; ca != nil {
		return ca
	}
	return a.empty
}

// build computes the viewer's answer in st, reusing from st.prev the part
// of each cluster whose compiled policy is the same.
func (a *Authorizer) build(st *fleetState, id *Identity) *index.Access {
	var prev *index.Access
	prevSt := st.prev.Load()
	if prevSt != nil {
		if v, ok := prevSt.views.Load().entries.Load(id.anyKey); ok {
			prev = v.(*index.Access)
		}
	}
	acc := &index.Access{Clusters: map[string]*index.ClusterAccess{}}
	for name, cp := range st.clusters {
		if prev != nil && prevSt.clusters[name] == cp {
			if ca := prev.Clusters[name]; ca != nil {
				acc.Clusters[name] = ca
			}
			continue
		}
		if ca := cp.compiled(a.src, name).accessFor(a.MappedUser(name, id)); !ca.Empty() {
			acc.Clusters[name] = ca
		}
	}
	return acc
}

// PolicyErrors returns the resolution errors of the cluster's current
// compiled policy, such as bindings to missing roles (errors.Is
// ErrRoleNotFound). They are not failures, since such bindings just grant
// nothing, but they explain access a user expected and did not get.
func (a *Authorizer) PolicyErrors(cluster string) []error {
	cp := a.state().clusters[cluster]
	if cp == nil {
		return nil
	}
	return slices.Clone(cp.compiled(a.src, cluster).errs)
}

// compiled returns the cluster's compiled policy, compiling it on the
// first call.
func (cp *clusterPolicy) compiled(src PolicySource, cluster string) *compiledPolicy {
	cp.once.Do(func() { cp.policy = compilePolicy(src, cluster, cp.rev) })
	return cp.policy
}

// state returns the current fleetState, refreshing it first when the
// source's policy changed since it was built.
func (a *Authorizer) state() *fleetState {
	if st := a.cur.Load(); st != nil && !closed(st.changed) {
		return st
	}
	return a.refresh()
}

// refresh reads the policy revisions again and installs the fleetState
// they describe, unless another caller just did. Clusters whose revision
// did not move keep their compiled policy; when none moved (the watch
// may fire spuriously) the answers are kept too.
func (a *Authorizer) refresh() *fleetState {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.cur.Load()
	if old != nil && !closed(old.changed) {
		return old
	}
	// The revisions (and the channel) are read before any rows: a change
	// racing with a compile leaves this state stale, so it is rebuilt on
	// the next call; it can never be labeled fresh with old rows.
	pr := a.src.WatchPolicies()
	st := &fleetState{changed: pr.Changed, revs: pr.Clusters, clusters: make(map[string]*clusterPolicy, len(pr.Clusters))}
	for name, rev := range pr.Clusters {
		if old != nil && old.revs[name] == rev {
			if cp, ok := old.clusters[name]; ok {
				st.clusters[name] = cp
				continue
			}
		}
		st.clusters[name] = &clusterPolicy{rev: rev}
	}
	switch {
	case old == nil:
		st.views.Store(&viewCache{})
	case maps.Equal(old.revs, pr.Clusters):
		st.views.Store(old.views.Load())
		st.prev.Store(old.prev.Load())
	default:
		st.views.Store(&viewCache{})
		old.prev.Store(nil) // keep one generation
		st.prev.Store(old)
	}
	a.cur.Store(st)
	return st
}

// closed reports whether ch is closed, without waiting. A nil channel (a
// source that never changes) is never closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
