package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
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

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// process is a running fleetgraph binary; exited yields its exit error
// once it ends.
type process struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan error
}

// startBinary runs the built fleetgraph with args in its own process group;
// the kernel kills it if the test process dies, and the test's cleanup
// kills its group if it is still running.
func startBinary(t *testing.T, args ...string) *process {
	t.Helper()
	return runBinary(t, buildFleetgraph(t, t.TempDir()), nil, args...)
}

// runBinary runs bin with args, and env added to the test's environment,
// as startBinary does.
func runBinary(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{out: &syncBuffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.exited <- p.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			if t.Failed() {
				// A Go program writes every goroutine's stack on SIGQUIT:
				// where a process that did not do its part waits.
				_ = p.cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-done:
				case <-time.After(5 * time.Second):
				}
			}
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s %s output:\n%s", filepath.Base(bin), strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// checkTimeouts plays slow clients against the binary started with
// --http-read-header-timeout 500ms, --http-read-timeout 1s,
// --http-idle-timeout 1s and --websocket-init-timeout 500ms: each is cut
// off in time, and the server keeps serving.
func checkTimeouts(t *testing.T, addr string) {
	// closedWithin writes what to a fresh connection, trickles more one
	// byte every 100 ms if trickle is set, and returns how long the server
	// took to close it (reading and dropping anything it answers).
	closedWithin := func(what string, trickle bool) time.Duration {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		start := time.Now()
		if _, err := conn.Write([]byte(what)); err != nil {
			t.Fatal(err)
		}
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(io.Discard, conn)
		}()
		for {
			select {
			case <-closed:
				return time.Since(start)
			case <-time.After(100 * time.Millisecond):
				if trickle {
					_, _ = conn.Write([]byte("x"))
				}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		send    string
		trickle bool
		max     time.Duration
	}{
		{"headers never finish", "POST /graphql HTTP/1.1\r\nHost: x\r\nX-Slow: ", true, 3 * time.Second},
		{"body trickles", "POST /graphql HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", true, 4 * time.Second},
		{"idle keep-alive", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", false, 4 * time.Second},
	} {
		if took := closedWithin(tc.send, tc.trickle); took > tc.max {
			t.Errorf("%s: the server held the connection %v; want it closed within %v", tc.name, took, tc.max)
		} else {
			t.Logf("%s: closed after %v", tc.name, took.Round(time.Millisecond))
		}
	}
	// A websocket that never sends connection_init is closed with 4408.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws://"+addr+"/graphql", &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Body != nil {
		_ = resp.Body.Close()
	}
	defer func() { _ = ws.CloseNow() }()
	start := time.Now()
	_, _, err = ws.Read(ctx)
	if code := websocket.CloseStatus(err); code != 4408 || time.Since(start) > 3*time.Second {
		t.Errorf("a websocket without connection_init: %v after %v; want close 4408", err, time.Since(start))
	}
}

// TestShutdownUnderFlood runs the real binary, floods it with live reads of
// a frozen cluster (each would hang for its full timeout) and label-selector
// scans from many clients, half of which give up, and sends SIGTERM: the
// process must cancel the work in flight and exit 0 within
// --shutdown-timeout.
func TestShutdownUnderFlood(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Name: "stuck"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Namespaces: 2, Pods: 2}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte("admin-token,root,root,\"ops\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	const shutdownTimeout = 3 * time.Second
	p := startBinary(t, "serve", "--kubeconfig", c.Kubeconfig, "--tokens-file", tokens, "--admin-group", "ops",
		"--listen", addr, "--shutdown-timeout", shutdownTimeout.String(),
		"--http-read-header-timeout", "500ms", "--http-read-timeout", "1s", "--http-idle-timeout", "1s", "--websocket-init-timeout", "500ms")

	post := func(ctx context.Context, q string) (int, string, error) {
		body, _ := json.Marshal(map[string]string{"query": q})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/graphql", bytes.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer admin-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		var b bytes.Buffer
		_, err = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String(), err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body, err := post(t.Context(), `{ objects(filter: {kinds: ["Pod"]}) { totalCount } }`)
		if err == nil && code == http.StatusOK && strings.Contains(body, `"totalCount":4`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never served the 4 pods: %d %s %v", code, body, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	t.Run("timeouts", func(t *testing.T) { checkTimeouts(t, addr) })

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Thaw() })
	const clients = 40
	flood, stopFlood := context.WithCancel(context.Background())
	defer stopFlood()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := `{ object(cluster: "stuck", kind: "Pod", namespace: "ns-0", name: "pod-0") { name } }`
			if i%2 == 1 {
				q = `{ a: objects(filter: {labelSelector: "app"}) { totalCount } b: facets(filter: {nameContains: "pod"}) { total } }`
			}
			for flood.Err() == nil {
				ctx := flood
				if i%4 < 2 { // half the clients give up after a moment
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(flood, 200*time.Millisecond)
					_, _, _ = post(ctx, q)
					cancel()
					continue
				}
				_, _, _ = post(ctx, q)
			}
		}()
	}
	time.Sleep(2 * time.Second) // let the live reads pile up against the frozen cluster

	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		took := time.Since(start)
		t.Logf("exited %v after SIGTERM (shutdown timeout %v): %v", took.Round(time.Millisecond), shutdownTimeout, err)
		if err != nil {
			t.Errorf("exit status %v, want 0", err)
		}
		if took > shutdownTimeout {
			t.Errorf("the process took %v to exit after SIGTERM; --shutdown-timeout is %v", took, shutdownTimeout)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the process ignored SIGTERM for 30 s")
	}
	stopFlood()
	wg.Wait()
}
