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
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// demoUsers are the restricted users every demo cluster knows. The admin
// token is printed too.
var demoUsers = []testcluster.User{
	{Name: "alice", Groups: []string{"team-a"}},
	{Name: "bob", Groups: []string{"team-b"}},
}

func newDemoCommand() *cobra.Command {
	var (
		clusters   []string
		namespaces int
		listen     string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start local Kubernetes control planes, seed them, and serve fleetgraph over them",
		Long: `demo starts real kube-apiserver processes (built by "make testenv"),
seeds them with namespaces, pods, services, Flux and Istio objects and RBAC
users, keeps changing a few objects, and serves fleetgraph over them. It
prints the API address, user tokens and a kubeconfig for the clusters.

Type "stop <cluster>", "start <cluster>", "freeze <cluster>", "thaw <cluster>",
"cut <cluster>" (black-hole its network) or "heal <cluster>" to watch
fleetgraph notice and recover. Ctrl-C stops everything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), clusters, namespaces, listen)
		},
	}
	cmd.Flags().StringSliceVar(&clusters, "clusters", []string{"east", "west"}, "names of the clusters to start")
	cmd.Flags().IntVar(&namespaces, "namespaces", 10, "namespaces to seed per cluster")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address fleetgraph serves on")
	return cmd
}

func runDemo(ctx context.Context, names []string, namespaces int, listen string) (err error) {
	if len(names) == 0 {
		return errors.New("--clusters: give at least one cluster name")
	}
	dir, err := os.MkdirTemp("", "fleetgraph-demo-")
	if err != nil {
		return fmt.Errorf("create demo dir: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()

	var started []*testcluster.Cluster
	defer func() {
		for _, c := range started {
			err = errors.Join(err, c.Close())
		}
		slog.Info("demo stopped; every cluster is shut down")
	}()

	merged := clientcmdapi.NewConfig()
	for _, name := range names {
		slog.Info("starting cluster", "cluster", name)
		c, err := testcluster.New(ctx, testcluster.Options{Name: name, Users: demoUsers})
		if err != nil {
			return fmt.Errorf("start cluster %s: %w", name, err)
		}
		started = append(started, c)
		if err := seedDemoCluster(ctx, c, namespaces); err != nil {
			return fmt.Errorf("seed cluster %s: %w", name, err)
		}
		kc := c.KubeconfigFor(testcluster.AdminUser)
		for k, v := range kc.Clusters {
			merged.Clusters[k] = v
		}
		for k, v := range kc.AuthInfos {
			merged.AuthInfos[k] = v
		}
		for k, v := range kc.Contexts {
			merged.Contexts[k] = v
		}
		merged.CurrentContext = name
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*merged, kubeconfig); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	tokens, err := writeDemoTokens(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return err
	}
	specs, err := connection.KubeconfigSpecs(kubeconfig, nil)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go churn(ctx, started)
	go demoControl(ctx, started, os.Stdin)
	printDemo(started, kubeconfig, listen, tokens)
	f := serveFlags{listen: listen, tokensFile: filepath.Join(dir, "tokens.csv"), adminGroups: []string{"fleet-admins"}, relist: 30 * time.Second}
	if err := serve(ctx, &f, specs); err != nil {
		return err
	}
	fmt.Println("\nstopping...")
	return nil
}

// writeDemoTokens writes fleetgraph's own static tokens: an admin, and
// alice and bob, whose access each cluster's RBAC decides.
func writeDemoTokens(path string) (map[string]string, error) {
	tokens := map[string]string{}
	var csv strings.Builder
	for _, u := range []struct{ name, groups string }{{"admin", "fleet-admins"}, {"alice", "team-a"}, {"bob", "team-b"}} {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		tokens[u.name] = hex.EncodeToString(b)
		fmt.Fprintf(&csv, "%s,%s,%s,\"%s\"\n", tokens[u.name], u.name, u.name, u.groups)
	}
	if err := os.WriteFile(path, []byte(csv.String()), 0o600); err != nil {
		return nil, fmt.Errorf("write tokens: %w", err)
	}
	return tokens, nil
}

// churn keeps changing objects so subscriptions have something to show:
// every two seconds a pod somewhere flips between ready and crash-looping.
func churn(ctx context.Context, clusters []*testcluster.Cluster) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := clusters[i%len(clusters)]
		ns, name := fmt.Sprintf("team-%d", i%3), fmt.Sprintf("pod-%d", i%5)
		pods := c.Client().CoreV1().Pods(ns)
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue // the cluster may be stopped on purpose
		}
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels["churn"] = strconv.Itoa(i)
		if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			slog.Debug("churn", "err", err)
		}
	}
}

// demoControl reads commands that break and heal clusters.
func demoControl(ctx context.Context, clusters []*testcluster.Cluster, in io.Reader) {
	byName := map[string]*testcluster.Cluster{}
	for _, c := range clusters {
		byName[c.Name] = c
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) != 2 || byName[fields[1]] == nil {
			fmt.Println(`commands: stop|start|freeze|thaw|cut|heal <cluster>`)
			continue
		}
		c := byName[fields[1]]
		var err error
		switch fields[0] {
		case "stop":
			err = c.Stop()
		case "start":
			err = c.Start(ctx)
		case "freeze":
			err = c.Freeze()
		case "thaw":
			err = c.Thaw()
		case "cut":
			c.Proxy.BlackHole()
		case "heal":
			c.Proxy.Restore()
		default:
			err = fmt.Errorf("unknown command %q", fields[0])
		}
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("%s %s: done\n", fields[0], c.Name)
	}
}

// seedDemoCluster installs the CRDs, creates objects in mixed states, and
// grants alice read access to the first half of the namespaces and bob
// read access to Flux objects everywhere.
func seedDemoCluster(ctx context.Context, c *testcluster.Cluster, namespaces int) error {
	if err := c.InstallFluxCRDs(ctx); err != nil {
		return err
	}
	if err := c.InstallIstioCRDs(ctx); err != nil {
		return err
	}
	start := time.Now()
	res, err := c.Seed(ctx, testcluster.SeedOptions{Prefix: "team", Namespaces: namespaces, Pods: 5, Services: 2, Flux: true, Istio: true})
	if err != nil {
		return err
	}
	slog.Info("seeded", "cluster", c.Name, "objects", res.Total, "took", time.Since(start).Round(time.Millisecond))

	rbac := c.Client().RbacV1()
	for i := range (namespaces + 1) / 2 {
		ns := fmt.Sprintf("team-%d", i)
		_, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-view"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("bind alice in %s: %w", ns, err)
		}
	}
	_, err = rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "flux-reader"},
		Rules: []rbacv1.PolicyRule{{
			Verbs:     []string{"get", "list", "watch"},
			APIGroups: []string{"kustomize.toolkit.fluxcd.io", "helm.toolkit.fluxcd.io", "source.toolkit.fluxcd.io"},
			Resources: []string{"*"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create flux-reader: %w", err)
	}
	_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "team-b-flux-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flux-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "team-b"}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("bind team-b: %w", err)
	}
	return nil
}

func printDemo(clusters []*testcluster.Cluster, kubeconfig, listen string, tokens map[string]string) {
	fmt.Printf("\nfleetgraph demo: %d clusters are running.\n\n", len(clusters))
	fmt.Printf("  GraphiQL:  http://%s/\n  GraphQL:   http://%s/graphql\n", listen, listen)
	fmt.Printf("  fleetgraph tokens (Authorization: Bearer ...):\n")
	for _, u := range []string{"admin", "alice", "bob"} {
		fmt.Printf("    %-6s %s\n", u, tokens[u])
	}
	fmt.Printf("  try: curl -s -H 'Authorization: Bearer %s' http://%s/graphql -d '{\"query\":\"{ fleet { message } objects(first: 3) { totalCount edges { node { cluster namespace kind name status } } } }\"}'\n\n", tokens["alice"], listen)
	fmt.Printf("  export KUBECONFIG=%s\n\n", kubeconfig)
	for _, c := range clusters {
		fmt.Printf("  cluster %-8s %s   (try: kubectl --context %s get pods -A)\n", c.Name, c.Proxy.URL(), c.Name)
		users := make([]string, 0, len(c.Tokens))
		for u := range c.Tokens {
			users = append(users, u)
		}
		sort.Strings(users)
		for _, u := range users {
			fmt.Printf("    %-6s token %s\n", u, c.Tokens[u])
		}
	}
	fmt.Println("\n  alice reads the first half of the team-* namespaces; bob (group team-b) reads Flux objects everywhere.")
	fmt.Println("  Type stop|start|freeze|thaw|cut|heal <cluster> to break and heal a cluster; Ctrl-C stops everything.")
}
