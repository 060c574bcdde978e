// Command embed is a program that embeds fleetgraph as a library, as a
// platform team's own service would, instead of running the fleetgraph
// command. It
//
//   - collects a kind of its own, the Widget custom resource of group
//     example.com, beside the built-in kinds (Config.ExtraKinds; its
//     status follows kstatus: Ready, Reconciling, Stalled);
//   - authenticates callers with the organisation's API keys, a custom
//     authz.Authenticator (apiKeys, below), instead of fleetgraph's token
//     file or OIDC;
//   - serves the API, the dashboard and GraphiQL from its own http.Server,
//     and stops cleanly on SIGINT or SIGTERM.
//
// Run it against the clusters of a kubeconfig (every context is a cluster):
//
//	go run ./examples/embed -kubeconfig ~/.kube/config -api-keys keys.csv -listen 127.0.0.1:8080
//
// keys.csv holds one "key,user,group;group" line per key. Send a key in an
// X-API-Key header, or as a bearer token (what the dashboard and websocket
// clients send):
//
//	curl -H 'X-API-Key: <key>' -H 'Content-Type: application/json' \
//	  http://127.0.0.1:8080/graphql -d '{"query":"{ objects(filter: {kinds: [\"Widget.example.com\"]}) { totalCount } }"}'
//
// Every answer is filtered by each cluster's RBAC for the key's user and
// groups, exactly as for the fleetgraph command.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
)

// widgetKind is the custom kind: group/version/Kind.
const widgetKind = "example.com/v1/Widget"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. It prints "serving http://..." once it
// listens.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("embed", flag.ContinueOnError)
	fl.SetOutput(stderr)
	kubeconfig := fl.String("kubeconfig", "", "kubeconfig whose contexts are the clusters (default: $KUBECONFIG or ~/.kube/config)")
	keysFile := fl.String("api-keys", "", `file of "key,user,group;group" lines (required)`)
	adminGroup := fl.String("admin-group", "platform", "group whose members see every object of every cluster")
	listen := fl.String("listen", "127.0.0.1:8080", "address to serve on")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *keysFile == "" {
		return errors.New("-api-keys is required")
	}
	keys, err := loadAPIKeys(*keysFile)
	if err != nil {
		return err
	}
	clusters, err := connection.KubeconfigSpecs(*kubeconfig, nil)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv, err := fleetgraph.New(fleetgraph.Config{
		Clusters:      clusters,
		ExtraKinds:    []string{widgetKind},
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{keys}},
		AdminGroups:   []string{*adminGroup},
		Logger:        log,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	_, _ = fmt.Fprintf(stdout, "serving http://%s (dashboard /, GraphQL /graphql) for %d clusters\n", ln.Addr(), len(clusters))

	// Run collects until ctx ends, then tells websocket clients the server
	// is going away; the HTTP server stops after it.
	err = srv.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = errors.Join(err, hs.Shutdown(sctx))
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// apiKeys is the custom authenticator: it knows each key by its SHA-256,
// so that the lookup does not leak a key's bytes through timing.
type apiKeys struct {
	users map[[sha256.Size]byte]*user.DefaultInfo
}

// Authenticate implements authz.Authenticator. A request without a key is
// not this authenticator's business (authz.ErrNotApplicable), so a Union
// can try others; an unknown key is rejected.
func (a *apiKeys) Authenticate(_ context.Context, c authz.Credentials) (user.Info, error) {
	key := c.Header.Get("X-API-Key")
	if key == "" {
		key = c.Token
	}
	if key == "" {
		return nil, authz.ErrNotApplicable
	}
	u, ok := a.users[sha256.Sum256([]byte(key))]
	if !ok {
		return nil, errors.New("unknown API key")
	}
	return u, nil
}

// loadAPIKeys reads "key,user,group;group" lines. Like fleetgraph's own
// authenticators, it refuses identities that would pass for Kubernetes
// ServiceAccounts or system: groups in the leaf clusters' RBAC.
func loadAPIKeys(path string) (*apiKeys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	r := csv.NewReader(f)
	r.FieldsPerRecord = 3
	r.Comment = '#'
	records, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	keys := &apiKeys{users: map[[sha256.Size]byte]*user.DefaultInfo{}}
	for i, rec := range records {
		key, name := strings.TrimSpace(rec[0]), strings.TrimSpace(rec[1])
		var groups []string
		for _, g := range strings.Split(rec[2], ";") {
			if g = strings.TrimSpace(g); g != "" {
				groups = append(groups, g)
			}
		}
		if key == "" || name == "" {
			return nil, fmt.Errorf("%s: line %d: key and user must not be empty", path, i+1)
		}
		for _, n := range append([]string{name}, groups...) {
			if strings.HasPrefix(n, "system:") {
				return nil, fmt.Errorf("%s: line %d: %q: system: names are Kubernetes' own", path, i+1, n)
			}
		}
		h := sha256.Sum256([]byte(key))
		if _, dup := keys.users[h]; dup {
			return nil, fmt.Errorf("%s: line %d: the key is listed twice", path, i+1)
		}
		keys.users[h] = &user.DefaultInfo{Name: name, Groups: groups}
	}
	if len(keys.users) == 0 {
		return nil, fmt.Errorf("%s: no keys", path)
	}
	return keys, nil
}
