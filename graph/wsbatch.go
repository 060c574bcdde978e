package graph

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Batched websocket writes.
//
// coder/websocket flushes every message to the socket as it is written: one
// write system call per event. A fleet-wide viewer gets every change, and
// changes come in bursts (a commit publishes many, a resync thousands), so
// on the fan-out benchmark the write calls were a fifth of the server's
// CPU per delivery. batchConn sits under coder's connection, between it and
// the hijacked TCP connection: a write appends to the connection's buffer
// and returns, and the connection's flusher goroutine writes whatever has
// gathered meanwhile in one call. A quiet connection pays one goroutine
// wake-up per message; a busy one sends its burst in one call.
//
// What stays as it was:
//   - a client that stops reading is disconnected after the write timeout:
//     the flusher writes with that deadline and closes the connection when
//     it passes, and a writer finding batchMaxBuffered bytes waiting blocks
//     until there is room, which is at most until the flusher's write ends
//     (this is the only write deadline: wsConn.write sets none);
//   - messages are sent in the order they were written;
//   - closing is not losing: Close hands the connection to the flusher,
//     which sends what was written before it (within batchCloseGrace) and
//     then closes the socket.
//
// Concurrency contract: the flusher goroutine is started by Hijack and is
// the only one that writes to or closes the TCP connection after that;
// it ends when the connection is closed or a write fails. mu guards the
// buffer and the state; room is signalled when the flusher takes the
// buffer or the connection ends, kick (capacity 1) when there is work.

const (
	// batchMaxBuffered bounds the bytes waiting for a connection's
	// flusher; a writer waits beyond it. 64 KiB is hundreds of events, far
	// more than a burst of the fan-out benchmark, and small beside the
	// subscription's own queue (index.DefaultStreamBuffer events).
	batchMaxBuffered = 64 << 10
	// batchCloseGrace bounds how long a closing connection spends sending
	// what was written before the close: the peer of an abrupt close may
	// be gone or not reading.
	batchCloseGrace = time.Second
)

// batchingResponseWriter hands coder/websocket a batchConn when it
// hijacks the connection.
type batchingResponseWriter struct {
	http.ResponseWriter
	writeTimeout time.Duration
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w batchingResponseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack implements http.Hijacker.
func (w batchingResponseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Flush(); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("graph: flushing the upgrade response: %w", err)
	}
	bc := newBatchConn(conn, w.writeTimeout)
	return bc, bufio.NewReadWriter(brw.Reader, bufio.NewWriterSize(bc, brw.Writer.Size())), nil
}

// batchConn is a net.Conn whose writes are gathered and sent by one
// flusher goroutine (see above). Reads and the other methods are the TCP
// connection's.
type batchConn struct {
	net.Conn
	timeout time.Duration
	kick    chan struct{}

	mu      sync.Mutex
	room    sync.Cond
	buf     []byte
	closing bool  // Close was called: flush what is left, then close
	err     error // set once the connection ended; writes fail with it
}

func newBatchConn(c net.Conn, timeout time.Duration) *batchConn {
	if timeout <= 0 {
		timeout = DefaultWriteTimeout
	}
	bc := &batchConn{Conn: c, timeout: timeout, kick: make(chan struct{}, 1)}
	bc.room.L = &bc.mu
	go bc.flusher()
	return bc
}

// Write queues p for the flusher. It waits while batchMaxBuffered bytes
// are already waiting.
func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && !c.closing && len(c.buf) >= batchMaxBuffered {
		c.room.Wait()
	}
	switch {
	case c.err != nil:
		err := c.err
		c.mu.Unlock()
		return 0, err
	case c.closing:
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.buf = append(c.buf, p...)
	c.mu.Unlock()
	c.wake()
	return len(p), nil
}

func (c *batchConn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Close makes the flusher send what was written and close the
// connection; it does not wait for that.
func (c *batchConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.err != nil {
		return nil
	}
	c.closing = true
	// A write in progress to a peer that does not read gets the grace
	// too, not the rest of the write timeout.
	_ = c.SetWriteDeadline(time.Now().Add(c.grace()))
	c.room.Broadcast()
	c.wake()
	return nil
}

// grace is how long the last flush may take.
func (c *batchConn) grace() time.Duration { return min(c.timeout, batchCloseGrace) }

// flusher writes the gathered bytes until the connection is closed or a
// write fails; then it closes the TCP connection.
func (c *batchConn) flusher() {
	var out []byte
	for {
		<-c.kick
		c.mu.Lock()
		out, c.buf = c.buf, out[:0]
		closing := c.closing
		c.room.Broadcast()
		c.mu.Unlock()
		var err error
		if len(out) > 0 {
			deadline := time.Now().Add(c.timeout)
			if closing {
				deadline = time.Now().Add(c.grace())
			}
			if err = c.SetWriteDeadline(deadline); err == nil {
				_, err = c.Conn.Write(out)
			}
		}
		if err == nil && !closing {
			continue
		}
		c.mu.Lock()
		c.err = errors.Join(net.ErrClosed, err)
		c.buf = nil
		c.room.Broadcast()
		c.mu.Unlock()
		_ = c.Conn.Close()
		return
	}
}
