// Package testissuer is a real OpenID Connect issuer for tests: discovery
// and signing keys served over TLS by an httptest server, and ID tokens
// signed with its key (or another, to forge one). It is only for tests; it
// issues whatever claims it is given and checks nothing.
package testissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/coreos/go-oidc/v3/oidc/oidctest"
)

// Issuer serves discovery and keys until the test ends.
type Issuer struct {
	// Server serves discovery; Server.URL is the issuer URL and
	// Server.Client() trusts its certificate.
	Server *httptest.Server
	// Key signs the tokens the issuer publishes a key for.
	Key *rsa.PrivateKey
}

// New starts an issuer; it stops when the test ends.
func New(t testing.TB) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s := &oidctest.Server{PublicKeys: []oidctest.PublicKey{{PublicKey: key.Public(), KeyID: "k1", Algorithm: oidc.RS256}}}
	srv := httptest.NewTLSServer(s)
	s.SetIssuer(srv.URL)
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	return &Issuer{Server: srv, Key: key}
}

// URL is the issuer URL.
func (i *Issuer) URL() string { return i.Server.URL }

// Sign returns an ID token with claims, signed by key under the issuer's
// key id (so a key other than Key makes a forged token).
func (i *Issuer) Sign(t testing.TB, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	raw, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return oidctest.SignIDToken(key, "k1", oidc.RS256, string(raw))
}
