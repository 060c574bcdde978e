package authz

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/goleak"

	"github.com/fleetgraph/fleetgraph/internal/testissuer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStaticTokens(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.csv")
	content := `# comment lines are skipped
token-alice,alice,uid-1,"devs,ops"
token-bob,bob,uid-2

token-carol,carol,uid-3,
`
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := OpenTokenFile(path, TokenFileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Len() != 3 {
		t.Fatalf("%d tokens, want 3", st.Len())
	}
	ctx := context.Background()
	tests := []struct {
		token  string
		user   string
		groups []string
		err    error
	}{
		{"token-alice", "alice", []string{"devs", "ops"}, nil},
		{"token-bob", "bob", nil, nil},
		{"token-carol", "carol", nil, nil},
		{"nope", "", nil, ErrNotApplicable},
		{"", "", nil, ErrNotApplicable},
	}
	for _, tt := range tests {
		u, err := st.Authenticate(ctx, Credentials{Token: tt.token})
		if !errors.Is(err, tt.err) || (err == nil && tt.err != nil) {
			t.Errorf("token %q: err %v, want %v", tt.token, err, tt.err)
			continue
		}
		if err == nil && (u.GetName() != tt.user || !slices.Equal(u.GetGroups(), tt.groups)) {
			t.Errorf("token %q: got %q %q", tt.token, u.GetName(), u.GetGroups())
		}
	}
	if _, err := OpenTokenFile(filepath.Join(dir, "missing.csv"), TokenFileOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestStaticTokensMalformed(t *testing.T) {
	tests := []struct {
		name    string
		content string
		line    string
	}{
		{"too few columns", "t1,alice,1\nt2,bob\n", "line 2"},
		{"empty token", "t1,alice,1\n,bob,2\n", "line 2"},
		{"empty user", "t1,,1\n", "line 1"},
		{"duplicate token", "t1,alice,1\nt2,bob,2\nt1,carol,3\n", "line 3"},
		{"bad quoting", "t1,alice,1\nt2,\"bob,2\n", "line 2"},
		{"service account user", "t1,alice,1\nt2,system:serviceaccount:kube-system:default,2\n", "line 2"},
		{"system group", "t1,alice,1,\"devs,system:masters\"\n", "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseStaticTokens(strings.NewReader(tt.content), "tokens.csv", Naming{})
			if !errors.Is(err, ErrTokenFile) {
				t.Fatalf("err %v, want ErrTokenFile", err)
			}
			if !strings.Contains(err.Error(), tt.line) || !strings.Contains(err.Error(), "tokens.csv") {
				t.Errorf("error %q should name the file and %s", err, tt.line)
			}
		})
	}
}

func TestOIDC(t *testing.T) {
	iss := testissuer.New(t)
	ctx := context.Background()
	a, err := NewOIDC(ctx, OIDCConfig{
		IssuerURL:     iss.Server.URL,
		ClientID:      "fleetgraph",
		UsernameClaim: "email",
		GroupsClaim:   "groups",
		HTTPClient:    iss.Server.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claims := func(mut func(map[string]any)) map[string]any {
		c := map[string]any{
			"iss": iss.Server.URL, "aud": "fleetgraph", "sub": "u-1",
			"email": "alice@example.com", "email_verified": true,
			"groups": []string{"devs", "ops"},
			"iat":    now.Unix(), "exp": now.Add(time.Hour).Unix(),
		}
		if mut != nil {
			mut(c)
		}
		return c
	}
	var expired *oidc.TokenExpiredError

	t.Run("good", func(t *testing.T) {
		u, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(nil))})
		if err != nil {
			t.Fatal(err)
		}
		if u.GetName() != "alice@example.com" || !slices.Equal(u.GetGroups(), []string{"devs", "ops"}) || u.GetUID() != "u-1" {
			t.Errorf("got %q %q %q", u.GetName(), u.GetGroups(), u.GetUID())
		}
		// The token's exp is when long-lived connections must end.
		if exp, ok := ExpiresAt(u); !ok || exp.Unix() != now.Add(time.Hour).Unix() {
			t.Errorf("ExpiresAt = %v, %v; want the token's exp %v", exp, ok, now.Add(time.Hour))
		}
	})
	t.Run("single group string", func(t *testing.T) {
		u, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(func(c map[string]any) { c["groups"] = "devs" }))})
		if err != nil || !slices.Equal(u.GetGroups(), []string{"devs"}) {
			t.Fatalf("got %v, %v", u, err)
		}
	})
	t.Run("expired", func(t *testing.T) {
		_, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(func(c map[string]any) {
			c["iat"], c["exp"] = now.Add(-2*time.Hour).Unix(), now.Add(-time.Hour).Unix()
		}))})
		if !errors.Is(err, ErrOIDC) || !errors.As(err, &expired) {
			t.Fatalf("got %v, want an expiry error", err)
		}
	})
	t.Run("wrong audience", func(t *testing.T) {
		_, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(func(c map[string]any) { c["aud"] = "someone-else" }))})
		if !errors.Is(err, ErrOIDC) || !strings.Contains(err.Error(), "audience") {
			t.Fatalf("got %v, want an audience error", err)
		}
	})
	t.Run("wrong signature", func(t *testing.T) {
		_, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, otherKey, claims(nil))})
		if !errors.Is(err, ErrOIDC) || !strings.Contains(err.Error(), "signature") {
			t.Fatalf("got %v, want a signature error", err)
		}
	})
	t.Run("unverified email", func(t *testing.T) {
		_, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(func(c map[string]any) { c["email_verified"] = false }))})
		if !errors.Is(err, ErrOIDC) {
			t.Fatalf("got %v, want ErrOIDC", err)
		}
	})
	t.Run("missing username claim", func(t *testing.T) {
		_, err := a.Authenticate(ctx, Credentials{Token: iss.Sign(t, iss.Key, claims(func(c map[string]any) { delete(c, "email") }))})
		if !errors.Is(err, ErrOIDC) {
			t.Fatalf("got %v, want ErrOIDC", err)
		}
	})
	t.Run("other issuer or not a JWT is not applicable", func(t *testing.T) {
		for _, tok := range []string{
			iss.Sign(t, iss.Key, claims(func(c map[string]any) { c["iss"] = "https://elsewhere.example" })),
			"opaque-static-token",
			"a.b.c",
		} {
			if _, err := a.Authenticate(ctx, Credentials{Token: tok}); !errors.Is(err, ErrNotApplicable) {
				t.Errorf("token %.20q: got %v, want ErrNotApplicable", tok, err)
			}
		}
	})
	t.Run("discovery failure", func(t *testing.T) {
		if _, err := NewOIDC(ctx, OIDCConfig{IssuerURL: iss.Server.URL + "/nope", ClientID: "x", HTTPClient: iss.Server.Client()}); err == nil {
			t.Fatal("want a discovery error")
		}
	})
}

// testPKI issues certificates for request-header tests.
type testPKI struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newCA(t *testing.T, name string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{cert: cert, key: key}
}

func (ca *testPKI) issue(t *testing.T, cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	t.Helper()
	cert, _ := ca.issueWithKey(t, cn, usage)
	return cert
}

func (ca *testPKI) issueWithKey(t *testing.T, cn string, usage x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func TestRequestHeader(t *testing.T) {
	proxyCA := newCA(t, "proxy-ca")
	otherCA := newCA(t, "other-ca")
	pool := x509.NewCertPool()
	pool.AddCert(proxyCA.cert)
	rh, err := NewRequestHeader(RequestHeaderConfig{ClientCA: pool, AllowedNames: []string{"front-proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	headers := func() http.Header {
		h := http.Header{}
		h.Set("X-Remote-User", "alice")
		h.Add("X-Remote-Group", "devs")
		h.Add("X-Remote-Group", "ops")
		h.Set("X-Remote-Extra-Scopes", "read")
		return h
	}
	tlsWith := func(certs ...*x509.Certificate) *tls.ConnectionState {
		return &tls.ConnectionState{PeerCertificates: certs}
	}
	ctx := context.Background()

	t.Run("valid proxy certificate", func(t *testing.T) {
		u, err := rh.Authenticate(ctx, Credentials{Header: headers(), TLS: tlsWith(proxyCA.issue(t, "front-proxy", x509.ExtKeyUsageClientAuth))})
		if err != nil {
			t.Fatal(err)
		}
		if u.GetName() != "alice" || !slices.Equal(u.GetGroups(), []string{"devs", "ops"}) || !slices.Equal(u.GetExtra()["scopes"], []string{"read"}) {
			t.Errorf("got %q %q %v", u.GetName(), u.GetGroups(), u.GetExtra())
		}
	})
	rejected := []struct {
		name string
		tls  func(t *testing.T) *tls.ConnectionState
	}{
		{"no TLS", func(*testing.T) *tls.ConnectionState { return nil }},
		{"no client certificate", func(*testing.T) *tls.ConnectionState { return tlsWith() }},
		{"certificate from another CA", func(t *testing.T) *tls.ConnectionState {
			return tlsWith(otherCA.issue(t, "front-proxy", x509.ExtKeyUsageClientAuth))
		}},
		{"server-only certificate", func(t *testing.T) *tls.ConnectionState {
			return tlsWith(proxyCA.issue(t, "front-proxy", x509.ExtKeyUsageServerAuth))
		}},
		{"common name not allowed", func(t *testing.T) *tls.ConnectionState {
			return tlsWith(proxyCA.issue(t, "someone", x509.ExtKeyUsageClientAuth))
		}},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := rh.Authenticate(ctx, Credentials{Header: headers(), TLS: tt.tls(t)}); !errors.Is(err, ErrUntrustedProxy) {
				t.Fatalf("got %v, want ErrUntrustedProxy", err)
			}
		})
	}
	t.Run("no identity headers is not applicable", func(t *testing.T) {
		if _, err := rh.Authenticate(ctx, Credentials{Header: http.Header{}}); !errors.Is(err, ErrNotApplicable) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("over a real TLS connection", func(t *testing.T) {
		var got string
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, err := rh.Authenticate(r.Context(), CredentialsFromRequest(r))
			if err != nil {
				got = "error: " + err.Error()
				return
			}
			got = u.GetName()
		}))
		srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
		srv.StartTLS()
		defer srv.Close()
		clientCert, clientKey := proxyCA.issueWithKey(t, "front-proxy", x509.ExtKeyUsageClientAuth)
		client := srv.Client()
		tr := client.Transport.(*http.Transport)
		for _, withCert := range []bool{true, false} {
			if withCert {
				tr.TLSClientConfig.Certificates = []tls.Certificate{{Certificate: [][]byte{clientCert.Raw}, PrivateKey: clientKey}}
			} else {
				tr.TLSClientConfig.Certificates = nil
				tr.CloseIdleConnections()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = headers()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if err := resp.Body.Close(); err != nil {
				t.Fatal(err)
			}
			if withCert && got != "alice" {
				t.Errorf("with proxy certificate: %s", got)
			}
			if !withCert && !strings.Contains(got, "untrusted") {
				t.Errorf("without certificate: %s", got)
			}
		}
		tr.CloseIdleConnections()
	})
}

func TestUnion(t *testing.T) {
	st, err := ParseStaticTokens(strings.NewReader("good,alice,1\n"), "t", Naming{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	rh, err := NewRequestHeader(RequestHeaderConfig{ClientCA: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spoofed := http.Header{"X-Remote-User": []string{"admin"}}
	tests := []struct {
		name      string
		anonymous bool
		creds     Credentials
		user      string
		err       error
	}{
		{"token", false, Credentials{Token: "good"}, "alice", nil},
		{"bad token", false, Credentials{Token: "bad"}, "", ErrInvalidToken},
		{"bad token is never anonymous", true, Credentials{Token: "bad"}, "", ErrInvalidToken},
		{"nothing, anonymous off", false, Credentials{}, "", ErrUnauthenticated},
		{"nothing, anonymous on", true, Credentials{}, "system:anonymous", nil},
		{"spoofed headers are rejected, not anonymous", true, Credentials{Header: spoofed}, "", ErrUntrustedProxy},
		{"a good token wins over spoofed headers", false, Credentials{Token: "good", Header: spoofed}, "alice", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := &Union{Authenticators: []Authenticator{st, rh}, AllowAnonymous: tt.anonymous}
			info, err := u.Authenticate(ctx, tt.creds)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("got %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil || info.GetName() != tt.user {
				t.Fatalf("got %v, %v; want %q", info, err, tt.user)
			}
		})
	}
}

func TestCredentialsFromRequest(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer abc":   "abc",
		"bearer  abc ": "abc",
		"Basic abc":    "",
		"":             "",
		"Bearer":       "",
	} {
		r := httptest.NewRequest(http.MethodGet, "/graphql", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		if got := CredentialsFromRequest(r).Token; got != want {
			t.Errorf("%q: got %q, want %q", header, got, want)
		}
	}
}
