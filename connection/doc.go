// Package connection owns each cluster's connection lifecycle: building its
// client from a credential source, detecting loss (watch errors, a /readyz
// probe loop, HTTP/2 health checks), reconnecting with backoff, marking its
// rows stale, and emitting exactly one event per state transition. It also
// serves edge agents' websocket sessions in push mode.
//
// It does not normalize objects (collector) or answer queries (index,
// graph).
package connection
