package collector

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// The Flux API groups.
const (
	fluxKustomize = "kustomize.toolkit.fluxcd.io"
	fluxHelm      = "helm.toolkit.fluxcd.io"
	fluxSource    = "source.toolkit.fluxcd.io"
)

// fluxAdapters collect the Flux kinds through the dynamic client, in
// whatever version discovery prefers, so one fleetgraph works across Flux
// releases.
func fluxAdapters() []*Adapter {
	return []*Adapter{
		dynamicAdapter(fluxKustomize, "", "Kustomization", fluxStatus(func(u map[string]any) map[string]any {
			return map[string]any{
				"source":    str(u, "spec", "sourceRef", "kind") + "/" + str(u, "spec", "sourceRef", "name"),
				"path":      str(u, "spec", "path"),
				"revision":  str(u, "status", "lastAppliedRevision"),
				"suspended": boolean(u, "spec", "suspend"),
			}
		})),
		dynamicAdapter(fluxHelm, "", "HelmRelease", fluxStatus(func(u map[string]any) map[string]any {
			chart := str(u, "spec", "chart", "spec", "chart")
			if chart == "" {
				chart = str(u, "spec", "chartRef", "kind") + "/" + str(u, "spec", "chartRef", "name")
			}
			return map[string]any{
				"chart":     chart,
				"version":   str(u, "spec", "chart", "spec", "version"),
				"revision":  str(u, "status", "lastAttemptedRevision"),
				"suspended": boolean(u, "spec", "suspend"),
			}
		})),
		dynamicAdapter(fluxSource, "", "GitRepository", fluxStatus(func(u map[string]any) map[string]any {
			ref := firstNonEmpty(str(u, "spec", "ref", "branch"), str(u, "spec", "ref", "tag"),
				str(u, "spec", "ref", "semver"), str(u, "spec", "ref", "name"), str(u, "spec", "ref", "commit"))
			return map[string]any{"url": str(u, "spec", "url"), "ref": ref, "revision": str(u, "status", "artifact", "revision")}
		})),
		dynamicAdapter(fluxSource, "", "OCIRepository", fluxStatus(func(u map[string]any) map[string]any {
			ref := firstNonEmpty(str(u, "spec", "ref", "tag"), str(u, "spec", "ref", "semver"), str(u, "spec", "ref", "digest"))
			return map[string]any{"url": str(u, "spec", "url"), "ref": ref, "revision": str(u, "status", "artifact", "revision")}
		})),
		dynamicAdapter(fluxSource, "", "HelmRepository", fluxStatus(func(u map[string]any) map[string]any {
			return map[string]any{"url": str(u, "spec", "url"), "type": firstNonEmpty(str(u, "spec", "type"), "default")}
		})),
		dynamicAdapter(fluxSource, "", "HelmChart", fluxStatus(func(u map[string]any) map[string]any {
			return map[string]any{
				"chart": str(u, "spec", "chart"), "version": str(u, "spec", "version"),
				"source":   str(u, "spec", "sourceRef", "kind") + "/" + str(u, "spec", "sourceRef", "name"),
				"revision": str(u, "status", "artifact", "revision"),
			}
		})),
		dynamicAdapter(fluxSource, "", "Bucket", fluxStatus(func(u map[string]any) map[string]any {
			return map[string]any{
				"bucket": str(u, "spec", "bucketName"), "endpoint": str(u, "spec", "endpoint"),
				"provider": firstNonEmpty(str(u, "spec", "provider"), "generic"), "revision": str(u, "status", "artifact", "revision"),
			}
		})),
	}
}

// dynamicAdapter builds an adapter served through the dynamic client.
// version may be empty: discovery then picks it.
func dynamicAdapter(group, version, kind string, normalize func(*unstructured.Unstructured) Normalized) *Adapter {
	return &Adapter{
		Group: group, Version: version, Kind: kind,
		listWatch: func(c *Clients, gvr schema.GroupVersionResource) cache.ListerWatcher {
			ri := c.Dynamic.Resource(gvr).Namespace(metav1.NamespaceAll)
			return listWatchOf(
				func(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
					return ri.List(ctx, o)
				},
				func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return ri.Watch(ctx, o) },
			)
		},
		newObject: func() runtime.Object { return &unstructured.Unstructured{} },
		normalize: func(obj runtime.Object) Normalized {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return Normalized{Status: "UNKNOWN", Message: "unexpected object type"}
			}
			return normalize(u)
		},
	}
}

func str(obj map[string]any, fields ...string) string {
	s, _, _ := unstructured.NestedString(obj, fields...)
	return s
}

func boolean(obj map[string]any, fields ...string) bool {
	b, _, _ := unstructured.NestedBool(obj, fields...)
	return b
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
