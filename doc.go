// Package fleetgraph gives one view of many Kubernetes clusters: it keeps a
// normalized row per object in memory, filters every answer through the
// RBAC of the object's own cluster, and serves it over GraphQL.
//
// New wires the parts (index, authz, collector, connection, graph) into a
// Server that a program can embed: Server.Handler serves the API and
// Server.Run collects from the clusters until its context ends. The
// fleetgraph command (cmd/fleetgraph) is one such program.
//
// The library registers only its own metrics (fleetgraph_*), on
// Config.Registry. It does not register the Go runtime and process
// collectors: they describe the whole process, which the embedding program
// owns, and a registry that already holds them refuses them twice. The
// program that builds the registry registers them, once, as cmd/fleetgraph
// does for serve and edge; with a nil Config.Registry, /metrics holds
// fleetgraph's metrics only.
package fleetgraph
