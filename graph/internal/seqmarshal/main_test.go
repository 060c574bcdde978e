package main

import (
	"strings"
	"testing"
)

func TestRewrite(t *testing.T) {
	src := "ret := graphql.MarshalSliceConcurrently(ctx, len(v), 0, false, func(ctx context.Context, i int) graphql.Marshaler {"
	out, n := rewrite([]byte(src))
	if n != 1 || string(out) != "ret := marshalSlice(ctx, len(v), func(ctx context.Context, i int) graphql.Marshaler {" {
		t.Errorf("rewrote %d: %s", n, out)
	}
	if _, n := rewrite([]byte(strings.ReplaceAll(src, "0, false", "4, true"))); n != 0 {
		t.Error("rewrote a call with other arguments")
	}
}
