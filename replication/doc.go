// Package replication runs fleetgraph on more than one process over NATS
// JetStream: collectors that own clusters publish every write their index
// takes, and query replicas build their index from what was published,
// each through index.Sink, the one way rows enter an index.
//
// # The stream
//
// One JetStream stream (DefaultStream) holds a log per cluster, on subject
// "<prefix>.c.<cluster>". A log is a sequence of messages (codec.go has
// the encoding: a version byte, zstd, and the protocol buffers wire
// format), each written by the cluster's owner and naming the message it
// follows on the subject. A message carries either index.Sink operations
// (Replace, UpsertBatch, Delete, ReportKindError, UpsertCluster,
// RemoveCluster), each with the time the owner's index applied it, so that
// a replica applying it through index.Store.At ends with the very same
// rows; or a part of a snapshot (index.ClusterSnapshot), the whole state
// of the cluster. Large operations and snapshots are split into parts that
// fit a message and applied whole.
//
// The owner publishes only writes that changed its index (an edge's
// periodic full resync of an unchanged cluster publishes nothing). Once
// what it published since its last snapshot reaches half that snapshot's
// size, it writes a new snapshot and purges the log before it: a log holds
// at most about one and a half snapshots, so the stream's size follows the
// fleet's size, not its history. A replica that starts reads every log
// from its first message, a snapshot, without asking any leaf cluster; a
// replica that followed the log skips snapshots, which copy the state it
// has (no change events). A replica that finds a hole in a log (a message
// that does not follow the last one it applied) stops applying that
// cluster, asks the owner for a snapshot ("<prefix>.resync.<cluster>"),
// and loads it.
//
// # Owners and fencing
//
// A Node owns a cluster after Acquire: it brings its index's state of the
// cluster to the end of the log, then writes a snapshot of it with an
// epoch above every earlier owner's, on the condition that the log's last
// message is the one it read (JetStream's expected last subject
// sequence). Every later message of the owner carries the same condition,
// so once a new owner has written, the stream refuses the old owner's
// writes: the old owner learns it lost the cluster (OnLost) and drops
// further writes, and replicas ignore any message whose epoch is below the
// highest they have seen. Two owners never both write a log: writes are
// ordered by the stream and each is checked against the one before.
// Which process should own a cluster is decided outside this file (by
// Kubernetes Leases, see leases.go); a lease's generation travels in every
// message.
//
// It does not collect clusters (connection, edge), answer queries (graph)
// or decide visibility (authz); it moves index writes between processes.
package replication
