// Command watch prints one line per connection state transition of the
// clusters a fleetgraph viewer can see. It subscribes to clusterConnection
// over a websocket, speaking the graphql-transport-ws protocol itself (a
// few messages; any GraphQL websocket client library would do the same):
//
//	FLEETGRAPH_TOKEN=... go run ./examples/watch -url http://127.0.0.1:8080 [-clusters east,west]
//
//	2026-11-23T16:20:46Z west CONNECTED -> DISCONNECTED: readyz probe: ... connection refused
//	2026-11-23T16:21:02Z west DISCONNECTED -> CONNECTED
//
// A lost cluster is one DISCONNECTED line, however many reconnect attempts
// fail, and one CONNECTED (or DEGRADED) line once it has synced again: the
// server sends one event per transition. The time is when the cluster
// entered the state. A cluster that joins the fleet prints "(new)" as its
// previous state.
//
// It runs until interrupted (exit 0) or until the server ends the
// subscription or the socket (exit 1, saying why). It does not reconnect:
// transitions while it is away are not replayed, so run it under a
// supervisor, or read the clusters query for the current states.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv("FLEETGRAPH_TOKEN"), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "watch:", err)
		os.Exit(1)
	}
}

// subscription is the GraphQL document the program runs.
const subscription = `subscription Watch($clusters: [String!]) {
  clusterConnection(clusters: $clusters) { cluster state previous at message }
}`

// event is one clusterConnection event.
type event struct {
	Cluster  string    `json:"cluster"`
	State    string    `json:"state"`
	Previous *string   `json:"previous"`
	At       time.Time `json:"at"`
	Message  *string   `json:"message"`
}

// message is a graphql-transport-ws message.
type message struct {
	ID      string `json:"id,omitempty"`
	Type    string `json:"type"`
	Payload any    `json:"payload,omitempty"`
}

// run watches until ctx ends (nil) or the server ends the stream (an
// error). Lines go to out; what it is doing goes to log.
func run(ctx context.Context, args []string, token string, out, log io.Writer) error {
	fl := flag.NewFlagSet("watch", flag.ContinueOnError)
	fl.SetOutput(log)
	server := fl.String("url", "http://127.0.0.1:8080", "fleetgraph's base URL")
	clusters := fl.String("clusters", "", "comma-separated cluster names to watch (default: every cluster you can see)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if token == "" {
		return errors.New("set FLEETGRAPH_TOKEN to your bearer token")
	}
	endpoint, err := wsURL(*server)
	if err != nil {
		return err
	}
	vars := map[string]any{}
	if *clusters != "" {
		vars["clusters"] = strings.Split(*clusters, ",")
	}

	conn, _, err := websocket.Dial(ctx, endpoint, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	defer func() { _ = conn.CloseNow() }()

	// The token goes in connection_init, never in the URL.
	if err := wsjson.Write(ctx, conn, message{Type: "connection_init", Payload: map[string]string{"Authorization": "Bearer " + token}}); err != nil {
		return err
	}
	var ack message
	if err := read(ctx, conn, &ack); err != nil {
		return err
	}
	if ack.Type != "connection_ack" {
		return fmt.Errorf("the server answered connection_init with %q", ack.Type)
	}
	if err := wsjson.Write(ctx, conn, message{ID: "1", Type: "subscribe", Payload: map[string]any{"query": subscription, "variables": vars}}); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(log, "watching cluster connections at %s\n", endpoint)

	for {
		var m struct {
			Type    string          `json:"type"`
			Payload json.RawMessage `json:"payload"`
		}
		if err := read(ctx, conn, &m); err != nil {
			if ctx.Err() != nil {
				_ = conn.Close(websocket.StatusNormalClosure, "")
				return nil
			}
			return err
		}
		switch m.Type {
		case "next":
			var p struct {
				Data   struct{ ClusterConnection event }
				Errors []gqlError
			}
			if err := json.Unmarshal(m.Payload, &p); err != nil {
				return fmt.Errorf("bad event %s: %w", m.Payload, err)
			}
			if len(p.Errors) > 0 {
				return fmt.Errorf("subscription error: %s", p.Errors[0].Message)
			}
			if _, err := fmt.Fprintln(out, format(p.Data.ClusterConnection)); err != nil {
				return err
			}
		case "error":
			var errs []gqlError
			_ = json.Unmarshal(m.Payload, &errs)
			if len(errs) == 0 {
				return fmt.Errorf("subscription refused: %s", m.Payload)
			}
			return fmt.Errorf("subscription refused: %s", errs[0].Message)
		case "complete":
			return errors.New("the server ended the subscription")
		case "ping":
			if err := wsjson.Write(ctx, conn, message{Type: "pong"}); err != nil {
				return err
			}
		}
	}
}

type gqlError struct {
	Message string `json:"message"`
}

// format renders one transition as a line.
func format(e event) string {
	prev := "(new)"
	if e.Previous != nil {
		prev = *e.Previous
	}
	line := fmt.Sprintf("%s %s %s -> %s", e.At.UTC().Format(time.RFC3339), e.Cluster, prev, e.State)
	if e.Message != nil && *e.Message != "" {
		line += ": " + *e.Message
	}
	return line
}

// read reads one message, turning a close by the server into an error
// that says why (4403: credentials rejected, expired or revoked; 1001: the
// server is shutting down).
func read(ctx context.Context, conn *websocket.Conn, v any) error {
	err := wsjson.Read(ctx, conn, v)
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return fmt.Errorf("the server closed the connection: %d %s", ce.Code, ce.Reason)
	}
	return err
}

// wsURL turns the server's base URL into its GraphQL websocket URL.
func wsURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("-url %q: want the server's base URL, e.g. http://127.0.0.1:8080", base)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("-url %q: want http or https", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/graphql"
	return u.String(), nil
}
