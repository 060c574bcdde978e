// Command bigfleet serves the real GraphQL API and dashboard over the
// synthetic 1M-object benchmark fleet (index/indextest.DefaultFleet),
// loaded straight into an index.Store: what `make bench-ui` measures the
// dashboard against. It prints one line, "url=... admin=... viewer=...",
// once the fleet is loaded, and serves until interrupted.
//
// admin is a fleet admin (every object); viewer is bound in 200
// namespaces of every cluster, 20,000 namespaces in all, like the viewer of
// the graph benchmark's Q3.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bigfleet:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	store := index.New()
	if err := load(ctx, store, indextest.DefaultFleet()); err != nil {
		return err
	}
	tokens, err := authz.ParseStaticTokens(strings.NewReader("tok-admin,admin,admin,\"fleet-admins\"\ntok-viewer,viewer,viewer\n"), "bigfleet tokens", authz.Naming{})
	if err != nil {
		return err
	}
	h, err := graph.NewHandler(graph.Options{
		Store: store, Authorizer: authz.NewAuthorizer(store, authz.Options{}),
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{tokens}},
		AdminGroups:   []string{"fleet-admins"},
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	fmt.Printf("url=http://%s admin=tok-admin viewer=tok-viewer objects=%d\n", ln.Addr(), indextest.DefaultFleet().Size())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// load writes the fleet, one Replace per cluster and kind, and RBAC that
// binds viewer in 200 namespaces of every cluster.
func load(ctx context.Context, s *index.Store, f indextest.Fleet) error {
	per := f.Namespaces * f.PerNamespace
	byGroup := map[string][]string{}
	for _, k := range indextest.Kinds {
		byGroup[k.Group] = append(byGroup[k.Group], k.Resource)
	}
	var rules []index.PolicyRule
	for g, res := range byGroup {
		rules = append(rules, index.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{g}, Resources: res})
	}
	crKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}
	rbKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}
	now := time.Now()
	for c := range f.Clusters {
		name := indextest.ClusterName(c)
		if err := s.UpsertCluster(ctx, index.Cluster{Name: name, Mode: index.ModePull, State: index.StateConnected, Since: now, Synced: true}); err != nil {
			return err
		}
		byKind := make([][]index.Object, len(indextest.Kinds))
		for i := c * per; i < (c+1)*per; i++ {
			k := f.KindOf(i)
			byKind[k] = append(byKind[k], f.Object(i))
		}
		for k, rows := range byKind {
			if err := s.Replace(ctx, name, indextest.Kinds[k], rows); err != nil {
				return err
			}
		}
		role := index.Object{Cluster: name, Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles",
			Name: "fleet-view", Policy: &index.Policy{Rules: rules}}
		if err := s.Replace(ctx, name, crKind, []index.Object{role}); err != nil {
			return err
		}
		var bindings []index.Object
		for j := range min(200, f.Namespaces) {
			ns := indextest.NamespaceName(j * 5 % f.Namespaces)
			bindings = append(bindings, index.Object{Cluster: name, Namespace: ns, Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding,
				Resource: "rolebindings", Name: "viewer",
				Policy: &index.Policy{RoleRef: index.RoleRef{APIGroup: index.RBACGroup, Kind: index.KindClusterRole, Name: "fleet-view"},
					Subjects: []index.Subject{{Kind: "User", APIGroup: index.RBACGroup, Name: "viewer"}}}})
		}
		if err := s.Replace(ctx, name, rbKind, bindings); err != nil {
			return err
		}
	}
	return nil
}
