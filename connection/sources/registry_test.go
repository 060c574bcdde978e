package sources_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/connection"
	"github.com/fleetgraph/fleetgraph/connection/sources"
)

// fakeFleet records what a Registry asks of it.
type fakeFleet struct {
	mu    sync.Mutex
	calls []string
	specs map[string]connection.Spec
}

func newFakeFleet() *fakeFleet { return &fakeFleet{specs: map[string]connection.Spec{}} }

func (f *fakeFleet) Add(s connection.Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.specs[s.Name]; ok {
		return fmt.Errorf("cluster %q is added already", s.Name)
	}
	f.specs[s.Name] = s
	f.calls = append(f.calls, "add "+s.Name)
	return nil
}

func (f *fakeFleet) Remove(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.specs, name)
	f.calls = append(f.calls, "remove "+name)
	return nil
}

func (f *fakeFleet) Reconnect(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "reconnect "+name)
	return nil
}

func (f *fakeFleet) SetLabels(_ context.Context, name string, labels map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		kv = append(kv, k+"="+labels[k])
	}
	f.calls = append(f.calls, "labels "+name+" "+strings.Join(kv, ","))
	return nil
}

// take returns the calls so far and forgets them.
func (f *fakeFleet) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// config calls the Config of a cluster as the Manager would.
func (f *fakeFleet) config(t *testing.T, name string) (*rest.Config, error) {
	t.Helper()
	f.mu.Lock()
	s, ok := f.specs[name]
	f.mu.Unlock()
	if !ok {
		t.Fatalf("cluster %s was not added", name)
	}
	return s.Config(t.Context())
}

func claim(source, object, cluster, version, host string) sources.Claim {
	return sources.Claim{
		Source: source, Object: object, Cluster: cluster, Version: version,
		Config: func(context.Context) (*rest.Config, error) { return &rest.Config{Host: host}, nil },
	}
}

func TestRegistry(t *testing.T) {
	f := newFakeFleet()
	r := sources.NewRegistry(f, nil)
	expect := func(want ...string) {
		t.Helper()
		if got := f.take(); !slices.Equal(got, want) {
			t.Fatalf("fleet calls %q, want %q", got, want)
		}
	}

	r.Set(claim("capi", "ns/a", "a", "v1", "https://a"))
	expect("add a")
	if cfg, err := f.config(t, "a"); err != nil || cfg.Host != "https://a" {
		t.Fatalf("config of a: %v, %v", cfg, err)
	}

	// The same claim again changes nothing; new labels relabel; new
	// credentials reconnect.
	r.Set(claim("capi", "ns/a", "a", "v1", "https://a"))
	expect()
	relabelled := claim("capi", "ns/a", "a", "v1", "https://a")
	relabelled.Labels = map[string]string{"env": "prod"}
	r.Set(relabelled)
	expect("labels a env=prod")
	relabelled.Version, relabelled.Config = "v2", claim("", "", "", "", "https://a2").Config
	r.Set(relabelled)
	expect("reconnect a")
	if cfg, _ := f.config(t, "a"); cfg.Host != "https://a2" {
		t.Errorf("config after the change: %s", cfg.Host)
	}

	// A second source naming a: a conflict on a, not an overwrite.
	r.Set(claim("argocd", "argocd/a", "a", "v1", "https://elsewhere"))
	expect("reconnect a")
	_, err := f.config(t, "a")
	if !errors.Is(err, sources.ErrConflict) || !strings.Contains(err.Error(), "capi ns/a and argocd argocd/a") {
		t.Fatalf("config during the conflict: %v", err)
	}
	// The first claim going leaves the second: the cluster takes its labels
	// and reconnects with it.
	r.Delete(t.Context(), "capi", "ns/a")
	expect("labels a ", "reconnect a")
	if cfg, err := f.config(t, "a"); err != nil || cfg.Host != "https://elsewhere" {
		t.Fatalf("config after the conflict: %v, %v", cfg, err)
	}

	// A claim that changes its cluster's name moves: the old cluster goes.
	r.Set(claim("argocd", "argocd/a", "b", "v1", "https://elsewhere"))
	expect("remove a", "add b")
	r.Delete(t.Context(), "argocd", "argocd/a")
	expect("remove b")
	r.Delete(t.Context(), "argocd", "argocd/a")
	expect()

	// Names no cluster can have are refused.
	r.Set(claim("capi", "ns/x", "", "v1", "https://x"))
	r.Set(claim("capi", "ns/y", "bad\nname", "v1", "https://y"))
	expect()
}

func TestRegistryReady(t *testing.T) {
	r := sources.NewRegistry(newFakeFleet(), nil)
	if err := r.Ready(); err != nil {
		t.Fatalf("no sources: %v", err)
	}
	r.Expect("capi")
	r.Expect("argocd")
	if err := r.Ready(); err == nil || !strings.Contains(err.Error(), "source argocd: not listed yet") {
		t.Fatalf("before listing: %v", err)
	}
	r.Listed("capi", errors.New("clusters.cluster.x-k8s.io is forbidden"))
	if err := r.Ready(); err == nil || !strings.Contains(err.Error(), "source capi: clusters.cluster.x-k8s.io is forbidden") {
		t.Fatalf("after a list error: %v", err)
	}
	r.Listed("capi", nil)
	r.Listed("argocd", nil)
	if err := r.Ready(); err != nil {
		t.Fatalf("after listing: %v", err)
	}
	// Listed once is listed: a later watch error does not unready it.
	r.Listed("capi", errors.New("watch broke"))
	if err := r.Ready(); err != nil {
		t.Fatalf("after a later error: %v", err)
	}
}
