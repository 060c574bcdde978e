package replication

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultMaxPayload is the maximum message size of an embedded server:
// NATS's default (1 MiB) would do, since every message is split below it,
// but object details of push clusters travel in one reply.
const DefaultMaxPayload = 8 << 20

// EmbeddedOptions configures a NATS server run inside the process.
type EmbeddedOptions struct {
	// Dir holds JetStream's files; the stream survives restarts there.
	// Required.
	Dir string
	// Listen is "host:port" to accept connections from other processes
	// (port 0 picks a free one); empty means this process only.
	Listen string
	// Name names the server (default: a generated one); a cluster's
	// servers need distinct names that survive restarts.
	Name string
	// ClusterName, ClusterListen and Routes join the server to other
	// servers as one JetStream cluster: the cluster's name, the
	// "host:port" this server takes routes on, and the route URLs
	// ("nats://host:port") of the others.
	ClusterName   string
	ClusterListen string
	Routes        []string
	// MaxPayload defaults to DefaultMaxPayload.
	MaxPayload int32
}

// StartEmbedded starts a NATS server with JetStream in this process and
// waits until it accepts connections.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	if o.Dir == "" {
		return nil, errors.New("replication: an embedded NATS server needs a directory")
	}
	opts := &server.Options{
		ServerName: o.Name, JetStream: true, StoreDir: o.Dir, NoSigs: true, NoLog: true,
		MaxPayload: o.MaxPayload, DontListen: o.Listen == "" && o.ClusterListen == "",
	}
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = DefaultMaxPayload
	}
	if o.Listen != "" {
		host, port, err := splitHostPort(o.Listen)
		if err != nil {
			return nil, fmt.Errorf("replication: NATS listen address: %w", err)
		}
		opts.Host, opts.Port = host, port
	} else {
		opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	}
	if o.ClusterListen != "" {
		host, port, err := splitHostPort(o.ClusterListen)
		if err != nil {
			return nil, fmt.Errorf("replication: NATS cluster address: %w", err)
		}
		opts.Cluster = server.ClusterOpts{Name: o.ClusterName, Host: host, Port: port}
		for _, r := range o.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("replication: NATS route %q: %w", r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("replication: NATS server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("replication: the embedded NATS server did not start within 30s")
	}
	return s, nil
}

// ConnectEmbedded connects to an embedded server without the network.
func ConnectEmbedded(s *server.Server, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect("", append([]nats.Option{nats.InProcessServer(s), nats.Name("fleetgraph")}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("replication: connect to the embedded NATS server: %w", err)
	}
	return nc, nil
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}
