package fleetgraph

import (
	"context"
	"errors"
	"net/http"
)

// ErrNotImplemented is returned by parts of the server that are not built
// yet.
var ErrNotImplemented = errors.New("not implemented yet")

// Config configures a Server.
type Config struct{}

// Server is an embeddable fleetgraph: an HTTP handler for the API and a
// collection loop.
type Server struct{}

// New wires a Server from its configuration.
func New(Config) (*Server, error) {
	return nil, ErrNotImplemented
}

// Handler returns the HTTP handler that serves the API.
func (s *Server) Handler() http.Handler {
	return http.NotFoundHandler()
}

// Run collects from the configured clusters until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
