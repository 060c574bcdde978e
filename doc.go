// Package fleetgraph gives one view of many Kubernetes clusters: it keeps a
// normalized row per object in memory, filters every answer through the
// RBAC of the object's own cluster, and serves it over GraphQL.
//
// New wires the parts (index, authz, collector, connection, graph) into a
// Server that a program can embed: Server.Handler serves the API and
// Server.Run collects from the clusters until its context ends. The
// fleetgraph command (cmd/fleetgraph) is one such program.
package fleetgraph
