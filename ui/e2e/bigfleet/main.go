// Command bigfleet serves the real GraphQL API and dashboard over the
// synthetic 1M-object benchmark fleet (index/indextest.DefaultFleet),
// loaded straight into an index.Store.
//
// Without -runs it prints one line, "url=... admin=... viewer=...", once
// the fleet is loaded, and serves until interrupted, for measuring by hand.
// With -runs N (make bench-ui) it runs the dashboard's browser timings
// (timing.mjs, in Chromium) N times as each user and prints one line of
// medians:
//
//	ui: objects=1000000 first_render_ms=... filter_to_table_p50_ms=... filter_to_table_p95_ms=... viewer_first_render_ms=... viewer_filter_to_table_p95_ms=... runs=3
//
// admin is a fleet admin (every object); viewer is bound in 200
// namespaces of every cluster, 20,000 namespaces in all, like the viewer of
// the graph benchmark's Q3.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

func main() {
	runs := flag.Int("runs", 0, "run timing.mjs this many times as each user, print the medians and exit (0: serve until interrupted)")
	rounds := flag.Int("rounds", 5, "with -runs: rounds of facet clicks per run (8 timed filter changes each)")
	script := flag.String("timing", filepath.Join("ui", "e2e", "timing.mjs"), "with -runs: the timing script")
	flag.Parse()
	if err := run(*runs, *rounds, *script); err != nil {
		fmt.Fprintln(os.Stderr, "bigfleet:", err)
		os.Exit(1)
	}
}

// users are the tokens bigfleet accepts: the admin, and the viewer of
// 20,000 namespaces.
var users = map[string]string{"admin": "tok-admin", "viewer": "tok-viewer"}

func run(runs, rounds int, script string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store := index.New(memtables.Open)
	fleet := indextest.DefaultFleet()
	start := time.Now()
	if runs > 0 {
		fmt.Fprintf(os.Stderr, "bigfleet: loading %d objects...\n", fleet.Size())
	}
	if err := load(ctx, store, fleet); err != nil {
		return err
	}
	tokens, err := authz.ParseStaticTokens(strings.NewReader(users["admin"]+",admin,admin,\"fleet-admins\"\n"+users["viewer"]+",viewer,viewer\n"), "bigfleet tokens", authz.Naming{})
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
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	if runs == 0 {
		fmt.Printf("url=%s admin=%s viewer=%s objects=%d\n", url, users["admin"], users["viewer"], fleet.Size())
		<-ctx.Done()
	} else {
		fmt.Fprintf(os.Stderr, "bigfleet: loaded in %s; serving %s\n", time.Since(start).Round(time.Second), url)
		err = bench(ctx, url, script, runs, rounds, fleet.Size())
	}
	_ = srv.Close()
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// bench runs the timing script runs times as each user and prints the
// medians of its figures.
func bench(ctx context.Context, url, script string, runs, rounds, objects int) error {
	figures := map[string][]float64{} // "admin first_render_ms" -> one value per run
	for i := range runs {
		for _, u := range []string{"admin", "viewer"} {
			line, err := timing(ctx, url, script, users[u], rounds)
			if err != nil {
				return fmt.Errorf("run %d as %s: %w", i+1, u, err)
			}
			fmt.Fprintf(os.Stderr, "bigfleet: run %d as %s: %s\n", i+1, u, line)
			for _, kv := range strings.Fields(strings.TrimPrefix(line, "ui:")) {
				k, v, _ := strings.Cut(kv, "=")
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return fmt.Errorf("run %d as %s: bad figure %q in %q", i+1, u, kv, line)
				}
				figures[u+" "+k] = append(figures[u+" "+k], f)
			}
		}
	}
	m := func(key string) string { return strconv.FormatFloat(median(figures[key]), 'f', 0, 64) }
	fmt.Printf("ui: objects=%d first_render_ms=%s filter_to_table_p50_ms=%s filter_to_table_p95_ms=%s viewer_first_render_ms=%s viewer_filter_to_table_p50_ms=%s viewer_filter_to_table_p95_ms=%s runs=%d\n",
		objects, m("admin first_render_ms"), m("admin filter_p50_ms"), m("admin filter_p95_ms"),
		m("viewer first_render_ms"), m("viewer filter_p50_ms"), m("viewer filter_p95_ms"), runs)
	return nil
}

// timingTimeout bounds one run of the timing script.
const timingTimeout = 15 * time.Minute

// timing runs the timing script once and returns its "ui: ..." line. Node
// dies with this process (and Chromium with node, see chromium.sh).
func timing(ctx context.Context, url, script, token string, rounds int) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timingTimeout)
	defer cancel()
	cmd := exec.Command("node", script)
	cmd.Env = append(os.Environ(), "FLEETGRAPH_URL="+url, "FLEETGRAPH_TOKEN="+token, "ROUNDS="+strconv.Itoa(rounds))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start node: %w", err)
	}
	kill := context.AfterFunc(ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer kill()
	var result string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, "ui: ") {
			result = l
		} else {
			fmt.Fprintln(os.Stderr, l)
		}
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%s: %w", script, errors.Join(err, ctx.Err()))
	}
	if result == "" {
		return "", fmt.Errorf("%s printed no result line", script)
	}
	return result, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// load writes the fleet, one Replace per cluster and kind, and RBAC that
// binds viewer in 200 namespaces of every cluster.
func load(ctx context.Context, s *index.Store, f indextest.Fleet) error {
	rules := indextest.ReadRules()
	crKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}
	rbKind := index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}
	now := time.Now()
	for c := range f.Clusters {
		name := indextest.ClusterName(c)
		if err := s.UpsertCluster(ctx, index.Cluster{Name: name, Mode: index.ModePull, State: index.StateConnected, Since: now, Synced: true}); err != nil {
			return err
		}
		if err := f.ReplaceCluster(ctx, s, c); err != nil {
			return err
		}
		role := index.Object{
			Cluster: name, Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles",
			Name: "fleet-view", Policy: &index.Policy{Rules: rules},
		}
		if err := s.Replace(ctx, name, crKind, []index.Object{role}); err != nil {
			return err
		}
		var bindings []index.Object
		for j := range min(200, f.Namespaces) {
			ns := indextest.NamespaceName(j * 5 % f.Namespaces)
			bindings = append(bindings, index.Object{
				Cluster: name, Namespace: ns, Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding,
				Resource: "rolebindings", Name: "viewer",
				Policy: &index.Policy{
					RoleRef:  index.RoleRef{APIGroup: index.RBACGroup, Kind: index.KindClusterRole, Name: "fleet-view"},
					Subjects: []index.Subject{{Kind: "User", APIGroup: index.RBACGroup, Name: "viewer"}},
				},
			})
		}
		if err := s.Replace(ctx, name, rbKind, bindings); err != nil {
			return err
		}
	}
	return nil
}
