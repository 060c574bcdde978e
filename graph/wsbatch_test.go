package graph

import (
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// gatedConn records the writes it gets; each write waits until the test
// lets it through.
type gatedConn struct {
	net.Conn
	entered chan []byte   // a write has started, with its bytes
	release chan struct{} // lets one write finish
	closed  chan struct{}

	mu     sync.Mutex
	writes []string
}

func newGatedConn() *gatedConn {
	return &gatedConn{entered: make(chan []byte, 16), release: make(chan struct{}), closed: make(chan struct{})}
}

func (g *gatedConn) Write(p []byte) (int, error) {
	g.entered <- slices.Clone(p)
	<-g.release
	g.mu.Lock()
	g.writes = append(g.writes, string(p))
	g.mu.Unlock()
	return len(p), nil
}

func (g *gatedConn) SetWriteDeadline(time.Time) error { return nil }

func (g *gatedConn) Close() error { close(g.closed); return nil }

// TestBatchConnGathersWrites: what is written while the flusher sends is
// sent next, in one write and in order, and closing sends what was
// written before the close, then closes the connection.
func TestBatchConnGathersWrites(t *testing.T) {
	g := newGatedConn()
	bc := newBatchConn(g, time.Minute)
	write := func(s string) {
		t.Helper()
		if n, err := bc.Write([]byte(s)); err != nil || n != len(s) {
			t.Fatalf("write %q: %d, %v", s, n, err)
		}
	}
	write("a")
	if got := string(<-g.entered); got != "a" {
		t.Fatalf("first write %q", got)
	}
	write("b")
	write("c")
	write("d")
	g.release <- struct{}{}
	if got := string(<-g.entered); got != "bcd" {
		t.Errorf("second write %q, want the three messages written meanwhile", got)
	}
	write("e")
	must(t, bc.Close())
	if _, err := bc.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
	g.release <- struct{}{}
	select {
	case p := <-g.entered:
		if string(p) != "e" {
			t.Errorf("last write %q, want what was written before the close", p)
		}
		g.release <- struct{}{}
	case <-g.closed:
		t.Fatal("closed without sending what was written before the close")
	}
	<-g.closed
	if want := []string{"a", "bcd", "e"}; !slices.Equal(g.writes, want) {
		t.Errorf("writes %q, want %q", g.writes, want)
	}
}

// TestBatchConnDropsAPeerThatDoesNotRead: when the peer stops reading,
// the flusher's write passes its deadline, the connection is closed and
// later writes fail, as coder's writes did.
func TestBatchConnDropsAPeerThatDoesNotRead(t *testing.T) {
	server, client := net.Pipe() // unbuffered: nobody reads the client end yet
	defer func() { _ = client.Close() }()
	bc := newBatchConn(server, 20*time.Millisecond)
	if _, err := bc.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	var err error
	for err == nil {
		_, err = bc.Write(make([]byte, batchMaxBuffered)) // waits for room once the buffer is full
	}
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("write to a stuck peer: %v, want net.ErrClosed", err)
	}
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the peer reads %v, want EOF: the connection should be closed", err)
	}
}
