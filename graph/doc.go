// Package graph serves fleetgraph's public GraphQL API with gqlgen: queries,
// subscriptions, authentication and limits over HTTP and websockets.
//
// Resolvers are thin: they authenticate the viewer, ask authz for an access
// set, and delegate to index and connection. The package holds no state of
// its own beyond open subscriptions.
package graph
