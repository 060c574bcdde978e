// Package testcluster starts real Kubernetes control planes for tests and
// for the demo: a kube-apiserver built from k8s.io/kubernetes with an
// embedded etcd, one process per cluster, on loopback.
//
// Each cluster runs with authorization-mode RBAC and a static token file,
// so tests exercise the same authentication and authorization code as a
// production cluster. A TCP fault proxy sits between clients and the API
// server; everything fleetgraph is given (Config, Kubeconfig) goes through
// it, so tests can black-hole, reset or slow the connection. DirectConfig
// goes through a plain forwarder that is never faulted. Stop, Restart,
// Freeze (SIGSTOP) and Thaw (SIGCONT) act on the process itself.
//
// Nothing here picks a port. kube-testenv listens on ports the kernel
// gives it and reports the API server's address on stdout; the proxy and
// the forwarder follow it there, so a restart may move the API server while
// every address a client holds stays the same, and a port freed by a
// stopped cluster is never mistaken for it.
//
// The control-plane binary, kube-testenv, is built from the nested testenv
// module by `make testenv`; the root module never depends on
// k8s.io/kubernetes. Tests find it through $FLEETGRAPH_TESTENV: when that
// is unset they skip, saying so (Require; `make test-unit`), and when it is
// set a missing binary fails them (`make test`). The demo and benchmarks
// also look for bin/kube-testenv in the repository.
//
// Besides the API server, the process runs the two controllers whose
// absence would make a cluster unlike a real one for fleetgraph:
// ClusterRole aggregation (so "view", "edit" and "admin" have rules) and
// namespace deletion (so deleted namespaces are finalized and go away).
// There is no scheduler or kubelet: pods stay Pending unless a test writes
// their status.
//
// Processes, proxies and temporary directories are released by Close,
// which Start and StartAll register with t.Cleanup, so they go away even
// when a test fails; the kernel kills a control plane whose test process
// died (Pdeathsig).
package testcluster
