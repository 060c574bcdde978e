package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tunnelHost is the Host of a tunnelled rest.Config. Requests never go to
// it; it is a reserved name (RFC 2606) so a misrouted request fails at
// once.
const tunnelHost = "http://fleetgraph-edge.invalid"

// ErrReadOnly is returned for a tunnelled request that is not a read.
var ErrReadOnly = errors.New("edge tunnel carries only GET and HEAD requests")

// tunnel is the manager side of detail requests: an http.RoundTripper
// that sends each request over the cluster's current edge session. It
// looks the session up per request, so a config obtained before a
// reconnect keeps working after it.
type tunnel struct {
	hub     *Hub
	cluster string
}

// RoundTrip implements http.RoundTripper.
func (t *tunnel) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close() // reads have no body; RoundTrip must close it
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return nil, fmt.Errorf("%w: %s", ErrReadOnly, req.Method)
	}
	s, _ := t.hub.active(t.cluster)
	if s == nil {
		t.hub.metrics.details.WithLabelValues(t.cluster, "not_connected").Inc()
		return nil, fmt.Errorf("%w: the edge of cluster %q is not connected", ErrNotConnected, t.cluster)
	}
	resp, err := s.detail(req.Context(), &DetailRequest{
		Method: req.Method, Path: req.URL.RequestURI(), Header: ForwardHeaders(req.Header),
	})
	if err != nil {
		t.hub.metrics.details.WithLabelValues(t.cluster, "error").Inc()
		return nil, err
	}
	if resp.Error != "" {
		t.hub.metrics.details.WithLabelValues(t.cluster, "edge_error").Inc()
		return nil, fmt.Errorf("edge of cluster %q: %s", t.cluster, resp.Error)
	}
	t.hub.metrics.details.WithLabelValues(t.cluster, "ok").Inc()
	return resp.HTTPResponse(req), nil
}

// HTTPResponse turns a response that carries no Error into the
// *http.Response of req.
func (resp *DetailResponse) HTTPResponse(req *http.Request) *http.Response {
	header := resp.Header
	if header == nil {
		header = http.Header{}
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", resp.Status, http.StatusText(resp.Status)), StatusCode: resp.Status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: header, Body: io.NopCloser(bytes.NewReader(resp.Body)), ContentLength: int64(len(resp.Body)),
		Request: req,
	}
}

// ForwardHeaders keeps the headers a detail read needs: content
// negotiation and the viewer's impersonation. Credentials never travel:
// whoever performs the request uses its own.
func ForwardHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		switch {
		case ck == "Accept", ck == "User-Agent", ck == "Impersonate-User", ck == "Impersonate-Group",
			ck == "Impersonate-Uid", strings.HasPrefix(ck, "Impersonate-Extra-"):
			out[ck] = v
		}
	}
	return out
}

// detailTimeout bounds one detail request on the edge, like graph's own
// live-read timeout.
const detailTimeout = 15 * time.Second

// detailClient performs detail requests on the edge's local API server.
type detailClient struct {
	host string // scheme://host[:port][/prefix], no trailing slash
	http *http.Client
	// maxBody is the largest response body that fits in a message.
	maxBody int
}

// PerformDetail runs one detail request against the API server at host
// with client, as an edge does for its manager (and a replicated
// collector for a query replica): only reads of the Kubernetes API that
// impersonate exactly one user, so that the requester never acts with
// the performer's own identity, and a response body of at most maxBody
// bytes.
func PerformDetail(ctx context.Context, client *http.Client, host string, maxBody int, req *DetailRequest) *DetailResponse {
	c := &detailClient{host: strings.TrimSuffix(host, "/"), http: client, maxBody: maxBody}
	return c.perform(ctx, req)
}

// perform runs one detail request. Only reads of the Kubernetes API that
// impersonate someone are performed: the tunnel must never let the
// manager act with the edge's own identity.
func (c *detailClient) perform(ctx context.Context, req *DetailRequest) *DetailResponse {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return statusResponse(req.ID, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "the edge performs only GET and HEAD detail requests")
	}
	u, err := url.ParseRequestURI(req.Path)
	if err != nil || u.Scheme != "" || u.Host != "" || !apiPath(u.Path) {
		return statusResponse(req.ID, http.StatusForbidden, metav1.StatusReasonForbidden, "the edge performs detail requests only under /api and /apis")
	}
	if len(req.Header.Values("Impersonate-User")) != 1 || req.Header.Get("Impersonate-User") == "" {
		return statusResponse(req.ID, http.StatusForbidden, metav1.StatusReasonForbidden, "a detail request must impersonate exactly one user")
	}
	ctx, cancel := context.WithTimeout(ctx, detailTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, req.Method, c.host+u.RequestURI(), nil)
	if err != nil {
		return &DetailResponse{ID: req.ID, Error: err.Error()}
	}
	hreq.Header = ForwardHeaders(req.Header)
	resp, err := c.http.Do(hreq)
	if err != nil {
		return &DetailResponse{ID: req.ID, Error: fmt.Sprintf("local API server: %v", err)}
	}
	defer func() { _ = resp.Body.Close() }() // a read-only body: nothing to report
	body, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.maxBody)+1))
	if err != nil {
		return &DetailResponse{ID: req.ID, Error: fmt.Sprintf("local API server: reading the response: %v", err)}
	}
	if len(body) > c.maxBody {
		return &DetailResponse{ID: req.ID, Error: fmt.Sprintf("the response is over %d bytes, too large for the edge session", c.maxBody)}
	}
	header := http.Header{}
	for _, k := range []string{"Content-Type", "Warning", "Audit-Id"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			header[k] = v
		}
	}
	return &DetailResponse{ID: req.ID, Status: resp.StatusCode, Header: header, Body: body}
}

// apiPath reports whether p is a Kubernetes API path, after cleaning, so
// "/api/../debug" does not pass.
func apiPath(p string) bool {
	if path.Clean(p) != p {
		return false
	}
	return p == "/api" || p == "/apis" || strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/apis/")
}

// statusResponse is a response the edge makes itself, as a Kubernetes
// Status so that client-go reports it like one from the API server.
func statusResponse(id uint64, code int32, reason metav1.StatusReason, msg string) *DetailResponse {
	body, err := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: code,
	})
	if err != nil {
		return &DetailResponse{ID: id, Error: msg}
	}
	return &DetailResponse{ID: id, Status: int(code), Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}
