// Command kube-testenv runs one real Kubernetes control plane for tests:
// an embedded etcd and a kube-apiserver built from k8s.io/kubernetes, both
// in this one process, on loopback ports.
//
// It is deliberately a separate binary in a nested module so that the root
// fleetgraph module never depends on k8s.io/kubernetes. Tests start it
// through internal/testcluster, which owns ports, data directories, tokens
// and fault injection. Running it again with the same --data-dir keeps every
// object, the serving certificate and the service-account keys.
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
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration, as kube-apiserver's main does
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as kube-apiserver's main does
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as kube-apiserver's main does
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
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
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-testenv:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		dataDir   = flag.String("data-dir", "", "directory for etcd data, certificates and keys (required; reused on restart)")
		port      = flag.Int("port", 0, "kube-apiserver secure port on 127.0.0.1 (required)")
		etcdPort  = flag.Int("etcd-port", 0, "embedded etcd client port on 127.0.0.1 (required)")
		peerPort  = flag.Int("etcd-peer-port", 0, "embedded etcd peer port on 127.0.0.1 (required)")
		tokenFile = flag.String("token-auth-file", "", "kube-apiserver --token-auth-file CSV (required)")
		ctlToken  = flag.String("controller-token", "", "system:masters token the in-process controllers use (optional)")
		verbosity = flag.Int("v", 0, "kube-apiserver log verbosity")
	)
	flag.Parse()
	if *dataDir == "" || *port == 0 || *etcdPort == 0 || *peerPort == 0 || *tokenFile == "" {
		flag.Usage()
		return errors.New("--data-dir, --port, --etcd-port, --etcd-peer-port and --token-auth-file are required")
	}

	saKey := filepath.Join(*dataDir, "sa.key")
	if err := ensureServiceAccountKey(saKey); err != nil {
		return err
	}

	etcd, err := startEtcd(filepath.Join(*dataDir, "etcd"), *etcdPort, *peerPort)
	if err != nil {
		return err
	}
	defer etcd.Close()

	if *ctlToken != "" {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := &rest.Config{
			Host:            "https://127.0.0.1:" + strconv.Itoa(*port),
			BearerToken:     *ctlToken,
			TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(*dataDir, "certs", "apiserver.crt")},
		}
		// Informers retry until the API server below is serving.
		go runControllers(ctx, cfg)
	}

	cmd := app.NewAPIServerCommand()
	cmd.SetArgs([]string{
		"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(*etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(*port),
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
	if code := cli.Run(cmd); code != 0 {
		return fmt.Errorf("kube-apiserver exited with code %d", code)
	}
	return nil
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

// startEtcd starts a single-member etcd on loopback and waits until it
// serves.
func startEtcd(dir string, clientPort, peerPort int) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "testenv"
	cfg.LogLevel = "error"
	clientURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(clientPort)}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(peerPort)}
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.QuotaBackendBytes = 2 << 30
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
