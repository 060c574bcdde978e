package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetgraph/fleetgraph"
	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/edge"
	"github.com/fleetgraph/fleetgraph/connection/sources"
	"github.com/fleetgraph/fleetgraph/graph"
	"github.com/fleetgraph/fleetgraph/internal/gcpolicy"
)

// serveFlags are the flags of `fleetgraph serve`; demo reuses them.
type serveFlags struct {
	scopeFlags
	listen            string
	metricsListen     string
	kubeconfig        string
	contexts          []string
	clusterLabels     []string
	mgmtKubeconfig    string
	tokensFile        string
	edgeTokensFile    string
	oidcIssuer        string
	oidcClientID      string
	oidcUsernameClaim string
	oidcGroupsClaim   string
	oidcUsernamePfx   string
	oidcGroupsPrefix  string
	allowSystemNames  []string
	requestHeaderCA   string
	tlsCert, tlsKey   string
	adminGroups       []string
	namespaces        []string
	excludeNamespaces []string
	relist            time.Duration
	maxSyncs          int
	noIntrospection   bool
	originPatterns    []string
	allowAnonymous    bool
	timeouts          timeoutFlags
	replication       replicationFlags

	// Set by demo, not flags: a listener already open (so the URL can be
	// printed before the clusters start), and routes around the API that
	// use its authenticator.
	listener net.Listener
	wrap     func(authz.Authenticator, http.Handler) http.Handler
}

// timeoutFlags are serve's timeouts; docs/security.md says what each one
// bounds.
type timeoutFlags struct {
	readHeader, read, idle time.Duration // HTTP
	request                time.Duration // one GraphQL query
	wsInit, wsKeepAlive    time.Duration // GraphQL websockets
	edgeHello              time.Duration // an edge's upgrade until its Hello
	shutdown               time.Duration // from SIGTERM to exit
}

// defaultTimeouts are the flags' defaults, and what a zero field means. The
// shutdown timeout, from SIGTERM to exit, is well inside Kubernetes'
// default 30 s grace period.
var defaultTimeouts = timeoutFlags{
	readHeader: 10 * time.Second, read: 30 * time.Second, idle: 120 * time.Second,
	request: graph.DefaultRequestTimeout, wsInit: graph.DefaultInitTimeout, wsKeepAlive: graph.DefaultKeepAlive,
	edgeHello: edge.DefaultHelloTimeout, shutdown: 10 * time.Second,
}

// orDefaults fills the zero fields of t from defaultTimeouts.
func (t timeoutFlags) orDefaults() timeoutFlags {
	d := defaultTimeouts
	return timeoutFlags{
		readHeader: cmp.Or(t.readHeader, d.readHeader), read: cmp.Or(t.read, d.read), idle: cmp.Or(t.idle, d.idle),
		request: cmp.Or(t.request, d.request), wsInit: cmp.Or(t.wsInit, d.wsInit), wsKeepAlive: cmp.Or(t.wsKeepAlive, d.wsKeepAlive),
		edgeHello: cmp.Or(t.edgeHello, d.edgeHello), shutdown: cmp.Or(t.shutdown, d.shutdown),
	}
}

func (t *timeoutFlags) register(fl *pflag.FlagSet) {
	fl.DurationVar(&t.readHeader, "http-read-header-timeout", defaultTimeouts.readHeader, "time a client has to send its request headers")
	fl.DurationVar(&t.read, "http-read-timeout", defaultTimeouts.read, "time a client has to send a whole request, body included (websockets and event streams are not bounded by it once open)")
	fl.DurationVar(&t.idle, "http-idle-timeout", defaultTimeouts.idle, "time a kept-alive connection may wait for its next request")
	fl.DurationVar(&t.request, "request-timeout", defaultTimeouts.request, "deadline of one GraphQL query; its reads stop then (subscriptions have none)")
	fl.DurationVar(&t.wsInit, "websocket-init-timeout", defaultTimeouts.wsInit, "time a GraphQL websocket has to send connection_init (then closed with 4408)")
	fl.DurationVar(&t.wsKeepAlive, "websocket-keepalive", defaultTimeouts.wsKeepAlive, "interval of websocket keep-alives; a client silent for two intervals is disconnected (also the read deadline of legacy graphql-ws clients)")
	fl.DurationVar(&t.edgeHello, "edge-hello-timeout", defaultTimeouts.edgeHello, "time an edge has, from its upgrade, to send its Hello")
	fl.DurationVar(&t.shutdown, "shutdown-timeout", defaultTimeouts.shutdown, "time from SIGTERM to exit: queries in flight are canceled at once, websockets told to go away, and whatever still runs after this is cut off")
}

func (f *serveFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	f.scopeFlags.register(fl)
	f.replication.register(fl)
	fl.StringVar(&f.listen, "listen", ":8080", "address to serve the API on")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "also serve /metrics without authentication on this address, for scrapers (on --listen, /metrics is for --admin-group members only: its labels name every cluster)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig whose contexts are the clusters (default $KUBECONFIG or ~/.kube/config)")
	fl.StringSliceVar(&f.contexts, "context", nil, "collect only these contexts (repeatable; default every context)")
	fl.StringArrayVar(&f.clusterLabels, "cluster-label", nil, "label the clusters of kubeconfig contexts: [CONTEXT:]KEY=VALUE, for every context without CONTEXT: (repeatable)")
	fl.StringVar(&f.mgmtKubeconfig, "management-kubeconfig", "", "kubeconfig of the management cluster the sources read (default: the cluster fleetgraph runs in)")
	fl.StringVar(&f.tokensFile, "tokens-file", "", "static tokens in kube-apiserver --token-auth-file CSV format")
	fl.StringVar(&f.edgeTokensFile, "edge-tokens-file", "", "accept edge agents at /edge: one \"token,cluster\" per line (re-read when it changes)")
	fl.StringVar(&f.oidcIssuer, "oidc-issuer", "", "OIDC issuer URL")
	fl.StringVar(&f.oidcClientID, "oidc-client-id", "", "OIDC client id (the audience of ID tokens)")
	fl.StringVar(&f.oidcUsernameClaim, "oidc-username-claim", "sub", "OIDC claim naming the user")
	fl.StringVar(&f.oidcGroupsClaim, "oidc-groups-claim", "", "OIDC claim holding the groups")
	fl.StringVar(&f.oidcUsernamePfx, "oidc-username-prefix", "", "prefix put before OIDC usernames, as kube-apiserver's flag of that name: default the issuer URL and '#' (none for the email claim); '-' for no prefix")
	fl.StringVar(&f.oidcGroupsPrefix, "oidc-groups-prefix", "", "prefix put before OIDC groups, as kube-apiserver's flag of that name")
	fl.StringSliceVar(&f.allowSystemNames, "allow-system-names", nil, "authenticators (tokens-file, oidc, requestheader) whose users may be ServiceAccounts or carry system: groups; by default such identities are refused")
	fl.StringVar(&f.requestHeaderCA, "requestheader-client-ca-file", "", "trust X-Remote-User/X-Remote-Group from clients whose certificate this CA signed (needs --tls-cert-file)")
	fl.StringVar(&f.tlsCert, "tls-cert-file", "", "serve HTTPS with this certificate")
	fl.StringVar(&f.tlsKey, "tls-private-key-file", "", "private key of --tls-cert-file")
	fl.StringSliceVar(&f.adminGroups, "admin-group", nil, "groups whose members see everything (repeatable)")
	fl.StringSliceVar(&f.namespaces, "namespaces", nil, "collect only these namespaces")
	fl.StringSliceVar(&f.excludeNamespaces, "exclude-namespaces", nil, "do not collect these namespaces")
	fl.DurationVar(&f.relist, "relist", collector.DefaultRelist, "interval of the full anti-entropy relist")
	fl.IntVar(&f.maxSyncs, "max-concurrent-syncs", connection.DefaultMaxConcurrentSyncs, "clusters that may list their kinds at once, after connecting or reconnecting; the others wait their turn (CONNECTING, or DISCONNECTED after an outage) and are not probed meanwhile (0: no limit)")
	fl.BoolVar(&f.noIntrospection, "disable-introspection", false, "turn off GraphQL introspection")
	fl.StringSliceVar(&f.originPatterns, "allowed-origins", nil, "extra origins (host patterns) allowed to open websockets; same-origin is always allowed")
	fl.BoolVar(&f.allowAnonymous, "allow-anonymous", false, "let requests without credentials in as system:anonymous")
	f.timeouts.register(fl)
}

// maxConcurrentSyncs is --max-concurrent-syncs as connection.Options
// takes it: there zero is the default and a negative value no limit.
func (f *serveFlags) maxConcurrentSyncs() int {
	if f.maxSyncs <= 0 {
		return -1
	}
	return f.maxSyncs
}

func newServeCommand() *cobra.Command {
	var f serveFlags
	var gcHeadroom int
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Collect from every cluster of a kubeconfig and serve the GraphQL API",
		Long: `serve collects clusters into an in-memory index and serves it over GraphQL
at /graphql, filtered by each cluster's RBAC. Clusters come from --source:
every context of --kubeconfig (or the --context ones), and inventories kept
in a management cluster (--management-kubeconfig, default the cluster
fleetgraph runs in): Weave GitOps GitopsClusters, Cluster API Clusters,
Argo CD cluster Secrets, SIG-Multicluster ClusterProfiles and labelled
Secrets. Each is watched: clusters come, change and go while serve runs.
At least one authenticator (--tokens-file, --oidc-issuer or
--requestheader-client-ca-file) is required.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setMemoryLimit(memlimit.FromCgroup)
			gcp := gcpolicy.Default()
			gcp.Headroom = gcHeadroom
			gc, err := gcpolicy.Start(gcp, slog.Default())
			if err != nil {
				return fmt.Errorf("--gc-headroom: %w", err)
			}
			defer gc.Stop()
			if f.replication.role != string(fleetgraph.RoleQuery) { // a query replica collects nothing
				if err := f.defaultSources(); err != nil {
					return err
				}
			}
			return serve(cmd.Context(), &f, nil)
		},
	}
	f.register(cmd)
	// Not in serveFlags: demo's index is small, and below 16 MiB of live
	// heap the policy keeps the Go default anyway.
	cmd.Flags().IntVar(&gcHeadroom, "gc-headroom", gcpolicy.DefaultHeadroom,
		"percent of the live heap the heap may grow by between garbage collections, but at least 16 MiB (Go's default is 100%): 10 to 100, less memory for more GC CPU, see docs/operations.md; 0 turns it off, and so does a non-empty GOGC in the environment")
	return cmd
}

// serve runs a fleetgraph server for the given clusters until ctx ends.
func serve(ctx context.Context, f *serveFlags, specs []connection.Spec) error {
	f.timeouts = f.timeouts.orDefaults()
	repl, closeRepl, err := f.replication.setup(f.managementConfig)
	if err != nil {
		return err
	}
	defer closeRepl()
	var authn authz.Authenticator
	var tokens *authz.TokenFile
	if repl == nil || repl.Role != fleetgraph.RoleCollector { // a collector serves no queries
		if authn, tokens, err = f.authenticator(ctx); err != nil {
			return err
		}
	}
	var edgeTokens edge.Tokens
	if f.edgeTokensFile != "" {
		if edgeTokens, err = edge.LoadTokenFile(f.edgeTokensFile, slog.Default()); err != nil {
			return err
		}
	}
	srcs, err := f.sources()
	if err != nil {
		return err
	}
	srv, err := fleetgraph.New(fleetgraph.Config{
		EdgeTokens: edgeTokens, Sources: srcs, Registry: newMetricsRegistry(),
		Clusters: specs, Kinds: f.kinds, ExtraKinds: f.extraKinds,
		Namespaces: f.namespaces, ExcludeNamespaces: f.excludeNamespaces, Relist: f.relist,
		Connection:     connection.Options{MaxConcurrentSyncs: f.maxConcurrentSyncs()},
		DisableDetails: f.noDetails,
		Authenticator:  authn, AdminGroups: f.adminGroups,
		ShutdownTimeout: f.timeouts.shutdown,
		Replication:     repl,
		Edge:            edge.HubOptions{HelloTimeout: f.timeouts.edgeHello},
		Graph: graph.Options{
			DisableIntrospection: f.noIntrospection,
			Limits:               graph.Limits{RequestTimeout: f.timeouts.request},
			Websocket: graph.WebsocketOptions{
				OriginPatterns: f.originPatterns, InitTimeout: f.timeouts.wsInit, KeepAlive: f.timeouts.wsKeepAlive,
			},
		},
	})
	if err != nil {
		return err
	}

	handler := srv.Handler()
	if f.wrap != nil {
		handler = f.wrap(authn, handler)
	}
	return f.run(ctx, srv, handler, tokens, len(specs))
}

// run serves srv until ctx ends or something fails, then shuts down within
// --shutdown-timeout: the API cancels its queries in flight at once, the
// listeners stop accepting and wait for their requests, collectors and edge
// sessions stop. Whatever is still running when the timeout passes is cut
// off and run returns an error saying so.
func (f *serveFlags) run(ctx context.Context, srv *fleetgraph.Server, handler http.Handler, tokens *authz.TokenFile, clusters int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var servers []*http.Server
	closeAll := func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}
	failed := make(chan error, 2) // a listener that stopped by itself
	listen := func(ln net.Listener, addr string, h http.Handler, tlsConfig *tls.Config, what string) error {
		hs := &http.Server{
			Handler: h, TLSConfig: tlsConfig,
			ReadHeaderTimeout: f.timeouts.readHeader, ReadTimeout: f.timeouts.read, IdleTimeout: f.timeouts.idle,
		}
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", addr); err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
		}
		scheme := "http"
		if tlsConfig != nil {
			scheme = "https"
		}
		slog.Info("serving "+what, "url", scheme+"://"+ln.Addr().String(), "clusters", clusters, "sources", f.sourceNames)
		servers = append(servers, hs)
		go func() {
			var err error
			if tlsConfig != nil {
				err = hs.ServeTLS(ln, f.tlsCert, f.tlsKey)
			} else {
				err = hs.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("serving %s on %s: %w", what, addr, err)
			}
		}()
		return nil
	}
	if f.metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", srv.MetricsHandler())
		if err := listen(nil, f.metricsListen, mux, nil, "metrics"); err != nil {
			return err
		}
	}
	var tlsConfig *tls.Config
	if f.tlsCert != "" {
		var err error
		if tlsConfig, err = f.tlsConfig(); err != nil {
			closeAll()
			return err
		}
	}
	if err := listen(f.listener, f.listen, handler, tlsConfig, "the API"); err != nil {
		closeAll()
		return err
	}

	tasks := make(chan error, 2)
	running := 1
	go func() { tasks <- srv.Run(ctx) }()
	if tokens != nil {
		running++
		go func() { tokens.Run(ctx); tasks <- nil }()
	}
	var runErr error
	select {
	case <-ctx.Done():
		slog.Info("shutting down", "timeout", f.timeouts.shutdown)
	case runErr = <-tasks:
		running--
		if runErr == nil {
			runErr = errors.New("the server stopped by itself")
		}
	case runErr = <-failed:
	}
	cancel()

	shutdown, done := context.WithTimeout(context.Background(), f.timeouts.shutdown)
	defer done()
	shut := make(chan error, len(servers))
	for _, s := range servers {
		go func() { shut <- s.Shutdown(shutdown) }()
	}
	for pending := running + len(servers); pending > 0; pending-- {
		var err error
		select {
		case err = <-tasks:
		case err = <-shut:
		case <-shutdown.Done():
			closeAll()
			return errors.Join(runErr, fmt.Errorf("shutdown did not finish within --shutdown-timeout %v; cut off", f.timeouts.shutdown))
		}
		if err != nil && runErr == nil {
			runErr = err
		}
	}
	return runErr
}

// The authenticators --allow-system-names may name.
const (
	authnTokensFile    = "tokens-file"
	authnOIDC          = "oidc"
	authnRequestHeader = "requestheader"
)

// authenticator builds the union of the configured authenticators, each
// with its own naming. The token file, if any, is returned too: serve
// keeps it in step with the file.
func (f *serveFlags) authenticator(ctx context.Context) (authz.Authenticator, *authz.TokenFile, error) {
	allowSystem := map[string]bool{}
	for _, a := range f.allowSystemNames {
		switch a {
		case authnTokensFile, authnOIDC, authnRequestHeader:
			allowSystem[a] = true
		default:
			return nil, nil, fmt.Errorf("--allow-system-names: unknown authenticator %q (want %s, %s or %s)", a, authnTokensFile, authnOIDC, authnRequestHeader)
		}
	}
	union := &authz.Union{AllowAnonymous: f.allowAnonymous}
	var tokens *authz.TokenFile
	if f.tokensFile != "" {
		var err error
		tokens, err = authz.OpenTokenFile(f.tokensFile, authz.TokenFileOptions{Naming: authz.Naming{AllowSystemNames: allowSystem[authnTokensFile]}})
		if errors.Is(err, authz.ErrReservedName) {
			err = fmt.Errorf("%w (to allow such identities from this file: --allow-system-names=%s)", err, authnTokensFile)
		}
		if err != nil {
			return nil, nil, err
		}
		union.Authenticators = append(union.Authenticators, tokens)
	}
	if f.oidcIssuer != "" {
		if f.oidcClientID == "" {
			return nil, nil, errors.New("--oidc-issuer needs --oidc-client-id")
		}
		o, err := authz.NewOIDC(ctx, authz.OIDCConfig{
			IssuerURL: f.oidcIssuer, ClientID: f.oidcClientID,
			UsernameClaim: f.oidcUsernameClaim, GroupsClaim: f.oidcGroupsClaim,
			UsernamePrefix: f.oidcUsernamePfx, GroupsPrefix: f.oidcGroupsPrefix,
			AllowSystemNames: allowSystem[authnOIDC],
		})
		if err != nil {
			return nil, nil, err
		}
		union.Authenticators = append(union.Authenticators, o)
	}
	if f.requestHeaderCA != "" {
		if f.tlsCert == "" {
			return nil, nil, errors.New("--requestheader-client-ca-file needs --tls-cert-file: proxies prove themselves with client certificates")
		}
		pool, err := loadCertPool(f.requestHeaderCA)
		if err != nil {
			return nil, nil, err
		}
		rh, err := authz.NewRequestHeader(authz.RequestHeaderConfig{ClientCA: pool, Naming: authz.Naming{AllowSystemNames: allowSystem[authnRequestHeader]}})
		if err != nil {
			return nil, nil, err
		}
		union.Authenticators = append(union.Authenticators, rh)
	}
	if len(union.Authenticators) == 0 && !f.allowAnonymous {
		return nil, nil, errors.New("no authenticator: give --tokens-file, --oidc-issuer or --requestheader-client-ca-file (or --allow-anonymous)")
	}
	return union, tokens, nil
}

func (f *serveFlags) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.requestHeaderCA != "" {
		pool, err := loadCertPool(f.requestHeaderCA)
		if err != nil {
			return nil, err
		}
		// Ask for client certificates, but let browsers without one in:
		// only request-header authentication needs them.
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

func loadCertPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// defaultSources fills in --source when it is not given: the kubeconfig's
// contexts, and the labelled Secrets when --cluster-secrets-namespace is
// set. A kubeconfig without contexts is fine then if clusters come from
// Secrets or edge agents.
func (f *serveFlags) defaultSources() error {
	if len(f.sourceNames) > 0 {
		return nil
	}
	if f.secretNamespace != "" {
		f.sourceNames = append(f.sourceNames, sources.SecretsSource)
	}
	_, err := connection.KubeconfigSpecs(f.kubeconfig, f.contexts)
	switch {
	case err == nil:
		f.sourceNames = append(f.sourceNames, sources.KubeconfigSource)
	case !errors.Is(err, connection.ErrNoContexts) || (len(f.sourceNames) == 0 && f.edgeTokensFile == ""):
		return err
	}
	return nil
}

// sources builds the --source sources. The kubeconfig is checked at once,
// so a typo in --context fails the start instead of showing as a broken
// cluster.
func (f *serveFlags) sources() ([]sources.Source, error) {
	for _, name := range f.sourceNames {
		switch {
		case !sources.Valid(name):
			_, err := sources.New(name, sources.Options{})
			return nil, fmt.Errorf("--source: %w", err)
		case name == sources.SecretsSource && f.secretNamespace == "":
			return nil, errors.New("--source secrets needs --cluster-secrets-namespace")
		case name == sources.ClusterProfileSource && f.providerFile == "":
			return nil, errors.New("--source clusterprofile needs --clusterprofile-provider-file")
		}
	}
	if len(f.clusterLabels) > 0 && !slices.Contains(f.sourceNames, sources.KubeconfigSource) {
		return nil, errors.New("--cluster-label labels kubeconfig contexts; other sources take labels from their objects")
	}
	var out []sources.Source
	var opts *sources.Options
	for _, name := range f.sourceNames {
		if name == sources.KubeconfigSource {
			if _, err := connection.KubeconfigSpecs(f.kubeconfig, f.contexts); err != nil {
				return nil, err
			}
			labels, err := parseClusterLabels(f.clusterLabels)
			if err != nil {
				return nil, err
			}
			out = append(out, sources.NewKubeconfig(sources.KubeconfigOptions{
				Path: f.kubeconfig, Contexts: f.contexts, Labels: labels, Logger: slog.Default(),
			}))
			continue
		}
		if opts == nil {
			mgmt, err := f.managementConfig()
			if err != nil {
				return nil, fmt.Errorf("--source %s: %w", name, err)
			}
			o := f.sourceOptions()
			o.Management = mgmt
			opts = &o
		}
		src, err := sources.New(name, *opts)
		if err != nil {
			return nil, err
		}
		out = append(out, src)
	}
	return out, nil
}

// managementConfig reaches the cluster that holds the inventories.
func (f *serveFlags) managementConfig() (*rest.Config, error) {
	if f.mgmtKubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", f.mgmtKubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--management-kubeconfig: %w", err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no management cluster: give --management-kubeconfig or run in a cluster: %w", err)
	}
	return cfg, nil
}

// parseClusterLabels reads --cluster-label values, [CONTEXT:]KEY=VALUE,
// into labels by context ("" for every context).
func parseClusterLabels(values []string) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	for _, v := range values {
		eq := strings.Index(v, "=")
		if eq < 0 {
			return nil, fmt.Errorf("--cluster-label %q: want [CONTEXT:]KEY=VALUE", v)
		}
		// Label keys hold no ":", contexts may (EKS ARNs): the context
		// ends at the last ":" before the "=".
		ctx, kv := "", v
		if i := strings.LastIndex(v[:eq], ":"); i >= 0 {
			ctx, kv = v[:i], v[i+1:]
		}
		key, value, _ := strings.Cut(kv, "=")
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("--cluster-label %q: key: %s", v, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, fmt.Errorf("--cluster-label %q: value: %s", v, strings.Join(errs, "; "))
		}
		if out[ctx] == nil {
			out[ctx] = map[string]string{}
		}
		out[ctx][key] = value
	}
	return out, nil
}
