package graph

import (
	"sync"

	"github.com/hashicorp/go-memdb"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

// accessCache keeps each viewer's fleet-wide access set until the RBAC (or
// the kinds) of some cluster change, or a cluster joins or leaves.
//
// authz caches access per (cluster, identity) and checks the cluster's
// policy revision on every call; for a fleet of 100 clusters that is 100
// index reads per query, a fifth of a query's CPU. Here a query costs a
// list of the cluster rows and a non-blocking poll of the watch channels
// of every cluster's policy revision, which the index closes on the next
// change. Those watches are the same for every viewer, so they are kept
// once, in a fleetView; an entry is fresh while its view is the current
// one and nothing fired. A stale entry is rebuilt through authz, so
// answers stay exactly as fresh as authz's.
type accessCache struct {
	store *index.Store
	authz *authz.Authorizer
	max   int

	mu      sync.Mutex
	view    *fleetView
	entries map[string]*accessEntry // by authz.Identity.Key
}

// fleetView is the set of clusters and the watches on their policies.
type fleetView struct {
	clusters []string
	watches  []<-chan struct{}
}

// accessEntry is one viewer's access as of a view.
type accessEntry struct {
	access *index.Access
	view   *fleetView
}

// maxCachedViewers bounds the cache; when full it starts over, as authz's
// cache does, rather than track recency.
const maxCachedViewers = 4096

func newAccessCache(store *index.Store, az *authz.Authorizer) *accessCache {
	return &accessCache{store: store, authz: az, max: maxCachedViewers, entries: map[string]*accessEntry{}}
}

// get returns the viewer's access in every cluster of the fleet.
func (c *accessCache) get(id *authz.Identity) *index.Access {
	view := c.currentView()
	c.mu.Lock()
	e := c.entries[id.Key()]
	c.mu.Unlock()
	if e != nil && e.view == view {
		return e.access
	}
	e = &accessEntry{access: compact(c.authz.Access(id, view.clusters)), view: view}
	c.mu.Lock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[id.Key()] = e
	c.mu.Unlock()
	return e.access
}

// currentView returns the view of the fleet, replacing it when a cluster
// joined or left or a policy changed. The watches are taken before authz
// reads the policies, so a change racing with the rebuild leaves the new
// view already stale, never wrongly fresh.
func (c *accessCache) currentView() *fleetView {
	rows := c.store.ListClusters(nil)
	c.mu.Lock()
	v := c.view
	c.mu.Unlock()
	if v != nil && v.fresh(rows) {
		return v
	}
	ws := memdb.NewWatchSet()
	v = &fleetView{clusters: make([]string, len(rows))}
	for i, r := range rows {
		v.clusters[i] = r.Name
		c.store.PolicyRevisionWatch(ws, r.Name)
	}
	v.watches = make([]<-chan struct{}, 0, len(ws))
	for ch := range ws {
		v.watches = append(v.watches, ch)
	}
	c.mu.Lock()
	c.view = v
	c.mu.Unlock()
	return v
}

// fresh reports whether the view still describes the fleet.
func (v *fleetView) fresh(rows []*index.Cluster) bool {
	if len(rows) != len(v.clusters) {
		return false
	}
	for i, r := range rows {
		if r.Name != v.clusters[i] {
			return false
		}
	}
	for _, ch := range v.watches {
		select {
		case <-ch:
			return false
		default:
		}
	}
	return true
}

// compact copies an access set into a map of its own size: authz sizes
// the map for every cluster of the fleet, and a viewer cached for the
// lifetime of a subscription usually sees a few.
func compact(a *index.Access) *index.Access {
	if a == nil || a.All || len(a.Clusters) == 0 {
		return a
	}
	out := &index.Access{Clusters: make(map[string]*index.ClusterAccess, len(a.Clusters))}
	for c, ca := range a.Clusters {
		out.Clusters[c] = ca
	}
	return out
}
