package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// The demo's fleet: two clusters fleetgraph pulls, and one pushed to it by a
// `fleetgraph edge` process, as a cluster the manager cannot reach would be.
var demoClusters = []demoSpec{
	{name: "east", region: "us-east-1"},
	{name: "west", region: "eu-west-1"},
	{name: "north", region: "ap-northeast-1", push: true},
}

type demoSpec struct {
	name, region string
	push         bool
}

// demoUsers are the users every demo cluster knows, for kubectl; fleetgraph
// knows them by its own tokens (writeDemoTokens) with the same names.
var demoUsers = []testcluster.User{
	{Name: "alice", Groups: []string{"team-a"}},
	{Name: "bob", Groups: []string{"team-b"}},
}

// demoAdminGroup is the fleetgraph admin group of the demo.
const demoAdminGroup = "fleet-admins"

// demoFlags are the flags of `fleetgraph demo`.
type demoFlags struct {
	listen     string
	namespaces int
	churn      time.Duration
	edgeBinary string
}

func newDemoCommand() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start three local Kubernetes clusters, seed them, and serve fleetgraph over them",
		Long: `demo starts three real kube-apiserver processes (built by "make testenv"):
east and west, which fleetgraph pulls, and north, which a "fleetgraph edge"
process pushes to it. It seeds them with namespaces of pods, services,
endpoint slices, Flux and Istio objects in mixed states, and RBAC for the
users alice and bob; keeps changing objects; and serves fleetgraph with the
dashboard. It prints the URL and the tokens first.

Break and heal a cluster from the dashboard (signed in as admin: Fleet page,
"Demo controls") or by typing into this terminal:

  stop <cluster>     stop its API server          start <cluster>  start it again
  freeze <cluster>   SIGSTOP it (hangs, no error) thaw <cluster>   SIGCONT it
  cut <cluster>      black-hole fleetgraph's      heal <cluster>   restore it
                     network path to it (kubectl still reaches it)

Ctrl-C stops everything, the clusters and the edge process included.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), &f, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address fleetgraph serves on (port 0 picks a free one)")
	fl.IntVar(&f.namespaces, "namespaces", 16, "namespaces per team (team-a, team-b) per cluster; each holds about 21 objects")
	fl.DurationVar(&f.churn, "churn", 2*time.Second, "interval of the background changes (0 turns them off)")
	fl.StringVar(&f.edgeBinary, "edge-binary", "", "fleetgraph binary that runs the edge of north (default: this program)")
	return cmd
}

// runDemo runs the demo until ctx ends. Everything it starts, it stops.
func runDemo(ctx context.Context, f *demoFlags, stdin io.Reader, out io.Writer) (err error) {
	if f.namespaces < 1 {
		return errors.New("--namespaces: at least 1")
	}
	exe := f.edgeBinary
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("find this program for the edge process: %w", err)
		}
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s (is another demo running? use --listen): %w", f.listen, err)
	}
	defer func() { _ = ln.Close() }() // serve closes it first; this covers the early returns
	url := "http://" + ln.Addr().String()

	dir, err := os.MkdirTemp("", "fleetgraph-demo-")
	if err != nil {
		return fmt.Errorf("create demo dir: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	tokens, err := writeDemoTokens(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return err
	}
	printIntro(out, url, tokens)

	fleet := &demoFleet{}
	defer func() {
		err = errors.Join(err, fleet.close())
		say(out, "demo stopped: the clusters and the edge process are shut down.\n")
	}()
	start := time.Now()
	if err := fleet.start(ctx, f.namespaces, out); err != nil {
		return err
	}
	say(out, "  all 3 clusters are up and seeded with %d objects (%s)\n", fleet.objects(), time.Since(start).Round(time.Second))

	// fleetgraph reaches the clusters through their fault proxies, which
	// "cut" black-holes; people and kubectl reach them directly, so they can
	// change a cluster while fleetgraph is cut off from it.
	kubeconfig, proxied := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "fleetgraph.kubeconfig")
	if err := fleet.writeKubeconfig(kubeconfig, true); err != nil {
		return err
	}
	if err := fleet.writeKubeconfig(proxied, false); err != nil {
		return err
	}
	specs, err := connection.KubeconfigSpecs(proxied, fleet.pulled())
	if err != nil {
		return err
	}
	for i := range specs {
		specs[i].Labels = map[string]string{"region": fleet.byName(specs[i].Name).spec.region}
	}
	edgeToken := randomHex(16)
	edgeTokens := filepath.Join(dir, "edge-tokens.csv")
	if err := os.WriteFile(edgeTokens, []byte(edgeToken+",north\n"), 0o600); err != nil {
		return fmt.Errorf("write edge tokens: %w", err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sf := serveFlags{
		listen: f.listen, listener: ln, tokensFile: filepath.Join(dir, "tokens.csv"), edgeTokensFile: edgeTokens,
		adminGroups: []string{demoAdminGroup}, relist: 30 * time.Second,
		wrap: func(authn authz.Authenticator, api http.Handler) http.Handler { return newDemoAPI(authn, fleet, api) },
	}
	served := make(chan error, 1)
	go func() { served <- serve(ctx, &sf, specs) }()

	if err := fleet.startEdge(exe, dir, url, edgeToken); err != nil {
		cancel()
		return errors.Join(err, <-served)
	}
	printReady(out, url, kubeconfig, tokens, fleet)
	if f.churn > 0 {
		go churn(ctx, fleet, f.churn)
	}
	go fleet.readCommands(ctx, stdin, out)

	err = <-served
	say(out, "\nstopping...\n")
	return err
}

// writeDemoTokens writes fleetgraph's own static tokens: an admin, and
// alice and bob, whose access each cluster's RBAC decides.
func writeDemoTokens(path string) (map[string]string, error) {
	tokens := map[string]string{}
	var csv strings.Builder
	for _, u := range []struct{ name, groups string }{{"admin", demoAdminGroup}, {"alice", "team-a"}, {"bob", "team-b"}} {
		tokens[u.name] = randomHex(12)
		fmt.Fprintf(&csv, "%s,%s,%s,\"%s\"\n", tokens[u.name], u.name, u.name, u.groups)
	}
	if err := os.WriteFile(path, []byte(csv.String()), 0o600); err != nil {
		return nil, fmt.Errorf("write tokens: %w", err)
	}
	return tokens, nil
}

// say writes demo output; a terminal that went away is not worth failing
// the demo for.
func say(out io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(out, format, args...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// demoUsersHelp says what each fleetgraph user of the demo sees.
var demoUsersHelp = map[string]string{
	"admin": "fleet admin: sees everything, and has the demo controls",
	"alice": "sees the team-a namespaces of east and west, nothing of north",
	"bob":   "may list Kustomizations in west, and get one pod (team-b-0/pod-0) in east",
}

// printIntro is the first screen: what to open and what to paste, before
// anything slow starts.
func printIntro(out io.Writer, url string, tokens map[string]string) {
	say(out, "\nfleetgraph demo\n\n  Open %s/ and paste one of these tokens:\n\n", url)
	for _, u := range []string{"admin", "alice", "bob"} {
		say(out, "    %-6s %s   %s\n", u, tokens[u], demoUsersHelp[u])
	}
	say(out, "\n  Starting 3 Kubernetes clusters: east and west (pulled), north (pushed by a fleetgraph edge process)...\n")
}

// printReady lists what to try once everything runs. Every line starting
// with "$ " is a command that works when pasted as is (a test runs them).
func printReady(out io.Writer, url, kubeconfig string, tokens map[string]string, fleet *demoFleet) {
	say(out, "\nfleetgraph is serving the fleet.\n\n")
	say(out, "  Dashboard  %s/\n  GraphiQL   %s/graphiql\n  GraphQL    %s/graphql\n\n", url, url, url)
	say(out, "  Ask the API as alice:\n    $ curl -s -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' %s/graphql -d '{\"query\":\"{ viewer { username } fleet { message } objects(first: 3, filter: {statuses: [UNHEALTHY]}) { totalCount edges { node { cluster namespace kind name status message } } } }\"}'\n\n", tokens["alice"], url)
	say(out, "  Admin kubeconfig, a context per cluster, straight to the API servers (\"cut\" does not cut it):\n    %s\n", kubeconfig)
	if _, err := exec.LookPath("kubectl"); err == nil {
		say(out, "    $ kubectl --kubeconfig %s --context east get pods -n team-a-0\n", kubeconfig)
	}
	say(out, "\n")
	say(out, "  The edge process of north logs to %s\n\n", fleet.edgeLog)
	say(out, "  Break and heal a cluster: sign in as admin, Fleet page, or type here:\n")
	say(out, "    stop east | start east | freeze west | thaw west | cut north | heal north\n")
	say(out, "  Ctrl-C stops everything.\n\n")
}

// demoFleet is the demo's clusters and the edge process, and what the
// controls did to them. Its methods are safe for concurrent use.
type demoFleet struct {
	mu       sync.Mutex
	clusters []*demoCluster
	edge     *exec.Cmd
	edgeDone chan struct{}
	edgeLog  string
}

type demoCluster struct {
	spec    demoSpec
	c       *testcluster.Cluster
	seeded  int
	stopped bool
	frozen  bool
	cut     bool
}

// start starts and seeds the clusters in parallel, printing progress.
func (d *demoFleet) start(ctx context.Context, namespaces int, out io.Writer) error {
	var (
		wg   sync.WaitGroup
		errs = make([]error, len(demoClusters))
		pmu  sync.Mutex
	)
	progress := func(format string, args ...any) {
		pmu.Lock()
		defer pmu.Unlock()
		say(out, "  "+format+"\n", args...)
	}
	d.clusters = make([]*demoCluster, len(demoClusters))
	for i, spec := range demoClusters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			c, err := testcluster.New(ctx, testcluster.Options{Name: spec.name, Users: demoUsers})
			if err != nil {
				errs[i] = fmt.Errorf("start cluster %s: %w", spec.name, err)
				return
			}
			dc := &demoCluster{spec: spec, c: c}
			d.mu.Lock()
			d.clusters[i] = dc
			d.mu.Unlock()
			progress("%-5s control plane ready (%s); seeding...", spec.name, time.Since(t0).Round(100*time.Millisecond))
			t1 := time.Now()
			if dc.seeded, err = seedDemoCluster(ctx, c, namespaces); err != nil {
				errs[i] = fmt.Errorf("seed cluster %s: %w", spec.name, err)
				return
			}
			progress("%-5s seeded with %d objects and RBAC (%s)", spec.name, dc.seeded, time.Since(t1).Round(100*time.Millisecond))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (d *demoFleet) objects() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.clusters {
		n += c.seeded
	}
	return n
}

func (d *demoFleet) byName(name string) *demoCluster {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.clusters {
		if c != nil && c.spec.name == name {
			return c
		}
	}
	return nil
}

func (d *demoFleet) pulled() []string {
	var out []string
	for _, s := range demoClusters {
		if !s.push {
			out = append(out, s.name)
		}
	}
	return out
}

// writeKubeconfig writes one admin context per cluster, either straight to
// the API servers or through their fault proxies.
func (d *demoFleet) writeKubeconfig(path string, direct bool) error {
	merged := clientcmdapi.NewConfig()
	for _, dc := range d.clusters {
		kc := dc.c.KubeconfigFor(testcluster.AdminUser)
		for k, v := range kc.Clusters {
			if direct {
				v.Server = dc.c.DirectConfig.Host
			}
			merged.Clusters[k] = v
		}
		for k, v := range kc.AuthInfos {
			merged.AuthInfos[k] = v
		}
		for k, v := range kc.Contexts {
			merged.Contexts[k] = v
		}
	}
	merged.CurrentContext = d.clusters[0].spec.name
	if err := clientcmd.WriteToFile(*merged, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// edgeStopTimeout bounds how long the edge process gets to leave after
// SIGTERM before it is killed.
const edgeStopTimeout = 5 * time.Second

// startEdge starts `fleetgraph edge` for the push cluster. The kernel kills
// it if the demo dies without cleaning up.
func (d *demoFleet) startEdge(exe, dir, url, token string) error {
	var push *demoCluster
	for _, c := range d.clusters {
		if c.spec.push {
			push = c
		}
	}
	kubeconfig := filepath.Join(dir, push.spec.name+".kubeconfig")
	if err := push.c.WriteKubeconfig(kubeconfig, testcluster.AdminUser); err != nil {
		return fmt.Errorf("write %s kubeconfig: %w", push.spec.name, err)
	}
	tokenFile := filepath.Join(dir, "edge-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("write edge token: %w", err)
	}
	d.edgeLog = filepath.Join(dir, "edge.log")
	logFile, err := os.Create(d.edgeLog)
	if err != nil {
		return fmt.Errorf("create edge log: %w", err)
	}
	cmd := exec.Command(exe, "edge", "--manager", strings.Replace(url, "http://", "ws://", 1)+"/edge",
		"--cluster", push.spec.name, "--token-file", tokenFile, "--kubeconfig", kubeconfig,
		"--region", push.spec.region, "--environment", "demo")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start the edge process (%s edge): %w", exe, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // its exit shows in its log
		_ = logFile.Close()
		close(done)
	}()
	d.mu.Lock()
	d.edge, d.edgeDone = cmd, done
	d.mu.Unlock()
	return nil
}

// close stops the edge process, then the clusters.
func (d *demoFleet) close() error {
	d.mu.Lock()
	edge, done, clusters := d.edge, d.edgeDone, d.clusters
	d.mu.Unlock()
	if edge != nil {
		_ = edge.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(edgeStopTimeout):
			_ = syscall.Kill(-edge.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	var errs []error
	for _, c := range clusters {
		if c != nil {
			errs = append(errs, c.c.Close())
		}
	}
	return errors.Join(errs...)
}

// demoActions are the controls, in the order the dashboard shows them.
var demoActions = []string{"stop", "start", "freeze", "thaw", "cut", "heal"}

// act applies one control to one cluster.
func (d *demoFleet) act(ctx context.Context, cluster, action string) error {
	dc := d.byName(cluster)
	if dc == nil {
		return fmt.Errorf("no demo cluster %q (east, west or north)", cluster)
	}
	var err error
	switch action {
	case "stop":
		err = dc.c.Stop()
	case "start":
		err = dc.c.Start(ctx)
	case "freeze":
		err = dc.c.Freeze()
	case "thaw":
		err = dc.c.Thaw()
	case "cut":
		dc.c.Proxy.BlackHole()
	case "heal":
		dc.c.Proxy.Restore()
	default:
		return fmt.Errorf("unknown action %q: use %s", action, strings.Join(demoActions, ", "))
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", action, cluster, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch action {
	case "stop", "start":
		dc.stopped, dc.frozen = action == "stop", false
	case "freeze", "thaw":
		dc.frozen = action == "freeze"
	case "cut", "heal":
		dc.cut = action == "cut"
	}
	return nil
}

// demoClusterStatus is what the dashboard's demo controls show.
type demoClusterStatus struct {
	Name    string `json:"name"`
	Mode    string `json:"mode"`
	Stopped bool   `json:"stopped"`
	Frozen  bool   `json:"frozen"`
	Cut     bool   `json:"cut"`
}

func (d *demoFleet) status() []demoClusterStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]demoClusterStatus, 0, len(d.clusters))
	for _, c := range d.clusters {
		mode := "pull"
		if c.spec.push {
			mode = "push"
		}
		out = append(out, demoClusterStatus{Name: c.spec.name, Mode: mode, Stopped: c.stopped, Frozen: c.frozen, Cut: c.cut})
	}
	return out
}

// readCommands reads controls typed into the terminal, one per line.
func (d *demoFleet) readCommands(ctx context.Context, in io.Reader, out io.Writer) {
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			say(out, "type <action> <cluster>: actions %s; clusters east, west, north\n", strings.Join(demoActions, ", "))
			continue
		}
		if err := d.act(ctx, fields[1], fields[0]); err != nil {
			say(out, "error: %v\n", err)
			continue
		}
		say(out, "%s %s: done\n", fields[0], fields[1])
	}
}

// churn keeps changing objects so that the dashboard has something live to
// show: on every tick one pod somewhere flips between running and
// crash-looping, and every fifth tick a short-lived pod is created in
// team-a-0 and an older one deleted.
func churn(ctx context.Context, d *demoFleet, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		dc := d.clusters[i%len(d.clusters)]
		if err := churnOnce(ctx, dc.c, i/len(d.clusters)); err != nil {
			slog.Debug("churn", "cluster", dc.spec.name, "err", err) // the cluster may be stopped on purpose
		}
	}
}

func seedDemoCluster(ctx context.Context, c *testcluster.Cluster, namespaces int) (int, error) {
	if err := c.InstallFluxCRDs(ctx); err != nil {
		return 0, err
	}
	if err := c.InstallIstioCRDs(ctx); err != nil {
		return 0, err
	}
	total := 0
	for _, team := range []string{"team-a", "team-b"} {
		res, err := c.Seed(ctx, testcluster.SeedOptions{Prefix: team, Namespaces: namespaces, Pods: 8, Services: 3, Flux: true, Istio: true})
		if err != nil {
			return 0, err
		}
		total += res.Total
	}
	return total, grantDemoAccess(ctx, c, namespaces)
}

// grantDemoAccess writes the demo's RBAC: alice reads everything in the
// team-a namespaces of east and west (a RoleBinding per namespace to the
// ClusterRole namespace-reader); bob lists Kustomizations in west and may
// get pod-0 of team-b-0 in east. north grants them nothing.
func grantDemoAccess(ctx context.Context, c *testcluster.Cluster, namespaces int) error {
	rbac := c.Client().RbacV1()
	user := func(name string) []rbacv1.Subject {
		return []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}}
	}
	switch c.Name {
	case "east", "west":
		if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "namespace-reader"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"*"}, Resources: []string{"*"}}},
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace-reader: %w", err)
		}
		for i := range namespaces {
			ns := fmt.Sprintf("team-a-%d", i)
			if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "alice-reads-team-a"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "namespace-reader"},
				Subjects:   user("alice"),
			}, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("bind alice in %s: %w", ns, err)
			}
		}
	}
	switch c.Name {
	case "west":
		if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kustomization-lister"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"list"}, APIGroups: []string{"kustomize.toolkit.fluxcd.io"}, Resources: []string{"kustomizations"}}},
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create kustomization-lister: %w", err)
		}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "bob-lists-kustomizations"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kustomization-lister"},
			Subjects:   user("bob"),
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bind bob in west: %w", err)
		}
	case "east":
		if _, err := rbac.Roles("team-b-0").Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "one-pod"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"pod-0"}}},
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create one-pod: %w", err)
		}
		if _, err := rbac.RoleBindings("team-b-0").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "bob-one-pod"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "one-pod"},
			Subjects:   user("bob"),
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("bind bob in east: %w", err)
		}
	}
	return nil
}
