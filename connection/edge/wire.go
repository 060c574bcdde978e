package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

const (
	// writeTimeout bounds one message write. A peer that does not take
	// a 4 MiB message within it is gone or hopelessly slow; the session
	// ends and the edge resyncs.
	writeTimeout = 30 * time.Second
	// shutdownGrace bounds what a connection the hub ends at shutdown
	// (Run's context ends) or disowns (Hub.DisownAll, which the
	// replication collector uses at shutdown), supersedes (a new
	// connection of the same edge instance) or ends for a revoked token
	// (session.endCut) still does: a write in
	// flight (an ack, a detail request), the Reject, the close
	// handshake. Then the connection is cut off (conn.cutOff). A write
	// to an edge that reads takes no time: what the manager sends is
	// small, and the socket buffers take it at once. Only an edge that
	// stopped reading with the buffers full makes a write wait, and
	// under writeTimeout it held the hub's shutdown for about 32 s
	// (writeTimeout + closeGrace): past cmd/fleetgraph's
	// --shutdown-timeout (10 s), which then cut off everything else
	// still stopping, and past Kubernetes' default 30 s grace period.
	// Longer than closeGrace, so a live edge that is not held up by an
	// apply in progress takes its Reject and closes before the cut (if
	// the cut comes first, the edge sees a lost connection instead of
	// the reason and reconnects as it would have; nothing is lost).
	// Short enough that sessions end within about 3 s of the shutdown,
	// and within about 8 s in the worst case: a session whose reader had
	// stopped and which entered coder's Close before the cut waits for
	// coder's own 5 s close handshake, which a cut does not shorten
	// (closeWith). Both leave --shutdown-timeout (10 s) to the
	// collectors' publishing and lease writes, which run meanwhile.
	shutdownGrace = 3 * time.Second
)

// conn is one end of an edge websocket, either side, over coder/websocket
// (the one websocket library of the module, which gqlgen's transport
// already imports). It adds what the protocol needs on top: a read limit
// that says why, a liveness rule, bounded writes and a close that sends
// the Reject's reason.
//
// Liveness: a read fails when nothing has been heard from the peer for
// the wait it was given. Decoded bytes of a message count, and so do pongs
// between messages (a ping goes unanswered while the peer is busy writing
// a large message; its bytes keep the session alive instead). Pongs do not
// count in the middle of a message, so a peer cannot hold a read open
// forever with frames that decompress to nothing.
//
// Deadlines: coder closes the connection when the context of a read or
// write ends, and every other goroutine's operation then fails with "use
// of closed network connection". So a deadline of this end records why
// (the connection's cause) before it ends its operation's context, and a
// read or write that fails because the connection is closed reports that
// cause: a sender racing the reader that found the peer silent, or a
// reader whose connection a stuck write closed, says what happened (see
// deadline).
//
// Cut-off: cutOff ends ctx, the parent of every read and write, at a
// time; coder then closes the connection, and whatever was still waiting
// on it fails with the cut-off's cause (the hub at shutdown,
// shutdownGrace).
//
// Concurrency: one goroutine reads (read, or close's wait for the peer);
// writes and pings may come from any goroutine.
type conn struct {
	ws     *websocket.Conn
	ctx    context.Context // the parent of every read and write; abort ends it
	abort  context.CancelFunc
	heardM sync.Mutex
	heard  func() // resets the current read's liveness timer between messages; nil otherwise
	causeM sync.Mutex
	cause  error // why a deadline of this end closed the connection; nil until one has
}

// newConn returns a conn for a websocket that accept or dial will set,
// with the pong hook their options need.
func newConn() *conn {
	c := &conn{}
	c.ctx, c.abort = context.WithCancel(context.Background())
	return c
}

// pong is the OnPongReceived hook.
func (c *conn) pong(context.Context, []byte) {
	c.heardM.Lock()
	defer c.heardM.Unlock()
	if c.heard != nil {
		c.heard()
	}
}

// errSilent ends a read when the peer has said nothing for too long.
type errSilent time.Duration

func (e errSilent) Error() string {
	return fmt.Sprintf("nothing heard from the peer for %s", time.Duration(e))
}

// deadline bounds one operation on a conn. When it expires it records why
// as the conn's cause and then ends ctx, which makes coder close the
// connection; see conn.
type deadline struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	d      time.Duration
	why    error
}

func (c *conn) deadline(parent context.Context, d time.Duration, why error) *deadline {
	ctx, cancel := context.WithCancelCause(parent)
	dl := &deadline{ctx: ctx, cancel: cancel, d: d, why: why}
	dl.timer = time.AfterFunc(d, func() {
		c.setCause(why)
		cancel(why)
	})
	return dl
}

// reset restarts the deadline's wait.
func (dl *deadline) reset() { dl.timer.Reset(dl.d) }

// expired returns why, once the deadline has expired. An operation whose
// deadline expired has failed, even if it completed meanwhile: the
// connection may be closing under it.
func (dl *deadline) expired() error {
	if context.Cause(dl.ctx) != dl.why { //nolint:errorlint // identity: this deadline's own cause, not one of the parent's
		return nil
	}
	return dl.why
}

// stop releases the deadline once its operation is over.
func (dl *deadline) stop() {
	dl.timer.Stop()
	dl.cancel(nil)
}

func (c *conn) setCause(err error) {
	c.causeM.Lock()
	defer c.causeM.Unlock()
	if c.cause == nil {
		c.cause = err
	}
}

// failed returns the error of a failed op: the conn's cause when err only
// says that the connection is closed or the op's context ended and a
// deadline of this end did it, else err.
func (c *conn) failed(op string, err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) {
		c.causeM.Lock()
		cause := c.cause
		c.causeM.Unlock()
		if cause != nil {
			return cause
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// read reads the next text message of at most limit bytes after
// decompression and decodes it, failing when nothing is heard for wait.
// Errors that a Reject can explain are *RejectError; others mean the
// connection is gone (a silent peer's connection is closed).
func (c *conn) read(limit int, wait time.Duration) (*Message, int, error) {
	alive := c.deadline(c.ctx, wait, fmt.Errorf("read: %w", errSilent(wait)))
	defer alive.stop()
	c.setHeard(alive.reset)
	return c.readMessage(alive, limit, alive.reset)
}

// readFirst reads the first message of a session, which must be complete
// within d: unlike read, neither pongs nor bytes move the deadline, so a
// peer that has not authenticated cannot hold the connection by trickling
// its Hello.
func (c *conn) readFirst(limit int, d time.Duration) (*Message, int, error) {
	dl := c.deadline(c.ctx, d, rejectf(ReasonInvalid, "no complete hello within %s of the upgrade", d))
	defer dl.stop()
	return c.readMessage(dl, limit, func() {})
}

// readMessage reads one message under dl, calling progress as its bytes
// arrive.
func (c *conn) readMessage(dl *deadline, limit int, progress func()) (*Message, int, error) {
	// Our own limit below is the one that can say why; this one only
	// stops coder from reading past it.
	c.ws.SetReadLimit(int64(limit) + 1)
	typ, r, err := c.ws.Reader(dl.ctx)
	c.setHeard(nil)
	if why := dl.expired(); why != nil {
		return nil, 0, why
	}
	if err != nil {
		return nil, 0, c.failed("read", err)
	}
	if typ != websocket.MessageText {
		return nil, 0, rejectf(ReasonMalformed, "binary frame; messages are JSON text")
	}
	data, err := io.ReadAll(io.LimitReader(&progressReader{r: r, progress: progress}, int64(limit)+1))
	if why := dl.expired(); why != nil {
		return nil, len(data), why
	}
	if err != nil {
		return nil, len(data), c.failed("read", err)
	}
	if len(data) > limit {
		return nil, len(data), rejectf(ReasonOversize, "message over %d bytes (limit after decompression)", limit)
	}
	m, err := decodeMessage(data)
	return m, len(data), err
}

func (c *conn) setHeard(f func()) {
	c.heardM.Lock()
	c.heard = f
	c.heardM.Unlock()
}

// progressReader calls progress whenever data arrives, so a large message
// on a slow link is not cut off while it is still flowing.
type progressReader struct {
	r        io.Reader
	progress func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.progress()
	}
	return n, err
}

// write encodes and writes one message. The caller serializes writes and
// has set Seq and Time. A write that times out (writeTimeout) or is cut
// off (cutOff) closes the connection.
func (c *conn) write(m *Message) (int, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", m.Type, err)
	}
	op := "write " + string(m.Type)
	dl := c.deadline(c.ctx, writeTimeout, fmt.Errorf("%s: not written within %s", op, writeTimeout))
	defer dl.stop()
	err = c.ws.Write(dl.ctx, websocket.MessageText, data)
	if why := dl.expired(); why != nil {
		return 0, why
	}
	if err != nil {
		return 0, c.failed(op, err)
	}
	return len(data), nil
}

// closeGrace bounds how long a side that sent a close frame waits for the
// peer's while its reader runs. Closing a socket with unread data makes
// TCP reset the connection, and the peer would lose the Reject that
// explains why.
const closeGrace = 2 * time.Second

// closeWith sends a close frame for a reject (code and "reason: message"),
// waits for the peer's close frame and closes the connection. A nil reject
// closes normally.
func (c *conn) closeWith(r *Reject) {
	code, text := websocket.StatusNormalClosure, ""
	if r != nil {
		code, text = websocket.StatusCode(CloseCode(r.Reason)), closeText(r)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.ws.Close(code, text) // best effort: the peer may be gone, and then there is no one to tell
	}()
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		// Ending a running reader closes the socket, which ends the
		// handshake; with no reader, coder bounds its own wait (5 s).
		c.abort()
		<-done
	}
	c.abort()
}

// cutOff ends, d from now, whatever the connection is doing then: a read,
// a write waiting for a peer that stopped reading (coder closes the
// connection when their context ends), the wait of closeWith, but not a
// Close that coder is already running (its handshake has a 5 s bound of
// its own). Operations that fail for it report why; the first cut-off to
// fire wins. The timer is not stopped when the connection closes first:
// it fires on a closed connection, where it changes nothing a caller
// sees, and keeps the connection's memory for at most d.
func (c *conn) cutOff(d time.Duration, why string) {
	err := fmt.Errorf("%s: the connection did not close within %s", why, d)
	time.AfterFunc(d, func() {
		c.setCause(err)
		c.abort()
	})
}

// closeNow closes the connection without a close handshake.
func (c *conn) closeNow() {
	_ = c.ws.CloseNow() // the socket is done either way
	c.abort()
}

// asReject turns an error into the Reject that explains it to the peer,
// or nil when the error is not the peer's fault.
func asReject(err error) *Reject {
	var re *RejectError
	if errors.As(err, &re) {
		return &Reject{Reason: re.Reason, Message: re.Message, RetryAfterMillis: re.retryAfter.Milliseconds()}
	}
	var r *Reject
	if errors.As(err, &r) {
		return r
	}
	return nil
}

// closeReason extracts the reject reason from a close error sent by the
// peer ("reason: message" as close text), for logs and backoff.
func closeReason(err error) (*Reject, bool) {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return nil, false
	}
	reason, msg, ok := strings.Cut(ce.Reason, ": ")
	if !ok {
		return nil, false
	}
	return &Reject{Reason: Reason(reason), Message: msg}, true
}

// normalClose reports whether err is the peer closing normally or going
// away.
func normalClose(err error) bool {
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		return true
	}
	return false
}

// pingEvery pings the peer every interval until ctx ends, stop is closed
// (a nil stop never is) or a ping cannot be written. A ping waits for its
// pong at most interval. Why a connection ended is the reader's to say
// (see conn), never the pinger's: a missing pong leaves the reader
// silent until its wait ends, a connection a ping cannot be written to
// fails the reader too, and a ping often fails only because the reader
// closed the connection, for a reason it knows and the ping error hides
// ("use of closed network connection" instead of "nothing heard").
func pingEvery(ctx context.Context, stop <-chan struct{}, c *conn, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := c.ws.Ping(pctx)
		waited := pctx.Err() != nil
		cancel()
		if err != nil && !waited {
			return
		}
	}
}
