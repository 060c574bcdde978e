package ui

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
)

//go:embed all:dist
var dist embed.FS

// Pages are the paths that serve the dashboard's index.html; the dashboard
// routes between them in the browser, and each can be reloaded or shared.
var Pages = []string{"/", "/objects", "/object"}

// GraphiQLPath is where GraphiQL is served.
const GraphiQLPath = "/graphiql"

// contentSecurityPolicy lets the pages load only their own assets and talk
// only to their own origin (websockets included), and keeps them out of
// frames. Inline styles are allowed because Svelte and GraphiQL set style
// attributes.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; font-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// asset is one embedded file, ready to serve. Its gzipped form is made on
// the first request that accepts it.
type asset struct {
	body        []byte
	contentType string
	etag        string
	immutable   bool // content-hashed name under assets/

	gzipOnce sync.Once
	gzipped  []byte // nil when not worth it
}

// Handler serves the embedded pages. It answers GET and HEAD only; any
// other path than the pages, GraphiQL and their assets is a 404.
type Handler struct {
	files map[string]*asset // by URL path
}

// NewHandler returns a handler of the embedded build. It fails only if the
// binary was built without it, which the package's tests rule out. The
// build is immutable, so its table is read once per process and shared.
func NewHandler() (*Handler, error) {
	files, err := loadFiles()
	if err != nil {
		return nil, err
	}
	return &Handler{files: files}, nil
}

var loadFiles = sync.OnceValues(readBuild)

func readBuild() (map[string]*asset, error) {
	h := &Handler{files: map[string]*asset{}}
	err := fs.WalkDir(dist, "dist", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := dist.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, "dist/")
		if !strings.HasPrefix(rel, "assets/") {
			return nil // the pages are served under their routes below
		}
		a := newAsset(rel, body)
		a.immutable = true
		h.files["/"+rel] = a
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ui: reading the embedded build: %w", err)
	}
	pages := map[string]string{GraphiQLPath: "graphiql.html"}
	for _, p := range Pages {
		pages[p] = "index.html"
	}
	for route, file := range pages {
		body, err := dist.ReadFile("dist/" + file)
		if err != nil {
			return nil, fmt.Errorf("ui: the embedded build has no %s (run make ui): %w", file, err)
		}
		h.files[route] = newAsset(file, body)
	}
	return h.files, nil
}

func newAsset(name string, body []byte) *asset {
	sum := sha256.Sum256(body)
	a := &asset{body: body, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
	a.contentType = mime.TypeByExtension(path.Ext(name))
	if a.contentType == "" {
		a.contentType = "application/octet-stream"
	}
	return a
}

// gzip returns the gzipped body, or nil when the asset is not worth
// compressing.
func (a *asset) gzip() []byte {
	a.gzipOnce.Do(func() {
		if !compressible(a.contentType) || len(a.body) < 1024 {
			return
		}
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(a.body); err != nil {
			return // a bytes.Buffer does not fail; serve uncompressed if it did
		}
		if zw.Close() == nil && buf.Len() < len(a.body) {
			a.gzipped = buf.Bytes()
		}
	})
	return a.gzipped
}

func compressible(contentType string) bool {
	for _, p := range []string{"text/", "application/javascript", "text/javascript", "application/json", "image/svg+xml"} {
		if strings.HasPrefix(contentType, p) {
			return true
		}
	}
	return false
}

// Has reports whether the handler serves a path, so that a mux can route
// only those paths here.
func (h *Handler) Has(urlPath string) bool {
	_, ok := h.files[urlPath]
	return ok
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	a, ok := h.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", a.contentType)
	hdr.Set("ETag", a.etag)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Vary", "Accept-Encoding")
	if a.immutable {
		hdr.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		// Pages change with every release; their assets never do.
		hdr.Set("Cache-Control", "no-cache")
		hdr.Set("Content-Security-Policy", contentSecurityPolicy)
		hdr.Set("Referrer-Policy", "no-referrer")
		hdr.Set("X-Frame-Options", "DENY")
	}
	if match := r.Header.Get("If-None-Match"); match != "" && match == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := a.body
	if acceptsGzip(r) {
		if z := a.gzip(); z != nil {
			hdr.Set("Content-Encoding", "gzip")
			body = z
		}
	}
	hdr.Set("Content-Length", fmt.Sprint(len(body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.TrimSpace(q) != "q=0" {
			return true
		}
	}
	return false
}
