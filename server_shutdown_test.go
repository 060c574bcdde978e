package fleetgraph_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
)

// TestShutdownGoesAway stops a running server with a subscription open:
// /readyz turns unready and the websocket ends with a going-away close,
// which clients take as "reconnect elsewhere", not as an error.
func TestShutdownGoesAway(t *testing.T) {
	users, err := authz.ParseStaticTokens(strings.NewReader("root-token,root,1,admins\n"), "test", authz.Naming{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := fleetgraph.New(fleetgraph.Config{Authenticator: users, AdminGroups: []string{"admins"}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()

	readyz := func() int {
		resp, err := http.Get(hs.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(10 * time.Second)
	for readyz() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(50 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+"/graphql",
		&websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.CloseNow() }()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(wsjson.Write(ctx, c, map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer root-token"}}))
	var ack map[string]any
	must(wsjson.Read(ctx, c, &ack))
	if ack["type"] != "connection_ack" {
		t.Fatalf("got %v, want connection_ack", ack)
	}
	must(wsjson.Write(ctx, c, map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{"query": "subscription { fleet { message } }"}}))
	var first map[string]any
	must(wsjson.Read(ctx, c, &first))

	stop()
	var closeErr error
	for closeErr == nil {
		var m map[string]any
		closeErr = wsjson.Read(ctx, c, &m)
	}
	if code := websocket.CloseStatus(closeErr); code != websocket.StatusGoingAway {
		t.Errorf("websocket ended with %v (%d), want going away (1001)", closeErr, code)
	}
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after shutdown: %d, want 503", code)
	}
}
