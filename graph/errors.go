package graph

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/fleetgraph/fleetgraph/index"
)

// Error codes, sent as extensions.code of GraphQL errors (and of the JSON
// bodies of 401 and 413 answers). Clients switch on them, so they are part
// of the API.
const (
	// CodeUnauthenticated: no credentials, or credentials that no
	// authenticator accepted (HTTP 401; websocket close 4403).
	CodeUnauthenticated = "UNAUTHENTICATED"
	// CodeForbidden: the leaf cluster denied the viewer (object(...)), the
	// cluster does not exist or the viewer may see nothing in it (the two
	// answer alike), or a non-admin asked for /metrics (HTTP 403).
	CodeForbidden = "FORBIDDEN"
	// CodeImpersonationDenied: fleetgraph's own credentials for a cluster
	// lack the impersonate verb, so object(...) cannot act as the viewer.
	CodeImpersonationDenied = "IMPERSONATION_DENIED"
	// CodeBadUserInput: an invalid filter, order, cursor, kind or page size.
	CodeBadUserInput = "BAD_USER_INPUT"
	// CodeClusterUnavailable: the cluster cannot be reached for a live
	// request, or is unknown.
	CodeClusterUnavailable = "CLUSTER_UNAVAILABLE"
	// CodeResyncRequired: a subscription cursor is older than the change
	// feed retains, or the server fell behind; query again and subscribe
	// from the answer's changesCursor.
	CodeResyncRequired = "RESYNC_REQUIRED"
	// CodeSlowConsumer: the client read events more slowly than they came
	// and its subscription was ended; resume with extensions.cursor.
	CodeSlowConsumer = "SLOW_CONSUMER"
	// CodeTooManyOperations: a websocket already runs
	// WebsocketOptions.MaxOperations operations.
	CodeTooManyOperations = "TOO_MANY_OPERATIONS"
	// CodeBadRequest: an operation used the wrong transport, e.g. a
	// subscription over HTTP POST.
	CodeBadRequest = "BAD_REQUEST"
	// CodeRequestTooLarge: the HTTP body exceeds Limits.MaxBodyBytes (413).
	CodeRequestTooLarge = "REQUEST_TOO_LARGE"
	// CodeDeadlineExceeded: the query ran, or waited for a slot (see
	// Limits.MaxScansPerViewer), past Limits.RequestTimeout.
	CodeDeadlineExceeded = "DEADLINE_EXCEEDED"
	// CodeCanceled: the client went away or the server is shutting down
	// while the query ran.
	CodeCanceled = "CANCELED"
	// CodeShuttingDown: the server is closing; reconnect elsewhere or later.
	CodeShuttingDown = "SHUTTING_DOWN"
	// CodeInternal: a bug or an unexpected failure; the server logged it.
	CodeInternal = "INTERNAL_SERVER_ERROR"
	// codeValidationFailed is gqlgen's code for invalid documents; the
	// depth, alias and complexity limits use it too, with
	// extensions.limit naming the limit, so that HTTP status handling
	// treats them like any other invalid document.
	codeValidationFailed = "GRAPHQL_VALIDATION_FAILED"
)

// apiError is an error with a code for clients. Its message is written for
// the viewer; the cause is kept for errors.Is/As and logs and included in
// the message when it is safe to show.
type apiError struct {
	code string
	msg  string
	err  error
	ext  map[string]any
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *apiError) Unwrap() error { return e.err }

// newError returns an apiError whose message is fmt.Sprintf(format, a...).
func newError(code string, cause error, format string, a ...any) *apiError {
	return &apiError{code: code, msg: fmt.Sprintf(format, a...), err: cause}
}

// with returns e with one more extension field.
func (e *apiError) with(key string, v any) *apiError {
	if e.ext == nil {
		e.ext = map[string]any{}
	}
	e.ext[key] = v
	return e
}

// gqlError converts an error into the GraphQL error clients see: an
// apiError keeps its code, index.ErrInvalidQuery becomes BAD_USER_INPUT,
// and anything else is INTERNAL_SERVER_ERROR.
func gqlError(err error) *gqlerror.Error {
	out := &gqlerror.Error{Message: err.Error(), Extensions: map[string]any{}}
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		out.Message = ae.Error()
		for k, v := range ae.ext {
			out.Extensions[k] = v
		}
		out.Extensions["code"] = ae.code
	case errors.Is(err, index.ErrInvalidQuery):
		out.Extensions["code"] = CodeBadUserInput
	default:
		out.Extensions["code"] = CodeInternal
	}
	return out
}

// presentError is the gqlgen error presenter: it keeps gqlgen's path and
// locations and adds our codes. Errors gqlgen made itself (validation,
// parsing, complexity) already carry a code and pass through.
func presentError(log *slog.Logger) graphql.ErrorPresenterFunc {
	return func(ctx context.Context, err error) *gqlerror.Error {
		var gerr *gqlerror.Error
		if errors.As(err, &gerr) && gerr.Err == nil {
			return gerr
		}
		out := graphql.DefaultErrorPresenter(ctx, err)
		cause := err
		if gerr != nil && gerr.Err != nil {
			cause = gerr.Err
		}
		mapped := gqlError(cause)
		out.Message = mapped.Message
		if out.Extensions == nil {
			out.Extensions = map[string]any{}
		}
		for k, v := range mapped.Extensions {
			out.Extensions[k] = v
		}
		if mapped.Extensions["code"] == CodeInternal {
			log.ErrorContext(ctx, "graphql: internal error", "err", cause, "path", out.Path.String())
		}
		return out
	}
}

// recoverPanic is the gqlgen recover function: a panicking resolver is a
// bug, logged with its stack; the client gets a generic error and the
// server keeps serving.
func recoverPanic(log *slog.Logger) graphql.RecoverFunc {
	return func(ctx context.Context, v any) error {
		log.ErrorContext(ctx, "graphql: panic in resolver", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		return newError(CodeInternal, nil, "internal server error")
	}
}

// writeHTTPError answers a request that never reached GraphQL execution
// (authentication, body size) with a GraphQL-shaped JSON error body, so
// that clients parse every failure the same way.
func writeHTTPError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	// No "data" entry: nothing executed.
	b, err := json.Marshal(map[string]any{"errors": gqlerror.List{{Message: msg, Extensions: map[string]any{"code": code}}}})
	if err != nil {
		return
	}
	_, _ = w.Write(b)
}
