package connection

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// withHealthChecks returns a copy of cfg with a transport of its own whose
// HTTP/2 connections are health-checked: after readIdle without a frame a
// ping is sent, and the connection is closed if it is not answered within
// pingTimeout. That breaks every watch on a half-open connection, which is
// how a black-holed server is noticed even between probes.
//
// client-go can do the same only through process-wide environment
// variables, so fleetgraph builds the transport itself. Configs whose
// credentials plug into the transport (exec plugins, auth providers) keep
// client-go's own transport and rely on the probe loop alone; the returned
// transport is then nil.
//
// The transport is new for every call, so a reconnect never reuses a
// connection of the session it replaces.
func withHealthChecks(cfg *rest.Config, readIdle, pingTimeout time.Duration) (*rest.Config, *http.Transport, error) {
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil || cfg.Transport != nil {
		return cfg, nil, nil
	}
	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS config: %w", err)
	}
	proxy := http.ProxyFromEnvironment
	if cfg.Proxy != nil {
		proxy = cfg.Proxy
	}
	dial := (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if cfg.Dial != nil {
		dial = cfg.Dial
	}
	tr := &http.Transport{
		Proxy:               proxy,
		DialContext:         dial,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 25,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{SendPingTimeout: readIdle, PingTimeout: pingTimeout},
	}
	out := rest.CopyConfig(cfg)
	out.Transport = tr
	out.TLSClientConfig = rest.TLSClientConfig{} // it lives in the transport now
	out.Proxy, out.Dial = nil, nil
	return out, tr, nil
}

// readActivity records when a cluster's connection last delivered response
// bytes (list pages, watch events): proof that its API server answers,
// whatever a probe that timed out says. Dead, frozen and black-holed
// servers deliver nothing, so they are still detected. Connections of
// configs that keep client-go's transport (exec plugins, auth providers:
// see withHealthChecks) have no HTTP/2 pings, so data a dead server had
// already sent can still be read for a while; the session bounds how many
// timed-out probes it forgives (forgiveAfterSync).
//
// Times are offsets from a monotonic base: a step of the wall clock (NTP,
// a resumed VM) cannot make an old read look recent.
type readActivity struct {
	base time.Time    // carries a monotonic reading
	last atomic.Int64 // nanoseconds from base to the last read that returned bytes; -1 before the first
}

func newReadActivity() *readActivity {
	a := &readActivity{base: time.Now()}
	a.last.Store(-1)
	return a
}

// wrap is a transport wrapper (rest.Config.Wrap) that watches every
// response body.
func (a *readActivity) wrap(rt http.RoundTripper) http.RoundTripper {
	return activityTransport{rt: rt, a: a}
}

// since reports whether response bytes arrived at or after t, a time
// taken with time.Now (so with a monotonic reading).
func (a *readActivity) since(t time.Time) bool {
	last := a.last.Load()
	return last >= 0 && last >= int64(t.Sub(a.base))
}

// read records that response bytes arrived now.
func (a *readActivity) read() { a.last.Store(int64(time.Since(a.base))) }

type activityTransport struct {
	rt http.RoundTripper
	a  *readActivity
}

func (t activityTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = activityBody{ReadCloser: resp.Body, a: t.a}
	return resp, nil
}

type activityBody struct {
	io.ReadCloser
	a *readActivity
}

func (b activityBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.a.read()
	}
	return n, err
}
