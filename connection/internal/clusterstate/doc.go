// Package clusterstate owns a cluster's row in the index for both pull and
// push mode: its connection state and when it was entered, when the cluster
// last answered, the last error, whether it has synced, and its metadata.
// connection's pull lifecycle and edge's hub sessions report what happens
// to a connection (it began, the cluster answered, kinds synced or failed,
// it was lost) and a Machine turns that into transitions, written through
// the index's Sink. The transitions table is in the connection package's
// documentation.
//
// It does not detect loss or reconnect (connection, edge) and does not
// decide what is stale (index.Cluster.Stale, from the state).
package clusterstate
