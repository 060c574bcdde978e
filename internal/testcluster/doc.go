// Package testcluster starts real Kubernetes control planes for tests and
// for the demo: a kube-apiserver built from k8s.io/kubernetes with an
// embedded etcd, one process per cluster, on loopback ports.
//
// Each cluster runs with authorization-mode RBAC and a static token file,
// so tests exercise the same authentication and authorization code as a
// production cluster. A TCP fault proxy sits between clients and the API
// server; everything fleetgraph is given (Config, Kubeconfig) goes through
// it, so tests can black-hole, reset or slow the connection. Stop, Restart,
// Freeze (SIGSTOP) and Thaw (SIGCONT) act on the process itself.
//
// The control-plane binary, kube-testenv, is built from the nested testenv
// module by `make testenv`; the root module never depends on
// k8s.io/kubernetes. Tests find the binary through $FLEETGRAPH_TESTENV or
// at bin/kube-testenv in the repository.
//
// There is no controller-manager, scheduler or kubelet: pods stay Pending
// unless a test writes their status, and deleted namespaces are never
// finalized.
//
// Processes, ports and temporary directories are released by Close, which
// Start registers with t.Cleanup, so they go away even when a test fails.
package testcluster
