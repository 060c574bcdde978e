// Package sources turns the cluster inventories users already keep into
// the clusters a connection.Manager collects, and keeps them current while
// fleetgraph runs: kubeconfig contexts, labelled Secrets holding a
// kubeconfig, Weave GitOps GitopsClusters, Cluster API Clusters and their
// kubeconfig Secrets, Argo CD cluster Secrets and SIG-Multicluster
// ClusterProfiles.
//
// Each source watches its objects in a management cluster and, on any
// change, computes a Claim per object: the cluster's name, its labels, and
// a function that builds its client config from the source's current
// state. The Registry is the one place that turns claims into clusters: it
// adds a cluster for a new name, reconnects it when its credentials change,
// removes it (and its rows) when its last claim goes, and reports two
// claims of one name as an error on that cluster instead of letting one
// silently win. A broken object (a missing Secret, a kubeconfig without a
// current context, a CA that does not parse) becomes an error on its own
// cluster; it never stops the source or the other clusters.
//
// It does not run connections (connection does), and it does not write to
// the index except through the Manager.
package sources
