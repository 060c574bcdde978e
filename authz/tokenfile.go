package authz

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"
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
// token or user, or a token that appears twice is an error naming the line.
//
// Tokens are kept as SHA-256 digests, so lookups do not compare secrets
// byte by byte and the table holds no usable secret.
type StaticTokens struct {
	users map[[sha256.Size]byte]*user.DefaultInfo
}

// LoadStaticTokens reads a token file from disk.
func LoadStaticTokens(path string) (*StaticTokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading token file: %w", err)
	}
	return ParseStaticTokens(bytes.NewReader(data), path)
}

// ParseStaticTokens reads a token file; name is used in error messages.
func ParseStaticTokens(r io.Reader, name string) (*StaticTokens, error) {
	st := &StaticTokens{users: make(map[[sha256.Size]byte]*user.DefaultInfo)}
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
		u := &user.DefaultInfo{Name: username, UID: record[2]}
		if len(record) >= 4 && record[3] != "" {
			for _, g := range strings.Split(record[3], ",") {
				if g = strings.TrimSpace(g); g != "" {
					u.Groups = append(u.Groups, g)
				}
			}
		}
		st.users[sum] = u
	}
	return st, nil
}

// Len returns the number of tokens.
func (s *StaticTokens) Len() int { return len(s.users) }

// Authenticate implements Authenticator. A token that is not in the file is
// ErrNotApplicable, so that other token authenticators get a chance.
func (s *StaticTokens) Authenticate(_ context.Context, c Credentials) (user.Info, error) {
	if c.Token == "" {
		return nil, ErrNotApplicable
	}
	u, ok := s.users[sha256.Sum256([]byte(c.Token))]
	if !ok {
		return nil, fmt.Errorf("static token: unknown token: %w", ErrNotApplicable)
	}
	cp := *u // callers get their own value; Groups is shared and read-only
	return &cp, nil
}
