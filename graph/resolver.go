package graph

// Resolver is the root of gqlgen's resolvers. It holds the dependencies;
// each resolver method is a few lines that delegate to the service, which
// in turn delegates to index, authz and LeafClients.
type Resolver struct {
	svc *service
}
