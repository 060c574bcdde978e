package graph

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// The conformance tests run Node programs from graph/conformance against a
// live server: the graphql-http server audits and a graphql-ws client.
// They need node and `npm ci` in graph/conformance (make test and make
// test-conformance do it) and run only when FLEETGRAPH_CONFORMANCE is set
// (make test sets it; make test-unit does not). When it is set, a missing
// node or package fails them.

// conformanceNode returns the node binary and the conformance directory.
func conformanceNode(t *testing.T) (node, dir string) {
	t.Helper()
	if os.Getenv("FLEETGRAPH_CONFORMANCE") == "" {
		t.Skip("needs Node: FLEETGRAPH_CONFORMANCE is unset (make test and make test-conformance set it; make test-unit skips these tests)")
	}
	dir, err := filepath.Abs("conformance")
	must(t, err)
	node, err = exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "graphql-http", "package.json"))
	}
	if err != nil {
		t.Fatal("conformance tests need node and its packages: run `make test-conformance` or `npm ci --prefix graph/conformance`: " + err.Error())
	}
	return node, dir
}

type auditLine struct {
	ID, Name, Status, Reason string
	HTTPStatus               int `json:"httpStatus"`
	Summary                  map[string]struct{ OK, Fail int }
}

func TestGraphQLOverHTTPAudits(t *testing.T) {
	node, dir := conformanceNode(t)
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "audit.mjs", f.srv.URL+"/graphql", f.tokens["alice"])
	cmd.Dir = dir
	out, err := cmd.Output()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running the audits: %v", err)
	}
	if exitErr != nil && exitErr.ExitCode() != 1 {
		t.Fatalf("audits exited %d: %s", exitErr.ExitCode(), exitErr.Stderr)
	}
	var summary map[string]struct{ OK, Fail int }
	for _, raw := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var l auditLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("audit output %q: %v", raw, err)
		}
		if l.Summary != nil {
			summary = l.Summary
			continue
		}
		switch {
		case l.Status == "ok":
		case strings.HasPrefix(l.Name, "MUST"):
			t.Errorf("%s (%s): %s [HTTP %d]", l.Name, l.ID, l.Reason, l.HTTPStatus)
		default:
			t.Logf("%s %s (%s): %s [HTTP %d]", strings.ToUpper(l.Status), l.Name, l.ID, l.Reason, l.HTTPStatus)
		}
	}
	if summary == nil {
		t.Fatalf("no summary in the audit output:\n%s", out)
	}
	t.Logf("graphql-http audits: MUST %d ok %d failed; SHOULD %d ok %d failed; MAY %d ok %d failed",
		summary["MUST"].OK, summary["MUST"].Fail, summary["SHOULD"].OK, summary["SHOULD"].Fail, summary["MAY"].OK, summary["MAY"].Fail)
	if summary["MUST"].OK == 0 {
		t.Error("no MUST audit ran")
	}
}

func TestGraphQLWSClient(t *testing.T) {
	node, dir := conformanceNode(t)
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const events = 3
	cmd := exec.CommandContext(ctx, node, "subscribe.mjs", f.wsURL(), f.tokens["alice"], "3")
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != `{"ready":true}` {
		_ = cmd.Wait()
		t.Fatalf("client did not connect: %q, stderr %s", lines.Text(), stderr.String())
	}
	f.waitSubscribers(1)
	upsert(t, f.store,
		testObject(podKind, "east", "team-b", "hidden", index.StatusHealthy),
		testObject(podKind, "east", "team-a", "ws-1", index.StatusHealthy),
		testObject(podKind, "east", "team-a", "ws-2", index.StatusUnhealthy))
	gone := testObject(podKind, "east", "team-a", "ws-1", index.StatusHealthy)
	must(t, f.store.Delete(context.Background(), gone.Key()))
	var got []string
	for lines.Scan() {
		var e changeEvent
		must(t, json.Unmarshal(lines.Bytes(), &e))
		got = append(got, e.ObjectChanges.Type+" "+e.ObjectChanges.Object.Name)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("graphql-ws client: %v, stderr %s", err, stderr.String())
	}
	want := []string{"ADDED ws-1", "ADDED ws-2", "DELETED ws-1"}
	if len(got) != events || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("graphql-ws client got %v, want %v", got, want)
	}
}
