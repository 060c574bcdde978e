package authz

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/internal/filewatch"
)

// ErrTokenFile means a token file could not be parsed. The wrapping error
// names the file and line.
var ErrTokenFile = errors.New("malformed token file")

// StaticTokens authenticates bearer tokens listed in a file in the format
// of kube-apiserver's --token-auth-file, so that the same file can serve a
// test cluster and fleetgraph:
//
//	token,user,uid,"group1,group2"
//
// The groups column is optional. It is stricter than kube-apiserver, which
// only logs some mistakes: a line with fewer than three columns, an empty
// token or user, a token that appears twice, or a user or group the
// table's Naming does not allow (a system: name) is an error naming the
// line.
//
// Tokens are kept as SHA-256 digests, so lookups do not compare secrets
// byte by byte and the table holds no usable secret. A StaticTokens never
// changes; TokenFile swaps whole tables when its file changes.
type StaticTokens struct {
	entries map[[sha256.Size]byte]*tokenEntry
}

// tokenEntry is one line of a token file. Its user is never modified after
// parsing; revoked is closed when a reloaded file no longer grants the same
// identity for the token.
type tokenEntry struct {
	user    user.DefaultInfo
	revoked chan struct{}
}

// tokenUser is the identity a static token established; it is Revocable.
type tokenUser struct {
	*user.DefaultInfo
	revoked <-chan struct{}
}

// Revoked implements Revocable.
func (u *tokenUser) Revoked() <-chan struct{} { return u.revoked }

// ParseStaticTokens reads a token file; name is used in error messages and
// naming applies to every line.
func ParseStaticTokens(r io.Reader, name string, naming Naming) (*StaticTokens, error) {
	st := &StaticTokens{entries: make(map[[sha256.Size]byte]*tokenEntry)}
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.Comment = '#'
	firstLine := make(map[[sha256.Size]byte]int)
	for {
		record, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			// csv.ParseError carries its own line number.
			return nil, fmt.Errorf("%w %s: %w", ErrTokenFile, name, err)
		}
		if len(record) < 3 {
			return nil, fmt.Errorf("%w %s, line %d: want at least 3 columns (token, user name, user uid), found %d",
				ErrTokenFile, name, line, len(record))
		}
		token, username := record[0], record[1]
		if token == "" {
			return nil, fmt.Errorf("%w %s, line %d: empty token", ErrTokenFile, name, line)
		}
		if username == "" {
			return nil, fmt.Errorf("%w %s, line %d: empty user name", ErrTokenFile, name, line)
		}
		sum := sha256.Sum256([]byte(token))
		if prev, dup := firstLine[sum]; dup {
			return nil, fmt.Errorf("%w %s, line %d: duplicate token (first on line %d)", ErrTokenFile, name, line, prev)
		}
		firstLine[sum] = line
		e := &tokenEntry{user: user.DefaultInfo{Name: username, UID: record[2]}, revoked: make(chan struct{})}
		if len(record) >= 4 && record[3] != "" {
			for _, g := range strings.Split(record[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					e.user.Groups = append(e.user.Groups, g)
				}
			}
		}
		if err := naming.apply(&e.user); err != nil {
			return nil, fmt.Errorf("%w %s, line %d: %w", ErrTokenFile, name, line, err)
		}
		st.entries[sum] = e
	}
	return st, nil
}

// Len returns the number of tokens.
func (s *StaticTokens) Len() int { return len(s.entries) }

// Authenticate implements Authenticator. A token that is not in the file is
// ErrNotApplicable, so that other token authenticators get a chance.
func (s *StaticTokens) Authenticate(_ context.Context, c Credentials) (user.Info, error) {
	if c.Token == "" {
		return nil, ErrNotApplicable
	}
	e, ok := s.entries[sha256.Sum256([]byte(c.Token))]
	if !ok {
		return nil, fmt.Errorf("static token: unknown token: %w", ErrNotApplicable)
	}
	cp := e.user // callers get their own value; Groups is shared and read-only
	return &tokenUser{DefaultInfo: &cp, revoked: e.revoked}, nil
}

// TokenFileOptions configures a TokenFile. The zero value takes defaults.
type TokenFileOptions struct {
	// Naming applies to every line (see Naming; by default system: users
	// and groups are refused).
	Naming Naming
	// Interval is how often Run re-reads the file (default
	// filewatch.DefaultInterval, 1 s).
	Interval time.Duration
	// Logger receives the errors of reloads; nil means slog.Default().
	Logger *slog.Logger
}

// TokenFile is StaticTokens read from a file and kept in step with it while
// Run runs: a token added to the file works within Interval, and a token
// removed from it, or whose line now names another user, uid or groups,
// stops working within Interval. The identities a removed token
// established are revoked (see Revocable), so long-lived connections made
// with it end too. A file that stops parsing keeps the last good table and
// the error is logged.
//
// TokenFile starts no goroutine; Run re-reads the file in the caller's.
type TokenFile struct {
	opts   TokenFileOptions
	file   *filewatch.File
	tokens atomic.Pointer[StaticTokens]
}

// OpenTokenFile reads a token file. Call Run to keep it current.
func OpenTokenFile(path string, opts TokenFileOptions) (*TokenFile, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	f := &TokenFile{opts: opts}
	f.file = filewatch.New(path, f.load)
	if err := f.file.Load(); err != nil {
		return nil, err
	}
	return f, nil
}

// load parses a new content and swaps it in, carrying over the entries
// whose token grants the same identity as before and revoking the others.
func (f *TokenFile) load(content []byte) error {
	next, err := ParseStaticTokens(bytes.NewReader(content), f.file.Path(), f.opts.Naming)
	if err != nil {
		return err
	}
	prev := f.tokens.Load()
	if prev == nil {
		f.tokens.Store(next)
		return nil
	}
	for sum, e := range next.entries {
		if old, ok := prev.entries[sum]; ok && sameUser(&old.user, &e.user) {
			next.entries[sum] = old
		}
	}
	f.tokens.Store(next)
	revoked := 0
	for sum, old := range prev.entries {
		if next.entries[sum] != old {
			close(old.revoked)
			revoked++
		}
	}
	f.opts.Logger.Info("token file reloaded", "file", f.file.Path(), "tokens", next.Len(), "revoked", revoked)
	return nil
}

func sameUser(a, b *user.DefaultInfo) bool {
	return a.Name == b.Name && a.UID == b.UID && slices.Equal(a.Groups, b.Groups)
}

// Run re-reads the file every Interval until ctx ends.
func (f *TokenFile) Run(ctx context.Context) {
	f.file.Run(ctx, f.opts.Interval, func(err error) {
		f.opts.Logger.Error("token file not reloaded; keeping the previous tokens", "err", err)
	})
}

// Len returns the number of tokens now.
func (f *TokenFile) Len() int { return f.tokens.Load().Len() }

// Authenticate implements Authenticator with the current table.
func (f *TokenFile) Authenticate(ctx context.Context, c Credentials) (user.Info, error) {
	return f.tokens.Load().Authenticate(ctx, c)
}
