package graph

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
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/coder/websocket"
)

// The websocket transport is gqlgen's transport.Websocket (which speaks
// graphql-transport-ws and the legacy graphql-ws) on top of coder/websocket
// (the module's one websocket library, which gqlgen's transport imports),
// through wsConn, which adds what gqlgen leaves out:
//
//   - the close codes of graphql-transport-ws: 4400 for malformed or unknown
//     messages, 4401 for subscribe before connection_init, 4408 when
//     connection_init does not come within InitTimeout, 4409 for an
//     operation id already in use, 4429 for a second connection_init
//     (gqlgen itself sends 4403 from wsInit);
//   - a bound on operations per connection (TOO_MANY_OPERATIONS), where an
//     operation holds its slot until its resolver has returned;
//   - a write timeout, so a client that stops reading is disconnected
//     instead of holding its goroutines forever (enforced by batchConn,
//     see write);
//   - a read deadline for legacy graphql-ws clients, which send nothing
//     while they wait: a websocket ping unanswered within two KeepAlive
//     intervals closes the socket with 1008;
//   - a registry of open connections, so Handler.Close can end them.
//
// wsConn learns that an operation ended from the messages gqlgen writes
// (their type and id, read back from the JSON), never from gqlgen's types.

// errProtocol ends gqlgen's read loop after wsConn closed the socket for a
// protocol violation.
var errProtocol = errors.New("graphql websocket protocol violation")

// wsTransport returns the configured gqlgen websocket transport.
func (h *Handler) wsTransport() transport.Websocket {
	o := h.opts.Websocket
	readLimit := o.ReadLimit
	return transport.Websocket{
		Implementation: wsAcceptor{h: h},
		InitFunc:       h.wsInit,
		// wsConn runs its own init timer, to close with 4408 rather than
		// gqlgen's 1002.
		InitTimeout:           0,
		KeepAlivePingInterval: o.KeepAlive,
		PingPongInterval:      o.KeepAlive,
		PayloadReadLimit:      &readLimit,
		ErrorFunc: func(ctx context.Context, err error) {
			h.log.DebugContext(ctx, "graphql: websocket error", "err", err)
		},
	}
}

// checkOrigin applies the origin policy to a websocket upgrade, the way
// coder/websocket does (same host, or a pattern match on the host, or on
// scheme://host when the pattern has a scheme), so that a disallowed origin
// gets a clear 403 before any upgrade work.
func checkOrigin(r *http.Request, patterns []string) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return fmt.Errorf("origin %q is not a URL with a host", origin)
	}
	if strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return nil
		}
	}
	return fmt.Errorf("origin %q is not allowed to open websockets on this server", origin)
}

// wsAcceptor implements transport.WebsocketImplementation.
type wsAcceptor struct{ h *Handler }

// Accept upgrades the request and starts the init timer.
func (a wsAcceptor) Accept(w http.ResponseWriter, r *http.Request, _ transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	h := a.h
	c, err := websocket.Accept(batchingResponseWriter{ResponseWriter: w, writeTimeout: h.opts.Websocket.WriteTimeout}, r, &websocket.AcceptOptions{
		// Preferred first: coder picks the first of these the client
		// offers.
		Subprotocols:   []string{"graphql-transport-ws", "graphql-ws"},
		OriginPatterns: h.opts.Websocket.OriginPatterns,
		// Per-message deflate costs a compressor per connection; change
		// events are small and a thousand subscribers must stay cheap.
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, fmt.Errorf("graph: websocket upgrade: %w", err)
	}
	wc := &wsConn{
		c: c, h: h,
		active: map[string]*wsOperation{},
		closed: make(chan struct{}),
		done:   make(chan struct{}),
	}
	if !h.track(wc) {
		_ = c.Close(closeGoingAway, "server shutting down")
		return nil, errors.New("graph: server shutting down")
	}
	if up, ok := r.Context().Value(upgradeKey{}).(*upgrade); ok {
		up.conn = wc // for wsInit: the viewer's credentials may expire
	}
	wc.mu.Lock() // the timer may fire at once; its callback reads initTimer
	wc.initTimer = time.AfterFunc(h.opts.Websocket.InitTimeout, wc.initExpired)
	wc.mu.Unlock()
	if c.Subprotocol() != "graphql-transport-ws" {
		// The legacy protocol has no pong of its own: websocket pings,
		// which browsers answer by themselves, find a client that is gone.
		go wc.keepAlive()
	}
	return wc, nil
}

// wsConn implements transport.WebsocketConn over a coder/websocket
// connection. gqlgen reads from one goroutine and writes from many (each
// operation, keep-alives); coder's Write is safe for that, and wsConn's own
// state is guarded by mu.
//
// An operation holds one of the connection's MaxOperations slots from the
// client's subscribe until the server's complete or error for its id, which
// gqlgen sends when the resolver has returned: a client that completes an
// operation does not get its slot back while the resolver still runs.
type wsConn struct {
	c *websocket.Conn
	h *Handler

	mu          sync.Mutex
	initSeen    bool
	active      map[string]*wsOperation // operation ids whose resolvers have not finished
	subscribing string                  // the id of the subscribe message gqlgen reads now (see bindOperation)
	writing     int                     // messages being written
	quiet       idleWaiter              // until active and writing are both empty
	closing     bool
	closed      chan struct{} // closed when the close handshake is over
	done        chan struct{} // closed when the connection ends; stops keepAlive
	doneOnce    sync.Once
	initTimer   *time.Timer
	deadline    *time.Timer
	expiry      *time.Timer // closes the socket when its credentials expire
	untrackOnce sync.Once
}

// wsOperation is one operation id in flight.
type wsOperation struct {
	// ended is closed when the server has sent the operation's complete
	// or error; completed says the client sent complete (stop) first.
	ended     chan struct{}
	completed bool
	// rc is the operation's context once gqlgen created it (see
	// bindOperation): how a resolver finds its operation id.
	rc *graphql.OperationContext
}

var _ interface {
	transport.WebsocketConn
	transport.WebsocketReadLimiter
	transport.WebsocketReadDeadliner
} = (*wsConn)(nil)

// wsEnvelope is the part of a websocket message wsConn checks: the type
// and id of what a client sends, and of what gqlgen writes.
type wsEnvelope struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// NextReader implements transport.WebsocketConn. It reads one message,
// enforces the protocol rules gqlgen does not, and hands the message to
// gqlgen unchanged.
func (c *wsConn) NextReader() (int, io.Reader, error) {
	for {
		typ, data, err := c.c.Read(context.Background())
		if err != nil {
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusNoStatusRcvd, websocket.StatusGoingAway:
				return 0, nil, transport.ErrWebsocketClosed
			}
			return 0, nil, err
		}
		pass, err := c.check(data)
		if err != nil {
			return 0, nil, err
		}
		if pass {
			return int(typ), bytes.NewReader(data), nil
		}
	}
}

// check applies the protocol rules to one client message. It returns
// false for a message it answered itself, and errProtocol after closing
// the socket for a violation.
func (c *wsConn) check(data []byte) (bool, error) {
	var m wsEnvelope
	if err := json.Unmarshal(data, &m); err != nil || m.Type == "" {
		return false, c.violation(closeBadRequest, "Invalid message received")
	}
	switch m.Type {
	case "connection_init":
		c.mu.Lock()
		seen := c.initSeen
		c.initSeen = true
		c.initTimer.Stop()
		c.mu.Unlock()
		if seen {
			return false, c.violation(closeTooManyInits, "Too many initialisation requests")
		}
	case "subscribe", "start":
		return c.startOperation(m.ID)
	case "complete", "stop":
		c.mu.Lock()
		if op := c.active[m.ID]; op != nil {
			op.completed = true // the slot stays taken until the resolver returns
		}
		c.mu.Unlock()
	case "ping", "pong", "connection_terminate":
	default:
		return false, c.violation(closeBadRequest, "Invalid message received")
	}
	return true, nil
}

// completedWait bounds how long a subscribe waits for the server to finish
// the operation the client just completed under the same id.
const completedWait = 2 * time.Second

// startOperation admits a subscribe (start) message.
func (c *wsConn) startOperation(id string) (bool, error) {
	c.mu.Lock()
	if !c.initSeen {
		c.mu.Unlock()
		return false, c.violation(closeUnauthorized, "Unauthorized")
	}
	if id == "" {
		c.mu.Unlock()
		return false, c.violation(closeBadRequest, "Invalid message received")
	}
	if op := c.active[id]; op != nil && op.completed {
		// The client reused the id of an operation it just completed;
		// let gqlgen finish the old one first, or it would confuse the
		// two.
		c.mu.Unlock()
		t := time.NewTimer(completedWait)
		select {
		case <-op.ended:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
	}
	if _, ok := c.active[id]; ok {
		c.mu.Unlock()
		return false, c.violation(closeDuplicateID, truncateReason("Subscriber for "+id+" already exists"))
	}
	if max := c.h.opts.Websocket.MaxOperations; len(c.active) >= max {
		c.mu.Unlock()
		c.rejectOperation(id, fmt.Sprintf("this connection already runs %d operations, the maximum", max))
		return false, nil
	}
	c.active[id] = &wsOperation{ended: make(chan struct{})}
	c.subscribing = id
	c.mu.Unlock()
	return true, nil
}

// bindOperation records the context gqlgen created for the subscribe
// message it is reading now. gqlgen reads the connection's messages on one
// goroutine and creates a subscribe's operation context there, before it
// reads the next message (see wsOperationIDs), so that message is the one
// NextReader handed it last.
func (c *wsConn) bindOperation(rc *graphql.OperationContext) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if op := c.active[c.subscribing]; op != nil && op.rc == nil {
		op.rc = rc
	}
	c.subscribing = ""
}

// operationID returns the id of the operation whose context is rc, while
// the operation runs.
func (c *wsConn) operationID(rc *graphql.OperationContext) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, op := range c.active {
		if op.rc == rc {
			return id, true
		}
	}
	return "", false
}

// rejectOperation answers one operation with an error message and keeps
// the connection.
func (c *wsConn) rejectOperation(id, msg string) {
	b, err := json.Marshal(map[string]any{
		"id": id, "type": "error",
		"payload": []map[string]any{{"message": msg, "extensions": map[string]any{"code": CodeTooManyOperations}}},
	})
	if err != nil {
		return
	}
	c.mu.Lock()
	c.writing++
	c.mu.Unlock()
	if err := c.write(b); err != nil {
		c.h.log.Debug("graph: websocket write", "err", err)
	}
}

// violation closes the socket with a protocol close code.
func (c *wsConn) violation(code int, reason string) error {
	_ = c.WriteClose(code, reason)
	return errProtocol
}

// initExpired closes a socket that sent no connection_init in time.
func (c *wsConn) initExpired() {
	c.mu.Lock()
	seen := c.initSeen
	c.mu.Unlock()
	if !seen {
		_ = c.WriteClose(closeInitTimeout, closeReasonInitTimout)
	}
}

// expireAt closes the socket with 4403 at t, when the credentials it was
// initialized with expire: every operation on it runs as that viewer, and
// the server would now refuse them.
func (c *wsConn) expireAt(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	c.expiry = time.AfterFunc(time.Until(t), func() {
		c.h.log.Debug("graph: websocket credentials expired; closing")
		_ = c.WriteClose(closeForbidden, closeReasonExpired)
	})
}

// keepAlive pings a legacy graphql-ws client every KeepAlive and closes
// the socket when a pong does not come back within two intervals: this is
// the read deadline of a protocol whose clients send nothing while they
// wait for events. (graphql-transport-ws has its own ping and pong, which
// gqlgen times through SetReadDeadline, with the same two intervals.)
func (c *wsConn) keepAlive() {
	interval := c.h.opts.Websocket.KeepAlive
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*interval)
		err := c.c.Ping(ctx)
		silent := ctx.Err() != nil
		cancel()
		if silent {
			c.h.log.Debug("graph: legacy websocket client does not answer pings; closing")
			_ = c.WriteClose(closePolicyViolation, truncateReason(fmt.Sprintf("no pong within %s", 2*interval)))
			return
		}
		if err != nil {
			return // the connection is gone
		}
	}
}

// stopTimers stops what would close the socket; c.mu is held.
func (c *wsConn) stopTimers() {
	c.initTimer.Stop()
	for _, t := range []*time.Timer{c.deadline, c.expiry} {
		if t != nil {
			t.Stop()
		}
	}
	c.doneOnce.Do(func() { close(c.done) })
}

// WriteJSON implements transport.WebsocketConn. A complete or error
// message ends its operation and frees its slot.
func (c *wsConn) WriteJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("graph: encoding a websocket message: %w", err)
	}
	var m wsEnvelope
	if !isDataMessage(b) {
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("graph: reading back a websocket message: %w", err)
		}
	}
	c.mu.Lock()
	c.writing++ // before the operation ends, so Close waits for this message too
	if op := c.active[m.ID]; op != nil && (m.Type == "complete" || m.Type == "error") {
		delete(c.active, m.ID)
		close(op.ended)
	}
	c.mu.Unlock()
	return c.write(b)
}

// writeEvent sends a subscription event that graph encoded itself (see
// directEvents): a message that neither starts nor ends an operation.
func (c *wsConn) writeEvent(b []byte) error {
	c.mu.Lock()
	c.writing++
	c.mu.Unlock()
	return c.write(b)
}

// isDataMessage reports whether b, a message gqlgen wrote, is a
// subscription event ("next", or "data" in graphql-ws), which neither
// starts nor ends an operation, so that WriteJSON need not decode the
// whole event to find its type. gqlgen's message structs put the type last
// and encoding/json writes fields in order, so an event ends with
// "type":"next"}; valid JSON has that suffix only when it is the
// top-level object's last member (a quote before "type" that closed a
// string could not be followed by a letter, and the payload, an object,
// ends in a brace). If gqlgen reordered its fields the suffix would not
// match and the message would be decoded as before.
func isDataMessage(b []byte) bool {
	return bytes.HasSuffix(b, []byte(`"type":"next"}`)) || bytes.HasSuffix(b, []byte(`"type":"data"}`))
}

// write sends one text message, then releases the c.writing its caller
// took. It sets no deadline of its own: the connection's batchConn
// (wsbatch.go) writes to the socket with the write timeout as its deadline
// and closes the connection when it passes, which fails this write and
// every later one, so a client that stops reading is still dropped after
// the write timeout (TestWebsocketSlowClientIsDropped). A context with a
// deadline per message cost coder/websocket a timer and an AfterFunc for
// every event: a seventh of the server's CPU per delivery on bench-graph's
// fan-out once the events were written directly (wsevents.go).
func (c *wsConn) write(b []byte) error {
	defer func() {
		c.mu.Lock()
		c.writing--
		if c.isQuiet() {
			c.quiet.wake()
		}
		c.mu.Unlock()
	}()
	if err := c.c.Write(context.Background(), websocket.MessageText, b); err != nil {
		return fmt.Errorf("graph: websocket write: %w", err)
	}
	return nil
}

// isQuiet reports whether no operation is in flight and nothing is being
// written; c.mu is held.
func (c *wsConn) isQuiet() bool { return len(c.active) == 0 && c.writing == 0 }

// waitQuiet waits until no operation is in flight and nothing is being
// written, so that a close frame cannot overtake the final messages of
// operations that were just ended, or until ctx ends.
func (c *wsConn) waitQuiet(ctx context.Context) {
	c.mu.Lock()
	quiet := c.quiet.channel(c.isQuiet())
	c.mu.Unlock()
	if quiet == nil {
		return
	}
	select {
	case <-quiet:
	case <-ctx.Done():
	}
}

// WriteClose implements transport.WebsocketConn. Only the first close
// counts. The close handshake (up to 5 s with a silent peer) runs in the
// background so gqlgen's teardown does not wait for it.
func (c *wsConn) WriteClose(code int, reason string) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	c.stopTimers()
	c.mu.Unlock()
	go func() {
		defer close(c.closed)
		defer c.untrack()
		_ = c.c.Close(websocket.StatusCode(code), truncateReason(reason))
	}()
	return nil
}

// Close implements transport.WebsocketConn.
func (c *wsConn) Close() error {
	c.mu.Lock()
	closing := c.closing
	c.closing = true
	c.stopTimers()
	c.mu.Unlock()
	if closing {
		return nil // the handshake goroutine closes the connection
	}
	defer c.untrack()
	defer close(c.closed)
	if err := c.c.CloseNow(); err != nil {
		return fmt.Errorf("graph: closing websocket: %w", err)
	}
	return nil
}

func (c *wsConn) untrack() { c.untrackOnce.Do(func() { c.h.untrack(c) }) }

// Subprotocol implements transport.WebsocketConn.
func (c *wsConn) Subprotocol() string { return c.c.Subprotocol() }

// SetReadLimit implements transport.WebsocketReadLimiter.
func (c *wsConn) SetReadLimit(n int64) { c.c.SetReadLimit(n) }

// SetReadDeadline implements transport.WebsocketReadDeadliner, which
// gqlgen uses to drop clients that stop answering pings.
func (c *wsConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deadline != nil {
		c.deadline.Stop()
		c.deadline = nil
	}
	if t.IsZero() || c.closing {
		return nil
	}
	c.deadline = time.AfterFunc(time.Until(t), func() { _ = c.c.CloseNow() })
	return nil
}

// truncateReason keeps a close reason within the 123 bytes a close frame
// allows.
func truncateReason(s string) string {
	const maxReason = 123
	if len(s) <= maxReason {
		return s
	}
	return s[:maxReason]
}
