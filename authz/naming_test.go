package authz

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/internal/testissuer"
)

func TestNaming(t *testing.T) {
	tests := []struct {
		name   string
		naming Naming
		user   string
		groups []string
		want   string
		wantGs []string
		err    bool
	}{
		{"zero", Naming{}, "alice", []string{"devs"}, "alice", []string{"devs"}, false},
		{"prefixes", Naming{UsernamePrefix: "oidc:", GroupsPrefix: "oidc:"}, "alice", []string{"devs"}, "oidc:alice", []string{"oidc:devs"}, false},
		{"service account refused", Naming{}, "system:serviceaccount:ns:sa", nil, "", nil, true},
		{"system group refused", Naming{}, "alice", []string{"devs", "system:masters"}, "", nil, true},
		{
			"a prefix defuses system names",
			Naming{UsernamePrefix: "oidc:", GroupsPrefix: "oidc:"},
			"system:serviceaccount:ns:sa",
			[]string{"system:masters"},
			"oidc:system:serviceaccount:ns:sa",
			[]string{"oidc:system:masters"},
			false,
		},
		{"a prefix can make a system name", Naming{UsernamePrefix: "system:"}, "node", nil, "", nil, true},
		{
			"allowed",
			Naming{AllowSystemNames: true},
			"system:serviceaccount:ns:sa",
			[]string{"system:masters"},
			"system:serviceaccount:ns:sa",
			[]string{"system:masters"},
			false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := &user.DefaultInfo{Name: tt.user, Groups: slices.Clone(tt.groups)}
			err := tt.naming.apply(u)
			if tt.err {
				if !errors.Is(err, ErrReservedName) {
					t.Fatalf("got %v, want ErrReservedName", err)
				}
				return
			}
			if err != nil || u.Name != tt.want || !slices.Equal(u.Groups, tt.wantGs) {
				t.Fatalf("got %q %q %v; want %q %q", u.Name, u.Groups, err, tt.want, tt.wantGs)
			}
		})
	}
}

// TestTokenFileReload: a TokenFile follows its file; a removed token, or
// one whose line now names someone else, stops working and its identity is
// revoked; an unchanged line keeps its identity unrevoked; a file that
// stops parsing changes nothing.
func TestTokenFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.csv")
	write := func(content string) {
		t.Helper()
		// Write to a new file and rename it over the old one, as a
		// Secret mount swaps files.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("t-alice,alice,1\nt-bob,bob,2\nt-carol,carol,3\n")
	tf, err := OpenTokenFile(path, TokenFileOptions{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tf.Run(ctx) }()
	defer func() { cancel(); <-done }()

	auth := func(token string) (*tokenUser, error) {
		u, err := tf.Authenticate(ctx, Credentials{Token: token})
		if err != nil {
			return nil, err
		}
		return u.(*tokenUser), nil
	}
	alice, _ := auth("t-alice")
	bob, _ := auth("t-bob")
	carol, _ := auth("t-carol")
	if alice == nil || bob == nil || carol == nil {
		t.Fatal("the first table did not authenticate its tokens")
	}

	write("t-alice,alice,1\nt-carol,mallory,3\nt-dave,dave,4\n")
	revokedWithin := func(u *tokenUser, d time.Duration) bool {
		select {
		case <-u.Revoked():
			return true
		case <-time.After(d):
			return false
		}
	}
	if !revokedWithin(bob, 5*time.Second) {
		t.Fatal("a removed token was not revoked within 5 s")
	}
	if !revokedWithin(carol, time.Second) {
		t.Error("a token whose line now names another user was not revoked")
	}
	if revokedWithin(alice, 100*time.Millisecond) {
		t.Error("an unchanged line was revoked")
	}
	if _, err := auth("t-bob"); !errors.Is(err, ErrNotApplicable) {
		t.Errorf("removed token: %v", err)
	}
	if u, err := auth("t-carol"); err != nil || u.Name != "mallory" {
		t.Errorf("re-pointed token: %v %v", u, err)
	}
	if u, err := auth("t-dave"); err != nil || u.Name != "dave" {
		t.Errorf("added token: %v %v", u, err)
	}

	write("t-alice,alice\n") // too few columns
	time.Sleep(200 * time.Millisecond)
	if u, err := auth("t-dave"); err != nil || u.Name != "dave" || tf.Len() != 3 {
		t.Errorf("a broken file changed the table: %v %v, %d tokens", u, err, tf.Len())
	}
	if revokedWithin(alice, 50*time.Millisecond) {
		t.Error("a broken file revoked a token")
	}
}

// TestOIDCNaming: OIDC usernames get kube-apiserver's default prefix (the
// issuer and "#", except for the email claim), "-" turns it off, and a
// token whose claims name a ServiceAccount or a system: group is refused
// unless allowed.
func TestOIDCNaming(t *testing.T) {
	iss := testissuer.New(t)
	ctx := context.Background()
	now := time.Now()
	token := func(sub string, groups ...string) string {
		return iss.Sign(t, iss.Key, map[string]any{
			"iss": iss.Server.URL, "aud": "fleetgraph", "sub": sub, "email": sub + "@example.com", "email_verified": true,
			"groups": groups, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		})
	}
	tests := []struct {
		name       string
		cfg        OIDCConfig
		token      string
		wantUser   string
		wantGroups []string
		reserved   bool
	}{
		{"default prefix for sub", OIDCConfig{}, token("alice", "devs"), iss.Server.URL + "#alice", []string{"devs"}, false},
		{"no default prefix for email", OIDCConfig{UsernameClaim: "email"}, token("alice"), "alice@example.com", []string{}, false},
		{"explicit prefixes", OIDCConfig{UsernamePrefix: "oidc:", GroupsPrefix: "oidc:"}, token("alice", "devs"), "oidc:alice", []string{"oidc:devs"}, false},
		{"dash disables the prefix", OIDCConfig{UsernamePrefix: "-"}, token("alice"), "alice", []string{}, false},
		{
			"prefixed service account name is a plain user",
			OIDCConfig{},
			token("system:serviceaccount:kube-system:default"),
			iss.Server.URL + "#system:serviceaccount:kube-system:default",
			[]string{},
			false,
		},
		{"unprefixed service account refused", OIDCConfig{UsernamePrefix: "-"}, token("system:serviceaccount:kube-system:default"), "", nil, true},
		{"system group refused", OIDCConfig{}, token("alice", "devs", "system:masters"), "", nil, true},
		{"groups prefix defuses system groups", OIDCConfig{GroupsPrefix: "idp:"}, token("alice", "system:masters"), iss.Server.URL + "#alice", []string{"idp:system:masters"}, false},
		{
			"allowed",
			OIDCConfig{UsernamePrefix: "-", AllowSystemNames: true},
			token("system:serviceaccount:ns:sa", "system:masters"),
			"system:serviceaccount:ns:sa",
			[]string{"system:masters"},
			false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.IssuerURL, cfg.ClientID, cfg.GroupsClaim, cfg.HTTPClient = iss.Server.URL, "fleetgraph", "groups", iss.Server.Client()
			a, err := NewOIDC(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			u, err := a.Authenticate(ctx, Credentials{Token: tt.token})
			if tt.reserved {
				if !errors.Is(err, ErrOIDC) || !errors.Is(err, ErrReservedName) {
					t.Fatalf("got %v, %v; want ErrReservedName", u, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if u.GetName() != tt.wantUser || !slices.Equal(nonNilStrings(u.GetGroups()), tt.wantGroups) {
				t.Errorf("got %q %q, want %q %q", u.GetName(), u.GetGroups(), tt.wantUser, tt.wantGroups)
			}
		})
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func TestRequestHeaderSystemNames(t *testing.T) {
	proxyCA := newCA(t, "proxy-ca")
	pool := x509.NewCertPool()
	pool.AddCert(proxyCA.cert)
	cert := proxyCA.issue(t, "front-proxy", x509.ExtKeyUsageClientAuth)
	h := http.Header{}
	h.Set("X-Remote-User", "alice")
	h.Add("X-Remote-Group", "system:masters")
	for _, allow := range []bool{false, true} {
		rh, err := NewRequestHeader(RequestHeaderConfig{ClientCA: pool, Naming: Naming{AllowSystemNames: allow}})
		if err != nil {
			t.Fatal(err)
		}
		u, err := rh.Authenticate(context.Background(), Credentials{Header: h, TLS: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}})
		if allow && (err != nil || !slices.Contains(u.GetGroups(), "system:masters")) {
			t.Errorf("allowed: %v %v", u, err)
		}
		if !allow && !errors.Is(err, ErrReservedName) {
			t.Errorf("not allowed: got %v, %v; want ErrReservedName", u, err)
		}
	}
	if !strings.Contains(ErrReservedName.Error(), "system:") {
		t.Errorf("ErrReservedName does not say which names: %v", ErrReservedName)
	}
}
