// Package retry is fleetgraph's one retry policy: the exponential, jittered
// Backoff every retry loop uses (a collector's failing kind, a pull
// cluster's reconnect, an edge's reconnect to the manager and its wait for
// the local API server, a cluster source's wait for its CRD), the constants of those loops with the reasons for
// them, and Jitter, which spreads periodic work such as relists.
//
// Jitter matters because failures come in crowds: when a manager restarts,
// hundreds of edges lose it at once, and when an API server dies every kind
// of it fails together. Spread waits keep them from retrying in lockstep.
//
// It does not decide what to retry or when a failure is final; the loops
// that own the work do.
package retry
