package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
)

// TestRunServes runs a control plane inside the test process, which make
// test builds with the race detector. That is the test of run's order:
// etcd's gRPC server and the controllers' clients log through klog from
// their first moment, so klog's logger must be set before they start.
// Set while they ran, a reader could see a contextual logger enabled and
// still nil, and a control plane crashed with a nil dereference within
// half a second of starting. The race detector sees a wrong order only
// when a reader reaches klog before the logger is set, which depends on
// scheduling: with etcd or the controllers started first, it failed 4 and
// 3 of 5 runs. The test then checks that the API server serves the
// controllers' token, that ClusterRole aggregation ran, and that run
// returns once its context ends. It does not check for leaked goroutines:
// an API server stopped in process leaves some behind, and kube-testenv
// is a process of its own that exits.
func TestRunServes(t *testing.T) {
	if os.Getenv("FLEETGRAPH_TESTENV") == "" {
		t.Skip("runs a control plane: FLEETGRAPH_TESTENV is unset (make test sets it; make test-unit skips these tests)")
	}
	if !firstRun.CompareAndSwap(false, true) {
		t.Skip("run applies process-wide settings that only one control plane per process may set (go test -count=1 runs it)")
	}
	dir := t.TempDir()
	const token = "kube-testenv-test-admin"
	tokens := filepath.Join(dir, "tokens.csv")
	writeFile(t, tokens, []byte(token+`,admin,admin,"system:masters"`+"\n"))
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "certs", "apiserver.crt"), certPEM)
	writeFile(t, filepath.Join(dir, "certs", "apiserver.key"), keyPEM)

	// The limits below are failure detectors for a race-built control
	// plane on two loaded cores, not speed bounds: it serves in about 9 s
	// on a quiet machine. The API server's own shutdown takes up to 60 s.
	const startLimit, stopLimit = 3 * time.Minute, 2 * time.Minute
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"--data-dir=" + dir, "--token-auth-file=" + tokens, "--controller-token=" + token}, w)
		_ = w.Close()
		done <- err
	}()
	// Registered after t.TempDir, so it runs first: etcd's files are
	// closed before the directory is removed, whatever failed.
	stopped := false
	t.Cleanup(func() {
		cancel()
		if stopped {
			return
		}
		select {
		case <-done:
		case <-time.After(stopLimit):
			t.Errorf("run still serving %s after its context ended", stopLimit)
		}
	})

	serving := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		serving <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var addr string
	select {
	case line := <-serving:
		if line == "" {
			stopped = true
			t.Fatalf("run wrote nothing on stdout and returned: %v", <-done)
		}
		var ok bool
		if addr, ok = strings.CutPrefix(strings.TrimSpace(line), servingPrefix); !ok {
			t.Fatalf("first line on stdout %q; want %q and an address", line, servingPrefix)
		}
	case <-time.After(startLimit):
		t.Fatalf("no serving line within %s", startLimit)
	}
	t.Logf("serving line after %s", time.Since(start).Round(time.Millisecond))

	client, err := kubernetes.NewForConfig(&rest.Config{
		Host:            "https://" + addr,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: certPEM},
	})
	if err != nil {
		t.Fatal(err)
	}
	// "view" is an aggregated ClusterRole: it has rules only once the
	// in-process aggregation controller has filled them in.
	for {
		view, err := client.RbacV1().ClusterRoles().Get(ctx, "view", metav1.GetOptions{})
		if err == nil && len(view.Rules) > 0 {
			break
		}
		if time.Since(start) > startLimit {
			t.Fatalf("ClusterRole view has no aggregated rules %s after the start (last error: %v)", startLimit, err)
		}
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("run returned while serving: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Logf("view aggregated after %s", time.Since(start).Round(time.Millisecond))

	cancel()
	stop := time.Now()
	select {
	case err := <-done:
		stopped = true
		if err != nil {
			t.Errorf("run returned %v after its context ended; want nil", err)
		}
		t.Logf("run returned %s after its context ended", time.Since(stop).Round(time.Millisecond))
	case <-time.After(stopLimit):
		t.Fatalf("run still serving %s after its context ended", stopLimit)
	}
}

// firstRun is set by the first TestRunServes of this process.
var firstRun atomic.Bool

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
