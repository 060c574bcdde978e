package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection/edge"
)

// edgeFlags are the flags of `fleetgraph edge`.
type edgeFlags struct {
	manager, cluster, tokenFile  string
	kubeconfig, context          string
	instance, region, env        string
	managerCA                    string
	kinds, extraKinds            []string
	namespaces, excludeNS        []string
	resync, resyncMin, resyncMax time.Duration
	metricsListen                string
}

func newEdgeCommand() *cobra.Command {
	var f edgeFlags
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "Run next to one cluster and push its state to a fleetgraph manager",
		Long: `edge collects the cluster of --kubeconfig (or the cluster it runs in) and
streams it to the manager's /edge endpoint over a websocket, claiming
--cluster with the token in --token-file (a line "token,cluster" of the
manager's --edge-tokens-file). It reconnects with backoff and resyncs fully
on every connect and every --resync interval. The manager's object detail
queries for this cluster are performed here, impersonating the viewer: the
edge's credentials need list and watch on the collected kinds and
impersonate on users and groups.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setMemoryLimit(memlimit.FromCgroup)
			opts, err := f.options()
			if err != nil {
				return err
			}
			reg := newMetricsRegistry()
			opts.Registerer = reg
			agent, err := edge.NewAgent(opts)
			if err != nil {
				return err
			}
			return f.run(cmd.Context(), agent, reg)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.manager, "manager", "", "the manager's edge endpoint, e.g. https://fleetgraph.example.com/edge (required)")
	fl.StringVar(&f.cluster, "cluster", "", "the cluster id to claim (required)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding this cluster's edge token, re-read on every connect (required)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the local cluster (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)")
	fl.StringVar(&f.context, "context", "", "kubeconfig context (default: the current context)")
	fl.StringVar(&f.instance, "instance", "", "this edge's instance id (default: hostname plus a random suffix)")
	fl.StringVar(&f.region, "region", "", "the cluster's region, shown as metadata")
	fl.StringVar(&f.env, "environment", "", "the cluster's environment, shown as metadata")
	fl.StringVar(&f.managerCA, "manager-ca-file", "", "CA bundle that signed the manager's certificate (default: system roots)")
	fl.StringSliceVar(&f.kinds, "kinds", nil, "collect only these kinds (RBAC kinds are always collected)")
	fl.StringSliceVar(&f.extraKinds, "extra-kinds", nil, "collect more kinds, as group/version/Kind")
	fl.StringSliceVar(&f.namespaces, "namespaces", nil, "collect only these namespaces")
	fl.StringSliceVar(&f.excludeNS, "exclude-namespaces", nil, "do not collect these namespaces")
	fl.DurationVar(&f.resync, "resync", edge.DefaultResyncInterval, "full resync interval")
	fl.DurationVar(&f.resyncMin, "resync-min", edge.DefaultResyncMin, "shortest full resync interval when the cluster changes a lot")
	fl.DurationVar(&f.resyncMax, "resync-max", edge.DefaultResyncMax, "longest full resync interval when the cluster is quiet (equal to --resync-min turns adaptation off)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve /metrics (the agent's counters, the Go runtime's and the process's) without authentication on this address, for scrapers")
	return cmd
}

// run runs agent until ctx ends, serving reg's /metrics on
// --metrics-listen meanwhile: the process's and the agent's (registered by
// edge.NewAgent, AgentOptions.Registerer). A metrics listener that fails
// stops the agent: an edge is run to be watched.
func (f *edgeFlags) run(ctx context.Context, agent *edge.Agent, reg *prometheus.Registry) error {
	if f.metricsListen == "" {
		return agent.Run(ctx)
	}
	ln, err := net.Listen("tcp", f.metricsListen)
	if err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	t := defaultTimeouts
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, IdleTimeout: t.idle}
	slog.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		err := hs.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		served <- err
		cancel()
	}()
	runErr := agent.Run(ctx)
	_ = hs.Close()
	if err := <-served; err != nil {
		return errors.Join(runErr, fmt.Errorf("serving metrics on %s: %w", f.metricsListen, err))
	}
	return runErr
}

func (f *edgeFlags) options() (edge.AgentOptions, error) {
	if f.manager == "" || f.cluster == "" || f.tokenFile == "" {
		return edge.AgentOptions{}, errors.New("edge needs --manager, --cluster and --token-file")
	}
	token := func() (string, error) {
		data, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return "", fmt.Errorf("read --token-file: %w", err)
		}
		tok := strings.TrimSpace(string(data))
		if tok == "" {
			return "", fmt.Errorf("--token-file %s is empty", f.tokenFile)
		}
		return tok, nil
	}
	if _, err := token(); err != nil {
		return edge.AgentOptions{}, err
	}
	local, err := f.localConfig()
	if err != nil {
		return edge.AgentOptions{}, err
	}
	registry := collector.NewRegistry()
	if err := registry.Restrict(f.kinds); err != nil {
		return edge.AgentOptions{}, fmt.Errorf("--kinds: %w", err)
	}
	for _, k := range f.extraKinds {
		if err := registry.AddGVK(k); err != nil {
			return edge.AgentOptions{}, fmt.Errorf("--extra-kinds: %w", err)
		}
	}
	md := map[string]string{}
	if f.region != "" {
		md["region"] = f.region
	}
	if f.env != "" {
		md["environment"] = f.env
	}
	opts := edge.AgentOptions{
		Manager: f.manager, Cluster: f.cluster, Token: token, Instance: f.instance, Metadata: md,
		Local: local, Registry: registry, Namespaces: f.namespaces, ExcludeNamespaces: f.excludeNS,
		Resync: edge.ResyncOptions{Interval: f.resync, Min: f.resyncMin, Max: f.resyncMax},
	}
	if f.managerCA != "" {
		pool, err := loadCertPool(f.managerCA)
		if err != nil {
			return edge.AgentOptions{}, err
		}
		opts.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return opts, nil
}

// localConfig is the in-cluster config when running in a pod without
// --kubeconfig, else the kubeconfig's (current or --context) context.
func (f *edgeFlags) localConfig() (*rest.Config, error) {
	if f.kubeconfig == "" && f.context == "" && os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config: %w", err)
		}
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}
