package authz

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// DefaultMaxIdentities is the default bound on cached access sets per
// cluster. An access set of a user bound in thousands of namespaces is tens
// of kilobytes; a few thousand active viewers per cluster is plenty, and the
// bound keeps a flood of distinct identities from growing memory without
// limit.
const DefaultMaxIdentities = 4096

// Options configures an Authorizer.
type Options struct {
	// Mappings holds the identity mapping of each cluster that needs one.
	Mappings map[string]Mapping
	// DefaultMapping applies to clusters not in Mappings.
	DefaultMapping Mapping
	// MaxIdentities bounds the cached access sets per cluster; when it is
	// exceeded the cluster's cache starts over. Zero means
	// DefaultMaxIdentities.
	MaxIdentities int
}

// Authorizer computes and caches access sets, and answers single RBAC
// questions, for the whole fleet.
//
// Freshness: every call first checks that the cluster's policy did not
// change (PolicyRevision, or the RevisionNotifier channel). When it did, the cluster's compiled policy is rebuilt once and all of that
// cluster's cached access sets are dropped; other clusters are untouched.
// So a revoked binding is effective on the first call after the index
// stores the change, with no time-based expiry.
//
// Concurrency: Authorizer is safe for concurrent use and starts no
// goroutines. Cached reads take no lock; a cluster's policy is compiled
// under that cluster's mutex, once per revision, by the first caller that
// needs it, while callers for other clusters proceed.
type Authorizer struct {
	src      PolicySource
	eval     *Evaluator
	opts     Options
	maxIDs   int64
	empty    *index.ClusterAccess // the one shared "sees nothing" answer
	mu       sync.Mutex           // serializes additions to clusters
	clusters atomic.Pointer[map[string]*clusterState]
}

// clusterState holds one cluster's compiled policy and cached access sets.
type clusterState struct {
	mu   sync.Mutex // serializes compiles
	snap atomic.Pointer[snapshot]
}

// snapshot is a compiled policy and the access sets built from it. It is
// replaced when the revision changes.
type snapshot struct {
	policy *compiledPolicy
	// changed is closed at the next policy change, when the source is a
	// RevisionNotifier; nil otherwise.
	changed <-chan struct{}
	cache   *accessCache
}

// accessCache holds the access sets built from one compiled policy.
type accessCache struct {
	entries sync.Map // Identity.anyKey → *index.ClusterAccess
	n       atomic.Int64
}

// fresh reports whether the snapshot still describes the cluster's policy.
func (s *snapshot) fresh(src PolicySource, cluster string) bool {
	if s.changed != nil {
		select {
		case <-s.changed:
			return false
		default:
			return true
		}
	}
	return src.PolicyRevision(cluster) == s.policy.rev
}

// NewAuthorizer returns an Authorizer that reads RBAC rows and kinds from
// src, which is normally *index.Store.
func NewAuthorizer(src PolicySource, opts Options) *Authorizer {
	a := &Authorizer{src: src, eval: NewEvaluator(src), opts: opts, maxIDs: int64(opts.MaxIdentities), empty: &index.ClusterAccess{}}
	if a.maxIDs <= 0 {
		a.maxIDs = DefaultMaxIdentities
	}
	empty := map[string]*clusterState{}
	a.clusters.Store(&empty)
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
// use ClusterAccess for filtering many objects.
func (a *Authorizer) Authorize(ctx context.Context, cluster string, id *Identity, attrs Attributes) (Decision, error) {
	attrs.User = a.MappedUser(cluster, id)
	return a.eval.Authorize(ctx, cluster, &attrs)
}

// ClusterAccess returns what the viewer may see in one cluster. The result
// is shared and must not be mutated. Its cost on a cache hit is a freshness
// check (a channel poll with a RevisionNotifier source, else a revision
// read) and two map lookups, whatever the number of bindings.
func (a *Authorizer) ClusterAccess(cluster string, id *Identity) *index.ClusterAccess {
	if h := id.last.Load(); h != nil && h.authorizer == a && h.cluster == cluster {
		if snap := h.state.snap.Load(); snap == h.snap && snap.fresh(a.src, cluster) {
			return h.access
		}
	}
	cs := a.state(cluster)
	snap := cs.snap.Load()
	if snap == nil || !snap.fresh(a.src, cluster) {
		snap = a.refresh(cs, cluster)
	}
	remember := func(ca *index.ClusterAccess) *index.ClusterAccess {
		id.last.Store(&identityHit{authorizer: a, cluster: cluster, state: cs, snap: snap, access: ca})
		return ca
	}
	if v, ok := snap.cache.entries.Load(id.anyKey); ok {
		return remember(v.(*index.ClusterAccess))
	}
	ca := snap.policy.accessFor(a.MappedUser(cluster, id))
	if isEmpty(ca) {
		// Most viewers see nothing in most clusters of a large fleet.
		// Caching those empty answers per identity and cluster cost more
		// memory than the rest of a subscriber (about 14 KiB at 100
		// clusters), and recomputing one is a walk over the few bindings
		// of the identity's subjects.
		return remember(a.empty)
	}
	if snap.cache.n.Add(1) > a.maxIDs {
		// Start over rather than track recency: the next callers rebuild
		// what they need in about a millisecond at most.
		cs.snap.CompareAndSwap(snap, &snapshot{policy: snap.policy, changed: snap.changed, cache: &accessCache{}})
		return ca
	}
	if v, loaded := snap.cache.entries.LoadOrStore(id.anyKey, ca); loaded {
		return remember(v.(*index.ClusterAccess))
	}
	return remember(ca)
}

// Access returns what the viewer may see in the given clusters, the value
// the index applies to queries, facets and the change feed. Clusters where
// nothing is visible are left out, so the index does not visit them.
func (a *Authorizer) Access(id *Identity, clusters []string) *index.Access {
	acc := &index.Access{Clusters: make(map[string]*index.ClusterAccess, len(clusters))}
	for _, c := range clusters {
		if ca := a.ClusterAccess(c, id); !isEmpty(ca) {
			acc.Clusters[c] = ca
		}
	}
	return acc
}

func isEmpty(ca *index.ClusterAccess) bool {
	return !ca.All && len(ca.Everywhere) == 0 && len(ca.Namespaces) == 0 && len(ca.Named) == 0
}

// PolicyErrors returns the resolution errors of the cluster's current
// compiled policy, such as bindings to missing roles (errors.Is
// ErrRoleNotFound). They are not failures, since such bindings just grant
// nothing, but they explain access a user expected and did not get.
func (a *Authorizer) PolicyErrors(cluster string) []error {
	cs := a.state(cluster)
	snap := cs.snap.Load()
	if snap == nil || !snap.fresh(a.src, cluster) {
		snap = a.refresh(cs, cluster)
	}
	return snap.policy.errs
}

// Forget drops everything cached for a cluster, for when it leaves the
// fleet.
func (a *Authorizer) Forget(cluster string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	old := *a.clusters.Load()
	cs, ok := old[cluster]
	if !ok {
		return
	}
	cs.snap.Store(nil) // invalidates what identities remember
	next := maps.Clone(old)
	delete(next, cluster)
	a.clusters.Store(&next)
}

// state returns the cluster's state, creating it on first use. The map is
// copy-on-write: clusters are added rarely and read on every call.
func (a *Authorizer) state(cluster string) *clusterState {
	if cs, ok := (*a.clusters.Load())[cluster]; ok {
		return cs
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := *a.clusters.Load()
	if cs, ok := old[cluster]; ok {
		return cs
	}
	cs := &clusterState{}
	next := make(map[string]*clusterState, len(old)+1)
	maps.Copy(next, old)
	next[cluster] = cs
	a.clusters.Store(&next)
	return cs
}

// refresh compiles the cluster's policy at its current revision, unless
// another caller just did, or the revision did not actually change (a watch
// may fire spuriously), in which case the cached access sets are kept.
func (a *Authorizer) refresh(cs *clusterState, cluster string) *snapshot {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	old := cs.snap.Load()
	if old != nil && old.fresh(a.src, cluster) {
		return old
	}
	// Read the revision (and watch) before the rows: a change racing
	// with the read then leaves this snapshot stale, so it is rebuilt on
	// the next call; it can never be labeled fresh with old rows.
	var (
		rev     uint64
		changed <-chan struct{}
	)
	if n, ok := a.src.(RevisionNotifier); ok {
		rev, changed = n.PolicyRevisionNotify(cluster)
	} else {
		rev = a.src.PolicyRevision(cluster)
	}
	snap := &snapshot{changed: changed}
	if old != nil && old.policy.rev == rev {
		snap.policy, snap.cache = old.policy, old.cache
	} else {
		snap.policy, snap.cache = compilePolicy(a.src, cluster, rev), &accessCache{}
	}
	cs.snap.Store(snap)
	return snap
}
