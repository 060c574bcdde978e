package fleetgraph_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/index"
)

// A program that embeds fleetgraph: New wires the server, Run collects
// until its context ends, Handler serves the API, the dashboard and
// GraphiQL on any http.Server. Here the fleet is empty (clusters come from
// Config.Clusters, Config.Sources, AddCluster or edge agents) and the
// viewers come from a token file; examples/embed is a complete program
// with a custom kind and a custom authenticator.
func ExampleNew() {
	// One line per token: token,user,uid,"group,group".
	tokens, err := authz.ParseStaticTokens(strings.NewReader(`alice-token,alice,alice,"team-a,oncall"`+"\n"), "tokens.csv", authz.Naming{})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := fleetgraph.New(fleetgraph.Config{
		Authenticator: tokens,
		AdminGroups:   []string{"platform"},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			fmt.Println(err)
		}
		hs.Close()
	}()

	fmt.Println(postQuery(hs.URL, "alice-token", `{ viewer { username groups } clusters { name } }`))
	fmt.Println(postQuery(hs.URL, "stolen-token", `{ viewer { username } }`))
	// Output:
	// 200 {"data":{"viewer":{"username":"alice","groups":["team-a","oncall"]},"clusters":[]}}
	// 401 {"errors":[{"message":"authentication failed: the credentials were not accepted","extensions":{"code":"UNAUTHENTICATED"}}]}
}

// Clusters can join and leave a running server. Each has a row in the
// index (Server.Store) with its connection state; one that cannot be
// reached says why.
func ExampleServer_AddCluster() {
	tokens, err := authz.ParseStaticTokens(strings.NewReader(`admin-token,admin,admin,platform`+"\n"), "tokens.csv", authz.Naming{})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := fleetgraph.New(fleetgraph.Config{
		Authenticator: tokens,
		AdminGroups:   []string{"platform"},
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// A kubeconfig's contexts are clusters; this one names a cluster
	// that is not there.
	specs, err := connection.KubeconfigSpecs("testdata/example-kubeconfig.yaml", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, spec := range specs {
		if err := srv.AddCluster(spec); err != nil {
			fmt.Println(err)
			return
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	// The first probe fails: the cluster is DISCONNECTED, and says why.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c, ok := srv.Store().GetCluster(nil, "nowhere"); ok && c.State == index.StateDisconnected {
			fmt.Printf("%s %s %s: %s\n", c.Name, c.Mode, c.State, c.LastError)
			break
		}
	}
	// Output:
	// nowhere PULL DISCONNECTED: discovery: Get "https://127.0.0.1:1/api": dial tcp 127.0.0.1:1: connect: connection refused
}

// postQuery sends a GraphQL query with a bearer token and returns the status
// and the body.
func postQuery(url, token, query string) string {
	req, err := http.NewRequest(http.MethodPost, url+"/graphql", strings.NewReader(fmt.Sprintf(`{"query": %q}`, query)))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}
