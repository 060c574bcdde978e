package fleetgraph_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyBoundaries checks the import rules of DESIGN.md that the
// compiler does not: the root module never depends on k8s.io/kubernetes
// (only the nested testenv module may), and the index, the package every
// other one reads, imports no Kubernetes client code and no other
// fleetgraph package.
func TestDependencyBoundaries(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	for _, m := range goList(t, "-m", "all") {
		if strings.HasPrefix(m, "k8s.io/kubernetes ") {
			t.Errorf("the root module depends on %s; only testenv may", m)
		}
	}
	forbidden := []string{"k8s.io/client-go/", "k8s.io/api/", "istio.io/", "github.com/fleetgraph/fleetgraph/"}
	for _, pkg := range goList(t, "-deps", "./index/...") {
		if strings.HasPrefix(pkg, "github.com/fleetgraph/fleetgraph/index") {
			continue
		}
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("index depends on %s", pkg)
			}
		}
	}
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		msg := err.Error()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			msg += ": " + string(ee.Stderr)
		}
		t.Fatalf("go list %s: %s", strings.Join(args, " "), msg)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
