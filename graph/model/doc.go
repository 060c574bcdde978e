// Package model holds the Go types of the GraphQL schema: the ones gqlgen
// generates into models_gen.go and the hand-written JSON scalar. They are
// plain values that resolvers fill from index and authz types; the package
// has no behavior beyond marshaling.
package model
