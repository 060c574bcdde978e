// Command seqmarshal rewrites gqlgen's generated executor so that lists are
// marshaled in order on the calling goroutine instead of one goroutine per
// element.
//
// gqlgen marshals every list of objects with graphql.MarshalSliceConcurrently,
// which starts a goroutine per element. That pays off when elements have slow
// resolvers; fleetgraph's list elements are plain values already in memory
// (a page of 100 objects with their labels is about 600 goroutines per
// request), and the goroutines cost a third of a query's CPU. The rewrite
// points those calls at generated.marshalSlice (slices.go, hand-written),
// which keeps gqlgen's per-element field context and panic recovery.
//
// It runs from go generate right after gqlgen, and fails when the call it
// rewrites is missing, so a gqlgen upgrade that changes it is noticed.
//
//	go run ./internal/seqmarshal generated/generated.go
package main

import (
	"bytes"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "seqmarshal:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: seqmarshal <generated.go>")
	}
	src, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	out, n := rewrite(src)
	if n == 0 {
		return fmt.Errorf("%s: no graphql.MarshalSliceConcurrently call to rewrite; has gqlgen changed?", args[0])
	}
	return os.WriteFile(args[0], out, 0o644)
}

// rewrite replaces the concurrent list marshaling calls and returns how
// many it replaced.
func rewrite(src []byte) ([]byte, int) {
	from := []byte("graphql.MarshalSliceConcurrently(ctx, len(v), 0, false, ")
	to := []byte("marshalSlice(ctx, len(v), ")
	return bytes.ReplaceAll(src, from, to), bytes.Count(src, from)
}
