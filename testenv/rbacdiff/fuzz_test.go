package rbacdiff

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/fleetgraph/fleetgraph/authz"
)

// FuzzAuthorize decodes the fuzzer's bytes into a policy (possibly built on
// an upstream case or the bootstrap policy) and requests, with the two
// strings mixed into every vocabulary (names, namespaces, verbs, subjects,
// resources), and requires authz to agree with the Kubernetes authorizer:
// no panic, never allowing what Kubernetes denies, and never denying what
// it allows; and the access set of one identity to show exactly the
// objects Kubernetes would let it read.
//
//	cd testenv && go test -run '^$' -fuzz FuzzAuthorize -fuzztime 25m ./rbacdiff/
func FuzzAuthorize(f *testing.F) {
	seedPolicies := Seeds()
	// One corpus entry per seed policy (the first byte 0 picks a seed,
	// the second which), then random ones.
	for i := range seedPolicies {
		f.Add([]byte{0, byte(i), 1, 2, 3, 0, 0, 1, 2}, "ns1", "pods")
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for _, extra := range [][2]string{
		{"*", "*/scale"},
		{"", "system:authenticated"},
		{"system:serviceaccount:ns1:sa1", "sa1"},
		{"a:b", "ns1:sa1"},
		{"GET", "Pods"},
		{"namespaces", "ns2"},
		{"/healthz/*", "/healthz"},
	} {
		data := make([]byte, 64)
		for i := range data {
			data[i] = byte(rng.UintN(256))
		}
		f.Add(data, extra[0], extra[1])
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte, s1, s2 string) {
		g := NewGen(&ByteChooser{Data: data}, []string{s1, s2}, seedPolicies)
		p := g.Policy()
		oracle := p.Oracle()
		store := p.Store(Kinds())
		e := authz.NewEvaluator(store)
		for range 4 {
			a := g.Case(p)
			want := OracleAllows(ctx, oracle, &a)
			d, _ := e.Authorize(ctx, Cluster, &a)
			if d.Allowed && !want {
				t.Fatalf("authz allows what Kubernetes denies: %s (%s)\npolicy:\n%s", describe(&a), d.Reason, DumpPolicy(p))
			}
			if !d.Allowed && want {
				t.Fatalf("authz denies what Kubernetes allows: %s\npolicy:\n%s", describe(&a), DumpPolicy(p))
			}
		}
		az := authz.NewAuthorizer(store, authz.Options{})
		id := authz.NewIdentity(g.User(p))
		ca := az.ClusterAccess(Cluster, id)
		mapped := az.MappedUser(Cluster, id)
		for _, o := range Universe([]string{"ns1", s1}, []string{"a", s2}) {
			if o.Namespaced && o.Namespace == "" {
				continue // not an object: namespaced objects have a namespace
			}
			if o.Name == "" {
				continue // objects always have a name
			}
			want := OracleVisible(ctx, oracle, mapped, o)
			if got := authz.Allows(ca, o.GR, o.Namespace, o.Name); got != want {
				t.Fatalf("access set says %v, Kubernetes %v, for %+v as %q %q\npolicy:\n%s",
					got, want, o, mapped.GetName(), mapped.GetGroups(), DumpPolicy(p))
			}
		}
	})
}
