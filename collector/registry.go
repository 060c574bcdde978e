package collector

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/index"
)

// Adapter knows how to list, watch and normalize one kind. Adapters for
// typed clients (core, RBAC, Istio) name an exact version; dynamic ones
// (Flux, extra kinds) leave Version empty and use the version discovery
// prefers for the group.
type Adapter struct {
	// Group, Version and Kind name the kind. Resource and scope come from
	// discovery.
	Group, Version, Kind string
	// listWatch returns a ListerWatcher over every namespace.
	listWatch func(c *Clients, gvr schema.GroupVersionResource) cache.ListerWatcher
	// newObject returns an empty object of the kind, for the reflector.
	newObject func() runtime.Object
	// normalize computes the kind-specific part of a row.
	normalize func(obj runtime.Object) Normalized
}

// Normalized is the kind-specific part of a row: what a status function
// says about the object, and the policy of RBAC rows.
type Normalized struct {
	Status  index.Status
	Message string
	// Summary holds a few kind-specific columns; it becomes the row's JSON
	// summary.
	Summary map[string]any
	Policy  *index.Policy
}

// GroupKind returns "Kind" or "Kind.group".
func (a *Adapter) GroupKind() string {
	return index.Kind{Group: a.Group, Kind: a.Kind}.GroupKind()
}

// Registry is the ordered set of kinds a collector collects. It is built
// once at start-up and read concurrently afterwards.
type Registry struct {
	adapters []*Adapter
}

// NewRegistry returns a registry of the default kinds: core, Istio, Flux and
// RBAC (see DefaultKinds).
func NewRegistry() *Registry {
	r := &Registry{}
	r.adapters = append(r.adapters, coreAdapters()...)
	r.adapters = append(r.adapters, istioAdapters()...)
	r.adapters = append(r.adapters, fluxAdapters()...)
	r.adapters = append(r.adapters, rbacAdapters()...)
	return r
}

// RegistryFor returns the default registry restricted to kinds (none: all)
// and with extraKinds ("group/version/Kind") added, as the --kinds and
// --extra-kinds flags say.
func RegistryFor(kinds, extraKinds []string) (*Registry, error) {
	r := NewRegistry()
	if err := r.Restrict(kinds); err != nil {
		return nil, fmt.Errorf("kinds: %w", err)
	}
	for _, k := range extraKinds {
		if err := r.AddGVK(k); err != nil {
			return nil, fmt.Errorf("extra kinds: %w", err)
		}
	}
	return r, nil
}

// Adapters returns the registry's adapters in order.
func (r *Registry) Adapters() []*Adapter { return r.adapters }

// Restrict keeps only the kinds named, as "Kind" or "Kind.group"
// (case-insensitive). RBAC kinds are always kept because authz needs them.
// It fails on a name that matches no kind, so a typo is not silently
// ignored.
func (r *Registry) Restrict(names []string) error {
	if len(names) == 0 {
		return nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[strings.ToLower(strings.TrimSpace(n))] = false
	}
	var kept []*Adapter
	for _, a := range r.adapters {
		gk, k := strings.ToLower(a.GroupKind()), strings.ToLower(a.Kind)
		_, byGK := want[gk]
		_, byKind := want[k]
		switch {
		case byGK:
			want[gk] = true
		case byKind:
			want[k] = true
		case a.Group != index.RBACGroup:
			continue
		}
		kept = append(kept, a)
	}
	for n, found := range want {
		if !found {
			return fmt.Errorf("unknown kind %q: add it with its group and version (group/version/Kind)", n)
		}
	}
	r.adapters = kept
	return nil
}

// AddGVK adds a kind collected through the dynamic client, with the
// generic kstatus status. spec is "group/version/Kind", or "version/Kind"
// for the core group, for example "apps/v1/Deployment".
func (r *Registry) AddGVK(spec string) error {
	parts := strings.Split(spec, "/")
	var gvk schema.GroupVersionKind
	switch len(parts) {
	case 2:
		gvk = schema.GroupVersionKind{Version: parts[0], Kind: parts[1]}
	case 3:
		gvk = schema.GroupVersionKind{Group: parts[0], Version: parts[1], Kind: parts[2]}
	default:
		return fmt.Errorf("kind %q: want group/version/Kind or version/Kind", spec)
	}
	if gvk.Version == "" || gvk.Kind == "" {
		return fmt.Errorf("kind %q: version and kind must not be empty", spec)
	}
	for _, a := range r.adapters {
		if a.Group == gvk.Group && a.Kind == gvk.Kind {
			return fmt.Errorf("kind %q is collected already", spec)
		}
	}
	r.adapters = append(r.adapters, dynamicAdapter(gvk.Group, gvk.Version, gvk.Kind, genericStatus))
	return nil
}
