package graph

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/index"
)

// slowLeaf is a LeafClients whose RESTConfig returns only when released,
// whatever the request's context says: a resolver that keeps running after
// its client has gone.
type slowLeaf struct {
	release chan struct{}
	mu      sync.Mutex
	running int
	most    int
}

func (l *slowLeaf) RESTConfig(string) (*rest.Config, error) {
	l.mu.Lock()
	l.running++
	l.most = max(l.most, l.running)
	l.mu.Unlock()
	<-l.release
	l.mu.Lock()
	l.running--
	l.mu.Unlock()
	return nil, errors.New("released")
}

func (l *slowLeaf) inFlight() (now, most int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running, l.most
}

// TestWebsocketSlotHeldUntilResolverReturns plays a client that starts
// expensive operations and completes each at once, to run more of them
// than MaxOperations allows: the slot of an operation is freed when its
// resolver returns, not when the client says complete.
func TestWebsocketSlotHeldUntilResolverReturns(t *testing.T) {
	leaf := &slowLeaf{release: make(chan struct{})}
	f := newFixture(t, wsOptions, func(o *Options) { o.LeafClients = leaf })
	released := false
	release := func() {
		if !released {
			released = true
			close(leaf.release)
		}
	}
	defer release()
	const live = `{ object(cluster: "east", kind: "Pod", namespace: "team-a", name: "pod-team-a-0") { name } }`
	c := f.connect("admin")
	waitRunning := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for now, _ := leaf.inFlight(); now != n; now, _ = leaf.inFlight() {
			if time.Now().After(deadline) {
				t.Fatalf("%d live reads running, want %d", now, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// MaxOperations is 2: start and complete two, each still running.
	for i, id := range []string{"1", "2"} {
		c.subscribe(id, live, nil)
		waitRunning(i + 1)
		c.send(wsMessage{ID: id, Type: "complete"})
	}
	c.subscribe("3", live, nil)
	if m := c.readFor("3"); m.Type != "error" || !strings.Contains(string(m.Payload), CodeTooManyOperations) {
		t.Fatalf("a third operation while two resolvers run: %+v %s, want a %s error", m, m.Payload, CodeTooManyOperations)
	}
	if _, most := leaf.inFlight(); most != 2 {
		t.Errorf("%d live reads ran at once on one connection, want at most 2", most)
	}

	// Once the resolvers return, the slots are free again: each is freed
	// as the server writes the operation's complete, which may follow its
	// next, so wait for the complete.
	release()
	for _, id := range []string{"1", "2"} {
		m := c.readFor(id)
		if m.Type == "next" {
			m = c.readFor(id)
		}
		if m.Type != "complete" {
			t.Fatalf("operation %s after release: %+v, want its complete", id, m)
		}
	}
	c.subscribe("4", "subscription { fleet { message } }", nil)
	if m := c.readFor("4"); m.Type != "next" {
		t.Fatalf("an operation after the slots were freed: %+v %s", m, m.Payload)
	}
	f.assertAlive()
}

// TestLegacyWebsocketReadDeadline plays a legacy graphql-ws client that
// goes silent (it stops reading, so it answers no ping): the server closes
// the socket within about three KeepAlive intervals instead of keeping it,
// and its subscription, forever. A client that reads is not closed.
func TestLegacyWebsocketReadDeadline(t *testing.T) {
	const keepAlive = 250 * time.Millisecond
	f := newFixture(t, func(o *Options) { o.Websocket.KeepAlive = keepAlive })
	c := f.dial("graphql-ws", nil)
	c.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"authToken": f.tokens["alice"]})})
	if m := c.read(); m.Type != "connection_ack" {
		t.Fatalf("got %+v", m)
	}
	c.send(wsMessage{ID: "1", Type: "start", Payload: mustJSON(t, map[string]any{"query": "subscription { fleet { message } }"})})
	if m := c.readFor("1"); m.Type != "data" {
		t.Fatalf("got %+v", m)
	}
	f.waitSubscribers(1)

	// Silent for eight intervals: no read, so no pong.
	time.Sleep(8 * keepAlive)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		_, _, err := c.c.Read(ctx) // ka messages queued before the close
		if err == nil {
			continue
		}
		if code := websocket.CloseStatus(err); code != closePolicyViolation {
			t.Fatalf("after going silent: %v, want a close with %d", err, closePolicyViolation)
		}
		break
	}
	f.waitSubscribers(0)

	// A legacy client that reads (and so answers pings) stays.
	ok := f.dial("graphql-ws", nil)
	ok.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"authToken": f.tokens["alice"]})})
	if m := ok.read(); m.Type != "connection_ack" {
		t.Fatalf("got %+v", m)
	}
	quiet := time.Now().Add(8 * keepAlive)
	for time.Now().Before(quiet) {
		if m, err := ok.readTimeout(time.Until(quiet)); err == nil {
			t.Fatalf("unexpected message %+v", m)
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a reading legacy client was disconnected: %v", err)
		}
	}
}

// TestIsDataMessage: only an event's own type makes it a data message,
// never a "type" field inside its payload.
func TestIsDataMessage(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		data bool
	}{
		{`{"payload":{"data":{"objectChanges":{"type":"ADDED"}}},"id":"1","type":"next"}`, true},
		{`{"payload":{"data":{}},"id":"1","type":"data"}`, true},
		{`{"id":"1","type":"complete"}`, false},
		{`{"payload":[{"message":"x"}],"id":"1","type":"error"}`, false},
		{`{"payload":{"data":{"e":{"type":"next"}}},"id":"1","type":"complete"}`, false},
		{`{"id":"1","type":"complete","payload":{"type":"next"}}`, false},
		{`{"id":"\"type\":\"next","type":"error"}`, false},
		{`{"type":"ka"}`, false},
	} {
		if got := isDataMessage([]byte(tc.msg)); got != tc.data {
			t.Errorf("%s: data message %v, want %v", tc.msg, got, tc.data)
		}
	}
}

// TestWebsocketSlowClientIsDropped plays a graphql-transport-ws client that
// subscribes and then never reads: once the socket buffers are full, the
// write timeout closes the connection and ends the subscription instead of
// holding its goroutines forever, whether its events are written directly
// (wsevents.go) or go through gqlgen's transport.
func TestWebsocketSlowClientIsDropped(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(map[bool]string{true: "written directly", false: "through gqlgen"}[direct], func(t *testing.T) {
			f := newFixture(t, func(o *Options) {
				o.Websocket.WriteTimeout = 300 * time.Millisecond
				o.Websocket.KeepAlive = time.Hour
				o.SubscriptionBuffer = 64
			})
			f.h.svc.events.wsOff.Store(!direct)
			small := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					err = c.(*net.TCPConn).SetReadBuffer(4096)
				}
				return c, err
			}}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, _, err := websocket.Dial(ctx, f.wsURL(), &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}, HTTPClient: small})
			must(t, err)
			defer func() { _ = conn.CloseNow() }()
			c := &wsClient{t: t, c: conn}
			c.send(wsMessage{Type: "connection_init", Payload: mustJSON(t, map[string]any{"Authorization": "Bearer " + f.tokens["admin"]})})
			if m := c.read(); m.Type != "connection_ack" {
				t.Fatalf("expected connection_ack, got %+v", m)
			}
			c.subscribe("1", `subscription { objectChanges { object { name message } } }`, nil)
			f.waitSubscribers(1)
			if written := f.h.svc.events.written.Load() > 0; written != direct {
				t.Fatalf("events written directly: %v, want %v", written, direct)
			}
			// Changes until the subscription is gone: each event is
			// written to a socket nobody reads.
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; f.h.streams.len() > 0; i++ {
				o := testObject(podKind, "east", "team-a", fmt.Sprintf("flood-%d", i), index.StatusHealthy)
				o.Message = strings.Repeat("m", 2000)
				must(t, f.store.Upsert(context.Background(), o))
				if time.Now().After(deadline) {
					t.Fatalf("the subscription of a client that does not read is still open after %d changes", i+1)
				}
				if i%100 == 99 {
					time.Sleep(10 * time.Millisecond)
				}
			}
			f.assertAlive()
		})
	}
}
