package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"

	"k8s.io/klog/v2"
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

// TestLogFormat checks that --log-format json logs one JSON object per
// line, klog's (client-go's) lines included, and that other formats fail.
func TestLogFormat(t *testing.T) {
	prev := slog.Default()
	t.Cleanup(func() {
		slog.SetDefault(prev)
		klog.SetSlogLogger(prev)
	})
	var stderr bytes.Buffer
	root := newRootCommand()
	root.SetErr(&stderr)
	root.SetOut(io.Discard)
	root.SetArgs([]string{"--log-format", "json", "rbac", "--target", "leaf"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	slog.Info("from slog", "k", "v")
	klog.InfoS("from klog", "k", "v")
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 log lines, got %q", stderr.String())
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["k"] != "v" || m["msg"] == nil {
			t.Errorf("not a JSON log line with its fields: %q (%v)", l, err)
		}
	}
	root = newRootCommand()
	root.SetErr(io.Discard)
	root.SetArgs([]string{"--log-format", "xml", "rbac"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("--log-format xml: %v", err)
	}
}
