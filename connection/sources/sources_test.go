package sources_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fleetgraph/fleetgraph/connection/sources"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestSources runs every source against one real management cluster
// holding the source CRDs and two real leaves: each source adds its
// clusters with their labels, follows a credential rotation, shows broken
// objects as errors on their own clusters while the others work, and
// removes a cluster with its rows when its object goes.
func TestSources(t *testing.T) {
	e := startFleet(t)
	t.Run("gitopscluster", func(t *testing.T) { testGitopsClusters(t, e) })
	t.Run("capi", func(t *testing.T) { testCAPI(t, e) })
	t.Run("argocd", func(t *testing.T) { testArgoCD(t, e) })
	t.Run("clusterprofile", func(t *testing.T) { testClusterProfiles(t, e) })
	t.Run("secrets", func(t *testing.T) { testSecrets(t, e) })
	t.Run("kubeconfig", func(t *testing.T) { testKubeconfig(t, e) })
	t.Run("conflict", func(t *testing.T) { testConflict(t, e) })
}

// testKubeconfig follows a kubeconfig file: contexts with their labels,
// a rotated token, a context removed from the file.
func testKubeconfig(t *testing.T, e *fleetEnv) {
	leaf1, leaf2 := e.leaves[0], e.leaves[1]
	path := filepath.Join(t.TempDir(), "kubeconfig")
	tok1, bound1 := e.token(t, leaf1)
	tok2, _ := e.token(t, leaf2)
	write := func(tok1 string, withLeaf2 bool) {
		cfg := leaf1.KubeconfigForToken(tok1)
		if withLeaf2 {
			other := leaf2.KubeconfigForToken(tok2)
			cfg.Clusters[leaf2.Name] = other.Clusters[leaf2.Name]
			cfg.AuthInfos[leaf2.Name+"-token"] = other.AuthInfos[leaf2.Name+"-token"]
			cfg.Contexts[leaf2.Name] = other.Contexts[leaf2.Name]
		}
		tmp := path + ".tmp"
		if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil { // a whole file at once, as kubectl writes
			t.Fatal(err)
		}
	}
	write(tok1, true)
	f := runFleet(t, sources.NewKubeconfig(sources.KubeconfigOptions{Path: path, Labels: map[string]map[string]string{
		"": {"env": "test"}, leaf1.Name: {"region": "eu-west-1"},
	}}))
	f.waitConnected(t, leaf1.Name, 1, map[string]string{"env": "test", "region": "eu-west-1", sources.SourceLabel: "kubeconfig"})
	f.waitConnected(t, leaf2.Name, 1, map[string]string{"env": "test"})
	f.rotate(t, e, leaf1.Name, leaf1, bound1, true, func(token string) {
		tok1 = token
		write(token, true)
	})
	write(tok1, false)
	f.waitGone(t, leaf2.Name)
	if row, _ := f.store.GetCluster(nil, leaf1.Name); row == nil || row.State != index.StateConnected {
		t.Errorf("%s after %s left the kubeconfig: %+v", leaf1.Name, leaf2.Name, row)
	}
}

func testGitopsClusters(t *testing.T, e *fleetEnv) {
	const ns = "gitops"
	e.namespace(t, ns)
	leaf1, leaf2 := e.leaves[0], e.leaves[1]
	tokA, boundA := e.token(t, leaf1)
	putProd := func(token string) {
		// value.yaml: the second key Weave GitOps reads.
		e.putSecret(t, ns, "prod-kubeconfig-secret", nil, map[string][]byte{"value.yaml": kubeconfig(t, leaf1, token)})
	}
	putProd(tokA)
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "prod", map[string]string{"env": "prod", "region": "eu-west-1"},
		map[string]any{"secretRef": map[string]any{"name": "prod-kubeconfig-secret"}}, nil)
	// spec.capiClusterRef: the Cluster API kubeconfig Secret of "staging".
	tok2, _ := e.token(t, leaf2)
	e.putSecret(t, ns, "staging-kubeconfig", nil, map[string][]byte{"value": kubeconfig(t, leaf2, tok2)})
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "staging", map[string]string{"env": "staging"},
		map[string]any{"capiClusterRef": map[string]any{"name": "staging"}}, nil)
	// Broken objects, each an error on its own cluster.
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "missing", nil,
		map[string]any{"secretRef": map[string]any{"name": "missing-secret"}}, nil)
	e.putSecret(t, ns, "garbage", nil, map[string][]byte{"value": []byte("{{{ not a kubeconfig")})
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "garbage", nil,
		map[string]any{"secretRef": map[string]any{"name": "garbage"}}, nil)
	noContext := leaf1.KubeconfigForToken(tokA)
	noContext.CurrentContext = ""
	e.putSecret(t, ns, "nocontext", nil, map[string][]byte{"value": writeKubeconfig(t, noContext)})
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "nocontext", nil,
		map[string]any{"secretRef": map[string]any{"name": "nocontext"}}, nil)
	badCA := leaf1.KubeconfigForToken(tokA)
	badCA.Clusters[leaf1.Name].CertificateAuthorityData = []byte("not a certificate")
	e.putSecret(t, ns, "badca", nil, map[string][]byte{"value": writeKubeconfig(t, badCA)})
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "badca", nil,
		map[string]any{"secretRef": map[string]any{"name": "badca"}}, nil)
	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "neither", nil, map[string]any{}, nil)

	f := runFleet(t, sources.NewGitopsClusters(e.options(ns)))
	f.waitConnected(t, "prod", 1, map[string]string{
		"env": "prod", "region": "eu-west-1", sources.SourceLabel: "gitopscluster", sources.SourceNamespaceLabel: ns,
	})
	f.waitConnected(t, "staging", 1, map[string]string{"env": "staging"})
	f.waitError(t, "missing", "secret gitops/missing-secret (spec.secretRef of GitopsCluster gitops/missing) not found")
	f.waitError(t, "garbage", "parse kubeconfig")
	f.waitError(t, "nocontext", "no current context")
	f.waitError(t, "badca", "no PEM certificate")
	f.waitError(t, "neither", "neither spec.secretRef nor spec.capiClusterRef")

	// The missing Secret appears: its cluster connects without a restart.
	tokM, _ := e.token(t, leaf2)
	e.putSecret(t, ns, "missing-secret", nil, map[string][]byte{"value": kubeconfig(t, leaf2, tokM)})
	f.waitConnected(t, "missing", 1, nil)

	f.rotate(t, e, "prod", leaf1, boundA, true, putProd)

	e.deleteObject(t, gvrGitopsCluster, ns, "prod")
	f.waitGone(t, "prod")
	if row, _ := f.store.GetCluster(nil, "staging"); row == nil || row.State != index.StateConnected {
		t.Errorf("staging after prod's removal: %+v", row)
	}
	// A relabelled object changes nothing but can be seen through; deleting
	// the other objects removes every cluster.
	for _, name := range []string{"staging", "missing", "garbage", "nocontext", "badca", "neither"} {
		e.deleteObject(t, gvrGitopsCluster, ns, name)
		f.waitGone(t, name)
	}
}

func testCAPI(t *testing.T, e *fleetEnv) {
	const ns = "capi"
	e.namespace(t, ns)
	leaf1 := e.leaves[0]
	tok, bound := e.token(t, leaf1)
	put := func(token string) {
		e.putSecret(t, ns, "prod-kubeconfig", map[string]string{"cluster.x-k8s.io/cluster-name": "prod"},
			map[string][]byte{"value": kubeconfig(t, leaf1, token)})
	}
	put(tok)
	e.putObject(t, gvrCAPICluster, "Cluster", ns, "prod", map[string]string{"env": "prod", "region": "eu-west-1"},
		map[string]any{}, map[string]any{"phase": "Provisioned"})
	e.putObject(t, gvrCAPICluster, "Cluster", ns, "new", nil, map[string]any{}, map[string]any{"phase": "Provisioning"})

	f := runFleet(t, sources.NewCAPI(e.options(ns)))
	f.waitConnected(t, "prod", 1, map[string]string{"env": "prod", "region": "eu-west-1", sources.SourceLabel: "capi"})
	f.waitError(t, "new", "secret capi/new-kubeconfig (kubeconfig of Cluster API cluster capi/new, phase Provisioning) not found")

	// A relabelled Cluster relabels its cluster in place: no reconnect.
	e.putObject(t, gvrCAPICluster, "Cluster", ns, "prod", map[string]string{"env": "prod", "region": "us-east-1"},
		map[string]any{}, map[string]any{"phase": "Provisioned"})
	conntest.Eventually(t, 30*time.Second, "relabelled", func() error {
		if row, _ := f.store.GetCluster(nil, "prod"); row == nil || row.Labels["region"] != "us-east-1" {
			return fmt.Errorf("labels %v", row.Labels)
		}
		return nil
	})
	if n := len(f.rec.Of("prod")); n != 2 {
		t.Errorf("relabelling made transitions: %v", f.rec.Of("prod"))
	}

	f.rotate(t, e, "prod", leaf1, bound, true, put)

	e.deleteObject(t, gvrCAPICluster, ns, "prod")
	f.waitGone(t, "prod")
	if _, ok := f.store.GetCluster(nil, "new"); !ok {
		t.Error("the provisioning cluster went with prod")
	}
}

func testArgoCD(t *testing.T, e *fleetEnv) {
	const ns = "argocd-test"
	e.namespace(t, ns)
	leaf1, leaf2 := e.leaves[0], e.leaves[1]
	clusterLabels := map[string]string{sources.ArgoCDSecretTypeLabel: "cluster", "env": "prod", "region": "eu-west-1"}
	tok, bound := e.token(t, leaf1)
	put := func(token string) {
		e.putSecret(t, ns, "cluster-prod", clusterLabels, map[string][]byte{
			"name": []byte("prod"), "server": []byte(leaf1.Proxy.URL()),
			"config": mustJSON(t, map[string]any{"bearerToken": token, "tlsClientConfig": map[string]any{"caData": leaf1.CAData()}}),
		})
	}
	put(tok)
	// An exec provider: the test binary prints the token of a file.
	tokenFile := filepath.Join(t.TempDir(), "token")
	tok2, _ := e.token(t, leaf2)
	writeFile(t, tokenFile, tok2)
	e.putSecret(t, ns, "cluster-exec", map[string]string{sources.ArgoCDSecretTypeLabel: "cluster", "env": "staging"}, map[string][]byte{
		"name": []byte("exec"), "server": []byte(leaf2.Proxy.URL()),
		"config": mustJSON(t, map[string]any{
			"tlsClientConfig":    map[string]any{"caData": leaf2.CAData()},
			"execProviderConfig": execProvider(t, tokenFile),
		}),
	})
	e.putSecret(t, ns, "cluster-unreachable", map[string]string{sources.ArgoCDSecretTypeLabel: "cluster"}, map[string][]byte{
		"name": []byte("unreachable"), "server": []byte("https://" + closedAddr(t)),
		"config": mustJSON(t, map[string]any{"bearerToken": "x", "tlsClientConfig": map[string]any{"insecure": true}}),
	})
	e.putSecret(t, ns, "cluster-garbage", map[string]string{sources.ArgoCDSecretTypeLabel: "cluster"}, map[string][]byte{
		"name": []byte("garbage"), "server": []byte(leaf1.Proxy.URL()), "config": []byte("{{"),
	})
	// A Secret without the cluster label is not Argo CD's cluster.
	e.putSecret(t, ns, "repo-creds", map[string]string{sources.ArgoCDSecretTypeLabel: "repository"}, map[string][]byte{
		"name": []byte("repo"), "server": []byte(leaf1.Proxy.URL()),
	})

	f := runFleet(t, sources.NewArgoCD(e.options(ns)))
	f.waitConnected(t, "prod", 1, map[string]string{"env": "prod", "region": "eu-west-1", sources.SourceLabel: "argocd"})
	if row, _ := f.store.GetCluster(nil, "prod"); row != nil && row.Labels[sources.ArgoCDSecretTypeLabel] != "" {
		t.Errorf("the Argo CD secret-type label became a cluster label: %v", row.Labels)
	}
	f.waitConnected(t, "exec", 1, map[string]string{"env": "staging"})
	f.waitError(t, "unreachable", "connection refused")
	f.waitError(t, "garbage", `"config" field`)
	if _, ok := f.store.GetCluster(nil, "repo"); ok {
		t.Error("a repository Secret became a cluster")
	}

	f.rotate(t, e, "prod", leaf1, bound, true, put)

	if err := e.kube.CoreV1().Secrets(ns).Delete(t.Context(), "cluster-prod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitGone(t, "prod")
}

func testClusterProfiles(t *testing.T, e *fleetEnv) {
	const ns = "profiles"
	e.namespace(t, ns)
	leaf1, leaf2 := e.leaves[0], e.leaves[1]
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	providerFile := filepath.Join(dir, "providers.json")
	writeFile(t, providerFile, string(mustJSON(t, map[string]any{"providers": []any{
		map[string]any{
			"name": "test-provider",
			"execConfig": map[string]any{
				"apiVersion": "client.authentication.k8s.io/v1", "command": exe,
				"env":                []any{map[string]any{"name": execPluginEnv, "value": "1"}},
				"provideClusterInfo": true, "interactiveMode": "Never",
			},
			"profileSourcedEnvVarsPolicy": "AppendIfNotExists",
		},
	}})))
	// leaf-1 passes its token file as the plugin's cluster config (the
	// client.authentication.k8s.io/exec extension); leaf-2 through an
	// environment variable the profile adds.
	tok1File, tok2File := filepath.Join(dir, "token-1"), filepath.Join(dir, "token-2")
	tok1, bound1 := e.token(t, leaf1)
	writeFile(t, tok1File, tok1)
	tok2, _ := e.token(t, leaf2)
	writeFile(t, tok2File, tok2)
	e.putObject(t, gvrClusterProfile, "ClusterProfile", ns, "prod", map[string]string{"env": "prod"},
		map[string]any{"clusterManager": map[string]any{"name": "test"}},
		map[string]any{
			"accessProviders": []any{
				map[string]any{"name": "other-provider", "cluster": map[string]any{"server": "https://other.invalid"}},
				profileProvider(leaf1, map[string]any{
					"name": "client.authentication.k8s.io/exec", "extension": map[string]any{"tokenFile": tok1File},
				}),
			},
			"properties": []any{
				map[string]any{"name": "topology.kubernetes.io/region", "value": "eu-west-1"},
				map[string]any{"name": "not a label key", "value": "x"},
			},
		})
	e.putObject(t, gvrClusterProfile, "ClusterProfile", ns, "staging", map[string]string{"env": "staging"},
		map[string]any{"clusterManager": map[string]any{"name": "test"}},
		map[string]any{"credentialProviders": []any{profileProvider(leaf2, map[string]any{
			"name": "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs", "extension": map[string]any{"FLEETGRAPH_TEST_TOKEN_FILE": tok2File},
		})}})
	e.putObject(t, gvrClusterProfile, "ClusterProfile", ns, "pending", nil,
		map[string]any{"clusterManager": map[string]any{"name": "test"}}, nil)
	e.putObject(t, gvrClusterProfile, "ClusterProfile", ns, "foreign", nil,
		map[string]any{"clusterManager": map[string]any{"name": "test"}},
		map[string]any{"accessProviders": []any{map[string]any{"name": "someone-else", "cluster": map[string]any{"server": "https://x.invalid"}}}})

	opts := e.options(ns)
	opts.ProviderFile = providerFile
	f := runFleet(t, sources.NewClusterProfiles(opts))
	f.waitConnected(t, "prod", 1, map[string]string{
		"env": "prod", "topology.kubernetes.io/region": "eu-west-1", sources.SourceLabel: "clusterprofile",
	})
	f.waitConnected(t, "staging", 1, map[string]string{"env": "staging"})
	f.waitError(t, "pending", "lists no access providers yet")
	f.waitError(t, "foreign", `offers access providers "someone-else", but the provider file configures "test-provider"`)
	if row, _ := f.store.GetCluster(nil, "prod"); row != nil && row.Labels["not a label key"] != "" {
		t.Errorf("a property that is no label key became a label: %v", row.Labels)
	}

	// The plugin hands out a new token; the old one is revoked.
	f.rotate(t, e, "prod", leaf1, bound1, false, func(token string) { writeFile(t, tok1File, token) })

	e.deleteObject(t, gvrClusterProfile, ns, "prod")
	f.waitGone(t, "prod")
}

func testSecrets(t *testing.T, e *fleetEnv) {
	const ns = "cluster-secrets"
	e.namespace(t, ns)
	leaf1 := e.leaves[0]
	tok, bound := e.token(t, leaf1)
	labels := map[string]string{"fleetgraph.io/cluster": "true", sources.ClusterNameKey: "prod", "env": "prod"}
	put := func(token string) {
		e.putSecret(t, ns, "leaf-secret", labels, map[string][]byte{sources.SecretKubeconfigKey: kubeconfig(t, leaf1, token)})
	}
	put(tok)
	e.putSecret(t, ns, "broken", map[string]string{"fleetgraph.io/cluster": "true"}, map[string][]byte{sources.SecretKubeconfigKey: []byte("{{{")})
	e.putSecret(t, ns, "unlabelled", nil, map[string][]byte{sources.SecretKubeconfigKey: kubeconfig(t, leaf1, tok)})

	f := runFleet(t, sources.NewSecrets(e.options(ns)))
	f.waitConnected(t, "prod", 1, map[string]string{"env": "prod", sources.SourceLabel: "secrets"})
	if row, _ := f.store.GetCluster(nil, "prod"); row != nil && row.Labels[sources.ClusterNameKey] != "" {
		t.Errorf("the cluster-name label became a cluster label: %v", row.Labels)
	}
	f.waitError(t, "broken", "parse kubeconfig")
	if _, ok := f.store.GetCluster(nil, "unlabelled"); ok {
		t.Error("a Secret without the selector's label became a cluster")
	}
	f.rotate(t, e, "prod", leaf1, bound, true, put)
	if err := e.kube.CoreV1().Secrets(ns).Delete(t.Context(), "leaf-secret", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitGone(t, "prod")
}

// testConflict runs two sources naming the same cluster: the cluster shows
// the conflict as its error, naming both objects, until one goes.
func testConflict(t *testing.T, e *fleetEnv) {
	const ns = "conflict"
	e.namespace(t, ns)
	leaf1 := e.leaves[0]
	tok, _ := e.token(t, leaf1)
	e.putSecret(t, ns, "shared-kubeconfig", nil, map[string][]byte{"value": kubeconfig(t, leaf1, tok)})
	e.putObject(t, gvrCAPICluster, "Cluster", ns, "shared", nil, map[string]any{}, nil)

	f := runFleet(t, sources.NewCAPI(e.options(ns)), sources.NewGitopsClusters(e.options(ns)))
	f.waitConnected(t, "shared", 1, map[string]string{sources.SourceLabel: "capi"})

	e.putObject(t, gvrGitopsCluster, "GitopsCluster", ns, "shared", nil,
		map[string]any{"capiClusterRef": map[string]any{"name": "shared"}}, nil)
	f.waitError(t, "shared", "two sources name this cluster: capi conflict/shared and gitopscluster conflict/shared")

	e.deleteObject(t, gvrGitopsCluster, ns, "shared")
	f.waitConnected(t, "shared", 2, nil)
	if n := f.rec.Count("shared", index.StateDisconnected); n != 1 {
		t.Errorf("%d DISCONNECTED transitions, want 1 (the conflict): %v", n, f.rec.Of("shared"))
	}
}

// profileProvider is an access provider entry for a leaf with one
// extension.
func profileProvider(leaf *testcluster.Cluster, extension map[string]any) map[string]any {
	return map[string]any{"name": "test-provider", "cluster": map[string]any{
		"server": leaf.Proxy.URL(), "certificate-authority-data": leaf.CAData(),
		"extensions": []any{extension},
	}}
}

// execProvider is Argo CD's execProviderConfig running the test binary as
// an exec plugin that reads tokenFile.
func execProvider(t *testing.T, tokenFile string) map[string]any {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{
		"command": exe, "args": []string{"--token-file", tokenFile},
		"env": map[string]string{execPluginEnv: "1"}, "apiVersion": "client.authentication.k8s.io/v1",
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeKubeconfig(t *testing.T, cfg *clientcmdapi.Config) []byte {
	t.Helper()
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
