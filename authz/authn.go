package authz

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"
)

// Authentication errors. Match them with errors.Is.
var (
	// ErrNotApplicable means the authenticator found no credentials it
	// handles (no token of its kind, no identity headers). A Union moves
	// on to the next authenticator; it is never shown to a caller alone.
	ErrNotApplicable = errors.New("no credentials for this authenticator")
	// ErrUnauthenticated is what a Union returns when no authenticator
	// accepted the request. It wraps the reasons, if any.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrInvalidToken means a bearer token was presented and no
	// authenticator accepted it. Such a request is never treated as
	// anonymous, as in kube-apiserver.
	ErrInvalidToken = errors.New("invalid bearer token")
	// ErrNoCredentials is what a Union returns (wrapped in
	// ErrUnauthenticated) for a request that presented no credentials any
	// authenticator handles, when anonymous access is off.
	ErrNoCredentials = errors.New("no credentials")
)

// Credentials is what a caller presented. HTTP requests fill it with
// CredentialsFromRequest; a websocket takes the token from its
// connection_init payload and the rest from the upgrade request.
type Credentials struct {
	// Token is the bearer token, without the "Bearer " prefix.
	Token string
	// Header holds the request headers, for request-header
	// authentication. Authenticators do not modify it.
	Header http.Header
	// TLS is the connection state, whose verified peer certificates decide
	// whether identity headers come from a trusted proxy. Nil for
	// plaintext connections.
	TLS *tls.ConnectionState
}

// CredentialsFromRequest collects the credentials of an HTTP request: the
// bearer token of the Authorization header, the headers and the TLS state.
func CredentialsFromRequest(r *http.Request) Credentials {
	c := Credentials{Header: r.Header, TLS: r.TLS}
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			c.Token = strings.TrimSpace(token)
		}
	}
	return c
}

// Authenticator turns credentials into an identity. It returns the
// identity, ErrNotApplicable when the credentials are not of its kind, or
// an error saying why they were rejected. Implementations must be safe for
// concurrent use.
//
// The identity is the one the authenticator established, before any
// per-cluster Mapping and without system:authenticated, which Mapping adds.
type Authenticator interface {
	Authenticate(ctx context.Context, c Credentials) (user.Info, error)
}

// Expiring is implemented by the user.Info of credentials that stop being
// valid at a known time, as an OIDC ID token does at its "exp" claim. A
// request is authenticated once, but a websocket lives on: its server must
// end it by ExpiresAt, or it would keep streaming to a caller whose
// credentials the server would now refuse.
type Expiring interface {
	ExpiresAt() time.Time
}

// ExpiresAt returns when the credentials u was authenticated with expire,
// and false when they do not (static tokens, request-header users).
func ExpiresAt(u user.Info) (time.Time, bool) {
	if e, ok := u.(Expiring); ok && !e.ExpiresAt().IsZero() {
		return e.ExpiresAt(), true
	}
	return time.Time{}, false
}

// expiringUser is a user whose credentials expire.
type expiringUser struct {
	*user.DefaultInfo
	expires time.Time
}

func (u *expiringUser) ExpiresAt() time.Time { return u.expires }

// Union tries authenticators in order and returns the first identity. It is
// the one Authenticator the server needs.
type Union struct {
	// Authenticators are tried in order.
	Authenticators []Authenticator
	// AllowAnonymous, when true, lets a request that presents no
	// credentials at all through as system:anonymous in group
	// system:unauthenticated. Requests with credentials that were
	// rejected are never anonymous. It is false by default: docs/design.md
	// asks for 401 on anonymous requests.
	AllowAnonymous bool
}

// Authenticate implements Authenticator.
func (u *Union) Authenticate(ctx context.Context, c Credentials) (user.Info, error) {
	var errs []error
	for _, a := range u.Authenticators {
		info, err := a.Authenticate(ctx, c)
		if err == nil {
			return info, nil
		}
		if !errors.Is(err, ErrNotApplicable) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, errors.Join(errs...))
	}
	if c.Token != "" {
		return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, ErrInvalidToken)
	}
	if u.AllowAnonymous {
		return &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}, nil
	}
	return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, ErrNoCredentials)
}
