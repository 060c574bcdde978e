package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
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
}

// Cluster is one running (or stopped) control plane. Its methods are safe
// for concurrent use.
type Cluster struct {
	// Name is the cluster's name from Options.
	Name string
	// Config is an admin client config that goes through the fault proxy.
	Config *rest.Config
	// DirectConfig is an admin client config that bypasses the fault
	// proxy, for test setup while a fault is active. It goes through a
	// plain forwarder that, like Proxy, keeps its address across restarts.
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
	args    []string
	caPEM   []byte
	direct  *Proxy // never faulted; DirectConfig's address

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// EnvBinary names the environment variable that holds the kube-testenv
// path. Tests that need a control plane run only when it is set.
const EnvBinary = "FLEETGRAPH_TESTENV"

// Require skips the test unless $FLEETGRAPH_TESTENV names a control-plane
// binary, saying why: `make test-unit` leaves it unset to run only the
// tests that need no control plane. When it is set (`make test` always
// sets it), a missing binary is an error that fails the test, never a
// skip. Start and StartAll call it; tests that call New call it first.
func Require(t testing.TB) {
	t.Helper()
	if os.Getenv(EnvBinary) == "" {
		t.Skipf("needs a real control plane: %s is unset (make test sets it; make test-unit skips these tests)", EnvBinary)
	}
}

// Start starts a cluster for a test and registers its cleanup. It skips
// the test as Require does, and fails it if the cluster does not become
// ready.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Binary == "" {
		Require(t)
	}
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	cleanupOnEnd(t, c)
	return c
}

// cleanupOnEnd closes c when the test ends, showing its log's tail if the
// test failed.
func cleanupOnEnd(t testing.TB, c *Cluster) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testcluster %s: last log lines:\n%s", c.Name, c.LogTail(40))
		}
		if err := c.Close(); err != nil {
			t.Errorf("testcluster %s: close: %v", c.Name, err)
		}
	})
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
		_ = c.Close()
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// setup writes tokens and certificates, starts the proxies and builds the
// client configs. It starts no process and picks no port: the control
// plane's ports are picked by the kernel when it starts.
func (c *Cluster) setup(opts Options) error {
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
		"--token-auth-file=" + tokenFile,
		// ClusterRole aggregation and namespace deletion run in-process
		// as the admin, as kube-controller-manager would.
		"--controller-token=" + c.Tokens[AdminUser],
	}

	if c.Proxy, err = NewProxy(""); err != nil {
		return err
	}
	if c.direct, err = NewProxy(""); err != nil {
		return err
	}
	c.Config = c.configFor(AdminUser, c.Proxy.URL())
	c.DirectConfig = c.configFor(AdminUser, c.direct.URL())
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
// until /readyz answers ok. It keeps the data directory, so a start after
// Stop is a restart. The API server gets a new port from the kernel each
// time; the proxies move to it, so every address a client holds (Config,
// DirectConfig, Kubeconfig, Proxy.URL) stays the same.
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
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.mu.Unlock()
		_ = logFile.Close()
		return fmt.Errorf("stdout pipe: %w", err)
	}
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
	serving := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		readServing(stdout, logFile, serving)
		// The exit status goes to the log, where a start that failed
		// shows it: a crash and a kill read alike from the outside.
		_ = cmd.Wait()
		_, _ = fmt.Fprintf(logFile, "%s%v\n", exitedPrefix, cmd.ProcessState)
		_ = logFile.Close()
		close(done)
	}()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err = c.waitServing(ctx, serving, done)
	if err == nil {
		err = c.waitReady(ctx, done)
	}
	if err != nil {
		_ = c.Stop()
		return fmt.Errorf("cluster %s: %w\n%s", c.Name, err, c.LogTail(20))
	}
	return nil
}

// readServing copies the control plane's stdout to the log until it
// closes, and sends the API server's address from the line kube-testenv
// writes once it listens.
func readServing(stdout io.Reader, log io.Writer, serving chan<- string) {
	scanner := bufio.NewScanner(stdout)
	for scanner.Scan() {
		line := scanner.Text()
		if addr, ok := strings.CutPrefix(line, servingPrefix); ok {
			select {
			case serving <- addr:
			default: // a second report; the first one stands
			}
		}
		_, _ = fmt.Fprintln(log, line)
	}
}

// exitedPrefix starts the line the log ends with once the control plane
// has exited, followed by its exit status.
const exitedPrefix = "testcluster: kube-testenv exited: "

// servingPrefix starts the line on which kube-testenv reports its API
// server's host:port (testenv/cmd/kube-testenv's servingPrefix).
const servingPrefix = "kube-testenv: serving on "

// waitServing waits for the control plane to report the address the
// kernel gave its API server, and points both proxies at it.
func (c *Cluster) waitServing(ctx context.Context, serving <-chan string, exited <-chan struct{}) error {
	select {
	case addr := <-serving:
		c.Proxy.SetTarget(addr)
		c.direct.SetTarget(addr)
		return nil
	case <-exited:
		return errors.New("control plane exited while starting")
	case <-ctx.Done():
		return fmt.Errorf("no serving address within %s: %w", readyTimeout, ctx.Err())
	}
}

// waitReady polls /readyz through the direct forwarder (not the fault
// proxy, which a test may have broken) until it answers 200.
func (c *Cluster) waitReady(ctx context.Context, exited <-chan struct{}) error {
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
			return fmt.Errorf("not ready within %s: %w", readyTimeout, ctx.Err())
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
	// The dead server's port is free for any process to take: point the
	// proxies nowhere, so that clients see a dead server, never another.
	c.Proxy.SetTarget("")
	c.direct.SetTarget("")
	return nil
}

// Restart stops and starts the control plane, keeping its objects,
// addresses and certificates.
func (c *Cluster) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Freeze suspends the control plane with SIGSTOP: connections stay open
// and nothing answers, like a hung node. It returns once every thread of
// the process has stopped: kill(2) only queues the signal, and on a busy
// machine the threads that are running keep serving requests until one
// of them is scheduled and takes the group stop.
func (c *Cluster) Freeze() error {
	if err := c.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return c.waitStopped(stopTimeout)
}

// stopTimeout bounds how long Freeze waits for the threads to stop.
const stopTimeout = 10 * time.Second

// waitStopped polls /proc until every thread of the control plane is
// stopped (state T).
func (c *Cluster) waitStopped(timeout time.Duration) error {
	pid := c.Pid()
	if pid == 0 {
		return fmt.Errorf("cluster %s is not running", c.Name)
	}
	deadline := time.Now().Add(timeout)
	for {
		running, err := runningThreads(pid)
		if err != nil {
			return fmt.Errorf("cluster %s: read threads: %w", c.Name, err)
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster %s: %d threads still running %s after SIGSTOP", c.Name, running, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the threads of pid that are not stopped.
func runningThreads(pid int) (int, error) {
	threads, err := procfs.AllThreads(pid)
	if err != nil {
		return 0, err
	}
	running := 0
	for _, th := range threads {
		st, err := th.Stat()
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread exited
		}
		if err != nil {
			return 0, err
		}
		if st.State != "T" {
			running++
		}
	}
	return running, nil
}

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
	if c.direct != nil {
		c.direct.Close()
	}
	if c.ownDir {
		if rmErr := os.RemoveAll(c.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove data dir: %w", rmErr))
		}
	}
	return err
}

// LogTail returns the last n lines of the control plane's log, which end
// with its exit status once it has exited. If the log holds a crash whose
// first lines are not in the tail (a goroutine dump pushes them far out),
// those come first, then "...".
func (c *Cluster) LogTail(n int) string {
	data, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	tail := string(bytes.Join(lines, []byte("\n")))
	crash := crashLines(data, 12)
	if crash == "" || strings.Contains(tail, crash) {
		return tail
	}
	return crash + "\n...\n" + tail
}

// crashMarker matches the first line of a Go panic, a runtime fatal error,
// a race report and a klog fatal (F and the date, as in F1127 09:25:47).
var crashMarker = regexp.MustCompile(`(?m)^(panic: |fatal error: |WARNING: DATA RACE|F\d{4} \d)`)

// crashLines returns the first crash's first line and up to n lines after
// it, or "" if the log has none.
func crashLines(log []byte, n int) string {
	loc := crashMarker.FindIndex(log)
	if loc == nil {
		return ""
	}
	lines := bytes.SplitN(log[loc[0]:], []byte("\n"), n+2)
	if len(lines) > n+1 {
		lines = lines[:n+1]
	}
	return string(bytes.TrimRight(bytes.Join(lines, []byte("\n")), "\n"))
}

// findBinary locates kube-testenv: an explicit path, $FLEETGRAPH_TESTENV
// (which must exist), or bin/kube-testenv in the repository that contains
// the working directory (for the demo and benchmarks; tests skip through
// Require before they get here without $FLEETGRAPH_TESTENV).
func findBinary(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w (`make testenv` builds it)", EnvBinary, p, err)
		}
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

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
