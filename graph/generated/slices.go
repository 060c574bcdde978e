package generated

import (
	"context"

	"github.com/99designs/gqlgen/graphql"
)

// marshalSlice marshals list elements in order on the calling goroutine.
// generated.go calls it instead of graphql.MarshalSliceConcurrently (see
// graph/internal/seqmarshal for why); like gqlgen's version it gives each
// element its own field context and turns a panic into a field error and a
// null list.
//
// This file is hand-written; gqlgen does not touch it.
func marshalSlice(ctx context.Context, n int, marshal func(ctx context.Context, i int) graphql.Marshaler) graphql.Array {
	ret := make(graphql.Array, n)
	for i := range n {
		fc := &graphql.FieldContext{Index: &i}
		childCtx := graphql.WithFieldContext(ctx, fc)
		ok := func() (ok bool) {
			defer func() {
				if r := recover(); r != nil {
					graphql.AddError(childCtx, graphql.Recover(childCtx, r))
				}
			}()
			ret[i] = marshal(childCtx, i)
			return true
		}()
		if !ok {
			return nil
		}
	}
	return ret
}
