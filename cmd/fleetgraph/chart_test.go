package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fleetgraph/fleetgraph/internal/rbacgen"
)

// chartDir is the chart, from this package's directory.
const chartDir = "../../charts/fleetgraph"

// helmBinary finds the Helm that `make helm` builds: $FLEETGRAPH_HELM, else
// bin/helm in the repository. With neither, the test is skipped (make
// test-unit builds no Helm); a FLEETGRAPH_HELM that names no file fails it.
func helmBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("FLEETGRAPH_HELM")
	if p == "" {
		p = "../../bin/helm"
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			t.Skip("needs Helm: FLEETGRAPH_HELM is unset and bin/helm is not built (make test builds it; make test-unit skips these tests)")
		}
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("helm not found at %s: run `make helm` (it builds the version tools/helm/go.mod pins): %v", p, err)
	}
	return p
}

// helm runs Helm and returns its output, or its error with stderr.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// renderRaw runs helm template with values and returns its output.
func renderRaw(t *testing.T, release, namespace string, values map[string]any) ([]byte, error) {
	t.Helper()
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	// Not under t.TempDir: helm splits -f at commas, which test names hold.
	f, err := os.CreateTemp("", "fleetgraph-values-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := f.Name()
	t.Cleanup(func() { _ = os.Remove(file) })
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return helm(t, "template", release, chartDir, "--namespace", namespace, "--kube-version", "1.35.4", "-f", file)
}

// render runs helm template with values and returns the objects.
func render(t *testing.T, release, namespace string, values map[string]any) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := renderRaw(t, release, namespace, values)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 64<<10)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decode the rendered chart: %v", err)
		}
		if u.Object != nil {
			objs = append(objs, &u)
		}
	}
	return objs, nil
}

func mustRender(t *testing.T, release, namespace string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := render(t, release, namespace, values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

var rbacKinds = []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// rbacOf reduces RBAC objects to what they grant: "Kind namespace/name" to
// their rules, or their role reference and subjects.
func rbacOf(t *testing.T, objs []map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		if !slices.Contains(rbacKinds, kind) {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%s %v/%v", kind, md["namespace"], md["name"])
		grant := map[string]any{"rules": o["rules"], "roleRef": o["roleRef"], "subjects": o["subjects"]}
		data, err := json.Marshal(grant)
		if err != nil {
			t.Fatal(err)
		}
		out[key] = string(data)
	}
	return out
}

func toMaps(t *testing.T, objs any) []map[string]any {
	t.Helper()
	data, err := json.Marshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestChartRBACIsFleetgraphRBAC renders the chart in each mode with values
// that change what fleetgraph reads, and checks that its roles and bindings
// grant exactly what `fleetgraph rbac` prints for the same settings.
func TestChartRBACIsFleetgraphRBAC(t *testing.T) {
	const ns = "fleetgraph"
	cases := []struct {
		name   string
		values map[string]any
		flags  rbacFlags
	}{
		{"manager defaults", map[string]any{}, rbacFlags{
			targets:    []string{rbacgen.TargetManager},
			scopeFlags: scopeFlags{sourceNames: []string{"secrets"}, secretNamespace: ns, argoNamespace: "argocd"},
		}},
		{"manager with every source, limited, collecting itself", map[string]any{
			"rbac": map[string]any{"collectThisCluster": true},
			"sources": map[string]any{
				"names":     []string{"capi", "argocd", "gitopscluster", "clusterprofile", "secrets", "kubeconfig"},
				"namespace": "team-a", "argocdNamespace": "argo", "secretsNamespace": "cluster-secrets",
				"clusterProfileProviders": map[string]any{"providers": []any{map[string]any{"name": "p", "execConfig": map[string]any{"command": "x"}}}},
				"kubeconfigSecret":        "kc",
			},
		}, rbacFlags{
			targets: []string{rbacgen.TargetLeaf, rbacgen.TargetManager},
			scopeFlags: scopeFlags{
				sourceNames:     []string{"capi", "argocd", "gitopscluster", "clusterprofile", "secrets", "kubeconfig"},
				sourceNamespace: "team-a", argoNamespace: "argo", secretNamespace: "cluster-secrets",
			},
		}},
		{"manager with cluster-wide sources", map[string]any{
			"sources": map[string]any{"names": []string{"gitopscluster", "capi", "clusterprofile"}, "clusterProfileProviders": map[string]any{"providers": []any{}}},
		}, rbacFlags{
			targets:    []string{rbacgen.TargetManager},
			scopeFlags: scopeFlags{sourceNames: []string{"gitopscluster", "capi", "clusterprofile"}, argoNamespace: "argocd"},
		}},
		{"manager HA", map[string]any{"ha": map[string]any{"enabled": true, "nats": map[string]any{"url": "nats://nats:4222"}}}, rbacFlags{
			targets:        []string{rbacgen.TargetManager},
			scopeFlags:     scopeFlags{sourceNames: []string{"secrets"}, secretNamespace: ns, argoNamespace: "argocd"},
			leaseNamespace: ns,
		}},
		{"leaf defaults", map[string]any{"mode": "leaf"}, rbacFlags{
			targets: []string{rbacgen.TargetLeaf},
		}},
		{"leaf with Istio", map[string]any{"mode": "leaf", "collect": map[string]any{"istioNamespace": "istio-system"}}, rbacFlags{
			targets: []string{rbacgen.TargetLeaf}, istioNamespace: rbacgen.IstioSystem,
		}},
		{"leaf with fewer and extra kinds, no details, no Istio", map[string]any{"mode": "leaf", "collect": map[string]any{
			"kinds":         []string{"Pod", "kustomization.kustomize.toolkit.fluxcd.io", "gateway"},
			"extraKinds":    []string{"apps/v1/Deployment", "networking.k8s.io/v1/Ingress", "v1/Endpoints", "example.io/v1/Policy", "gateway.networking.k8s.io/v1/GatewayClass", "example.io/v1/Relay"},
			"objectDetails": false,
		}}, rbacFlags{
			targets: []string{rbacgen.TargetLeaf},
			scopeFlags: scopeFlags{
				kinds:      []string{"Pod", "kustomization.kustomize.toolkit.fluxcd.io", "gateway"},
				extraKinds: []string{"apps/v1/Deployment", "networking.k8s.io/v1/Ingress", "v1/Endpoints", "example.io/v1/Policy", "gateway.networking.k8s.io/v1/GatewayClass", "example.io/v1/Relay"},
				noDetails:  true,
			},
		}},
		{"edge", map[string]any{"mode": "edge", "edge": map[string]any{"managerURL": "https://m/edge", "cluster": "leaf-1", "tokenSecret": "t"}}, rbacFlags{
			targets: []string{rbacgen.TargetLeaf},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chart := rbacOf(t, toMaps(t, mustRender(t, "fleetgraph", ns, tc.values)))
			f := tc.flags
			f.name, f.serviceAccount, f.namespace = "fleetgraph", "fleetgraph", ns
			out, err := f.render()
			if err != nil {
				t.Fatal(err)
			}
			var docs []map[string]any
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 64<<10)
			for {
				var d map[string]any
				if err := dec.Decode(&d); err != nil {
					if errors.Is(err, io.EOF) {
						break
					}
					t.Fatal(err)
				}
				if d != nil {
					docs = append(docs, d)
				}
			}
			want := rbacOf(t, docs)
			if len(want) == 0 {
				t.Fatal("fleetgraph rbac printed nothing")
			}
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if chart[k] != want[k] {
					t.Errorf("%s:\nchart %s\nrbac  %s", k, chart[k], want[k])
				}
			}
			for _, k := range slices.Sorted(maps.Keys(chart)) {
				if _, ok := want[k]; !ok {
					t.Errorf("the chart grants %s, which fleetgraph rbac does not print: %s", k, chart[k])
				}
			}
		})
	}
}

// TestChartRBACTemplateIsGenerated fails when the chart's rules drift from
// `fleetgraph rbac --helm-template` (run `make chart-rbac`).
func TestChartRBACTemplateIsGenerated(t *testing.T) {
	want, err := rbacgen.HelmTemplate()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("../..", rbacgen.HelmTemplatePath))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what `fleetgraph rbac --helm-template` prints: run `make chart-rbac`", rbacgen.HelmTemplatePath)
	}
}

// TestChartValuesSchema checks that values.schema.json rejects wrong types
// and values with a message that names the value.
func TestChartValuesSchema(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"replicas not a number", map[string]any{"replicaCount": "two"}, "at '/replicaCount': got string, want integer"},
		{"unknown mode", map[string]any{"mode": "cloud"}, "at '/mode': value must be one of 'manager', 'leaf', 'edge'"},
		{"unknown source", map[string]any{"sources": map[string]any{"names": []string{"rancher"}}}, "/sources/names/0"},
		{"misspelt value", map[string]any{"replicas": 2}, "additional properties 'replicas' not allowed"},
		{"bad extra kind", map[string]any{"collect": map[string]any{"extraKinds": []string{"Deployment"}}}, "/collect/extraKinds/0"},
		{"bad duration", map[string]any{"collect": map[string]any{"relist": "30 seconds"}}, "/collect/relist"},
		{"edge without a manager", map[string]any{"mode": "edge"}, "edge.managerURL is required in mode edge"},
		{"unknown kind", map[string]any{"mode": "leaf", "collect": map[string]any{"kinds": []string{"Deployment"}}}, `collect.kinds: unknown kind "deployment"`},
		{"HA without NATS", map[string]any{"ha": map[string]any{"enabled": true}}, "ha.nats.url is required with ha.enabled"},
		{"HA NATS not a URL", map[string]any{"ha": map[string]any{"enabled": true, "nats": map[string]any{"url": "nats:4222"}}}, "at '/ha/nats/url': 'nats:4222' does not match pattern"},
		{"HA in a leaf", map[string]any{"mode": "leaf", "ha": map[string]any{"enabled": true, "nats": map[string]any{"url": "nats://n:4222"}}}, "ha.enabled is for mode manager, not leaf"},
		{"HA with no collector", map[string]any{"ha": map[string]any{"enabled": true, "collector": map[string]any{"replicas": 0}}}, "at '/ha/collector/replicas': minimum: got 0, want 1"},
		{"HA bad lease duration", map[string]any{"ha": map[string]any{"collector": map[string]any{"leaseDuration": "15"}}}, "/ha/collector/leaseDuration"},
		{"HA unknown anti-affinity", map[string]any{"ha": map[string]any{"antiAffinity": "strict"}}, "at '/ha/antiAffinity': value must be one of 'soft', 'hard', 'none'"},
		{"HA misspelt value", map[string]any{"ha": map[string]any{"replicas": 3}}, "additional properties 'replicas' not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "fleetgraph", "fleetgraph", tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error holding %q", err, tc.want)
			}
		})
	}
}

// TestChartRunsTheImage checks that the chart's default image is the one
// `make image` builds from the Dockerfile, and that the chart runs it as
// the image's non-root user, read-only and without capabilities.
func TestChartRunsTheImage(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "\nUSER 65532:65532\n") {
		t.Error("the Dockerfile's final stage does not run as 65532")
	}
	for _, o := range mustRender(t, "fleetgraph", "fleetgraph", map[string]any{}) {
		if o.GetKind() != "Deployment" {
			continue
		}
		pod, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		containers, _, _ := unstructured.NestedSlice(pod, "containers")
		c := containers[0].(map[string]any)
		if want := "ghcr.io/fleetgraph/fleetgraph:" + meta.AppVersion; c["image"] != want {
			t.Errorf("image %v, want %s", c["image"], want)
		}
		psc, _ := pod["securityContext"].(map[string]any)
		csc, _ := c["securityContext"].(map[string]any)
		caps, _ := csc["capabilities"].(map[string]any)
		if psc["runAsNonRoot"] != true || fmt.Sprint(psc["runAsUser"]) != "65532" || csc["readOnlyRootFilesystem"] != true ||
			csc["allowPrivilegeEscalation"] != false || fmt.Sprint(caps["drop"]) != "[ALL]" {
			t.Errorf("security context: pod %v, container %v", psc, csc)
		}
		return
	}
	t.Fatal("no Deployment rendered")
}

// TestChartArgsAreFlags parses the container arguments the chart renders
// with the real commands' flags, so a misspelt or removed flag fails here
// rather than in a crash-looping pod.
func TestChartArgsAreFlags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
	}{
		{"manager defaults", map[string]any{}},
		{"manager with everything", richValues},
		{"manager without details", map[string]any{"collect": map[string]any{"objectDetails": false, "kinds": []string{"Pod"}, "extraKinds": []string{"apps/v1/Deployment"}, "namespaces": []string{"a"}, "excludeNamespaces": []string{"b"}}}},
		{"edge", map[string]any{"mode": "edge", "edge": map[string]any{"managerURL": "https://m/edge", "cluster": "leaf-1", "tokenSecret": "t", "region": "eu", "environment": "prod"}}},
		{"manager HA", haValues("nats://nats:4222")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := workloads(t, mustRender(t, "fleetgraph", "fleetgraph", tc.values))
			if len(w) == 0 {
				t.Fatal("no Deployment or StatefulSet rendered")
			}
			for _, args := range w {
				root := newRootCommand()
				cmd, rest, err := root.Find(args)
				if err != nil {
					t.Fatalf("args %q: %v", args, err)
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s does not take the chart's arguments %q: %v", cmd.Name(), args, err)
				}
				if extra := cmd.Flags().Args(); len(extra) > 0 {
					t.Errorf("%s: stray arguments %q", cmd.Name(), extra)
				}
			}
		})
	}
}

// TestChartEdgeMetrics renders mode edge with a ServiceMonitor and checks
// that the agent's /metrics can be scraped: the agent serves them on the
// metrics port (--metrics-listen), the pod names the port, a Service and
// the ServiceMonitor select the edge's pods, and the NetworkPolicy lets
// scrapers (metricsFrom) reach that port and nothing else.
func TestChartEdgeMetrics(t *testing.T) {
	scrapers := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"name": "monitoring"}}}}
	objs := mustRender(t, "fleetgraph", "fleetgraph", map[string]any{
		"mode":          "edge",
		"edge":          map[string]any{"managerURL": "https://m/edge", "cluster": "leaf-1", "tokenSecret": "t"},
		"metrics":       map[string]any{"port": 9191, "serviceMonitor": map[string]any{"enabled": true}},
		"networkPolicy": map[string]any{"metricsFrom": scrapers},
	})
	found := map[string]bool{}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			found["Deployment"] = true
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			c := containers[0].(map[string]any)
			if args := fmt.Sprint(c["args"]); !strings.Contains(args, " --metrics-listen=:9191 ") {
				t.Errorf("edge args %s lack --metrics-listen=:9191", args)
			}
			if ports := fmt.Sprint(c["ports"]); ports != "[map[containerPort:9191 name:metrics protocol:TCP]]" {
				t.Errorf("edge container ports %s, want only metrics 9191", ports)
			}
		case "Service":
			found["Service"] = true
			ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector")
			if fmt.Sprint(ports) != "[map[name:metrics port:9191 protocol:TCP targetPort:metrics]]" || sel["app.kubernetes.io/component"] != "edge" {
				t.Errorf("edge Service ports %v, selector %v: want metrics 9191 of the edge's pods", ports, sel)
			}
		case "ServiceMonitor":
			found["ServiceMonitor"] = true
			sel, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
			endpoints, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
			if sel["app.kubernetes.io/component"] != "edge" || len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != "metrics" {
				t.Errorf("edge ServiceMonitor selector %v, endpoints %v: want the edge's metrics port", sel, endpoints)
			}
		case "NetworkPolicy":
			found["NetworkPolicy"] = true
			ingress, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
			want := []any{map[string]any{"ports": []any{map[string]any{"port": "metrics", "protocol": "TCP"}}, "from": scrapers}}
			if fmt.Sprint(ingress) != fmt.Sprint(want) {
				t.Errorf("edge NetworkPolicy ingress %v, want %v", ingress, want)
			}
		}
	}
	if len(found) != 4 {
		t.Errorf("rendered %v, want a Deployment, Service, ServiceMonitor and NetworkPolicy", found)
	}
}
