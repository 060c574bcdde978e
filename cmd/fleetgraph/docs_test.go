package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// The documents whose commands TestDocsCommands runs: the README and every
// page of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"../../README.md"}, files...)
}

// notRunHere are the documented commands this test does not run, by
// prefix, and why. Any other command of a sh block must be run by the
// test, so that a command added to the docs is either tested or listed
// here with its reason.
var notRunHere = map[string]string{
	"make demo":   "TestDemo runs the demo and every command it prints",
	"make test":   ".ci/run runs it",
	"make image":  "needs a docker or podman engine; the chart and Dockerfile lints cover the files",
	"kind ":       "needs kind and docker; TestChartManifestsAccepted has a real API server accept the chart's manifests",
	"helm ":       "installs into kind clusters (see kind); TestChart* render and lint the chart",
	"kubectl ":    "acts on the kind clusters of the Helm walk-through (see kind)",
	"go install ": "fetches the module from the network; the binary it builds is the one tested here",
}

// TestDocsCommands runs, against a real cluster, what the README and
// docs/ tell a new user to type: the token-file printf, the serve command
// line (with --listen 127.0.0.1:0 added, so that tests never fight over
// :8080), every curl command (the host and token placeholders filled in),
// `fleetgraph rbac`, the edge pair of commands, and every GraphQL document
// of the docs, as the admin. Each must work: the server serves, every
// answer has data and no errors.
func TestDocsCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver")
	}
	c := testcluster.Start(t, testcluster.Options{Name: "east"})
	if _, err := c.Seed(t.Context(), testcluster.SeedOptions{Prefix: "team-a", Namespaces: 1, Pods: 2, Services: 1}); err != nil {
		t.Fatal(err)
	}
	home, work := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteKubeconfig(filepath.Join(home, ".kube", "config"), testcluster.AdminUser); err != nil {
		t.Fatal(err)
	}
	bin := buildFleetgraph(t, t.TempDir())
	env := append(os.Environ(), "HOME="+home, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "KUBECONFIG=")

	cmds := documentedCommands(t)
	ran := map[string]bool{}
	shell := func(cmd string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		sh := exec.Command("bash", "-c", cmd)
		sh.Dir, sh.Env, sh.Stdout, sh.Stderr = work, env, &stdout, &stderr
		if err := sh.Run(); err != nil {
			t.Fatalf("%s: %v\n%s%s", cmd, err, stdout.String(), stderr.String())
		}
		return stdout.String()
	}

	// The token file of the Helm walk-through is the one used here.
	const adminToken = "change-me-admin-token"
	for _, cmd := range cmds {
		if strings.HasPrefix(cmd, "printf 'change-me-admin-token") {
			shell(cmd)
			ran[cmd] = true
		}
	}
	if _, err := os.Stat(filepath.Join(work, "tokens.csv")); err != nil {
		t.Fatalf("no documented command wrote tokens.csv: %v", err)
	}

	var url string
	for _, cmd := range cmds {
		if strings.HasPrefix(cmd, "fleetgraph serve --kubeconfig ~/.kube/config") && !ran[cmd] {
			url, _ = serveDocumented(t, cmd, work, env)
			ran[cmd] = true
		}
	}
	if url == "" {
		t.Fatal("no documented 'fleetgraph serve --kubeconfig' command")
	}
	waitReady(t, url)

	host := regexp.MustCompile(`https?://(127\.0\.0\.1|localhost):8080`)
	for _, cmd := range cmds {
		if !strings.HasPrefix(cmd, "curl ") {
			continue
		}
		ran[cmd] = true
		line := host.ReplaceAllString(cmd, url)
		line = strings.ReplaceAll(line, "<token>", adminToken)
		out := shell("TOKEN=" + adminToken + "; " + line)
		checkAnswer(t, cmd, []byte(out))
	}

	for _, cmd := range cmds {
		if strings.HasPrefix(cmd, "fleetgraph rbac ") {
			ran[cmd] = true
			if out := shell(cmd); !regexp.MustCompile("^(# |{{- /\\*\n)(Code )?[Gg]enerated by `?fleetgraph rbac").MatchString(out) {
				t.Errorf("%s printed:\n%.500s", cmd, out)
			}
		}
	}

	t.Run("graphql documents", func(t *testing.T) {
		docs := documentedQueries(t)
		t.Logf("running %d GraphQL documents of the docs", len(docs))
		for _, doc := range docs {
			code, body := postAs(t, url, adminToken, doc)
			if code != http.StatusOK {
				t.Errorf("HTTP %d for\n%s\n%s", code, doc, body)
				continue
			}
			checkAnswer(t, doc, body)
		}
	})

	t.Run("edge", func(t *testing.T) { runEdge(t, cmds, ran, work, env, shell) })

	for _, cmd := range cmds {
		if ran[cmd] {
			t.Logf("ran: %s", cmd)
			continue
		}
		skipped := false
		for prefix := range notRunHere {
			skipped = skipped || strings.HasPrefix(cmd, prefix)
		}
		if !skipped {
			t.Errorf("documented command not run by this test and not in notRunHere: %s", cmd)
		}
	}
}

// runEdge runs the push-mode pair of commands: the manager with an edge
// tokens file, and an edge that pushes the test's cluster to it, with the
// example host and token path replaced by the test's; the cluster must
// become CONNECTED with the documented metadata.
func runEdge(t *testing.T, cmds []string, ran map[string]bool, work string, env []string, shell func(string) string) {
	var serve, edge string
	for _, cmd := range cmds {
		switch {
		case strings.HasPrefix(cmd, "fleetgraph serve --tokens-file tokens.csv --edge-tokens-file edge-tokens.csv"):
			serve = cmd
		case strings.HasPrefix(cmd, "fleetgraph edge --manager https://fleetgraph.example.com/edge"):
			edge = cmd
		}
	}
	if serve == "" || edge == "" {
		t.Fatalf("the docs lost the edge commands (serve %q, edge %q)", serve, edge)
	}
	ran[serve], ran[edge] = true, true // the edge with the test's host and token file
	cluster := regexp.MustCompile(`--cluster (\S+)`).FindStringSubmatch(edge)[1]
	tokenFile := regexp.MustCompile(`--token-file (\S+)`).FindStringSubmatch(edge)[1]
	if err := os.WriteFile(filepath.Join(work, "edge-tokens.csv"), []byte("edge-secret,"+cluster+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "edge.token"), []byte("edge-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url, managerLog := serveDocumented(t, serve, work, env)
	waitReady(t, url)
	line := strings.ReplaceAll(edge, "https://fleetgraph.example.com", url)
	line = strings.ReplaceAll(line, tokenFile, filepath.Join(work, "edge.token"))
	startDocumented(t, line, work, env)

	// The manager as documented names no admin group, and the tokens
	// file's admin has no RBAC in the pushed cluster: its own log says
	// whether the edge's cluster synced.
	connected := fmt.Sprintf(`msg="cluster state" cluster=%s mode=PUSH from=CONNECTING to=CONNECTED`, cluster)
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(managerLog.String(), connected) {
		if time.Now().After(deadline) {
			t.Fatalf("the documented edge did not connect: no %q in the manager's log", connected)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serveDocumented starts a documented serve command with --listen
// 127.0.0.1:0 added and returns its URL, from its "serving" log line, and
// its output.
func serveDocumented(t *testing.T, cmd, dir string, env []string) (string, *syncBuffer) {
	t.Helper()
	out := startDocumented(t, cmd+" --listen 127.0.0.1:0", dir, env)
	re := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1], out
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: no serving line:\n%s", cmd, out.String())
	return "", nil
}

// startDocumented runs a documented command (through bash, as pasted)
// until the test ends, in its own process group that dies with the test.
func startDocumented(t *testing.T, cmd, dir string, env []string) *syncBuffer {
	t.Helper()
	out := &syncBuffer{}
	p := exec.Command("bash", "-c", "exec "+cmd)
	p.Dir, p.Env, p.Stdout, p.Stderr = dir, env, out, out
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("%s:\n%s", cmd, out.String())
		}
	})
	return out
}

// waitReady waits for /readyz to answer 200.
func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/readyz not ready: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// postAs posts one GraphQL document with a bearer token.
func postAs(t *testing.T, url, token, query string) (int, []byte) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"query": query})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/graphql", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var b bytes.Buffer
	if _, err := b.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b.Bytes()
}

// checkAnswer fails the test unless out is a GraphQL answer with data and
// no errors.
func checkAnswer(t *testing.T, what string, out []byte) {
	t.Helper()
	var r struct {
		Data   map[string]json.RawMessage `json:"data"`
		Errors []json.RawMessage          `json:"errors"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Data) == 0 || len(r.Errors) > 0 {
		t.Errorf("%s\nanswered %s (%v), want data and no errors", what, out, err)
	}
}

// documentedCommands returns the commands of the docs' sh code blocks
// (continuation lines joined, comments dropped) and their inline
// `fleetgraph rbac ...` and `curl ...` commands.
func documentedCommands(t *testing.T) []string {
	t.Helper()
	block := regexp.MustCompile("(?ms)^( *)```sh\n(.*?)^ *```")
	inline := regexp.MustCompile("`((?:curl [^`]*http|fleetgraph rbac )[^`]+)`")
	var out []string
	seen := map[string]bool{}
	add := func(cmd string) {
		if cmd != "" && !strings.HasPrefix(cmd, "#") && !seen[cmd] {
			seen[cmd] = true
			out = append(out, cmd)
		}
	}
	for _, f := range docFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		for _, m := range block.FindAllStringSubmatch(text, -1) {
			cmd := ""
			for _, l := range strings.Split(m[2], "\n") {
				cmd = strings.TrimSpace(cmd + " " + strings.TrimSpace(l))
				if c, ok := strings.CutSuffix(cmd, `\`); ok {
					cmd = strings.TrimSpace(c)
					continue
				}
				if i := strings.Index(cmd, "   # "); i > 0 { // a trailing comment
					cmd = strings.TrimSpace(cmd[:i])
				}
				add(cmd)
				cmd = ""
			}
		}
		// Inline commands may be wrapped over lines of the paragraph.
		for _, m := range inline.FindAllStringSubmatch(text, -1) {
			add(strings.Join(strings.Fields(m[1]), " "))
		}
	}
	return out
}

// documentedQueries returns the queries of the docs' graphql code blocks.
func documentedQueries(t *testing.T) []string {
	t.Helper()
	block := regexp.MustCompile("(?ms)^ *```graphql\n(.*?)^ *```")
	var out []string
	for _, f := range docFiles(t) {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(raw), -1) {
			// Schema excerpts (type ..., input ...) are not documents.
			if doc := strings.TrimSpace(m[1]); strings.HasPrefix(doc, "{") || strings.HasPrefix(doc, "query") {
				out = append(out, m[1])
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no graphql blocks in the docs")
	}
	return out
}
