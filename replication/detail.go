package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection/edge"
)

// Object details (Query.object) are read live from the leaf as the
// viewer. A query replica has no connection to the leaves: it sends the
// request, by NATS request/reply on "<prefix>.detail.<cluster>", to the
// cluster's owner, which performs it with its own client for the cluster
// (a pull cluster's credentials, or a push cluster's edge session) and
// answers. Only the owner subscribes to a cluster's subject, so a request
// for a cluster nobody holds fails at once (no responders).

// detailTimeout bounds one detail request, like graph's own live read.
const detailTimeout = 15 * time.Second

// maxDetailsInFlight bounds the detail requests one owner performs at
// once, so a burst of object(...) queries does not pile up goroutines.
const maxDetailsInFlight = 32

// detailHost is the Host of a replica's detail config: requests never go
// there (RFC 2606 reserved name), the transport carries them.
const detailHost = "http://fleetgraph-owner.invalid"

// The request and reply bodies are the edge protocol's DetailRequest and
// DetailResponse, in JSON.

// Details is graph.LeafClients for a query replica.
type Details struct {
	conn *nats.Conn
	subj subjects
}

// NewDetails returns the detail client of a replica whose stream uses
// prefix ("" for DefaultPrefix).
func NewDetails(conn *nats.Conn, prefix string) *Details {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Details{conn: conn, subj: subjects{prefix}}
}

// RESTConfig implements graph.LeafClients: a config whose transport sends
// each request to the cluster's owner.
func (d *Details) RESTConfig(cluster string) (*rest.Config, error) {
	return &rest.Config{Host: detailHost, Transport: &detailTunnel{d: d, cluster: cluster}}, nil
}

// ErrNoOwner is returned for a detail request of a cluster no collector
// holds now.
var ErrNoOwner = errors.New("no collector holds the cluster now")

type detailTunnel struct {
	d       *Details
	cluster string
}

// RoundTrip implements http.RoundTripper.
func (t *detailTunnel) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close() // reads have no body; RoundTrip must close it
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return nil, fmt.Errorf("replication: detail requests are reads, not %s", req.Method)
	}
	data, err := json.Marshal(&edge.DetailRequest{Method: req.Method, Path: req.URL.RequestURI(), Header: edge.ForwardHeaders(req.Header)})
	if err != nil {
		return nil, fmt.Errorf("replication: detail request: %w", err)
	}
	ctx, cancel := context.WithTimeout(req.Context(), detailTimeout)
	defer cancel()
	msg, err := t.d.conn.RequestWithContext(ctx, t.d.subj.detail(t.cluster), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("cluster %q: %w", t.cluster, ErrNoOwner)
	}
	if err != nil {
		return nil, fmt.Errorf("replication: detail request to the owner of cluster %q: %w", t.cluster, err)
	}
	var resp edge.DetailResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("replication: the owner of cluster %q answered garbage: %w", t.cluster, err)
	}
	if resp.Error != "" {
		return nil, fmt.Errorf("owner of cluster %q: %s", t.cluster, resp.Error)
	}
	return resp.HTTPResponse(req), nil
}

// serveDetails answers detail requests for a cluster this node owns,
// through leaf, until the returned function is called.
func (n *Node) serveDetails(cluster string, leaf func(string) (*rest.Config, error)) func() {
	sem := make(chan struct{}, maxDetailsInFlight)
	sub, err := n.opts.Conn.Subscribe(n.subj.detail(cluster), func(m *nats.Msg) {
		select {
		case sem <- struct{}{}:
		default:
			n.replyDetail(m, &edge.DetailResponse{Error: "too many detail requests in flight at the owner"})
			return
		}
		go func() {
			defer func() { <-sem }()
			n.replyDetail(m, n.performDetail(cluster, leaf, m.Data))
		}()
	})
	if err != nil {
		n.log.Error("cannot answer detail requests", "cluster", cluster, "err", err)
		return func() {}
	}
	return func() { _ = sub.Unsubscribe() }
}

func (n *Node) replyDetail(m *nats.Msg, resp *edge.DetailResponse) {
	data, err := json.Marshal(resp)
	if err == nil {
		err = m.Respond(data)
	}
	if err != nil {
		n.log.Warn("answering a detail request", "err", err)
	}
}

// performDetail runs one detail request with the owner's client for the
// cluster, by the edge's rules (edge.PerformDetail): reads of the
// Kubernetes API that impersonate exactly one user, never the owner's
// own identity.
func (n *Node) performDetail(cluster string, leaf func(string) (*rest.Config, error), data []byte) *edge.DetailResponse {
	var req edge.DetailRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return &edge.DetailResponse{Error: "malformed detail request"}
	}
	cfg, err := leaf(cluster)
	if err != nil {
		return &edge.DetailResponse{Error: err.Error()}
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return &edge.DetailResponse{Error: fmt.Sprintf("client for cluster %q: %v", cluster, err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), detailTimeout)
	defer cancel()
	// The body and its JSON encoding (base64) must fit a reply.
	maxBody := int(n.opts.Conn.MaxPayload())*3/4 - 4096
	return edge.PerformDetail(ctx, client, cfg.Host, maxBody, &req)
}
