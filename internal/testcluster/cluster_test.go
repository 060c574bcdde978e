package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if children := childProcesses(); len(children) > 0 {
			fmt.Fprintf(os.Stderr, "processes left behind: %v\n", children)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// childProcesses lists the pids of processes whose parent is this test
// binary.
func childProcesses() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(status), "\n") {
			if ppid, ok := strings.CutPrefix(line, "PPid:"); ok && strings.TrimSpace(ppid) == self {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// shortClient returns an admin clientset with a short timeout through the
// proxy, so that a hung server shows up as a timeout.
func shortClient(t *testing.T, c *Cluster, timeout time.Duration) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.Config)
	cfg.Timeout = timeout
	return kubernetes.NewForConfigOrDie(cfg)
}

func createNamespace(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	_, err := client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

func TestTwoClustersRunAtOnce(t *testing.T) {
	t.Parallel()
	clusters := StartAll(t, Options{Name: "a"}, Options{Name: "b"})
	a, b := clusters[0], clusters[1]
	if a.Proxy.URL() == b.Proxy.URL() || a.DirectConfig.Host == b.DirectConfig.Host || apiAddr(a) == apiAddr(b) {
		t.Fatalf("clusters share an address: %s and %s", a.Proxy.URL(), b.Proxy.URL())
	}
	createNamespace(t, a.Client(), "only-in-a")
	if _, err := a.Client().CoreV1().Namespaces().Get(t.Context(), "only-in-a", metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace missing in a: %v", err)
	}
	_, err := b.Client().CoreV1().Namespaces().Get(t.Context(), "only-in-a", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("namespace of a visible in b: err=%v", err)
	}
	if a.Pid() == b.Pid() {
		t.Fatalf("clusters share a process")
	}
}

func TestRBACForbidsThenAllows(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "rbac", Users: []User{{Name: "alice", Groups: []string{"dev"}}}})
	alice := kubernetes.NewForConfigOrDie(c.UserConfig("alice"))

	_, err := alice.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("alice without a binding: want 403, got %v", err)
	}

	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-view", Namespace: "default"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	}
	if _, err := c.Client().RbacV1().RoleBindings("default").Create(t.Context(), rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create rolebinding: %v", err)
	}
	// The authorizer reads bindings from an informer, so allow a moment.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = alice.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("alice with a binding: want 200, got %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The binding is namespaced: other namespaces stay forbidden.
	if _, err := alice.CoreV1().Pods("kube-system").List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice in kube-system: want 403, got %v", err)
	}
}

// apiAddr returns the address the cluster's proxies forward to: its API
// server's, or "" while it is stopped.
func apiAddr(c *Cluster) string {
	c.direct.mu.Lock()
	defer c.direct.mu.Unlock()
	return c.direct.target
}

func TestRestartKeepsObjects(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "restart"})
	createNamespace(t, c.Client(), "kept")
	url, direct, pid := c.Proxy.URL(), c.DirectConfig.Host, c.Pid()

	if err := c.Restart(t.Context()); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if c.Pid() == pid {
		t.Fatalf("restart kept the same process %d", pid)
	}
	if c.Proxy.URL() != url || c.DirectConfig.Host != direct {
		t.Fatalf("address changed across restart: %s -> %s, direct %s -> %s", url, c.Proxy.URL(), direct, c.DirectConfig.Host)
	}
	// Fresh clients: the old connections died with the old process.
	for _, cfg := range []*rest.Config{c.Config, c.DirectConfig} {
		if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Namespaces().Get(t.Context(), "kept", metav1.GetOptions{}); err != nil {
			t.Fatalf("namespace lost across restart (%s): %v", cfg.Host, err)
		}
	}

	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := shortClient(t, c, 2*time.Second).CoreV1().Namespaces().Get(t.Context(), "kept", metav1.GetOptions{}); err == nil {
		t.Fatalf("stopped cluster still answers")
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("start after stop: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(c.Config).CoreV1().Namespaces().Get(t.Context(), "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace lost across stop/start: %v", err)
	}
}

// expectTimeout runs a request that must hang until the client timeout.
func expectTimeout(t *testing.T, client kubernetes.Interface, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	_, err := client.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{})
	elapsed := time.Since(start)
	if err == nil {
		t.Fatalf("request succeeded; want a timeout")
	}
	if !isTimeout(err) {
		t.Fatalf("want a timeout, got %v", err)
	}
	if elapsed < timeout-100*time.Millisecond {
		t.Fatalf("failed after %s, before the %s client timeout: %v", elapsed, timeout, err)
	}
}

func isTimeout(err error) bool {
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) && netErr.Timeout() {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) ||
		strings.Contains(err.Error(), "Client.Timeout exceeded") // net/http wraps the deadline in an unexported error type
}

func expectOK(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := client.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("request still failing: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestFreezeAndThaw(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "freeze"})
	const timeout = 2 * time.Second
	client := shortClient(t, c, timeout)
	expectOK(t, client)

	if err := c.Freeze(); err != nil {
		t.Fatalf("freeze: %v", err)
	}
	expectTimeout(t, client, timeout)
	if err := c.Thaw(); err != nil {
		t.Fatalf("thaw: %v", err)
	}
	expectOK(t, client)
}

func TestProxyFaults(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "proxy"})
	const timeout = 2 * time.Second
	client := shortClient(t, c, timeout)
	expectOK(t, client)

	t.Run("black hole hangs until the client timeout", func(t *testing.T) {
		c.Proxy.BlackHole()
		expectTimeout(t, client, timeout)
		// A brand-new connection hangs too.
		expectTimeout(t, shortClient(t, c, timeout), timeout)
		// The direct path is unaffected.
		expectOK(t, kubernetes.NewForConfigOrDie(c.DirectConfig))
		c.Proxy.Restore()
		expectOK(t, client)
	})

	t.Run("reset breaks open connections only", func(t *testing.T) {
		tr, err := rest.TransportFor(c.Config)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: tr, Timeout: timeout}
		get := func() error {
			resp, err := hc.Get(c.Config.Host + "/readyz")
			if err != nil {
				return err
			}
			return resp.Body.Close()
		}
		if err := get(); err != nil {
			t.Fatalf("before reset: %v", err)
		}
		c.Proxy.Reset()
		// The pooled connection is gone; the next request dials anew and
		// succeeds, or fails once on the dead connection and then succeeds.
		if err := get(); err != nil {
			if err := get(); err != nil {
				t.Fatalf("after reset: %v", err)
			}
		}
		hc.CloseIdleConnections()
	})

	t.Run("latency slows requests", func(t *testing.T) {
		c.Proxy.SetLatency(300 * time.Millisecond)
		start := time.Now()
		expectOK(t, client)
		if elapsed := time.Since(start); elapsed < 300*time.Millisecond {
			t.Fatalf("request took %s with 300ms latency", elapsed)
		}
		c.Proxy.Restore()
	})
}

func TestCRDs(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "crds"})
	ctx := t.Context()
	if err := c.InstallIstioCRDs(ctx); err != nil {
		t.Fatalf("istio CRDs: %v", err)
	}
	if err := c.InstallFluxCRDs(ctx); err != nil {
		t.Fatalf("flux CRDs: %v", err)
	}
	// Installing again is a no-op.
	if err := c.InstallFluxCRDs(ctx); err != nil {
		t.Fatalf("flux CRDs again: %v", err)
	}
	resources, err := c.Client().Discovery().ServerResourcesForGroupVersion("kustomize.toolkit.fluxcd.io/v1")
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	if len(resources.APIResources) == 0 || resources.APIResources[0].Name != "kustomizations" {
		t.Fatalf("kustomizations not served: %+v", resources.APIResources)
	}
	if _, err := c.Client().Discovery().ServerResourcesForGroupVersion("networking.istio.io/v1"); err != nil {
		t.Fatalf("istio networking not served: %v", err)
	}
	if err := c.InstallCRDs(ctx, []byte("kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n")); err == nil {
		t.Fatalf("a manifest without CRDs was accepted")
	}
}

func TestMissingBinaryIsAClearError(t *testing.T) {
	t.Parallel()
	_, err := New(t.Context(), Options{Binary: filepath.Join(t.TempDir(), "nope")})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("want an error naming the missing binary, got %v", err)
	}
}

// TestRestartWhenTheOldPortIsTaken is the race that once failed a fresh
// clone's make test ("bind: address already in use"): between a stop and
// a start, another process takes the port the API server had. The restart
// must not care, and while stopped the proxies must not forward to the
// squatter.
func TestRestartWhenTheOldPortIsTaken(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Name: "taken"})
	old := apiAddr(c)
	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	accepted := make(chan struct{}, 1)
	if squatter, err := net.Listen("tcp", old); err != nil {
		// Another process took it first: the same case, without the
		// means to see whether the proxy forwards to it.
		t.Logf("old port %s already taken: %v", old, err)
	} else {
		defer func() { _ = squatter.Close() }()
		go func() {
			for {
				conn, err := squatter.Accept()
				if err != nil {
					return
				}
				_ = conn.Close()
				select {
				case accepted <- struct{}{}:
				default:
				}
			}
		}()
	}
	if _, err := shortClient(t, c, 2*time.Second).CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err == nil {
		t.Fatalf("stopped cluster answered")
	}
	select {
	case <-accepted:
		t.Fatalf("the stopped cluster's proxy forwarded to the process now holding its old port")
	default:
	}

	if err := c.Start(t.Context()); err != nil {
		t.Fatalf("start with the old port taken: %v", err)
	}
	if apiAddr(c) == old {
		t.Fatalf("API server is back on %s, which another listener holds", old)
	}
	expectOK(t, kubernetes.NewForConfigOrDie(c.Config))
	expectOK(t, kubernetes.NewForConfigOrDie(c.DirectConfig))
}

func TestRequireSkipsWithoutTheBinary(t *testing.T) {
	t.Setenv(EnvBinary, "")
	var sub *testing.T
	t.Run("needs a control plane", func(t *testing.T) {
		sub = t
		Require(t)
		t.Error("Require did not skip with FLEETGRAPH_TESTENV unset")
	})
	if !sub.Skipped() {
		t.Fatalf("test was not skipped")
	}
}

func TestMissingBinaryFromTheEnvironmentIsAnError(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kube-testenv")
	t.Setenv(EnvBinary, missing)
	_, err := New(t.Context(), Options{})
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), EnvBinary) {
		t.Fatalf("want an error naming %s and the missing path, got %v", EnvBinary, err)
	}
}

// TestCrashWhileStartingShowsItsCause starts a "control plane" that
// crashes as kube-testenv did once in CI: a panic, then a goroutine dump
// far longer than the log tail. The start's error must show the panic's
// first lines, the dump's end and the exit status, not only the end.
func TestCrashWhileStartingShowsItsCause(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "crashing-testenv")
	script := "#!/bin/sh\n" +
		"echo 'panic: runtime error: invalid memory address or nil pointer dereference' >&2\n" +
		"echo 'goroutine 283 [running]:' >&2\n" +
		"echo 'k8s.io/klog/v2.Background()' >&2\n" +
		"i=0; while [ $i -lt 200 ]; do echo \"frame $i\" >&2; i=$((i+1)); done\n" +
		"echo 'created by main.run in goroutine 1' >&2\n" +
		"exit 2\n"
	if err := os.WriteFile(bin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := New(t.Context(), Options{Name: "crash", Binary: bin})
	if err == nil {
		t.Fatal("a control plane that exits while starting started")
	}
	for _, want := range []string{
		"control plane exited while starting",
		"panic: runtime error: invalid memory address or nil pointer dereference",
		"k8s.io/klog/v2.Background()",
		"created by main.run in goroutine 1",
		exitedPrefix + "exit status 2",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("start error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "frame 100\n") {
		t.Errorf("start error shows the whole dump:\n%v", err)
	}
}
