package connection_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleetgraph/fleetgraph/connection"
)

// Every context of a kubeconfig is a cluster. A broken context (here, one
// whose user entry is missing) still yields its Spec, whose Config says
// what is wrong, so that one bad context never stops the others; the
// cluster then shows that error as its connection's lastError.
func ExampleKubeconfigSpecs() {
	dir, err := os.MkdirTemp("", "kubeconfig")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, "config")
	kubeconfig := `apiVersion: v1
kind: Config
clusters:
- name: east
  cluster: {server: "https://east.example:6443"}
- name: west
  cluster: {server: "https://west.example:6443"}
users:
- name: reader
  user: {token: "not-a-real-token"}
contexts:
- name: east
  context: {cluster: east, user: reader}
- name: west
  context: {cluster: west, user: nobody}
current-context: east
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		fmt.Println(err)
		return
	}
	specs, err := connection.KubeconfigSpecs(path, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, spec := range specs {
		cfg, err := spec.Config(context.Background())
		if err != nil {
			fmt.Printf("%s: %v\n", spec.Name, err)
			continue
		}
		fmt.Printf("%s: %s\n", spec.Name, cfg.Host)
	}
	// Output:
	// east: https://east.example:6443
	// west: kubeconfig context "west" names user "nobody", which the kubeconfig does not define
}
