package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// browserTimeout bounds the whole browser test, outage and recovery
// included.
const browserTimeout = 10 * time.Minute

// runBrowserTest runs the dashboard's browser test (ui/e2e/dashboard.mjs)
// against a running demo, and does for it what a browser cannot: change a
// cluster behind fleetgraph's back. make test sets FLEETGRAPH_BROWSER=1
// after installing Chromium and the Node packages; without it the test is
// skipped. Screenshots go to test-output/browser at the repository root.
func runBrowserTest(t *testing.T, d *demoRun) {
	if os.Getenv("FLEETGRAPH_BROWSER") == "" {
		t.Skip("set FLEETGRAPH_BROWSER=1 (make test does) to run the dashboard in Chromium")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(root, "test-output", "browser")
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	kube := d.directClient(t)
	tokens, _ := json.Marshal(d.tokens)

	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	cmd := exec.Command("node", filepath.Join(root, "ui", "e2e", "dashboard.mjs"))
	cmd.Dir = filepath.Join(root, "ui")
	cmd.Env = append(os.Environ(), "FLEETGRAPH_URL="+d.url, "FLEETGRAPH_TOKENS="+string(tokens), "OUT_DIR="+out)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node: %v", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer stop()

	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		t.Log(line)
		req, ok := strings.CutPrefix(line, "@@create ")
		if !ok {
			continue
		}
		answer := "@@ok"
		if err := createPods(ctx, kube, req); err != nil {
			t.Errorf("harness: %v", err)
			answer = "@@error"
		}
		if _, err := io.WriteString(stdin, answer+"\n"); err != nil {
			t.Errorf("harness: %v", err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("the browser test failed (%v); screenshots and result.json in %s", err, out)
	}
	if ctx.Err() != nil {
		t.Errorf("the browser test did not finish within %s", browserTimeout)
	}
}

// createPods handles "<cluster> <namespace> <name,...>": pods created
// straight on the cluster's API server, not through the path fleetgraph
// uses, so that they can be made while fleetgraph is cut off.
func createPods(ctx context.Context, kube func(string) (kubernetes.Interface, error), req string) error {
	f := strings.Fields(req)
	if len(f) != 3 {
		return fmt.Errorf("bad create request %q", req)
	}
	client, err := kube(f[0])
	if err != nil {
		return err
	}
	for _, name := range strings.Split(f[2], ",") {
		_, err := client.CoreV1().Pods(f[1]).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "outage"}},
			Spec:       corev1.PodSpec{NodeName: "node-0", Containers: []corev1.Container{{Name: "main", Image: "registry.example/outage:1.0"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s/%s in %s: %w", f[1], name, f[0], err)
		}
	}
	return nil
}

// directClient returns clients per cluster from the admin kubeconfig the
// demo prints, which reaches the API servers without the fault proxy.
func (d *demoRun) directClient(t *testing.T) func(string) (kubernetes.Interface, error) {
	t.Helper()
	var path string
	for _, l := range strings.Split(d.output(), "\n") {
		if p := strings.TrimSpace(l); strings.HasSuffix(p, "/kubeconfig") && !strings.Contains(p, " ") {
			path = p
		}
	}
	if path == "" {
		t.Fatalf("the demo printed no admin kubeconfig:\n%s", d.output())
	}
	return func(cluster string) (kubernetes.Interface, error) {
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{CurrentContext: cluster}).ClientConfig()
		if err != nil {
			return nil, err
		}
		return kubernetes.NewForConfig(cfg)
	}
}
