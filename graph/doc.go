// Package graph serves fleetgraph's public GraphQL API with gqlgen: queries,
// subscriptions, authentication and limits over HTTP, websockets and
// server-sent events.
//
// The schema (schema.graphqls) is the public contract of docs/design.md; its
// names are relied on outside this repository, so it is extended, never
// renamed. NewHandler builds an http.Handler serving:
//
//	POST /graphql   GraphQL over HTTP with JSON (Authorization: Bearer); a
//	                JSON or form body sent as a form (curl -d) when the
//	                request carries Authorization; any other content type
//	                is 415 naming application/json (post.go)
//	GET  /graphql   websocket: graphql-transport-ws, or legacy graphql-ws,
//	                with the token in the connection_init payload (ws.go)
//	GET, POST /graphql with Accept: text/event-stream: server-sent events
//	                (graphql-sse's distinct connections mode) for
//	                EventSource clients, authenticated like POST (sse.go)
//	GET  /          the dashboard (package ui), GraphiQL at /graphiql
//	GET  /healthz, /readyz, /metrics (fleet admins; MetricsHandler for scrapers)
//
// Every transport has the same authentication, limits and RBAC: the
// operation limits, the body or message cap, MaxOperations (per websocket,
// or open event streams per viewer), the write timeout and the keep-alive;
// credentials that expire or are revoked end websockets (4403) and event
// streams (an UNAUTHENTICATED error event) alike.
//
// Resolvers are thin: they authenticate the viewer (authz authenticators),
// take the viewer's access set from authz, and delegate to the index for
// lists, facets, clusters, the fleet status and change feeds, and to LeafClients (implemented
// by connection) for object(...), which is read live from the leaf while
// impersonating the viewer. Everything is filtered through each cluster's
// RBAC before pagination and counting.
//
// A websocket is authenticated once, at connection_init, and every
// operation on it runs as that viewer. When the credentials expire (an
// OIDC ID token's exp; see authz.Expiring), the socket is closed with 4403
// and its subscriptions end; the client reconnects with a fresh token.
//
// Subscriptions are adapters over the index's streams
// (index.Store.ObjectChanges, ClusterChanges, FleetChanges), which route
// the change feed by cluster and namespace, apply the filter and the
// viewer's access, re-read that access from authz when a cluster's RBAC
// changes, catch a slow subscription up from the replay buffer and end one
// that falls out of it (SLOW_CONSUMER); nothing ever waits for a client.
// Each subscription has one pump goroutine that reads its stream, converts
// the changes to the GraphQL model and owns the output channel; the
// handler keeps the set of open streams only to end them on Close.
//
// Two measured optimizations sit beside gqlgen's generated code: lists are
// marshaled in order rather than with a goroutine per element
// (internal/seqmarshal), and Query.objects writes its page directly in
// gqlgen's exact output format (fast.go), for the types and fields the
// schema puts under it. Both are checked against the generated code. The
// fast path runs no field middleware, so it is not installed when an
// extension (Options.Extensions) intercepts fields.
//
// The package keeps no state of its own beyond open subscriptions and
// websockets: it asks authz for the viewer's access on every operation
// (authz owns the only cache of it), never writes to the index and talks
// to clusters only for object(...).
package graph
