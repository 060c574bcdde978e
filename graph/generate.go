package graph

// gqlgen finds ../gqlgen.yml by itself and runs from the module root; then
// seqmarshal makes list marshaling sequential (see its doc comment).
//go:generate go run github.com/99designs/gqlgen generate
//go:generate go run ./internal/seqmarshal generated/generated.go
