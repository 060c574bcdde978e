package graph

// gqlgen finds ../gqlgen.yml by itself and runs from the module root.
//go:generate go run github.com/99designs/gqlgen generate
