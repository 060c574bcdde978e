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
// half a second of starting; the race detector reports the same order on
// every run. The test then checks that the API server serves the
// controllers' token, that ClusterRole aggregation ran, and that run
// returns once its context ends. It does not check for leaked goroutines:
// an API server stopped in process leaves some behind, and kube-testenv
// is a process of its own that exits.
func TestRunServes(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd and a kube-apiserver in this process")
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

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"--data-dir=" + dir, "--token-auth-file=" + tokens, "--controller-token=" + token}, w)
		_ = w.Close()
		done <- err
	}()

	serving := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		serving <- line
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var addr string
	select {
	case line := <-serving:
		var ok bool
		if addr, ok = strings.CutPrefix(strings.TrimSpace(line), servingPrefix); !ok {
			t.Fatalf("first line on stdout %q; want %q and an address", line, servingPrefix)
		}
	case err := <-done:
		t.Fatalf("run returned before serving: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no serving line within a minute")
	}

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
	deadline := time.Now().Add(2 * time.Minute)
	for {
		view, err := client.RbacV1().ClusterRoles().Get(ctx, "view", metav1.GetOptions{})
		if err == nil && len(view.Rules) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClusterRole view has no aggregated rules after 2 minutes (last error: %v)", err)
		}
		select {
		case err := <-done:
			t.Fatalf("run returned while serving: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run returned %v after its context ended; want nil", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("run still serving a minute after its context ended")
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
