package authz

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"k8s.io/apiserver/pkg/authentication/user"
)

// ErrOIDC means an ID token from the configured issuer was rejected:
// bad signature, wrong audience, expired, or missing claims. The wrapped
// error says which; go-oidc's *oidc.TokenExpiredError can be matched with
// errors.As.
var ErrOIDC = errors.New("oidc: token rejected")

// OIDCConfig configures OIDC ID-token authentication, with the meaning of
// kube-apiserver's --oidc-* flags of the same names.
type OIDCConfig struct {
	// IssuerURL is the issuer; discovery is read from
	// IssuerURL/.well-known/openid-configuration, and tokens must carry it
	// as "iss".
	IssuerURL string
	// ClientID is the audience tokens must be issued for.
	ClientID string
	// UsernameClaim is the claim that names the user. Default "sub". For
	// "email", a present email_verified claim must be true.
	UsernameClaim string
	// GroupsClaim, if set, is a claim holding a string or a list of
	// strings with the user's groups.
	GroupsClaim string
	// UsernamePrefix is put in front of every username, as
	// --oidc-username-prefix does: empty means the default, which is the
	// issuer URL and "#" for every username claim but "email" (so
	// "https://issuer.example#alice") and nothing for "email"; "-" means no
	// prefix at all.
	UsernamePrefix string
	// GroupsPrefix is put in front of every group, as --oidc-groups-prefix
	// does (default none).
	GroupsPrefix string
	// AllowSystemNames lets tokens establish usernames and groups that
	// start with "system:" once the prefixes are applied (see Naming).
	// Off by default: a token whose claims would make its holder a
	// ServiceAccount or put it in a system: group is rejected.
	AllowSystemNames bool
	// SigningAlgs restricts the accepted signature algorithms. Default:
	// what discovery advertises.
	SigningAlgs []string
	// HTTPClient fetches discovery and keys. Default http.DefaultClient.
	// Tests pass the client of an httptest TLS server.
	HTTPClient *http.Client
	// Now is the clock for expiry checks. Default time.Now.
	Now func() time.Time
}

// OIDC authenticates OIDC ID tokens with github.com/coreos/go-oidc. Signing
// keys are fetched from the issuer's JWKS and refreshed when a token names
// an unknown key.
type OIDC struct {
	cfg      OIDCConfig
	naming   Naming
	verifier *oidc.IDTokenVerifier
}

// OIDCUsernamePrefix returns the username prefix an OIDCConfig applies:
// its UsernamePrefix, or kube-apiserver's default for it.
func OIDCUsernamePrefix(cfg OIDCConfig) string {
	switch {
	case cfg.UsernamePrefix == "-":
		return ""
	case cfg.UsernamePrefix != "":
		return cfg.UsernamePrefix
	case cfg.UsernameClaim == "email":
		return ""
	}
	return cfg.IssuerURL + "#"
}

// NewOIDC reads the issuer's discovery document and returns the
// authenticator. It fails if the issuer cannot be reached or its discovery
// document names a different issuer, so a misconfiguration shows at start.
func NewOIDC(ctx context.Context, cfg OIDCConfig) (*OIDC, error) {
	if cfg.IssuerURL == "" || cfg.ClientID == "" {
		return nil, errors.New("oidc: issuer URL and client ID are required")
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = "sub"
	}
	if cfg.HTTPClient != nil {
		ctx = oidc.ClientContext(ctx, cfg.HTTPClient)
	}
	provider, err := oidc.NewProvider(ctx, cfg.IssuerURL)
	if err != nil {
		return nil, fmt.Errorf("oidc: discovery for %q: %w", cfg.IssuerURL, err)
	}
	return &OIDC{
		cfg:    cfg,
		naming: Naming{UsernamePrefix: OIDCUsernamePrefix(cfg), GroupsPrefix: cfg.GroupsPrefix, AllowSystemNames: cfg.AllowSystemNames},
		verifier: provider.VerifierContext(ctx, &oidc.Config{
			ClientID:             cfg.ClientID,
			SupportedSigningAlgs: cfg.SigningAlgs,
			Now:                  cfg.Now,
		}),
	}, nil
}

// Authenticate implements Authenticator. A token that is not a JWT, or
// whose unverified "iss" is another issuer, is ErrNotApplicable, so that
// several issuers and static tokens can be tried in turn; every other
// failure is an error wrapping ErrOIDC.
func (o *OIDC) Authenticate(ctx context.Context, c Credentials) (user.Info, error) {
	if c.Token == "" {
		return nil, ErrNotApplicable
	}
	iss, ok := unverifiedIssuer(c.Token)
	if !ok || iss != o.cfg.IssuerURL {
		return nil, fmt.Errorf("oidc: not a token of issuer %q: %w", o.cfg.IssuerURL, ErrNotApplicable)
	}
	if o.cfg.HTTPClient != nil {
		ctx = oidc.ClientContext(ctx, o.cfg.HTTPClient)
	}
	tok, err := o.verifier.Verify(ctx, c.Token)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOIDC, err)
	}
	var claims map[string]json.RawMessage
	if err := tok.Claims(&claims); err != nil {
		return nil, fmt.Errorf("%w: decoding claims: %w", ErrOIDC, err)
	}
	var name string
	if err := json.Unmarshal(claims[o.cfg.UsernameClaim], &name); err != nil || name == "" {
		return nil, fmt.Errorf("%w: claim %q is missing or not a non-empty string", ErrOIDC, o.cfg.UsernameClaim)
	}
	if o.cfg.UsernameClaim == "email" {
		if raw, ok := claims["email_verified"]; ok {
			var verified bool
			if err := json.Unmarshal(raw, &verified); err != nil || !verified {
				return nil, fmt.Errorf("%w: email %q is not verified", ErrOIDC, name)
			}
		}
	}
	u := &user.DefaultInfo{Name: name, UID: tok.Subject}
	if o.cfg.GroupsClaim != "" {
		if raw, ok := claims[o.cfg.GroupsClaim]; ok {
			groups, err := stringOrList(raw)
			if err != nil {
				return nil, fmt.Errorf("%w: claim %q: %w", ErrOIDC, o.cfg.GroupsClaim, err)
			}
			u.Groups = groups
		}
	}
	if err := o.naming.apply(u); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOIDC, err)
	}
	return &expiringUser{DefaultInfo: u, expires: tok.Expiry}, nil
}

// stringOrList decodes a claim that is a string or a list of strings.
func stringOrList(raw json.RawMessage) ([]string, error) {
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err != nil {
		return nil, errors.New("want a string or a list of strings")
	}
	return []string{one}, nil
}

// unverifiedIssuer reads "iss" from a JWT payload without checking the
// signature. It only routes the token to the right authenticator; the
// verifier checks everything afterwards.
func unverifiedIssuer(token string) (string, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", false
	}
	var c struct {
		Iss string `json:"iss"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", false
	}
	return c.Iss, true
}
