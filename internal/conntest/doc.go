// Package conntest holds test helpers shared by the tests of connection
// and connection/edge (and replication): a recorder of cluster state transitions read from
// the index's change feed, the cluster's truth against the index's rows,
// and a burst of changes. It is for tests only.
package conntest
