package rbacdiff

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// EnvCount reads a positive count from the environment variable name,
// def when it is unset.
func EnvCount(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// DumpPolicy prints a policy for a failure message.
func DumpPolicy(p *Policy) string {
	var b strings.Builder
	for _, r := range p.ClusterRoles {
		fmt.Fprintf(&b, "  ClusterRole %s: %+v\n", r.Name, r.Rules)
	}
	for _, r := range p.Roles {
		fmt.Fprintf(&b, "  Role %s/%s: %+v\n", r.Namespace, r.Name, r.Rules)
	}
	for _, x := range p.ClusterRoleBindings {
		fmt.Fprintf(&b, "  ClusterRoleBinding %s -> %+v: %+v\n", x.Name, x.RoleRef, x.Subjects)
	}
	for _, x := range p.RoleBindings {
		fmt.Fprintf(&b, "  RoleBinding %s/%s -> %+v: %+v\n", x.Namespace, x.Name, x.RoleRef, x.Subjects)
	}
	return b.String()
}

// Seeds returns the policies a generated one may start from: the
// bootstrap policy and the upstream cases'.
func Seeds() []*Policy {
	out := []*Policy{Bootstrap()}
	for _, c := range UpstreamCases() {
		out = append(out, c.Policy)
	}
	return out
}
