package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// demoRun is a `fleetgraph demo` process started by a test, as a person
// starts it with `make demo`: the built binary, its output read line by
// line.
type demoRun struct {
	t       testing.TB
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{}
	url     string
	tokens  map[string]string
	cmds    []string // the "$ " lines, as printed
	mu      sync.Mutex
	lines   []string
	newLine chan struct{}
}

// demoStartTimeout bounds the demo's start: three control planes and their
// seeding take about a minute on two loaded cores.
const demoStartTimeout = 5 * time.Minute

// buildFleetgraph builds the command into dir, as make demo does.
func buildFleetgraph(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "fleetgraph")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startDemo starts the demo with a small fleet and waits until it has
// printed its commands and every cluster has synced.
func startDemo(t testing.TB, dir string, args ...string) *demoRun {
	t.Helper()
	testcluster.Require(t) // the demo starts three control planes
	bin := buildFleetgraph(t, dir)
	d := &demoRun{t: t, done: make(chan struct{}), tokens: map[string]string{}, newLine: make(chan struct{}, 1)}
	d.cmd = exec.Command(bin, append([]string{"demo", "--listen", "127.0.0.1:0"}, args...)...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := os.Create(filepath.Join(dir, "demo.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stderr = stderr
	stdout, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if d.stdin, err = d.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.mu.Lock()
			d.lines = append(d.lines, sc.Text())
			d.mu.Unlock()
			select {
			case d.newLine <- struct{}{}:
			default:
			}
		}
		_ = d.cmd.Wait()
		_ = stderr.Close()
		close(d.done)
	}()
	if _, err := d.waitLine("Ctrl-C stops everything.", demoStartTimeout); err != nil {
		d.kill()
		log, _ := os.ReadFile(filepath.Join(dir, "demo.log"))
		t.Fatalf("%v\noutput:\n%s\nlog tail:\n%s", err, d.output(), tail(string(log), 30))
	}
	d.parse()
	d.waitSynced()
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (d *demoRun) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.lines, "\n")
}

// waitLine waits for a line containing s, printed after the line index
// from (0: any), and returns its index.
func (d *demoRun) waitLine(s string, timeout time.Duration) (int, error) {
	return d.waitLineAfter(0, s, timeout)
}

func (d *demoRun) waitLineAfter(from int, s string, timeout time.Duration) (int, error) {
	deadline := time.After(timeout)
	for {
		d.mu.Lock()
		for i := from; i < len(d.lines); i++ {
			if strings.Contains(d.lines[i], s) {
				d.mu.Unlock()
				return i, nil
			}
		}
		d.mu.Unlock()
		select {
		case <-d.newLine:
		case <-d.done:
			return 0, fmt.Errorf("the demo exited before printing %q", s)
		case <-deadline:
			return 0, fmt.Errorf("no %q within %s", s, timeout)
		}
	}
}

var (
	tokenLine = regexp.MustCompile(`^    (admin|alice|bob) +([0-9a-f]{24}) `)
	openLine  = regexp.MustCompile(`Open (http://127\.0\.0\.1:\d+)/ and paste`)
)

// parse reads the URL, the tokens and the commands from the output.
func (d *demoRun) parse() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.lines {
		if m := openLine.FindStringSubmatch(l); m != nil && d.url == "" {
			d.url = m[1]
		}
		if m := tokenLine.FindStringSubmatch(l); m != nil {
			d.tokens[m[1]] = m[2]
		}
		if c, ok := strings.CutPrefix(strings.TrimSpace(l), "$ "); ok {
			d.cmds = append(d.cmds, c)
		}
	}
	if d.url == "" || len(d.tokens) != 3 || len(d.cmds) == 0 {
		d.t.Fatalf("could not read the URL, 3 tokens and commands from:\n%s", strings.Join(d.lines, "\n"))
	}
}

// query posts a GraphQL query as a demo user and decodes data into out.
func (d *demoRun) query(user, query string, vars map[string]any, out any) error {
	body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	req, _ := http.NewRequest(http.MethodPost, d.url+"/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+d.tokens[user])
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	var r struct {
		Data   json.RawMessage
		Errors []struct{ Message string }
	}
	if err := json.NewDecoder(res.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: %w", res.Status, err)
	}
	if len(r.Errors) > 0 {
		return fmt.Errorf("%s", r.Errors[0].Message)
	}
	return json.Unmarshal(r.Data, out)
}

// clusterStates returns each cluster's connection state as admin sees it.
func (d *demoRun) clusterStates() (map[string]string, error) {
	var out struct {
		Clusters []struct {
			Name       string
			Connection struct{ State string }
			Sync       struct{ Synced bool }
		}
	}
	if err := d.query("admin", `{ clusters { name connection { state } sync { synced } } }`, nil, &out); err != nil {
		return nil, err
	}
	states := map[string]string{}
	for _, c := range out.Clusters {
		s := c.Connection.State
		if !c.Sync.Synced {
			s += ",unsynced"
		}
		states[c.Name] = s
	}
	return states, nil
}

// waitState waits until a cluster is in a state (CONNECTED means synced too).
func (d *demoRun) waitState(cluster, state string, timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	var last map[string]string
	for time.Now().Before(deadline) {
		states, err := d.clusterStates()
		if err == nil && states[cluster] == state {
			return
		}
		last = states
		time.Sleep(250 * time.Millisecond)
	}
	d.t.Fatalf("cluster %s not %s within %s: %v", cluster, state, timeout, last)
}

func (d *demoRun) waitSynced() {
	for _, c := range []string{"east", "west", "north"} {
		d.waitState(c, "CONNECTED", 2*time.Minute)
	}
}

// typeLine sends a control line to the demo's terminal and waits for its answer.
func (d *demoRun) typeLine(line string) {
	d.t.Helper()
	from := len(strings.Split(d.output(), "\n"))
	if _, err := io.WriteString(d.stdin, line+"\n"); err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.waitLineAfter(from-1, line+": done", time.Minute); err != nil {
		d.t.Fatalf("%s: %v\n%s", line, err, d.output())
	}
}

// children returns the pids of the demo's child processes.
func (d *demoRun) children() []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(d.cmd.Process.Pid) {
			out = append(out, pid)
		}
	}
	return out
}

// stop interrupts the demo as Ctrl-C does, and checks that it exits 0
// and leaves no process behind.
func (d *demoRun) stop() {
	d.t.Helper()
	kids := d.children()
	if len(kids) < 4 {
		d.t.Errorf("the demo runs %d child processes, want 3 control planes and an edge: %v", len(kids), kids)
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		d.kill()
		d.t.Fatalf("the demo did not stop within a minute of Ctrl-C")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		d.t.Errorf("the demo exited %d after Ctrl-C:\n%s", code, d.output())
	}
	if !strings.Contains(d.output(), "demo stopped") {
		d.t.Errorf("no 'demo stopped' line:\n%s", d.output())
	}
	for _, pid := range kids {
		if err := syscall.Kill(pid, 0); err == nil {
			d.t.Errorf("process %d of the demo still runs after it stopped", pid)
		}
	}
}

func (d *demoRun) kill() {
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.done
}

// TestDemo starts `fleetgraph demo` as make demo does and checks what a new
// user meets: the URL and tokens first, every printed command working when
// pasted, the users' access, the terminal and dashboard controls, and a
// clean stop. With FLEETGRAPH_BROWSER=1 it also runs the browser test of the
// dashboard against it (browser_test.go).
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three control planes")
	}
	dir := t.TempDir()
	d := startDemo(t, dir, "--namespaces", "4", "--churn", "1s")
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.kill()
		}
	})

	t.Run("first screen", func(t *testing.T) {
		out := d.output()
		open := strings.Index(out, "Open "+d.url+"/")
		starting := strings.Index(out, "Starting 3 Kubernetes clusters")
		if open < 0 || starting < open {
			t.Errorf("the URL is not on the first screen, before the clusters start:\n%s", out)
		}
		for u, tok := range d.tokens {
			if i := strings.Index(out, tok); i < 0 || i > starting {
				t.Errorf("the %s token is not on the first screen", u)
			}
		}
	})

	t.Run("printed commands work as pasted", func(t *testing.T) {
		for _, c := range d.cmds {
			cmd := exec.Command("bash", "-c", c)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s\n  failed: %v\n%s", c, err, out)
				continue
			}
			switch {
			case strings.HasPrefix(c, "curl"):
				var r struct {
					Data struct {
						Viewer  struct{ Username string }
						Objects struct{ TotalCount int }
					}
					Errors []any
				}
				if err := json.Unmarshal(out, &r); err != nil || len(r.Errors) > 0 || r.Data.Viewer.Username != "alice" || r.Data.Objects.TotalCount == 0 {
					t.Errorf("%s\n  answered %s", c, out)
				}
			case strings.HasPrefix(c, "kubectl"):
				if !strings.Contains(string(out), "pod-0") {
					t.Errorf("%s\n  answered %s", c, out)
				}
			default:
				t.Errorf("a printed command this test does not know how to check: %s", c)
			}
		}
	})

	t.Run("users see what the demo says", func(t *testing.T) {
		count := func(user string, filter map[string]any) int {
			var out struct{ Objects struct{ TotalCount int } }
			if err := d.query(user, `query($f: ObjectFilter) { objects(filter: $f, first: 0) { totalCount } }`, map[string]any{"f": filter}, &out); err != nil {
				t.Fatal(err)
			}
			return out.Objects.TotalCount
		}
		inNS := count("admin", map[string]any{"clusters": []string{"east", "west"}, "namespaces": teamA(4)})
		nsObjects := count("admin", map[string]any{"clusters": []string{"east", "west"}, "kinds": []string{"Namespace"}, "nameContains": "team-a-"})
		if n := count("alice", nil); n == 0 || n != inNS+nsObjects {
			t.Errorf("alice sees %d objects; admin sees %d in the team-a namespaces of east and west, and %d team-a Namespaces", n, inNS, nsObjects)
		}
		if n := count("alice", map[string]any{"clusters": []string{"north"}}); n != 0 {
			t.Errorf("alice sees %d objects in north", n)
		}
		kust := count("admin", map[string]any{"clusters": []string{"west"}, "kinds": []string{"Kustomization.kustomize.toolkit.fluxcd.io"}})
		if n := count("bob", nil); n != kust+1 {
			t.Errorf("bob sees %d objects, want west's %d Kustomizations and one pod", n, kust)
		}
		if n := count("bob", map[string]any{"clusters": []string{"east"}, "namespaces": []string{"team-b-0"}, "nameContains": "pod-0"}); n != 1 {
			t.Errorf("bob sees %d pods named pod-0 in east/team-b-0", n)
		}
	})

	t.Run("demo controls", func(t *testing.T) {
		call := func(user, method, body string) int {
			req, _ := http.NewRequest(method, d.url+demoAPIPath, strings.NewReader(body))
			if user != "" {
				req.Header.Set("Authorization", "Bearer "+d.tokens[user])
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = res.Body.Close()
			return res.StatusCode
		}
		if code := call("", http.MethodGet, ""); code != http.StatusUnauthorized {
			t.Errorf("demo API without a token: %d", code)
		}
		if code := call("alice", http.MethodPost, `{"cluster":"east","action":"stop"}`); code != http.StatusForbidden {
			t.Errorf("demo API as alice: %d", code)
		}
		if code := call("admin", http.MethodPost, `{"cluster":"east","action":"explode"}`); code != http.StatusBadRequest {
			t.Errorf("unknown action: %d", code)
		}
		if code := call("admin", http.MethodPost, `garbage`); code != http.StatusBadRequest {
			t.Errorf("garbage: %d", code)
		}
		// From the terminal: west goes away and comes back; so does the
		// pushed cluster, whose edge loses its API server.
		d.typeLine("stop west")
		d.waitState("west", "DISCONNECTED", time.Minute)
		d.typeLine("start west")
		d.waitState("west", "CONNECTED", 2*time.Minute)
		// From the dashboard's API, as admin.
		if code := call("admin", http.MethodPost, `{"cluster":"west","action":"cut"}`); code != http.StatusOK {
			t.Fatalf("cut west as admin: %d", code)
		}
		d.waitState("west", "DISCONNECTED", time.Minute)
		if code := call("admin", http.MethodPost, `{"cluster":"west","action":"heal"}`); code != http.StatusOK {
			t.Fatalf("heal west as admin: %d", code)
		}
		d.waitState("west", "CONNECTED", 2*time.Minute)
	})

	t.Run("browser", func(t *testing.T) { runBrowserTest(t, d) })

	d.stop()
}

func teamA(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "team-a-" + strconv.Itoa(i)
	}
	return out
}
