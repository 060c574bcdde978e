package graph

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/99designs/gqlgen/complexity"
	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/fleetgraph/fleetgraph/graph/generated"
	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// operationLimits is a gqlgen extension that rejects operations that are
// too deep, use too many aliases, or are too complex, after parsing and
// validation and before anything executes. (The token limit is gqlgen's
// parser limit; fragment cycles are rejected by gqlparser's validation.)
//
// The checks are cheap and bounded: aliases are counted once per
// occurrence in the document, and depth is computed once per fragment, so
// a document that spreads fragments into each other many times costs no
// more than its size.
type operationLimits struct {
	maxDepth, maxAliases, maxComplexity int
	es                                  graphql.ExecutableSchema
}

var _ interface {
	graphql.HandlerExtension
	graphql.OperationContextMutator
} = &operationLimits{}

// ExtensionName implements graphql.HandlerExtension.
func (*operationLimits) ExtensionName() string { return "fleetgraph.OperationLimits" }

// Validate implements graphql.HandlerExtension.
func (l *operationLimits) Validate(es graphql.ExecutableSchema) error {
	l.es = es
	return nil
}

// MutateOperationContext implements graphql.OperationContextMutator.
func (l *operationLimits) MutateOperationContext(ctx context.Context, opCtx *graphql.OperationContext) *gqlerror.Error {
	if n := countAliases(opCtx.Doc); n > l.maxAliases {
		return limitError("aliases", n, l.maxAliases, "the document uses %d aliases; at most %d are allowed", n, l.maxAliases)
	}
	if d := operationDepth(opCtx.Operation); d > l.maxDepth {
		return limitError("depth", d, l.maxDepth, "the operation nests fields %d deep; at most %d is allowed", d, l.maxDepth)
	}
	if c := complexity.Calculate(ctx, l.es, opCtx.Operation, opCtx.Variables); c > l.maxComplexity {
		return limitError("complexity", c, l.maxComplexity, "the operation has complexity %d; at most %d is allowed (objects costs its page size times its selection)", c, l.maxComplexity)
	}
	return nil
}

// limitError is a validation error that names the limit.
func limitError(limit string, got, max int, format string, a ...any) *gqlerror.Error {
	return &gqlerror.Error{
		Message: fmt.Sprintf(format, a...),
		Extensions: map[string]any{
			"code": codeValidationFailed, "limit": limit, "value": got, "max": max,
		},
	}
}

// countAliases counts aliased fields in the whole document, each
// occurrence once (gqlparser sets Alias to the name when there is none).
func countAliases(doc *ast.QueryDocument) int {
	n := 0
	var walk func(ast.SelectionSet)
	walk = func(set ast.SelectionSet) {
		for _, sel := range set {
			switch s := sel.(type) {
			case *ast.Field:
				if s.Alias != "" && s.Alias != s.Name {
					n++
				}
				walk(s.SelectionSet)
			case *ast.InlineFragment:
				walk(s.SelectionSet)
			}
		}
	}
	for _, op := range doc.Operations {
		walk(op.SelectionSet)
	}
	for _, f := range doc.Fragments {
		walk(f.SelectionSet)
	}
	return n
}

// operationDepth returns how deep fields nest in an operation, following
// fragment spreads. Root fields are depth 1. Each fragment's depth is
// computed once; a cycle (which validation already rejects) counts as
// infinitely deep.
func operationDepth(op *ast.OperationDefinition) int {
	const cycle = 1 << 30
	memo := map[*ast.FragmentDefinition]int{}
	var depth func(ast.SelectionSet) int
	depth = func(set ast.SelectionSet) int {
		best := 0
		for _, sel := range set {
			d := 0
			switch s := sel.(type) {
			case *ast.Field:
				d = 1 + depth(s.SelectionSet)
			case *ast.InlineFragment:
				d = depth(s.SelectionSet)
			case *ast.FragmentSpread:
				if s.Definition == nil {
					continue
				}
				fd, ok := memo[s.Definition]
				if !ok {
					memo[s.Definition] = cycle
					fd = depth(s.Definition.SelectionSet)
					memo[s.Definition] = fd
				}
				d = fd
			}
			best = max(best, d)
		}
		return min(best, cycle)
	}
	return depth(op.SelectionSet)
}

// complexityRoot prices the fields whose cost is not their selection: a
// page of objects costs its size times its selection, and ScanCost more
// when it must visit every candidate row (see isScan); facets cost
// FacetsCost, and ScanCost more likewise; a live object read costs a round
// trip to a cluster; lists of clusters are assumed to be a few dozen long.
// Aliases repeat fields, so they multiply these prices.
func complexityRoot(l Limits) generated.ComplexityRoot {
	var c generated.ComplexityRoot
	scan := func(f *model.ObjectFilter, o *model.ObjectOrder) int {
		if isScan(f, o) {
			return l.ScanCost
		}
		return 0
	}
	c.Query.Objects = func(child int, f *model.ObjectFilter, o *model.ObjectOrder, first *int, _ *string) int {
		n := index.DefaultPageSize
		if first != nil && *first >= 0 {
			n = min(*first, index.MaxPageSize)
		}
		return 1 + max(n, 1)*child + scan(f, o)
	}
	c.Query.Object = func(child int, _, _ string, _ *string, _ string) int { return l.LiveReadCost + child }
	c.Query.WhyVisible = func(child int, _, _ string, _ *string, _ string) int { return 50 + child }
	c.Query.Clusters = func(child int, _ *string) int { return 1 + 20*child }
	c.Query.Facets = func(child int, f *model.ObjectFilter) int { return l.FacetsCost + child + scan(f, nil) }
	return c
}

// limitBody rejects request bodies over max bytes with 413 before any
// parsing. A declared Content-Length is checked without reading; a chunked
// body is read up to the limit.
func (h *Handler) limitBody(next http.Handler) http.Handler {
	maxBytes := h.opts.Limits.MaxBodyBytes
	tooLarge := func(w http.ResponseWriter) {
		h.metrics.rejected("body_too_large")
		w.Header().Set("Connection", "close")
		writeHTTPError(w, http.StatusRequestEntityTooLarge, CodeRequestTooLarge,
			fmt.Sprintf("request body exceeds %d bytes", maxBytes))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength > maxBytes {
			tooLarge(w)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge(w)
				return
			}
			writeHTTPError(w, http.StatusBadRequest, CodeBadRequest, "reading the request body failed")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
