package collector

import (
	"context"
	"fmt"
	"net/http"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Clients are the API clients of one cluster, built from one rest.Config.
// They share one HTTP client, so all of a cluster's requests and watches
// share its connections. Core and RBAC kinds use protobuf, which decodes
// several times faster than JSON; custom resources only speak JSON.
type Clients struct {
	// Host is the API server's URL.
	Host string
	// HTTP is the authenticated HTTP client the others use; requests made
	// with it directly are not retried by client-go.
	HTTP      *http.Client
	Kube      kubernetes.Interface
	Istio     istioclient.Interface
	Dynamic   dynamic.Interface
	Discovery discovery.DiscoveryInterface
}

// NewClients builds the clients of a cluster.
func NewClients(cfg *rest.Config) (*Clients, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("http client: %w", err)
	}
	proto := rest.CopyConfig(cfg)
	proto.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	proto.ContentType = "application/vnd.kubernetes.protobuf"
	kube, err := kubernetes.NewForConfigAndClient(proto, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	istio, err := istioclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("istio client: %w", err)
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	return &Clients{Host: cfg.Host, HTTP: hc, Kube: kube, Istio: istio, Dynamic: dyn, Discovery: disco}, nil
}

// listWatchOf adapts a typed client's List and Watch to a ListerWatcher.
func listWatchOf[L runtime.Object](
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return list(ctx, opts)
		},
		WatchFuncWithContext: watchFn,
	}
}

// typed builds an adapter for a kind served by a typed client.
func typed[T runtime.Object, L runtime.Object](
	group, version, kind string,
	newObject func() T,
	client func(c *Clients) (func(context.Context, metav1.ListOptions) (L, error), func(context.Context, metav1.ListOptions) (watch.Interface, error)),
	normalize func(T) Normalized,
) *Adapter {
	return &Adapter{
		Group: group, Version: version, Kind: kind,
		listWatch: func(c *Clients, _ schema.GroupVersionResource) cache.ListerWatcher {
			list, w := client(c)
			return listWatchOf(list, w)
		},
		newObject: func() runtime.Object { return newObject() },
		normalize: func(obj runtime.Object) Normalized {
			t, ok := obj.(T)
			if !ok {
				return Normalized{Status: "UNKNOWN", Message: fmt.Sprintf("unexpected object type %T", obj)}
			}
			return normalize(t)
		},
	}
}
