package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gorilla/websocket"
)

const (
	// writeTimeout bounds one message write. A peer that does not take
	// a 4 MiB message within it is gone or hopelessly slow; the session
	// ends and the edge resyncs.
	writeTimeout = 30 * time.Second
	// controlTimeout bounds a ping or close frame write.
	controlTimeout = 5 * time.Second
)

// wireLimit is the read limit given to gorilla, which counts bytes on the
// wire, before decompression. It is a safety net above the real limit
// (checked after decompression by readMessage) so that the real one, which
// can say why, is the one that normally triggers. Deflate never grows data
// by more than a few bytes per 16 KiB block.
func wireLimit(maxMessage int) int64 { return int64(maxMessage) + int64(maxMessage)/64 + 4096 }

// deadlineReader pushes the connection's read deadline forward whenever
// data arrives, so a large message on a slow link is not cut off by the
// keep-alive deadline while it is still flowing.
type deadlineReader struct {
	r    io.Reader
	conn *websocket.Conn
	wait time.Duration
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if n > 0 {
		_ = d.conn.SetReadDeadline(time.Now().Add(d.wait)) // fails only on a closed conn, which the next read reports
	}
	return n, err
}

// readMessage reads the next text message of at most limit bytes after
// decompression and decodes it. Errors that a Reject can explain are
// *RejectError; others mean the connection is gone.
func readMessage(conn *websocket.Conn, limit int, wait time.Duration) (*Message, int, error) {
	if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return nil, 0, fmt.Errorf("set read deadline: %w", err)
	}
	typ, r, err := conn.NextReader()
	if err != nil {
		if errors.Is(err, websocket.ErrReadLimit) {
			return nil, 0, rejectf(ReasonOversize, "message over %d bytes", limit)
		}
		return nil, 0, fmt.Errorf("read: %w", err)
	}
	if typ != websocket.TextMessage {
		return nil, 0, rejectf(ReasonMalformed, "binary frame; messages are JSON text")
	}
	data, err := io.ReadAll(io.LimitReader(&deadlineReader{r: r, conn: conn, wait: wait}, int64(limit)+1))
	if err != nil {
		if errors.Is(err, websocket.ErrReadLimit) {
			return nil, len(data), rejectf(ReasonOversize, "message over %d bytes", limit)
		}
		return nil, len(data), fmt.Errorf("read: %w", err)
	}
	if len(data) > limit {
		return nil, len(data), rejectf(ReasonOversize, "message over %d bytes (limit after decompression)", limit)
	}
	m, err := decodeMessage(data)
	return m, len(data), err
}

// writeMessage encodes and writes one message. The caller serializes
// writes and has set Seq and Time.
func writeMessage(conn *websocket.Conn, m *Message) (int, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", m.Type, err)
	}
	if err := conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return 0, fmt.Errorf("set write deadline: %w", err)
	}
	if err := conn.WriteMessage(websocket.TextMessage, data); err != nil {
		return 0, fmt.Errorf("write %s: %w", m.Type, err)
	}
	return len(data), nil
}

// closeGrace bounds how long a side that sent a close frame keeps reading
// (and discarding) until the peer's close frame. Closing a socket with
// unread data makes TCP reset the connection, and the peer would lose the
// Reject that explains why.
const closeGrace = 2 * time.Second

// sendClose sends a close frame for a reject. It is best effort: the peer
// may be gone already, and then there is no one to tell.
func sendClose(conn *websocket.Conn, r *Reject) {
	_ = conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(CloseCode(r.Reason), closeText(r)), time.Now().Add(controlTimeout))
}

// drain reads and discards messages until the peer closes, the connection
// fails, or deadline passes. Only the connection's one reader may call it.
func drain(conn *websocket.Conn, deadline time.Time) {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return // closed already
	}
	for {
		_, r, err := conn.NextReader()
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, r); err != nil {
			return
		}
	}
}

// closeWith sends a close frame for a reject, waits for the peer to close
// (bounded by closeGrace), and closes the connection. Only the
// connection's one reader may call it.
func closeWith(conn *websocket.Conn, r *Reject) {
	sendClose(conn, r)
	drain(conn, time.Now().Add(closeGrace))
	_ = conn.Close() // the socket is done either way
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
	var ce *websocket.CloseError
	if !errors.As(err, &ce) {
		return nil, false
	}
	reason, msg, ok := strings.Cut(ce.Text, ": ")
	if !ok {
		return nil, false
	}
	return &Reject{Reason: Reason(reason), Message: msg}, true
}

// pingEvery writes a ping to conn every interval until ctx ends or stop
// is closed (a nil stop never is), and returns the error of a ping that
// could not be written. Both ends of a session ping this way.
func pingEvery(ctx context.Context, stop <-chan struct{}, conn *websocket.Conn, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case <-t.C:
		}
		if err := conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(controlTimeout)); err != nil {
			return fmt.Errorf("ping: %w", err)
		}
	}
}
