// Package ui serves fleetgraph's web pages from assets embedded in the
// binary: the dashboard at /, /objects and /object, and GraphiQL at
// /graphiql. Nothing is fetched from another host at run time, so the pages
// work offline and in air-gapped clusters.
//
// The sources (Svelte and TypeScript, built by Vite) live in this folder;
// dist/ is their build, committed so that `go build` and `go install` alone
// give the complete dashboard. `make ui` rebuilds dist/ from the pinned
// package-lock.json, and `make test` fails when the committed build differs
// from a fresh one.
//
// The pages use only the public GraphQL API at /graphql. The package does not
// authenticate anyone: the pages carry no data, and every request they make
// is authenticated by the API.
package ui
