package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

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
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Start local Kubernetes control planes, seed them and print how to reach them",
		Long: `demo starts real kube-apiserver processes (built by "make testenv"),
seeds them with namespaces, pods, services, Flux and Istio objects and RBAC
users, and prints a kubeconfig and tokens. Ctrl-C stops everything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), clusters, namespaces)
		},
	}
	cmd.Flags().StringSliceVar(&clusters, "clusters", []string{"east", "west"}, "names of the clusters to start")
	cmd.Flags().IntVar(&namespaces, "namespaces", 10, "namespaces to seed per cluster")
	return cmd
}

func runDemo(ctx context.Context, names []string, namespaces int) (err error) {
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
	printDemo(started, kubeconfig)

	<-ctx.Done()
	fmt.Println("\nstopping...")
	return nil
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

func printDemo(clusters []*testcluster.Cluster, kubeconfig string) {
	fmt.Printf("\nfleetgraph demo: %d clusters are running.\n\n", len(clusters))
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
	fmt.Println("  Press Ctrl-C to stop every cluster.")
}
