package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/fleetgraph/fleetgraph/internal/retry"
)

// Source is one inventory of clusters.
type Source interface {
	// Name is the source's name in --source, in claims and in logs.
	Name() string
	// Run keeps the registry's claims of this source current until ctx
	// ends. It calls Registry.Listed once its first listing is applied,
	// and with the reason while it cannot list. It returns nil when ctx
	// ends; an error only for a configuration that can never work.
	Run(ctx context.Context, r *Registry) error
}

// Labels and annotations fleetgraph reads on source objects, and the labels
// it gives every cluster from a source.
const (
	// ClusterNameKey, as a label or an annotation of a source object,
	// names its cluster; otherwise the object's name does (for Argo CD,
	// the Secret's "name" field).
	ClusterNameKey = "fleetgraph.io/cluster-name"
	// SourceLabel is set on every cluster from a source to the source's
	// name, so queries can select clusters by where they come from.
	SourceLabel = "fleetgraph.io/source"
	// SourceNamespaceLabel is set to the namespace of the source object.
	SourceNamespaceLabel = "fleetgraph.io/source-namespace"
)

// Options configures the sources that read a management cluster.
type Options struct {
	// Management reaches the cluster that holds the inventory objects.
	Management *rest.Config
	// Namespace limits the gitopscluster, capi and clusterprofile sources
	// to one namespace (so that fleetgraph needs only a Role there);
	// empty means every namespace.
	Namespace string
	// ArgoCDNamespace is where Argo CD keeps its cluster Secrets
	// (default "argocd").
	ArgoCDNamespace string
	// SecretsNamespace and SecretsSelector select the labelled cluster
	// Secrets of the secrets source (default selector
	// "fleetgraph.io/cluster=true").
	SecretsNamespace string
	SecretsSelector  string
	// ProviderFile is the access-provider file of the clusterprofile
	// source (the cluster inventory API's --clusterprofile-provider-file).
	ProviderFile string
	Logger       *slog.Logger
}

// Defaults of Options.
const (
	DefaultArgoCDNamespace = "argocd"
	DefaultSecretsSelector = "fleetgraph.io/cluster=true"
)

// relistEvery is the informers' resync period: a pass over every object
// that recomputes each claim, in case a Secret changed in a way its
// metadata did not show. Claims that did not change cost nothing.
const relistEvery = 10 * time.Minute

// clients are the management cluster's clients a source uses.
type clients struct {
	cfg       *rest.Config
	kube      kubernetes.Interface
	dynamic   dynamic.Interface
	metadata  metadata.Interface
	discovery discovery.DiscoveryInterface
}

func newClients(cfg *rest.Config) (*clients, error) {
	if cfg == nil {
		return nil, errors.New("sources: Options.Management is required")
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("management client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("management dynamic client: %w", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("management metadata client: %w", err)
	}
	return &clients{cfg: cfg, kube: kube, dynamic: dyn, metadata: meta, discovery: kube.Discovery()}, nil
}

// watcher runs one source's level-triggered loop: after its informers
// have synced, and again after every event (coalesced), it computes every
// claim from their caches and applies the difference to the registry.
//
// Concurrency: informer handlers only kick; one goroutine (run) computes
// and applies, so claims of one source are applied in order.
type watcher struct {
	name string
	reg  *Registry
	log  *slog.Logger
	kick chan struct{}
	infs []cache.SharedIndexInformer
}

func newWatcher(name string, reg *Registry, log *slog.Logger) *watcher {
	return &watcher{name: name, reg: reg, log: log.With("source", name), kick: make(chan struct{}, 1)}
}

// add registers an informer whose events recompute the claims. Errors of
// its first list are reported as the source's reason for not being ready.
func (w *watcher) add(inf cache.SharedIndexInformer) error {
	kick := func() {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}); err != nil {
		return fmt.Errorf("source %s: %w", w.name, err)
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.log.Warn("listing or watching source objects failed", "err", err)
		w.reg.Listed(w.name, err)
	}); err != nil {
		return fmt.Errorf("source %s: %w", w.name, err)
	}
	w.infs = append(w.infs, inf)
	return nil
}

// run starts the informers, applies compute's claims after their first
// listing and after every change, and stops when ctx ends. Deleted objects'
// claims are deleted; claims that remain when ctx ends are left, since the
// whole fleet is stopping.
func (w *watcher) run(ctx context.Context, compute func() []Claim) error {
	synced := make([]cache.InformerSynced, len(w.infs))
	done := make(chan struct{})
	for i, inf := range w.infs {
		synced[i] = inf.HasSynced
		go func() {
			defer func() { done <- struct{}{} }()
			inf.RunWithContext(ctx)
		}()
	}
	defer func() {
		for range w.infs {
			<-done
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended first
	}
	prev := map[string]bool{}
	for first := true; ; first = false {
		now := map[string]bool{}
		for _, c := range compute() {
			c.Source = w.name
			now[c.Object] = true
			w.reg.Set(c)
		}
		for obj := range prev {
			if !now[obj] {
				w.reg.Delete(ctx, w.name, obj)
			}
		}
		prev = now
		if first {
			w.reg.Listed(w.name, nil)
			w.log.Info("source listed", "clusters", len(now))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		}
	}
}

// objectRef is "namespace/name", or "name" for a cluster-scoped object.
func objectRef(o metav1.Object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// clusterName is the name a source object gives its cluster: the
// ClusterNameKey label or annotation, else def.
func clusterName(o metav1.Object, def string) string {
	if n := o.GetLabels()[ClusterNameKey]; n != "" {
		return n
	}
	if n := o.GetAnnotations()[ClusterNameKey]; n != "" {
		return n
	}
	return def
}

// clusterLabels are a source object's labels, without ClusterNameKey, plus
// SourceLabel and SourceNamespaceLabel.
func clusterLabels(source string, o metav1.Object, drop ...string) map[string]string {
	out := maps.Clone(o.GetLabels())
	if out == nil {
		out = map[string]string{}
	}
	delete(out, ClusterNameKey)
	for _, k := range drop {
		delete(out, k)
	}
	out[SourceLabel] = source
	if ns := o.GetNamespace(); ns != "" {
		out[SourceNamespaceLabel] = ns
	}
	return out
}

// preferredResource finds the version the management cluster prefers for
// a group and checks that it serves the resource, so that a source can say
// clearly that its CRDs are missing.
func preferredResource(disc discovery.DiscoveryInterface, group, resource string) (schema.GroupVersionResource, error) {
	groups, err := disc.ServerGroups()
	if err != nil {
		return schema.GroupVersionResource{}, fmt.Errorf("discover API groups: %w", err)
	}
	for _, g := range groups.Groups {
		if g.Name != group {
			continue
		}
		versions := []string{g.PreferredVersion.Version}
		for _, v := range g.Versions {
			if v.Version != g.PreferredVersion.Version {
				versions = append(versions, v.Version)
			}
		}
		for _, v := range versions {
			list, err := disc.ServerResourcesForGroupVersion(group + "/" + v)
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return schema.GroupVersionResource{}, fmt.Errorf("discover %s/%s: %w", group, v, err)
			}
			for _, r := range list.APIResources {
				if r.Name == resource {
					return schema.GroupVersionResource{Group: group, Version: v, Resource: resource}, nil
				}
			}
		}
	}
	return schema.GroupVersionResource{}, fmt.Errorf("the management cluster does not serve %s.%s: install its CRD", resource, group)
}

// waitForResource finds a resource, retrying while it is not served and
// reporting why to the registry, until ctx ends.
func waitForResource(ctx context.Context, w *watcher, disc discovery.DiscoveryInterface, group, resource string) (schema.GroupVersionResource, bool) {
	backoff := retry.New(retry.SourceResource, nil)
	for {
		gvr, err := preferredResource(disc, group, resource)
		if err == nil {
			return gvr, true
		}
		wait := backoff.Next()
		w.log.Warn("source resource not available; retrying", "err", err, "retry_in", wait.Round(time.Millisecond))
		w.reg.Listed(w.name, err)
		if !backoff.Sleep(ctx, wait) {
			return gvr, false
		}
	}
}

// sortedKeys quotes and joins map keys, for messages.
func sortedKeys[V any](m map[string]V) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = fmt.Sprintf("%q", k)
	}
	return strings.Join(keys, ", ")
}

// dynamicInformer watches a resource of the management cluster, in one
// namespace or in all, and registers it with w.
func dynamicInformer(c *clients, w *watcher, gvr schema.GroupVersionResource, namespace string) (cache.SharedIndexInformer, error) {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.dynamic, relistEvery, namespace, nil)
	inf := f.ForResource(gvr).Informer()
	if err := w.add(inf); err != nil {
		return nil, err
	}
	return inf, nil
}

// eachObject decodes every cached object of an informer into T, calling fn
// with the object or with the decoding error.
func eachObject[T any](inf cache.SharedIndexInformer, fn func(u *unstructured.Unstructured, obj *T, err error)) {
	for _, raw := range inf.GetStore().List() {
		u, ok := raw.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var obj T
		err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &obj)
		if err != nil {
			err = fmt.Errorf("decode %s %s: %w", u.GetKind(), objectRef(u), err)
		}
		fn(u, &obj, err)
	}
}

// failing is a Config that always fails with err: the claim of a broken
// source object, so that the error shows on its cluster.
func failing(err error) func(context.Context) (*rest.Config, error) {
	return func(context.Context) (*rest.Config, error) { return nil, err }
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}
