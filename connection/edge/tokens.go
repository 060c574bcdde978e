package edge

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/fleetgraph/fleetgraph/internal/filewatch"
)

// Tokens decides which cluster a Hello's token may claim.
type Tokens interface {
	// Cluster returns the cluster a token belongs to, or false for an
	// unknown token.
	Cluster(token string) (cluster string, ok bool)
}

// StaticTokens is a fixed token -> cluster table. Tokens are kept as
// SHA-256 digests, so a lookup is a map access whose timing does not depend
// on how much of a guessed token matches, and the table holds no secret a
// heap dump would reveal.
type StaticTokens struct {
	byDigest map[[sha256.Size]byte]string
}

// NewStaticTokens builds a table from token -> cluster.
func NewStaticTokens(tokens map[string]string) *StaticTokens {
	t := &StaticTokens{byDigest: make(map[[sha256.Size]byte]string, len(tokens))}
	for tok, cluster := range tokens {
		t.byDigest[sha256.Sum256([]byte(tok))] = cluster
	}
	return t
}

// Cluster implements Tokens.
func (t *StaticTokens) Cluster(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	c, ok := t.byDigest[sha256.Sum256([]byte(token))]
	return c, ok
}

// ErrTokenFile is returned for an edge tokens file that does not parse.
var ErrTokenFile = errors.New("edge tokens file")

// ParseTokens reads the edge tokens format: one "token,cluster" per line.
// Blank lines and lines starting with # are ignored; spaces around fields
// are trimmed. A cluster may have several tokens (for rotation), but a
// token names one cluster.
func ParseTokens(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		tok, cluster, ok := strings.Cut(line, ",")
		tok, cluster = strings.TrimSpace(tok), strings.TrimSpace(cluster)
		switch {
		case !ok || tok == "" || cluster == "" || strings.Contains(cluster, ","):
			return nil, fmt.Errorf("%w: line %d: want token,cluster", ErrTokenFile, n)
		case out[tok] != "" && out[tok] != cluster:
			return nil, fmt.Errorf("%w: line %d: the token is given for clusters %q and %q", ErrTokenFile, n, out[tok], cluster)
		}
		out[tok] = cluster
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenFile, err)
	}
	return out, nil
}

// TokenFile is Tokens read from a file in the ParseTokens format. It
// re-reads the file when a lookup finds it unchecked for tokenFileCheck and
// its content has changed (internal/filewatch compares digests, so a
// rewrite within one modification-time tick or a Secret's symlink swap is
// seen), so tokens can be added, rotated and removed without a restart.
// The Hub looks its sessions' tokens up every second, so a removed token
// ends its session within a few seconds. A file that stops parsing keeps
// the last good table, and the error is logged.
type TokenFile struct {
	logger *slog.Logger

	mu      sync.Mutex
	file    *filewatch.File
	tokens  *StaticTokens
	checked time.Time
}

// tokenFileCheck bounds how often a TokenFile reads its file: Hellos can
// arrive in bursts when a manager restarts and every edge reconnects.
const tokenFileCheck = time.Second

// LoadTokenFile reads an edge tokens file. logger (nil means
// slog.Default()) receives errors of later reloads.
func LoadTokenFile(path string, logger *slog.Logger) (*TokenFile, error) {
	if logger == nil {
		logger = slog.Default()
	}
	f := &TokenFile{logger: logger}
	f.file = filewatch.New(path, f.load)
	if err := f.file.Load(); err != nil {
		if !errors.Is(err, ErrTokenFile) {
			err = fmt.Errorf("%w: %w", ErrTokenFile, err)
		}
		return nil, err
	}
	f.checked = time.Now()
	return f, nil
}

// load parses a new content; f.mu is held (by Reload or Cluster), or f is
// not shared yet.
func (f *TokenFile) load(content []byte) error {
	tokens, err := ParseTokens(content)
	if err != nil {
		return fmt.Errorf("%s: %w", f.file.Path(), err)
	}
	f.tokens = NewStaticTokens(tokens)
	return nil
}

// Reload reads the file now.
func (f *TokenFile) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checked = time.Now()
	return f.file.Load()
}

// Cluster implements Tokens.
func (f *TokenFile) Cluster(token string) (string, bool) {
	f.mu.Lock()
	if time.Since(f.checked) >= tokenFileCheck {
		f.checked = time.Now()
		if err := f.file.Load(); err != nil {
			f.logger.Error("edge tokens file not reloaded; keeping the previous tokens", "err", err)
		}
	}
	t := f.tokens
	f.mu.Unlock()
	return t.Cluster(token)
}
