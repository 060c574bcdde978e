// Package conntest holds test helpers shared by the tests of connection
// and connection/edge: a recorder of cluster state transitions read from
// the index's change feed, and the goroutines those tests may leave
// running. It is for tests only.
package conntest
