package fleetgraph_test

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fleetgraph/fleetgraph"

// TestDependencyBoundaries checks the import rules that the compiler does
// not (docs/design.md, and each package's doc.go):
//
//   - the root module never depends on k8s.io/kubernetes (only the nested
//     testenv module may);
//   - index and authz, which every other package reads, import no
//     Kubernetes or Istio client code; index imports no other fleetgraph
//     package, authz only index and internal helpers;
//   - graph is resolvers and transports: it reaches neither connection nor
//     collector (the fleet status and the subscriptions it serves come from
//     index);
//   - only index/memtables imports go-memdb: index keeps its small tables
//     behind the index/tables contract, and every other package reads
//     them through index's own API (Watch, WatchPolicies, streams). So
//     `go list -deps ./graph` (and index's and authz's) holds neither
//     go-memdb nor connection;
//   - no reflection in graph, authz or index outside tests: shared access
//     sets are explicit (index.Resources), not detected;
//   - the connection lifecycle does not know the cluster sources: they sit
//     on top of it (connection/sources drives connection.Manager);
//   - replication moves index writes between processes: it may use the
//     collecting packages but not the API (graph, authz), and no package
//     below the root one depends on it.
func TestDependencyBoundaries(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	t.Run("no k8s.io/kubernetes", func(t *testing.T) {
		for _, m := range goList(t, "-m", "all") {
			if strings.HasPrefix(m, "k8s.io/kubernetes ") {
				t.Errorf("the root module depends on %s; only testenv may", m)
			}
		}
	})
	t.Run("index and authz import no client code", func(t *testing.T) {
		clients := []string{"k8s.io/client-go/", "k8s.io/api/", "istio.io/", "sigs.k8s.io/controller-runtime", "github.com/fluxcd/"}
		for _, tc := range []struct {
			pkgs    string
			allowed []string // fleetgraph packages it may depend on
		}{
			{"./index/...", []string{module + "/index"}},
			{"./authz/...", []string{module + "/index", module + "/authz", module + "/internal"}},
		} {
			for _, pkg := range goList(t, "-deps", tc.pkgs) {
				for _, f := range clients {
					if strings.HasPrefix(pkg, f) {
						t.Errorf("%s depends on %s", tc.pkgs, pkg)
					}
				}
				if strings.HasPrefix(pkg, module+"/") && !slices.ContainsFunc(tc.allowed, func(a string) bool { return within(pkg, a) }) {
					t.Errorf("%s depends on %s", tc.pkgs, pkg)
				}
			}
		}
	})
	t.Run("graph reaches neither connection nor collector", func(t *testing.T) {
		for _, pkg := range goList(t, "-deps", "./graph/...") {
			if within(pkg, module+"/connection") || within(pkg, module+"/collector") {
				t.Errorf("graph depends on %s", pkg)
			}
		}
	})
	t.Run("only index/memtables imports go-memdb", func(t *testing.T) {
		const memdb = "github.com/hashicorp/go-memdb"
		for _, line := range goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}} {{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./...") {
			pkg, imports, _ := strings.Cut(line, " ")
			if slices.Contains(strings.Fields(imports), memdb) && pkg != module+"/index/memtables" {
				t.Errorf("%s imports %s; only index/memtables may", pkg, memdb)
			}
		}
		for _, pkg := range []string{"./graph", "./index", "./authz"} {
			for _, dep := range goList(t, "-deps", pkg) {
				if within(dep, memdb) || within(dep, module+"/connection") {
					t.Errorf("go list -deps %s has %s", pkg, dep)
				}
			}
		}
	})
	t.Run("connection does not reach its sources", func(t *testing.T) {
		for _, pkg := range goList(t, "-deps", "./connection", "./connection/edge", "./collector/...") {
			if within(pkg, module+"/connection/sources") {
				t.Errorf("the connection lifecycle or the collector reaches %s", pkg)
			}
		}
	})
	t.Run("replication sits beside the API", func(t *testing.T) {
		for _, pkg := range goList(t, "-deps", "./replication/...") {
			if within(pkg, module+"/graph") || within(pkg, module+"/authz") {
				t.Errorf("replication depends on %s", pkg)
			}
		}
		for _, pkg := range goList(t, "-deps", "./index/...", "./authz/...", "./collector/...", "./connection/...", "./graph/...") {
			if within(pkg, module+"/replication") {
				t.Errorf("a package below the root one depends on %s", pkg)
			}
		}
	})
	t.Run("no reflection in graph, authz and index", func(t *testing.T) {
		for _, line := range goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./graph/...", "./authz/...", "./index/...") {
			pkg, imports, _ := strings.Cut(line, " ")
			if slices.Contains(strings.Fields(imports), "reflect") {
				t.Errorf("%s imports reflect", pkg)
			}
		}
	})
}

// within reports whether pkg is root or one of its subpackages.
func within(pkg, root string) bool {
	return pkg == root || strings.HasPrefix(pkg, root+"/")
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
