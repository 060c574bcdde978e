package rbacdiff

import (
	"context"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
)

var (
	sinkDecision bool
	sinkAccess   *index.ClusterAccess
)

// BenchmarkAuthorizeBootstrap runs the requests of the upstream
// BenchmarkAuthorize over the real bootstrap ClusterRoles and bindings,
// through authz and through the Kubernetes authorizer, side by side. The
// names are upstream's; RBAC denies all three (the bootstrap system:node
// binding has no subjects: the Node authorizer serves nodes).
func BenchmarkAuthorizeBootstrap(b *testing.B) {
	p := Bootstrap()
	oracle := p.Oracle()
	ours := authz.NewEvaluator(p.Store(Kinds()))
	node := &user.DefaultInfo{Name: "system:node:node1", Groups: []string{"system:nodes", "system:authenticated"}}
	requests := []struct {
		name  string
		attrs authz.Attributes
	}{
		{"allow list pods", authz.Attributes{User: node, Verb: "list", Resource: "pods", ResourceRequest: true}},
		{"allow update pods/status", authz.Attributes{User: node, Verb: "update", Resource: "pods", Subresource: "status", Name: "mypods", Namespace: "myns", ResourceRequest: true}},
		{"forbid educate dolphins", authz.Attributes{User: node, Verb: "educate", Resource: "dolphins", ResourceRequest: true}},
	}
	ctx := context.Background()
	for _, r := range requests {
		b.Run("authz/"+r.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d, _ := ours.Authorize(ctx, Cluster, &r.attrs)
				sinkDecision = d.Allowed
			}
		})
		b.Run("kubernetes/"+r.name, func(b *testing.B) {
			rec := OracleAttributes(&r.attrs)
			b.ReportAllocs()
			for b.Loop() {
				d, _, _ := oracle.Authorize(ctx, rec)
				sinkDecision = d == 1
			}
		})
	}
}

// BenchmarkAccessSetBootstrap builds the access set of a kube-scheduler
// identity over the bootstrap policy: compile included ("cold") and from
// the compiled policy ("cached").
func BenchmarkAccessSetBootstrap(b *testing.B) {
	store := Bootstrap().Store(Kinds())
	id := authz.NewIdentity(&user.DefaultInfo{Name: "system:kube-scheduler"})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkAccess = authz.NewAuthorizer(store, authz.Options{}).ClusterAccess(Cluster, id)
		}
	})
	b.Run("cached", func(b *testing.B) {
		a := authz.NewAuthorizer(store, authz.Options{})
		b.ReportAllocs()
		for b.Loop() {
			sinkAccess = a.ClusterAccess(Cluster, id)
		}
	})
}
