package authz

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"
)

// ErrUntrustedProxy means identity headers arrived without a client
// certificate that chains to the configured proxy CA (or with a certificate
// whose common name is not allowed). The headers are ignored and the
// request is rejected: anyone can send X-Remote-User.
var ErrUntrustedProxy = errors.New("request-header: identity headers from an untrusted client")

// RequestHeaderConfig configures request-header authentication, with the
// meaning of kube-apiserver's --requestheader-* flags.
type RequestHeaderConfig struct {
	// ClientCA verifies the proxy's client certificate. Required.
	ClientCA *x509.CertPool
	// AllowedNames, if not empty, lists the common names the proxy's
	// certificate may have.
	AllowedNames []string
	// UsernameHeaders are checked in order; the first with a value names
	// the user. Default X-Remote-User.
	UsernameHeaders []string
	// GroupHeaders all contribute groups. Default X-Remote-Group.
	GroupHeaders []string
	// ExtraHeaderPrefixes fill user extras, for example
	// X-Remote-Extra-Scopes. Default X-Remote-Extra-.
	ExtraHeaderPrefixes []string
	// Naming prefixes the proxy's users and groups and says whether the
	// proxy may assert system: names (by default it may not: a request
	// naming a ServiceAccount or a system: group is rejected).
	Naming Naming
}

// RequestHeader trusts identity headers set by an authenticating proxy, and
// only when the connection presents a client certificate signed by the
// configured CA. fleetgraph does not strip the headers from the request; the
// server must not forward them anywhere.
type RequestHeader struct {
	cfg RequestHeaderConfig
}

// NewRequestHeader returns the authenticator, filling defaults.
func NewRequestHeader(cfg RequestHeaderConfig) (*RequestHeader, error) {
	if cfg.ClientCA == nil {
		return nil, errors.New("request-header: a client CA is required")
	}
	if len(cfg.UsernameHeaders) == 0 {
		cfg.UsernameHeaders = []string{"X-Remote-User"}
	}
	if len(cfg.GroupHeaders) == 0 {
		cfg.GroupHeaders = []string{"X-Remote-Group"}
	}
	if len(cfg.ExtraHeaderPrefixes) == 0 {
		cfg.ExtraHeaderPrefixes = []string{"X-Remote-Extra-"}
	}
	return &RequestHeader{cfg: cfg}, nil
}

// Authenticate implements Authenticator. Without a username header it is
// ErrNotApplicable; with one, the client certificate must verify.
func (h *RequestHeader) Authenticate(_ context.Context, c Credentials) (user.Info, error) {
	name := firstHeader(c.Header, h.cfg.UsernameHeaders)
	if name == "" {
		return nil, ErrNotApplicable
	}
	if err := h.verifyClient(c); err != nil {
		return nil, err
	}
	u := &user.DefaultInfo{Name: name}
	for _, hdr := range h.cfg.GroupHeaders {
		u.Groups = append(u.Groups, c.Header.Values(hdr)...)
	}
	for key, values := range c.Header {
		for _, prefix := range h.cfg.ExtraHeaderPrefixes {
			if len(key) <= len(prefix) || !strings.EqualFold(key[:len(prefix)], prefix) {
				continue
			}
			extraKey := strings.ToLower(key[len(prefix):])
			if unescaped, err := url.PathUnescape(extraKey); err == nil {
				extraKey = unescaped
			}
			if u.Extra == nil {
				u.Extra = make(map[string][]string)
			}
			u.Extra[extraKey] = append(u.Extra[extraKey], values...)
		}
	}
	if err := h.cfg.Naming.apply(u); err != nil {
		return nil, fmt.Errorf("request-header: %w", err)
	}
	return u, nil
}

// verifyClient checks that the peer certificate chains to the CA for client
// authentication and, if configured, has an allowed common name.
func (h *RequestHeader) verifyClient(c Credentials) error {
	if c.TLS == nil || len(c.TLS.PeerCertificates) == 0 {
		return fmt.Errorf("%w: no client certificate", ErrUntrustedProxy)
	}
	leaf := c.TLS.PeerCertificates[0]
	opts := x509.VerifyOptions{
		Roots:         h.cfg.ClientCA,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, cert := range c.TLS.PeerCertificates[1:] {
		opts.Intermediates.AddCert(cert)
	}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("%w: %w", ErrUntrustedProxy, err)
	}
	if len(h.cfg.AllowedNames) > 0 && !slices.Contains(h.cfg.AllowedNames, leaf.Subject.CommonName) {
		return fmt.Errorf("%w: common name %q is not allowed", ErrUntrustedProxy, leaf.Subject.CommonName)
	}
	return nil
}

func firstHeader(h http.Header, names []string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}
