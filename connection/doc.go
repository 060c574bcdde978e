// Package connection owns each cluster's connection lifecycle: building its
// client from a credential source, detecting loss (watch errors, a /readyz
// probe loop, HTTP/2 health checks), reconnecting with backoff, marking its
// rows stale, and emitting exactly one event per state transition. It also
// serves edge agents' websocket sessions in push mode (package edge).
//
// # Cluster states
//
// One state machine (internal/clusterstate) owns a cluster's row for both
// modes. Its inputs are the same whichever way rows arrive:
//
//	input       pull mode                            push mode (edge)
//	Connect     a session starts (after a probe      an edge is welcomed
//	            answered, when reconnecting)
//	Seen        discovery and each probe answer      every message from the edge
//	Report      each kind listed or failed; synced   each snapshot and kind error;
//	            once every present kind has          synced by a full snapshot
//	Lost        a watch failure confirmed by         the session ends (lost
//	            ProbeFailures failed probes, or      connection, bad input,
//	            a reconnect attempt that fails       superseded)
//
// Connect returns a generation; every later input names it, and inputs
// from an older connection (a probe that outlived its client, a session
// that ended) change nothing, so they cannot cause a spurious reconnect or
// transition (docs/design.md, connection lifecycle).
//
// The transitions, each one written to the index as one change of the
// cluster row (index.EventCluster):
//
//	from                  input                      to
//	(none)                Connect                    CONNECTING
//	CONNECTED, DEGRADED   Connect (replaces a live   CONNECTING
//	                      connection)
//	CONNECTING            Report, synced, no kind    CONNECTED
//	                      failing
//	CONNECTING            Report, synced, a kind     DEGRADED
//	                      failing
//	DEGRADED              Report: no kind failing    CONNECTED
//	CONNECTED             Report: a kind failing     DEGRADED
//	any                   Lost                       DISCONNECTED
//	DISCONNECTED          Connect, Lost              DISCONNECTED (LastError
//	                                                 updated; no transition)
//	DISCONNECTED          Report, synced             CONNECTED or DEGRADED
//
// So an outage is exactly one DISCONNECTED and one CONNECTED (or DEGRADED):
// once DISCONNECTED, a cluster stays so until a new connection has synced,
// however many reconnect attempts fail on the way. A user sees one toast
// per outage, and Since stays the time the outage began.
//
// The other fields of the row:
//   - Since is when State was entered.
//   - LastSeen is the last time the cluster answered (see Seen above, plus
//     every completed sync and an edge's Hello). A write for any other
//     reason carries it; on its own it is written at most every 10 s
//     (clusterstate.SeenEvery), because each write is an event for
//     subscribers.
//   - LastError is the loss's reason while DISCONNECTED (the latest failed
//     attempt's), the first failing kind's error (in kind order) while
//     DEGRADED, and empty once CONNECTED.
//   - Synced becomes true at the first completed sync since the process
//     started and stays so; it feeds the fleet's rebuild progress.
//   - Stale (index.Cluster.Stale) follows from State: rows of a cluster that
//     is neither CONNECTED nor DEGRADED are last-known, never deleted.
//
// Until a connection has synced, its kind news is only remembered, so it goes
// from CONNECTING (or DISCONNECTED) to CONNECTED or DEGRADED in one step.
//
// It does not normalize objects (collector) or answer queries (index,
// graph).
package connection
