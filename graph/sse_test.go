package graph

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

// sseEvent is one server-sent event.
type sseEvent struct {
	Event string
	Data  string
}

// payload decodes an event's data as a GraphQL result.
func (e sseEvent) payload(t testing.TB) gqlResponse {
	t.Helper()
	var r gqlResponse
	if err := json.Unmarshal([]byte(e.Data), &r); err != nil {
		t.Fatalf("event %q data %q: %v", e.Event, e.Data, err)
	}
	return r
}

// sseClient reads one event stream, as EventSource would.
type sseClient struct {
	t      testing.TB
	resp   *http.Response
	events chan sseEvent
	err    chan error // the error that ended the stream (io.EOF for a clean end)
}

// openSSE starts an event stream. A nil body makes it a GET with the
// request in the query string (as EventSource sends it); token "" sends
// no Authorization.
func (f *fixture) openSSE(token, query string, vars map[string]any, get bool) (*sseClient, int, string) {
	f.t.Helper()
	var req *http.Request
	var err error
	if get {
		v := url.Values{"query": {query}}
		if vars != nil {
			v.Set("variables", string(mustJSON(f.t, vars)))
		}
		req, err = http.NewRequest(http.MethodGet, f.srv.URL+"/graphql?"+v.Encode(), nil)
	} else {
		req, err = http.NewRequest(http.MethodPost, f.srv.URL+"/graphql", bytes.NewReader(mustJSON(f.t, map[string]any{"query": query, "variables": vars})))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	must(f.t, err)
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	must(f.t, err)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return nil, resp.StatusCode, string(b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		f.t.Fatalf("content type %q", ct)
	}
	c := &sseClient{t: f.t, resp: resp, events: make(chan sseEvent, 100), err: make(chan error, 1)}
	go c.read()
	f.t.Cleanup(c.close)
	return c, resp.StatusCode, ""
}

func (c *sseClient) read() {
	r := bufio.NewReader(c.resp.Body)
	var ev sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			close(c.events)
			c.err <- err
			return
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if ev.Event != "" || ev.Data != "" {
				c.events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"): // a comment: keep-alive
		case strings.HasPrefix(line, "event:"):
			ev.Event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			ev.Data += strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		}
	}
}

func (c *sseClient) close() { _ = c.resp.Body.Close() }

// next returns the next event, failing after d.
func (c *sseClient) next(d time.Duration) sseEvent {
	c.t.Helper()
	select {
	case ev, ok := <-c.events:
		if !ok {
			c.t.Fatalf("the stream ended: %v", <-c.err)
		}
		return ev
	case <-time.After(d):
		c.t.Fatalf("no event within %v", d)
	}
	return sseEvent{}
}

// end waits for the stream to end after its events, which it returns, and
// fails unless it ended cleanly.
func (c *sseClient) end(d time.Duration) []sseEvent {
	c.t.Helper()
	var evs []sseEvent
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				if err := <-c.err; !errors.Is(err, io.EOF) {
					c.t.Errorf("the stream ended with %v, want a clean end", err)
				}
				return evs
			}
			evs = append(evs, ev)
		case <-deadline:
			c.t.Fatalf("the stream did not end within %v; events %+v", d, evs)
		}
	}
}

// lastError checks that a stream ended with an error event carrying code,
// then complete, and returns the error's message.
func lastError(t testing.TB, evs []sseEvent, code string) string {
	t.Helper()
	if len(evs) < 2 || evs[len(evs)-1].Event != "complete" || evs[len(evs)-2].Event != "next" {
		t.Fatalf("stream ended with %+v, want an error event then complete", evs)
	}
	r := evs[len(evs)-2].payload(t)
	if r.code() != code {
		t.Fatalf("last event %s, want code %s", evs[len(evs)-2].Data, code)
	}
	return r.Errors[0].Message
}

const fleetSub = `subscription { fleet { clustersTotal message } }`

// TestSSESubscription: a subscription over server-sent events, by POST and
// by GET (EventSource), delivers the same events as over a websocket,
// filtered by the viewer's RBAC; queries work too.
func TestSSESubscription(t *testing.T) {
	f := newFixture(t)
	for _, get := range []bool{false, true} {
		t.Run(map[bool]string{false: "POST", true: "GET"}[get], func(t *testing.T) {
			c, status, body := f.openSSE(f.tokens["alice"], fleetSub, nil, get)
			if c == nil {
				t.Fatalf("status %d %s", status, body)
			}
			ev := c.next(5 * time.Second)
			if ev.Event != "next" || !strings.Contains(ev.Data, `"clustersTotal":1`) {
				t.Fatalf("first event %+v, want alice's fleet (1 cluster)", ev)
			}
			f.waitSubscribers(1)
			c.close()
			f.waitSubscribers(0)
		})
	}

	// objectChanges: alice sees a change in her namespace, not in another.
	c, status, body := f.openSSE(f.tokens["alice"], objectChangesSub, nil, false)
	if c == nil {
		t.Fatalf("status %d %s", status, body)
	}
	f.waitSubscribers(1)
	ctx := context.Background()
	must(t, f.store.Upsert(ctx, testObject(podKind, "east", "team-b", "not-hers", index.StatusHealthy)))
	must(t, f.store.Upsert(ctx, testObject(podKind, "east", "team-a", "hers", index.StatusHealthy)))
	ev := c.next(5 * time.Second)
	if ev.Event != "next" || !strings.Contains(ev.Data, `"name":"hers"`) {
		t.Fatalf("got %+v, want the change to her pod and only that", ev)
	}

	// A query over SSE is one result, then complete.
	q, _, _ := f.openSSE(f.tokens["alice"], `{ viewer { username } }`, nil, true)
	evs := q.end(5 * time.Second)
	if len(evs) != 2 || !strings.Contains(evs[0].Data, `"username":"alice"`) || evs[1].Event != "complete" {
		t.Errorf("query over SSE: %+v", evs)
	}
}

// TestSSERefusesWhatWebsocketsRefuse plays clients that try the event
// stream as a side door: no credentials, a bad token, a mutation over GET,
// malformed parameters, a body over the cap, an operation over the limits,
// and more streams than one viewer may hold.
func TestSSERefusesWhatWebsocketsRefuse(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		o.Websocket.MaxOperations = 2
		o.Limits.MaxBodyBytes = 4 << 10
	})
	for _, tc := range []struct {
		name, token, query string
		vars               map[string]any
		get                bool
		status             int
		want               string
	}{
		{"anonymous", "", fleetSub, nil, false, http.StatusUnauthorized, "authentication required"},
		{"anonymous GET", "", fleetSub, nil, true, http.StatusUnauthorized, "authentication required"},
		{"bad token", "nope", fleetSub, nil, true, http.StatusUnauthorized, "not accepted"},
		{"mutation over GET", f.tokens["alice"], `mutation { stop }`, nil, true, http.StatusMethodNotAllowed, "mutations"},
		{"body over the cap", f.tokens["alice"], fleetSub, map[string]any{"x": strings.Repeat("x", 8<<10)}, false, http.StatusRequestEntityTooLarge, "exceeds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, status, body := f.openSSE(tc.token, tc.query, tc.vars, tc.get)
			if c != nil || status != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("status %d %s, want %d %q", status, body, tc.status, tc.want)
			}
		})
	}
	t.Run("bad variables", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodGet, f.srv.URL+"/graphql?query=%7Bviewer%7Busername%7D%7D&variables=%5B7%5D", nil)
		must(t, err)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Authorization", "Bearer "+f.tokens["alice"])
		if status, body := f.send(req); status != http.StatusBadRequest || !strings.Contains(string(body), "variables") {
			t.Errorf("status %d %s", status, body)
		}
	})
	t.Run("over the operation limits", func(t *testing.T) {
		aliases := "{ "
		for i := range DefaultMaxAliases + 1 {
			aliases += fmt.Sprintf("v%d: viewer { username } ", i)
		}
		aliases += "}"
		c, _, _ := f.openSSE(f.tokens["alice"], aliases, nil, false)
		evs := c.end(5 * time.Second)
		if len(evs) != 2 || !strings.Contains(evs[0].Data, "aliases") || evs[1].Event != "complete" {
			t.Errorf("too many aliases: %+v", evs)
		}
	})
	t.Run("more streams than MaxOperations", func(t *testing.T) {
		var open []*sseClient
		for range 2 {
			c, status, body := f.openSSE(f.tokens["alice"], fleetSub, nil, false)
			if c == nil {
				t.Fatalf("status %d %s", status, body)
			}
			c.next(5 * time.Second)
			open = append(open, c)
		}
		if c, status, body := f.openSSE(f.tokens["alice"], fleetSub, nil, true); c != nil || status != http.StatusTooManyRequests || !strings.Contains(body, CodeTooManyOperations) {
			t.Fatalf("a third stream: status %d %s, want 429 %s", status, body, CodeTooManyOperations)
		}
		// Another viewer is not affected; a closed stream frees its slot.
		if c, status, body := f.openSSE(f.tokens["bob"], fleetSub, nil, true); c == nil {
			t.Fatalf("bob: status %d %s", status, body)
		}
		open[0].close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, status, _ := f.openSSE(f.tokens["alice"], fleetSub, nil, true)
			if c != nil {
				break
			}
			if status != http.StatusTooManyRequests || time.Now().After(deadline) {
				t.Fatalf("after closing one: status %d", status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	f.assertAlive()
}

// TestSSEEndsWhenCredentialsEnd: a stream opened with expiring credentials
// ends with UNAUTHENTICATED when they expire, and one opened with a token
// that is then removed from the token file ends within 5 s of the removal.
func TestSSEEndsWhenCredentialsEnd(t *testing.T) {
	auth := &expiringAuth{}
	file := t.TempDir() + "/tokens.csv"
	writeTokens := func(content string) { must(t, os.WriteFile(file, []byte(content), 0o600)) }
	writeTokens("file-alice,alice,uid-alice\n")
	tf, err := authz.OpenTokenFile(file, authz.TokenFileOptions{Interval: 100 * time.Millisecond, Logger: testLogger(t)})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go tf.Run(ctx)
	f := newFixture(t, func(o *Options) {
		o.Authenticator = &authz.Union{Authenticators: []authz.Authenticator{auth, tf, o.Authenticator}}
	})
	exp := auth.expireIn(1500 * time.Millisecond)

	expiring, status, body := f.openSSE("expiring-alice", fleetSub, nil, false)
	if expiring == nil {
		t.Fatalf("status %d %s", status, body)
	}
	revocable, status, body := f.openSSE("file-alice", fleetSub, nil, true)
	if revocable == nil {
		t.Fatalf("status %d %s", status, body)
	}
	lasting, _, _ := f.openSSE(f.tokens["alice"], fleetSub, nil, true)
	for _, c := range []*sseClient{expiring, revocable, lasting} {
		c.next(5 * time.Second)
	}

	msg := lastError(t, expiring.end(5*time.Second), CodeUnauthenticated)
	if early := time.Until(exp); early > 0 || !strings.Contains(msg, "expired") {
		t.Errorf("ended %v before the credentials expired, with %q", early, msg)
	}

	writeTokens("other,bob,uid-bob\n")
	removed := time.Now()
	msg = lastError(t, revocable.end(5*time.Second), CodeUnauthenticated)
	if !strings.Contains(msg, "revoked") {
		t.Errorf("revoked stream ended with %q", msg)
	}
	t.Logf("the revoked stream ended %v after the token file changed", time.Since(removed).Round(time.Millisecond))

	// The stream with lasting credentials is still open.
	f.waitSubscribers(1)
	if c, status, _ := f.openSSE("file-alice", fleetSub, nil, true); c != nil || status != http.StatusUnauthorized {
		t.Errorf("the removed token opened a stream: %d", status)
	}
}

// TestSSECloseEndsStreams: Handler.Close ends every stream with
// SHUTTING_DOWN and complete, and the response ends cleanly; then new
// streams are refused.
func TestSSECloseEndsStreams(t *testing.T) {
	f := newFixture(t)
	var streams []*sseClient
	for _, user := range []string{"alice", "admin"} {
		c, status, body := f.openSSE(f.tokens[user], fleetSub, nil, user == "admin")
		if c == nil {
			t.Fatalf("status %d %s", status, body)
		}
		c.next(5 * time.Second)
		streams = append(streams, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t, f.h.Close(ctx))
	f.h.sse.mu.Lock()
	open := len(f.h.sse.open)
	f.h.sse.mu.Unlock()
	if open != 0 {
		t.Errorf("Close returned with %d streams open", open)
	}
	for _, c := range streams {
		lastError(t, c.end(5*time.Second), CodeShuttingDown)
	}
	if c, status, _ := f.openSSE(f.tokens["alice"], fleetSub, nil, true); c != nil || status != http.StatusServiceUnavailable {
		t.Errorf("a stream after Close: %d", status)
	}
}

// TestSSESlowClientIsDropped plays a client that opens a stream and never
// reads: once its socket buffers are full, the write timeout ends the
// stream and frees its goroutines instead of holding them forever.
func TestSSESlowClientIsDropped(t *testing.T) {
	f := newFixture(t, func(o *Options) {
		o.Websocket.WriteTimeout = 300 * time.Millisecond
		o.SubscriptionBuffer = 64
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	must(t, err)
	defer func() { _ = conn.Close() }()
	must(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	body := string(mustJSON(t, map[string]any{"query": `subscription { objectChanges { object { name message labels { key value } } } }`}))
	_, err = fmt.Fprintf(conn, "POST /graphql HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", f.tokens["admin"], len(body), body)
	must(t, err)
	f.waitSubscribers(1)
	// Changes until the stream is gone: each event is written to a
	// socket nobody reads.
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		o := testObject(podKind, "east", "team-a", fmt.Sprintf("flood-%d", i), index.StatusHealthy)
		o.Message = strings.Repeat("m", 2000)
		must(t, f.store.Upsert(ctx, o))
		f.h.sse.mu.Lock()
		open := len(f.h.sse.open)
		f.h.sse.mu.Unlock()
		if open == 0 {
			t.Logf("the stream ended after %d changes", i+1)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream of a client that does not read is still open after %d changes", i+1)
		}
		if i%100 == 99 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	f.waitSubscribers(0)
	f.assertAlive()
}

// TestPostContentTypes: what a person naturally types works where the
// GraphQL over HTTP spec allows it (curl -d sends a JSON body as a form),
// and anything else is a 415 that names the content type the server wants.
func TestPostContentTypes(t *testing.T) {
	f := newFixture(t)
	const query = `{"query":"{ viewer { username } }"}`
	post := func(contentType, auth, body string, header ...string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, f.srv.URL+"/graphql", strings.NewReader(body))
		must(t, err)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		must(t, err)
		return resp.StatusCode, string(b), resp.Header
	}
	alice := f.tokens["alice"]
	for _, tc := range []struct {
		name, contentType, auth, body string
		status                        int
		want                          string
	}{
		{"JSON", "application/json", alice, query, 200, `"username":"alice"`},
		{"JSON with charset", "application/json; charset=utf-8", alice, query, 200, `"username":"alice"`},
		{"curl -d: JSON sent as a form", "application/x-www-form-urlencoded", alice, query, 200, `"username":"alice"`},
		{
			"form fields", "application/x-www-form-urlencoded", alice,
			url.Values{"query": {"query($n: Int) { objects(first: $n) { totalCount } }"}, "variables": {`{"n": 1}`}}.Encode(), 200, `"totalCount":`,
		},
		{"form with bad variables", "application/x-www-form-urlencoded", alice, "query=%7Bviewer%7Busername%7D%7D&variables=7", 400, "variables"},
		{"form without Authorization", "application/x-www-form-urlencoded", "", query, 415, "Content-Type: application/json"},
		{"no content type", "", alice, query, 415, "Content-Type: application/json"},
		{"text/plain", "text/plain", alice, query, 415, "Content-Type text/plain is not supported: send the GraphQL request as JSON with Content-Type: application/json"},
		{"multipart", "multipart/form-data; boundary=x", alice, query, 415, "Content-Type: application/json"},
		{"application/graphql", "application/graphql", alice, "{ viewer { username } }", 415, "Content-Type: application/json"},
		{"garbage", "text/", alice, query, 415, "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, header := post(tc.contentType, tc.auth, tc.body)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("status %d %s, want %d with %q", status, body, tc.status, tc.want)
			}
			if status == http.StatusUnsupportedMediaType && header.Get("Accept") != "application/json" {
				t.Errorf("415 without Accept: application/json: %v", header)
			}
		})
	}
	t.Run("an event stream takes JSON", func(t *testing.T) {
		status, body, _ := post("application/x-www-form-urlencoded", alice, query, "Accept", "text/event-stream")
		if status != http.StatusUnsupportedMediaType || !strings.Contains(body, "application/json") {
			t.Errorf("status %d %s", status, body)
		}
	})
	t.Run("the demo's curl line, with curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("no curl on this machine")
		}
		out, err := exec.Command(curl, "-s", "-H", "Authorization: Bearer "+alice, f.srv.URL+"/graphql",
			"-d", `{"query":"{ fleet { message } objects(first: 3) { totalCount edges { node { cluster namespace kind name status } } } }"}`).Output()
		must(t, err)
		var r gqlResponse
		if err := json.Unmarshal(out, &r); err != nil || len(r.Errors) > 0 || !strings.Contains(string(r.Data), `"totalCount"`) {
			t.Errorf("curl got %s", out)
		}
	})
	f.assertAlive()
}
