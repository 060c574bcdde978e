package testcluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Resources the seeder writes, by the short names Seed uses.
var (
	GVRNamespace      = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	GVRPod            = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	GVRService        = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	GVRConfigMap      = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	GVREndpointSlice  = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	GVRKustomization  = schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}
	GVRHelmRelease    = schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"}
	GVRGitRepository  = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "gitrepositories"}
	GVRVirtualService = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
	GVRDestRule       = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "destinationrules"}
	GVRGateway        = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "gateways"}
)

// SeedOptions says how many objects Seed creates. Every namespace gets the
// same mix, so counts are predictable: see SeedResult.
type SeedOptions struct {
	// Prefix names the namespaces: <Prefix>-0, <Prefix>-1, ...
	Prefix     string
	Namespaces int
	// Pods, Services (each with one EndpointSlice) per namespace.
	Pods     int
	Services int
	// Flux adds a GitRepository, a Kustomization and a HelmRelease per
	// namespace; the Flux CRDs must be installed.
	Flux bool
	// Istio adds a VirtualService, a DestinationRule and a Gateway per
	// namespace; the Istio CRDs must be installed.
	Istio bool
	// Workers is the number of concurrent writers; default 16.
	Workers int
}

// SeedResult counts what Seed created, by resource.
type SeedResult struct {
	Created map[schema.GroupVersionResource]int
	Total   int
}

// Seed creates namespaces full of objects in mixed states: running,
// pending and crash-looping pods; ready, failing and reconciling Flux
// objects. Statuses are written through the status subresource, as
// controllers would. It uses the direct connection.
func (c *Cluster) Seed(ctx context.Context, opts SeedOptions) (SeedResult, error) {
	if opts.Prefix == "" {
		opts.Prefix = "ns"
	}
	if opts.Workers <= 0 {
		opts.Workers = 16
	}
	cfg := *c.DirectConfig
	client, err := dynamic.NewForConfig(&cfg)
	if err != nil {
		return SeedResult{}, fmt.Errorf("dynamic client: %w", err)
	}

	// Namespaces first, so that everything else can go in parallel.
	for i := range opts.Namespaces {
		ns := fmt.Sprintf("%s-%d", opts.Prefix, i)
		obj := object("v1", "Namespace", "", ns, map[string]any{"team": fmt.Sprintf("team-%d", i%5)})
		if err := create(ctx, client, GVRNamespace, obj, nil); err != nil {
			return SeedResult{}, err
		}
	}

	type job struct {
		gvr    schema.GroupVersionResource
		obj    *unstructured.Unstructured
		status map[string]any
	}
	jobs := make(chan job)
	var (
		mu       sync.Mutex
		created  = map[schema.GroupVersionResource]int{GVRNamespace: opts.Namespaces}
		firstErr error
		failed   atomic.Bool
		wg       sync.WaitGroup
	)
	for range opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if failed.Load() {
					continue
				}
				if err := create(ctx, client, j.gvr, j.obj, j.status); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					failed.Store(true)
					continue
				}
				mu.Lock()
				created[j.gvr]++
				mu.Unlock()
			}
		}()
	}

	send := func(gvr schema.GroupVersionResource, obj *unstructured.Unstructured, status map[string]any) bool {
		select {
		case jobs <- job{gvr, obj, status}:
			return true
		case <-ctx.Done():
			return false
		}
	}
produce:
	for i := range opts.Namespaces {
		ns := fmt.Sprintf("%s-%d", opts.Prefix, i)
		for p := range opts.Pods {
			obj, status := seedPod(ns, fmt.Sprintf("pod-%d", p), i*opts.Pods+p)
			if !send(GVRPod, obj, status) {
				break produce
			}
		}
		for s := range opts.Services {
			name := fmt.Sprintf("svc-%d", s)
			if !send(GVRService, seedService(ns, name), nil) || !send(GVREndpointSlice, seedEndpointSlice(ns, name), nil) {
				break produce
			}
		}
		if opts.Flux {
			for _, f := range seedFlux(ns, i) {
				if !send(f.gvr, f.obj, f.status) {
					break produce
				}
			}
		}
		if opts.Istio {
			for _, f := range seedIstio(ns) {
				if !send(f.gvr, f.obj, nil) {
					break produce
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return SeedResult{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return SeedResult{}, fmt.Errorf("seed: %w", err)
	}
	res := SeedResult{Created: created}
	for _, n := range created {
		res.Total += n
	}
	return res, nil
}

// create creates an object and then, if status is set, writes its status.
// Objects that exist already are left alone.
func create(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, obj *unstructured.Unstructured, status map[string]any) error {
	ri := client.Resource(gvr).Namespace(obj.GetNamespace())
	got, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create %s %s/%s: %w", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
	}
	if status == nil {
		return nil
	}
	got.Object["status"] = status
	if _, err := ri.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of %s %s/%s: %w", gvr.Resource, obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

func object(apiVersion, kind, namespace, name string, labels map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": name}
	if namespace != "" {
		meta["namespace"] = namespace
	}
	if labels != nil {
		meta["labels"] = labels
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}}
}

// seedPod returns a pod and a status: mostly running and ready, some
// pending, some crash-looping.
func seedPod(ns, name string, n int) (*unstructured.Unstructured, map[string]any) {
	app := fmt.Sprintf("app-%d", n%7)
	obj := object("v1", "Pod", ns, name, map[string]any{"app": app, "tier": []string{"web", "api", "db"}[n%3]})
	obj.Object["spec"] = map[string]any{
		"nodeName":   fmt.Sprintf("node-%d", n%4),
		"containers": []any{map[string]any{"name": "main", "image": "registry.example/" + app + ":1.0"}},
	}
	started := "2026-01-01T00:00:00Z"
	switch n % 10 {
	case 9: // crash-looping
		return obj, map[string]any{
			"phase": "Running",
			"conditions": []any{
				map[string]any{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [main]"},
			},
			"containerStatuses": []any{map[string]any{
				"name": "main", "ready": false, "restartCount": int64(7), "image": "x", "imageID": "",
				"state": map[string]any{"waiting": map[string]any{"reason": "CrashLoopBackOff", "message": "back-off restarting failed container main"}},
			}},
		}
	case 8: // pending
		return obj, map[string]any{
			"phase":      "Pending",
			"conditions": []any{map[string]any{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes are available"}},
		}
	default:
		return obj, map[string]any{
			"phase":      "Running",
			"startTime":  started,
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}},
			"containerStatuses": []any{map[string]any{
				"name": "main", "ready": true, "restartCount": int64(n % 2), "image": "x", "imageID": "",
				"state": map[string]any{"running": map[string]any{"startedAt": started}},
			}},
		}
	}
}

func seedService(ns, name string) *unstructured.Unstructured {
	obj := object("v1", "Service", ns, name, map[string]any{"app": name})
	obj.Object["spec"] = map[string]any{
		"selector": map[string]any{"app": name},
		"ports":    []any{map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}},
	}
	return obj
}

func seedEndpointSlice(ns, service string) *unstructured.Unstructured {
	obj := object("discovery.k8s.io/v1", "EndpointSlice", ns, service+"-abc", map[string]any{"kubernetes.io/service-name": service})
	obj.Object["addressType"] = "IPv4"
	obj.Object["endpoints"] = []any{map[string]any{"addresses": []any{"10.1.0.1"}, "conditions": map[string]any{"ready": true}}}
	obj.Object["ports"] = []any{map[string]any{"name": "http", "port": int64(8080), "protocol": "TCP"}}
	return obj
}

type seedObject struct {
	gvr    schema.GroupVersionResource
	obj    *unstructured.Unstructured
	status map[string]any
}

// readyCondition is a Flux-style Ready condition.
func readyCondition(status, reason, message string) map[string]any {
	return map[string]any{
		"type": "Ready", "status": status, "reason": reason, "message": message,
		"lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": int64(1),
	}
}

// seedFlux returns a GitRepository, a Kustomization and a HelmRelease in
// one of three states: ready, failed or reconciling.
func seedFlux(ns string, n int) []seedObject {
	var cond map[string]any
	switch n % 6 {
	case 4:
		cond = readyCondition("False", "BuildFailed", "kustomize build failed: accumulating resources: missing file")
	case 5:
		cond = readyCondition("Unknown", "Progressing", "reconciliation in progress")
	default:
		cond = readyCondition("True", "ReconciliationSucceeded", "Applied revision: main@sha1:0123abcd")
	}
	status := map[string]any{"observedGeneration": int64(1), "conditions": []any{cond}, "lastAppliedRevision": "main@sha1:0123abcd"}

	git := object("source.toolkit.fluxcd.io/v1", "GitRepository", ns, "repo", nil)
	git.Object["spec"] = map[string]any{"url": "https://git.example/" + ns, "interval": "1m", "ref": map[string]any{"branch": "main"}}
	ks := object("kustomize.toolkit.fluxcd.io/v1", "Kustomization", ns, "apps", nil)
	ks.Object["spec"] = map[string]any{
		"interval": "5m", "path": "./deploy", "prune": true,
		"sourceRef": map[string]any{"kind": "GitRepository", "name": "repo"},
	}
	hr := object("helm.toolkit.fluxcd.io/v2", "HelmRelease", ns, "chart", nil)
	hr.Object["spec"] = map[string]any{"interval": "5m", "chart": map[string]any{"spec": map[string]any{
		"chart": "podinfo", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "charts"},
	}}}
	return []seedObject{
		{GVRGitRepository, git, map[string]any{"observedGeneration": int64(1), "conditions": []any{readyCondition("True", "Succeeded", "stored artifact for revision main@sha1:0123abcd")}}},
		{GVRKustomization, ks, status},
		{GVRHelmRelease, hr, status},
	}
}

func seedIstio(ns string) []seedObject {
	host := "svc-0." + ns + ".svc.cluster.local"
	vs := object("networking.istio.io/v1", "VirtualService", ns, "routes", nil)
	vs.Object["spec"] = map[string]any{
		"hosts": []any{host}, "gateways": []any{"gateway"},
		"http": []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": host}}}}},
	}
	dr := object("networking.istio.io/v1", "DestinationRule", ns, "policy", nil)
	dr.Object["spec"] = map[string]any{"host": host, "trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}}}
	gw := object("networking.istio.io/v1", "Gateway", ns, "gateway", nil)
	gw.Object["spec"] = map[string]any{
		"selector": map[string]any{"istio": "ingressgateway"},
		"servers":  []any{map[string]any{"port": map[string]any{"number": int64(80), "name": "http", "protocol": "HTTP"}, "hosts": []any{"*"}}},
	}
	return []seedObject{{gvr: GVRVirtualService, obj: vs}, {gvr: GVRDestRule, obj: dr}, {gvr: GVRGateway, obj: gw}}
}
