package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestWireProxyFindsMessages sends websocket messages through the proxy,
// compressed as the edge sends them, and checks that it finds where each
// one starts and counts every byte.
func TestWireProxyFindsMessages(t *testing.T) {
	got := make(chan int, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionNoContextTakeover})
		if err != nil {
			return
		}
		defer func() { _ = c.CloseNow() }()
		c.SetReadLimit(1 << 24)
		for {
			_, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			got <- len(b)
		}
	}))
	defer srv.Close()
	p, err := newWireProxy(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+p.addr(), &websocket.DialOptions{CompressionMode: websocket.CompressionNoContextTakeover})
	if err != nil {
		t.Fatal(err)
	}
	c.CloseRead(ctx) // reads the pongs
	sizes := []int{100, 300_000, 70_000, 10}
	before := time.Now()
	for _, n := range sizes {
		if err := c.Write(ctx, websocket.MessageText, []byte(strings.Repeat("x", n/2)+strings.Repeat("0123456789", n/20))); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(ctx); err != nil { // control frames are not messages
			t.Fatal(err)
		}
	}
	for range sizes {
		<-got
	}
	_ = c.Close(websocket.StatusNormalClosure, "")
	start, wire, err := p.snapshot(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	wc := p.conns[0]
	p.mu.Unlock()
	wc.mu.Lock()
	defer wc.mu.Unlock()
	if len(wc.messages) != len(sizes) {
		t.Fatalf("found %d message starts, want %d", len(wc.messages), len(sizes))
	}
	if start.Before(before) || wire <= 0 || wire >= wc.sent-wc.messages[1].bytes+1 || wc.messages[2].bytes <= wc.messages[1].bytes {
		t.Errorf("second message at %v (+%d bytes), %d bytes after it, %d sent", start, wc.messages[1].bytes, wire, wc.sent)
	}
	// Compressed: far fewer bytes than the messages.
	if total := 100 + 300_000 + 70_000 + 10; wc.sent > int64(total)/5 {
		t.Errorf("%d bytes on the wire for %d bytes of messages: not compressed?", wc.sent, total)
	}
}
