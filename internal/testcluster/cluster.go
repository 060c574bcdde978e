package testcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
)

// AdminUser is the user every cluster has, in group system:masters.
const AdminUser = "admin"

const (
	// readyTimeout bounds a start or restart. A cold start takes about four
	// seconds on an idle machine; CI runs several clusters at once on two
	// cores, so allow much more.
	readyTimeout = 90 * time.Second
	// readyPoll is the /readyz polling interval while starting.
	readyPoll = 100 * time.Millisecond
)

// User is a static-token user of a test cluster.
type User struct {
	Name   string
	Groups []string
}

// Options configures a test cluster.
type Options struct {
	// Name identifies the cluster in logs and kubeconfig contexts.
	// Defaults to "test".
	Name string
	// Users get static tokens besides the admin. They have no RBAC
	// bindings until a test creates some.
	Users []User
	// Binary overrides the kube-testenv path.
	Binary string
	// LogOutput, if set, receives the control plane's log; by default it
	// goes to a file in the data directory and its tail is shown on
	// failure.
	LogOutput *os.File
}

// Cluster is one running (or stopped) control plane. Its methods are safe
// for concurrent use.
type Cluster struct {
	// Name is the cluster's name from Options.
	Name string
	// Config is an admin client config that goes through the fault proxy.
	Config *rest.Config
	// DirectConfig is an admin client config that bypasses the proxy, for
	// test setup while a fault is active.
	DirectConfig *rest.Config
	// Kubeconfig is the path of a kubeconfig file with one context, Name,
	// for the admin, through the fault proxy.
	Kubeconfig string
	// Tokens maps each user name, admin included, to its bearer token.
	Tokens map[string]string
	// Proxy is the fault proxy in front of the API server.
	Proxy *Proxy

	dir     string
	ownDir  bool
	binary  string
	logPath string
	apiPort int
	args    []string
	caPEM   []byte

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// Start starts a cluster for a test and registers its cleanup. It fails
// the test if the cluster does not become ready.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testcluster %s: last log lines:\n%s", c.Name, c.LogTail(40))
		}
		if err := c.Close(); err != nil {
			t.Errorf("testcluster %s: close: %v", c.Name, err)
		}
	})
	return c
}

// New starts a cluster and waits until it is ready. The caller must call
// Close. Tests should use Start instead.
func New(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Name == "" {
		opts.Name = "test"
	}
	binary, err := findBinary(opts.Binary)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fleetgraph-"+opts.Name+"-")
	if err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	c := &Cluster{Name: opts.Name, dir: dir, ownDir: true, binary: binary, logPath: filepath.Join(dir, "apiserver.log")}
	if err := c.setup(opts); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// setup picks ports, writes tokens and certificates, starts the proxy and
// builds the client configs. It starts no process.
func (c *Cluster) setup(opts Options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	c.apiPort = ports[0]

	c.Tokens = map[string]string{AdminUser: randomToken()}
	var csv strings.Builder
	fmt.Fprintf(&csv, "%s,%s,%s,\"system:masters\"\n", c.Tokens[AdminUser], AdminUser, AdminUser)
	for _, u := range opts.Users {
		if _, dup := c.Tokens[u.Name]; dup {
			return fmt.Errorf("user %q listed twice", u.Name)
		}
		c.Tokens[u.Name] = randomToken()
		fmt.Fprintf(&csv, "%s,%s,%s,\"%s\"\n", c.Tokens[u.Name], u.Name, u.Name, strings.Join(u.Groups, ","))
	}
	tokenFile := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(csv.String()), 0o600); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}

	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return fmt.Errorf("generate serving certificate: %w", err)
	}
	certDir := filepath.Join(c.dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return fmt.Errorf("create cert dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "apiserver.crt"), certPEM, 0o600); err != nil {
		return fmt.Errorf("write serving certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "apiserver.key"), keyPEM, 0o600); err != nil {
		return fmt.Errorf("write serving key: %w", err)
	}
	c.caPEM = certPEM

	c.args = []string{
		"--data-dir=" + c.dir,
		fmt.Sprintf("--port=%d", ports[0]),
		fmt.Sprintf("--etcd-port=%d", ports[1]),
		fmt.Sprintf("--etcd-peer-port=%d", ports[2]),
		"--token-auth-file=" + tokenFile,
		// ClusterRole aggregation and namespace deletion run in-process
		// as the admin, as kube-controller-manager would.
		"--controller-token=" + c.Tokens[AdminUser],
	}

	c.Proxy, err = NewProxy(fmt.Sprintf("127.0.0.1:%d", c.apiPort))
	if err != nil {
		return err
	}
	c.Config = c.configFor(AdminUser, c.Proxy.URL())
	c.DirectConfig = c.configFor(AdminUser, fmt.Sprintf("https://127.0.0.1:%d", c.apiPort))
	c.Kubeconfig = filepath.Join(c.dir, "kubeconfig")
	return c.WriteKubeconfig(c.Kubeconfig, AdminUser)
}

// UserConfig returns a client config for a user, through the proxy.
func (c *Cluster) UserConfig(user string) *rest.Config {
	return c.configFor(user, c.Proxy.URL())
}

func (c *Cluster) configFor(user, host string) *rest.Config {
	return &rest.Config{
		Host:            host,
		BearerToken:     c.Tokens[user],
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		QPS:             -1, // tests create objects in bursts; no client-side throttling
	}
}

// CAData returns the PEM of the API server's serving certificate, which
// clients trust as their CA.
func (c *Cluster) CAData() []byte { return c.caPEM }

// WriteKubeconfig writes a kubeconfig with one context, named after the
// cluster, for a user, through the proxy.
func (c *Cluster) WriteKubeconfig(path, user string) error {
	return clientcmd.WriteToFile(*c.KubeconfigFor(user), path)
}

// KubeconfigFor returns an in-memory kubeconfig with one context, named
// after the cluster, for a user, through the proxy. Callers can merge
// several clusters' kubeconfigs into one.
func (c *Cluster) KubeconfigFor(user string) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Proxy.URL(), CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[c.Name+"-"+user] = &clientcmdapi.AuthInfo{Token: c.Tokens[user]}
	cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: c.Name + "-" + user}
	cfg.CurrentContext = c.Name
	return cfg
}

// Client returns an admin clientset through the proxy.
func (c *Cluster) Client() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(c.Config)
}

// Start starts the control plane process, if it is not running, and waits
// until /readyz answers ok. It keeps the data directory and ports, so a
// start after Stop is a restart.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.cmd != nil {
		c.mu.Unlock()
		return nil
	}
	logFile, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		c.mu.Unlock()
		return fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command(c.binary, c.args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true,
		// The kernel kills the control plane if the test process dies
		// without running its cleanups (a panic, a timeout, SIGKILL).
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", c.binary, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the exit status is visible in the log; callers see readiness
		_ = logFile.Close()
		close(done)
	}()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	if err := c.waitReady(ctx, done); err != nil {
		_ = c.Stop()
		return fmt.Errorf("cluster %s: %w\n%s", c.Name, err, c.LogTail(20))
	}
	return nil
}

// waitReady polls /readyz directly (not through the proxy, which a test
// may have broken) until it answers 200.
func (c *Cluster) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tr, err := rest.TransportFor(c.DirectConfig)
	if err != nil {
		return fmt.Errorf("build transport: %w", err)
	}
	client := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	url := c.DirectConfig.Host + "/readyz"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("build readyz request: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("control plane exited while starting")
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", readyTimeout, ctx.Err())
		case <-time.After(readyPoll):
		}
	}
}

// Stop kills the control plane with SIGKILL, as a crash or a lost node
// would, keeping its data (etcd's write-ahead log makes that safe).
// Stopping a stopped cluster does nothing.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.cmd, c.done = nil, nil
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill control plane: %w", err)
	}
	<-done
	return nil
}

// Restart stops and starts the control plane, keeping its objects, port
// and certificates.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Freeze suspends the control plane with SIGSTOP: connections stay open
// and nothing answers, like a hung node.
func (c *Cluster) Freeze() error { return c.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen control plane with SIGCONT.
func (c *Cluster) Thaw() error { return c.signal(syscall.SIGCONT) }

func (c *Cluster) signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return fmt.Errorf("cluster %s is not running", c.Name)
	}
	if err := syscall.Kill(-c.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal %v: %w", sig, err)
	}
	return nil
}

// Pid returns the control plane's process id, or 0 when it is stopped.
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Close stops the control plane and the proxy and removes the data
// directory.
func (c *Cluster) Close() error {
	err := c.Stop()
	if c.Proxy != nil {
		c.Proxy.Close()
	}
	if c.ownDir {
		if rmErr := os.RemoveAll(c.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove data dir: %w", rmErr))
		}
	}
	return err
}

// LogTail returns the last n lines of the control plane's log.
func (c *Cluster) LogTail(n int) string {
	data, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// findBinary locates kube-testenv: an explicit path, $FLEETGRAPH_TESTENV,
// or bin/kube-testenv in the repository that contains the working
// directory.
func findBinary(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := os.Getenv("FLEETGRAPH_TESTENV"); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find kube-testenv: %w", err)
	}
	for {
		p := filepath.Join(dir, "bin", "kube-testenv")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		if _, err := os.Stat(filepath.Join(dir, "testenv", "go.mod")); err == nil {
			return "", fmt.Errorf("kube-testenv not found at %s: run `make testenv` first", p)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kube-testenv not found: set FLEETGRAPH_TESTENV or run `make testenv` in the repository")
		}
		dir = parent
	}
}

// freePorts reserves n distinct loopback ports by binding and releasing
// them. Another process could take one in between; on a test machine that
// is rare, and Start reports it clearly when it happens.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
