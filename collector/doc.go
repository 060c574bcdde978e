// Package collector turns one cluster's API into index rows.
//
// It holds the kind registry (core, Istio, Flux and RBAC kinds, plus any
// GVK added by configuration), the normalizers that compute each row's
// status, message and summary (kstatus plus kind-specific rules), and the
// reflectors that list and watch a cluster and write rows straight into an
// index.RowSink, without an informer cache of full objects.
//
// It does not decide when a cluster is connected or reconnect it: that is
// the connection package. It does not store rows: the Sink does.
package collector
