package ui_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetgraph/fleetgraph/ui"
)

func serve(t *testing.T, h http.Handler, method, path string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPagesAndAssets checks that every page is served with its security
// headers and that every script and style a page names is embedded: a
// build that lost a file, or a page that loads anything from another host,
// fails here.
func TestPagesAndAssets(t *testing.T) {
	h, err := ui.NewHandler()
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile(`(?:src|href)="([^"]+)"`)
	for _, page := range append([]string{ui.GraphiQLPath}, ui.Pages...) {
		t.Run(page, func(t *testing.T) {
			res := serve(t, h, http.MethodGet, page, nil)
			html := body(t, res)
			if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
				t.Fatalf("%s: %d %s", page, res.StatusCode, res.Header.Get("Content-Type"))
			}
			if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
				t.Errorf("%s: CSP %q", page, csp)
			}
			if res.Header.Get("Cache-Control") != "no-cache" {
				t.Errorf("%s: Cache-Control %q", page, res.Header.Get("Cache-Control"))
			}
			refs := ref.FindAllStringSubmatch(html, -1)
			if len(refs) == 0 {
				t.Fatalf("%s names no asset:\n%s", page, html)
			}
			for _, m := range refs {
				u := m[1]
				if strings.HasPrefix(u, "data:") {
					continue // inline, e.g. the empty favicon
				}
				if !strings.HasPrefix(u, "/assets/") {
					t.Errorf("%s loads %q, not an embedded asset", page, u)
					continue
				}
				a := serve(t, h, http.MethodGet, u, nil)
				if a.StatusCode != http.StatusOK || !strings.Contains(a.Header.Get("Cache-Control"), "immutable") {
					t.Errorf("%s: asset %s: %d %q", page, u, a.StatusCode, a.Header.Get("Cache-Control"))
				}
			}
		})
	}
}

func TestGzipAndConditionalRequests(t *testing.T) {
	h, err := ui.NewHandler()
	if err != nil {
		t.Fatal(err)
	}
	plain := serve(t, h, http.MethodGet, "/", nil)
	want := body(t, plain)
	zipped := serve(t, h, http.MethodGet, "/", map[string]string{"Accept-Encoding": "br, gzip"})
	if zipped.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader([]byte(body(t, zipped))))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil || string(got) != want {
			t.Fatalf("gzipped page differs (%v)", err)
		}
	}
	etag := plain.Header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	if res := serve(t, h, http.MethodGet, "/", map[string]string{"If-None-Match": etag}); res.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match: %d", res.StatusCode)
	}
}

func TestRefusesWhatItDoesNotServe(t *testing.T) {
	h, err := ui.NewHandler()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/assets/nope.js", http.StatusNotFound},
		{http.MethodGet, "/index.html", http.StatusNotFound},
		{http.MethodGet, "/../ui.go", http.StatusNotFound},
		{http.MethodGet, "/assets/../index.html", http.StatusNotFound},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
	} {
		if res := serve(t, h, c.method, c.path, nil); res.StatusCode != c.code {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, res.StatusCode, c.code)
		}
	}
	if res := serve(t, h, http.MethodHead, "/", nil); res.StatusCode != http.StatusOK || body(t, res) != "" {
		t.Errorf("HEAD /: %d", res.StatusCode)
	}
}
