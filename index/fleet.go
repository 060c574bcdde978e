package index

import "fmt"

// FleetStatus is the fleet's rebuild progress: after a start, the index is
// empty until every cluster's first full sync, and users are told how far
// along it is ("Rebuilding indices... 35/100 clusters").
type FleetStatus struct {
	ClustersTotal  int
	ClustersSynced int
	// Rebuilding is true while some reachable cluster has not finished its
	// first full sync. A cluster that is unreachable from the start does
	// not keep the fleet "rebuilding" forever: it counts as disconnected.
	Rebuilding bool
	Message    string
}

// Fleet returns the status of the clusters a viewer with access a is told
// about (Access.SeesCluster), from one read of the cluster rows; with
// access All, of the whole fleet, which is what readiness waits for.
func (s *Store) Fleet(a *Access) FleetStatus {
	var seen []*Cluster
	for _, c := range s.ListClusters(nil) {
		if a.SeesCluster(c.Name) {
			seen = append(seen, c)
		}
	}
	return fleetStatus(seen)
}

// SeesCluster reports whether the access shows anything in a cluster: with
// All, every cluster; otherwise a cluster whose ClusterAccess is not
// Empty. It decides which clusters, connection events and fleet counts a
// viewer is told about.
func (a *Access) SeesCluster(name string) bool {
	return a != nil && (a.All || !a.Clusters[name].Empty())
}

// fleetStatus computes the status of a set of cluster rows.
func fleetStatus(clusters []*Cluster) FleetStatus {
	s := FleetStatus{ClustersTotal: len(clusters)}
	disconnected := 0
	for _, c := range clusters {
		if c.Synced {
			s.ClustersSynced++
		}
		if c.State == StateDisconnected {
			disconnected++
		} else if !c.Synced {
			s.Rebuilding = true
		}
	}
	switch {
	case s.ClustersTotal == 0:
		s.Message = "No clusters"
	case s.Rebuilding:
		s.Message = fmt.Sprintf("Rebuilding indices... %d/%d clusters", s.ClustersSynced, s.ClustersTotal)
	case s.ClustersSynced == s.ClustersTotal:
		s.Message = fmt.Sprintf("All %d clusters synced", s.ClustersTotal)
	default:
		s.Message = fmt.Sprintf("%d/%d clusters synced", s.ClustersSynced, s.ClustersTotal)
	}
	if disconnected > 0 {
		s.Message += fmt.Sprintf(" (%d disconnected, showing last known state)", disconnected)
	}
	return s
}
