package index

import "time"

// ConnectionState is where a cluster is in its connection lifecycle. The
// connection package owns the transitions; the index stores the current
// state so that queries can mark rows of a lost cluster as stale.
type ConnectionState string

// The connection states.
const (
	StateConnecting   ConnectionState = "CONNECTING"
	StateConnected    ConnectionState = "CONNECTED"
	StateDegraded     ConnectionState = "DEGRADED" // connected, but some kinds fail
	StateDisconnected ConnectionState = "DISCONNECTED"
)

// SyncMode says how a cluster's rows arrive.
type SyncMode string

// The sync modes.
const (
	ModePull SyncMode = "PULL" // fleetgraph lists and watches the cluster's API
	ModePush SyncMode = "PUSH" // an edge agent streams rows over a websocket
)

// Cluster is the row for one member of the fleet.
type Cluster struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Mode   SyncMode          `json:"mode"`
	// State, Since, LastSeen and LastError describe the connection.
	// Since is when State was entered; LastSeen is the last time the
	// cluster answered.
	State     ConnectionState `json:"state"`
	Since     time.Time       `json:"since"`
	LastSeen  time.Time       `json:"lastSeen,omitzero"`
	LastError string          `json:"lastError,omitempty"`
	// Synced is true once a full sync of every collectable kind finished
	// since the process started; it feeds the fleet rebuild progress.
	Synced bool `json:"synced"`
	// Metadata holds facts such as region, environment, Kubernetes version
	// and istiod revision and version.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Stale reports whether the cluster's rows are last-known state rather than
// live: true unless it is connected.
func (c *Cluster) Stale() bool {
	return c.State != StateConnected && c.State != StateDegraded
}
