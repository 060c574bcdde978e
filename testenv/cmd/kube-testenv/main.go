// Command kube-testenv runs one real Kubernetes control plane for tests:
// an embedded etcd and a kube-apiserver built from k8s.io/kubernetes, both
// in this one process, on loopback ports the kernel picks. Its one line on
// stdout, "kube-testenv: serving on 127.0.0.1:PORT", reports the API
// server's address once it listens; everything else it logs goes to
// stderr. No caller picks a port, so processes started at once never race
// for one.
//
// It is deliberately a separate binary in a nested module so that the root
// fleetgraph module never depends on k8s.io/kubernetes. Tests start it
// through internal/testcluster, which owns data directories, tokens,
// stable addresses and fault injection. Running it again with the same
// --data-dir keeps every object, the serving certificate and the
// service-account keys (on a new port).
//
// The API server runs with authorization-mode RBAC and a static token file.
// Given --controller-token, the process also runs the two controllers whose
// absence would make the cluster behave unlike a real one for fleetgraph:
// ClusterRole aggregation (so "view", "edit" and "admin" have rules) and
// namespace deletion. There is no scheduler or kubelet, so pods stay
// Pending unless a test writes their status.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration, as kube-apiserver's main does
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as kube-apiserver's main does
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as kube-apiserver's main does
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
)

// etcdStartTimeout bounds how long embedded etcd may take to elect itself.
// A single-member cluster on loopback is ready in well under a second; ten
// seconds covers a loaded CI machine.
const etcdStartTimeout = 10 * time.Second

// controllerResync is the informer resync period of the in-process
// controllers, as kube-controller-manager's default namespace sync period.
const controllerResync = 5 * time.Minute

func main() {
	logs.InitLogs()
	err := run(genericapiserver.SetupSignalContext(), os.Args[1:], os.Stdout)
	logs.FlushLogs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-testenv:", err)
		os.Exit(1)
	}
}

// run serves a control plane until ctx ends, writing the serving line to
// stdout. Every process-wide setting (feature gates, klog's logger and
// verbosity, client-go's warning handler) is made before etcd and the
// controllers start: their goroutines log through klog from the first
// moment, and replacing its logger while they do is a data race that can
// crash the process as it starts.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kube-testenv", flag.ContinueOnError)
	var (
		dataDir   = fs.String("data-dir", "", "directory for etcd data, certificates and keys (required; reused on restart)")
		tokenFile = fs.String("token-auth-file", "", "kube-apiserver --token-auth-file CSV (required)")
		ctlToken  = fs.String("controller-token", "", "system:masters token the in-process controllers use (optional)")
		verbosity = fs.Int("v", 0, "kube-apiserver log verbosity")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dataDir == "" || *tokenFile == "" {
		fs.Usage()
		return errors.New("--data-dir and --token-auth-file are required")
	}

	saKey := filepath.Join(*dataDir, "sa.key")
	if err := ensureServiceAccountKey(saKey); err != nil {
		return err
	}

	// The kernel picks the API server's port: no other process can be
	// handed it, so two control planes starting at once never collide.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().String()

	s, err := apiServerFlags(ln, []string{
		"--advertise-address=127.0.0.1",
		"--cert-dir=" + filepath.Join(*dataDir, "certs"),
		"--authorization-mode=RBAC",
		"--token-auth-file=" + *tokenFile,
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller-manager creates default ServiceAccounts, so the
		// admission plugin that requires them would reject every pod.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--endpoint-reconciler-type=none",
		"--v=" + strconv.Itoa(*verbosity),
	})
	if err != nil {
		return err
	}

	etcd, err := startEtcd(filepath.Join(*dataDir, "etcd"))
	if err != nil {
		return err
	}
	defer etcd.Close()
	s.Etcd.StorageConfig.Transport.ServerList = []string{"http://" + etcd.Clients[0].Addr().String()}
	opts, err := completeOptions(ctx, s)
	if err != nil {
		return err
	}

	if *ctlToken != "" {
		cfg := &rest.Config{
			Host:            "https://" + addr,
			BearerToken:     *ctlToken,
			TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(*dataDir, "certs", "apiserver.crt")},
		}
		// Informers retry until the API server below is serving.
		go runControllers(ctx, cfg)
	}
	// The one line this process writes to stdout: the caller reads the
	// address from it, then waits for /readyz.
	if _, err := fmt.Fprintln(stdout, servingPrefix+addr); err != nil {
		return fmt.Errorf("report the serving address: %w", err)
	}
	return app.Run(ctx, opts)
}

// servingPrefix starts the stdout line that reports the API server's
// address, as host:port. internal/testcluster reads it.
const servingPrefix = "kube-testenv: serving on "

// apiServerFlags parses kube-apiserver flags into options that serve on
// ln, and applies their process-wide settings (feature gates, logging), as
// kube-apiserver's command does before it starts anything. The listener
// is given instead of opened from --secure-port, which cannot ask for a
// port the kernel picks (0 turns serving off).
func apiServerFlags(ln net.Listener, args []string) (*options.ServerRunOptions, error) {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port

	registry := s.GenericServerRunOptions.ComponentGlobalsRegistry
	if err := registry.Set(); err != nil {
		return nil, err
	}
	// As kube-apiserver: its loopback clients log no self-issued warnings.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	if err := logsapi.ValidateAndApply(s.Logs, registry.FeatureGateFor(basecompatibility.DefaultKubeComponent)); err != nil {
		return nil, err
	}
	return s, nil
}

// completeOptions completes and validates s, once its etcd address is set.
func completeOptions(ctx context.Context, s *options.ServerRunOptions) (options.CompletedOptions, error) {
	completed, err := s.Complete(ctx)
	if err != nil {
		return options.CompletedOptions{}, err
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return options.CompletedOptions{}, utilerrors.NewAggregate(errs)
	}
	return completed, nil
}

// runControllers runs ClusterRole aggregation and namespace deletion
// against the API server this process serves, until ctx ends.
func runControllers(ctx context.Context, cfg *rest.Config) {
	client := kubernetes.NewForConfigOrDie(cfg)
	meta := metadata.NewForConfigOrDie(cfg)
	// The namespace controller reads discovery once when built and exits
	// the process if it gets nothing, so wait until the server answers.
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := client.Discovery().ServerPreferredNamespacedResources()
		return err == nil, nil
	})
	if err != nil {
		return // ctx ended
	}
	factory := informers.NewSharedInformerFactory(client, controllerResync)

	aggregation := clusterroleaggregation.NewClusterRoleAggregation(factory.Rbac().V1().ClusterRoles(), client.RbacV1())
	namespaces := namespacecontroller.NewNamespaceController(ctx, client, meta,
		client.Discovery().ServerPreferredNamespacedResources,
		factory.Core().V1().Namespaces(), controllerResync, corev1.FinalizerKubernetes)
	factory.Start(ctx.Done())
	go aggregation.Run(ctx, 2)
	go namespaces.Run(ctx, 2)
}

// startEtcd starts a single-member etcd on loopback ports the kernel
// picks and waits until it serves. Its client address is
// Clients[0].Addr(). The advertised URLs keep port 0: the member's only
// client is the API server in this process, which is given the real
// address, and keeping them constant lets a restart reuse the data.
func startEtcd(dir string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "testenv"
	cfg.LogLevel = "error"
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.QuotaBackendBytes = 2 << 30
	// The gateway serves etcd's JSON API by dialling the configured
	// client address, which is port 0 here; the API server speaks gRPC.
	cfg.EnableGRPCGateway = false
	// Test clusters need no durability against power loss. Without fsync
	// a SIGKILLed process still loses nothing (the kernel keeps its
	// writes), and writes are an order of magnitude faster.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed: %w", err)
	case <-time.After(etcdStartTimeout):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after %s", etcdStartTimeout)
	}
}

// ensureServiceAccountKey writes an ECDSA key for signing service-account
// tokens, unless one exists already from an earlier run with this data dir.
func ensureServiceAccountKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal service-account key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		return fmt.Errorf("write service-account key: %w", err)
	}
	return nil
}
