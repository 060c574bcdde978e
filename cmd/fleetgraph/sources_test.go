package main

import (
	"maps"
	"strings"
	"testing"
)

func TestParseClusterLabels(t *testing.T) {
	got, err := parseClusterLabels([]string{
		"env=prod", "prod-east:region=eu-west-1", "arn:aws:eks:us-east-1:1:cluster/prod:tier=gold",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"":                                     {"env": "prod"},
		"prod-east":                            {"region": "eu-west-1"},
		"arn:aws:eks:us-east-1:1:cluster/prod": {"tier": "gold"},
	}
	if !maps.EqualFunc(got, want, maps.Equal) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"env", "ctx:bad key=x", "env=not a value", "=x"} {
		if _, err := parseClusterLabels([]string{bad}); err == nil || !strings.Contains(err.Error(), "--cluster-label") {
			t.Errorf("%q: got %v, want a --cluster-label error", bad, err)
		}
	}
}

func TestSourceFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		f    serveFlags
		want string
	}{
		{"unknown source", serveFlags{scopeFlags: scopeFlags{sourceNames: []string{"nope"}}}, `unknown source "nope"`},
		{"secrets without namespace", serveFlags{scopeFlags: scopeFlags{sourceNames: []string{"secrets"}}}, "--cluster-secrets-namespace"},
		{"clusterprofile without providers", serveFlags{scopeFlags: scopeFlags{sourceNames: []string{"clusterprofile"}}}, "--clusterprofile-provider-file"},
		{"no management cluster", serveFlags{scopeFlags: scopeFlags{sourceNames: []string{"capi"}}}, "--management-kubeconfig"},
		{"labels without kubeconfig", serveFlags{clusterLabels: []string{"a=b"}}, "--cluster-label labels kubeconfig contexts"},
		{"missing kubeconfig", serveFlags{scopeFlags: scopeFlags{sourceNames: []string{"kubeconfig"}}, kubeconfig: "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.f.sources()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}
