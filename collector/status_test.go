package collector

import (
	"strings"
	"testing"

	analysisapi "istio.io/api/analysis/v1alpha1"
	metaapi "istio.io/api/meta/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/fleetgraph/fleetgraph/index"
)

func TestPodStatus(t *testing.T) {
	now := metav1.Now()
	running := func(ready bool, restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{
			Name: "c", Ready: ready, RestartCount: restarts,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}
	}
	waiting := func(reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "details"}}}
	}
	cases := []struct {
		name    string
		pod     corev1.Pod
		want    index.Status
		message string
	}{
		{
			"running and ready",
			corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{running(true, 0)}}},
			index.StatusHealthy, "",
		},
		{
			"running, not ready",
			corev1.Pod{Status: corev1.PodStatus{
				Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{running(false, 0)},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}},
			}},
			index.StatusProgressing, "ContainersNotReady",
		},
		{
			"crash loop",
			corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{waiting("CrashLoopBackOff")}}},
			index.StatusUnhealthy, "CrashLoopBackOff: details",
		},
		{
			"image pull in an init container",
			corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{waiting("ImagePullBackOff")}}},
			index.StatusUnhealthy, "ImagePullBackOff",
		},
		{
			"pending, creating",
			corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{waiting("ContainerCreating")}}},
			index.StatusProgressing, "ContainerCreating",
		},
		{
			"unschedulable",
			corev1.Pod{Status: corev1.PodStatus{
				Phase:      corev1.PodPending,
				Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes"}},
			}},
			index.StatusProgressing, "Unschedulable: 0/3 nodes",
		},
		{"succeeded", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, index.StatusHealthy, "completed"},
		{
			"failed",
			corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "low memory"}},
			index.StatusUnhealthy, "Evicted: low memory",
		},
		{
			"terminating",
			corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			index.StatusTerminating, "deletion requested",
		},
		{"unknown phase", corev1.Pod{Status: corev1.PodStatus{Phase: "Weird"}}, index.StatusUnknown, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.pod.Spec.Containers = []corev1.Container{{Name: "c"}}
			got := podStatus(&tc.pod)
			if got.Status != tc.want || !strings.Contains(got.Message, tc.message) {
				t.Fatalf("got %s %q, want %s containing %q", got.Status, got.Message, tc.want, tc.message)
			}
			if got.Summary["ready"] == nil || got.Summary["phase"] != string(tc.pod.Status.Phase) {
				t.Fatalf("summary %v", got.Summary)
			}
		})
	}
}

func TestServiceAndEndpointSliceStatus(t *testing.T) {
	lb := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 443, Protocol: corev1.ProtocolTCP}}}}
	if n := serviceStatus(lb); n.Status != index.StatusProgressing || n.Summary["type"] != "LoadBalancer" {
		t.Errorf("pending load balancer: %+v", n)
	}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "1.2.3.4"}}
	if n := serviceStatus(lb); n.Status != index.StatusHealthy || n.Summary["ports"].([]string)[0] != "443/TCP" {
		t.Errorf("load balancer with address: %+v", n)
	}

	slice := &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{{Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}}}
	if n := endpointSliceStatus(slice); n.Status != index.StatusUnhealthy || n.Message != "no ready endpoints" {
		t.Errorf("no ready endpoints: %+v", n)
	}
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{})
	if n := endpointSliceStatus(slice); n.Status != index.StatusHealthy || n.Summary["ready"] != 1 {
		t.Errorf("one ready endpoint: %+v", n)
	}
	if n := endpointSliceStatus(&discoveryv1.EndpointSlice{}); n.Status != index.StatusHealthy {
		t.Errorf("empty slice: %+v", n)
	}
}

func TestNamespaceStatus(t *testing.T) {
	if n := namespaceStatus(&corev1.Namespace{Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}); n.Status != index.StatusHealthy {
		t.Errorf("active: %+v", n)
	}
	if n := namespaceStatus(&corev1.Namespace{Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}); n.Status != index.StatusTerminating {
		t.Errorf("terminating: %+v", n)
	}
}

func flux(generation, observed int64, suspend bool, conds ...map[string]any) *unstructured.Unstructured {
	items := make([]any, len(conds))
	for i, c := range conds {
		items[i] = c
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
		"metadata": map[string]any{"name": "apps", "namespace": "ns", "generation": generation},
		"spec":     map[string]any{"suspend": suspend, "path": "./deploy", "sourceRef": map[string]any{"kind": "GitRepository", "name": "repo"}},
		"status":   map[string]any{"observedGeneration": observed, "conditions": items, "lastAppliedRevision": "main@sha1:abc"},
	}}
	return u
}

func cond(typ, status, reason, message string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": message}
}

func TestFluxStatus(t *testing.T) {
	status := fluxAdapters()[0].normalize
	cases := []struct {
		name    string
		obj     *unstructured.Unstructured
		want    index.Status
		message string
	}{
		{"ready", flux(1, 1, false, cond("Ready", "True", "ReconciliationSucceeded", "Applied revision: main@sha1:abc")), index.StatusHealthy, "Applied revision"},
		// kstatus calls this "current"; for Flux it is a failed reconciliation.
		{"ready false", flux(1, 1, false, cond("Ready", "False", "BuildFailed", "kustomize build failed")), index.StatusUnhealthy, "BuildFailed: kustomize build failed"},
		{"ready unknown", flux(1, 1, false, cond("Ready", "Unknown", "Progressing", "reconciliation in progress")), index.StatusProgressing, "in progress"},
		{"reconciling", flux(1, 1, false, cond("Reconciling", "True", "Progressing", "building"), cond("Ready", "Unknown", "", "")), index.StatusProgressing, "building"},
		{"stalled", flux(1, 1, false, cond("Stalled", "True", "InvalidPath", "path not found"), cond("Ready", "False", "", "")), index.StatusUnhealthy, "path not found"},
		{"generation not observed", flux(2, 1, false, cond("Ready", "True", "", "")), index.StatusProgressing, ""},
		{"never reconciled", flux(1, 1, false), index.StatusProgressing, "not reconciled yet"},
		{"suspended", flux(1, 1, true, cond("Ready", "True", "", "ok")), index.StatusHealthy, "suspended"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := status(tc.obj)
			if got.Status != tc.want || !strings.Contains(got.Message, tc.message) {
				t.Fatalf("got %s %q, want %s containing %q", got.Status, got.Message, tc.want, tc.message)
			}
			if got.Summary["source"] != "GitRepository/repo" || got.Summary["revision"] != "main@sha1:abc" {
				t.Fatalf("summary %v", got.Summary)
			}
		})
	}
}

func TestIstioStatus(t *testing.T) {
	errMsg := &analysisapi.AnalysisMessageBase{
		Level: analysisapi.AnalysisMessageBase_ERROR,
		Type:  &analysisapi.AnalysisMessageBase_Type{Code: "IST0101", Name: "ReferencedResourceNotFound"},
	}
	warn := &analysisapi.AnalysisMessageBase{
		Level: analysisapi.AnalysisMessageBase_WARNING,
		Type:  &analysisapi.AnalysisMessageBase_Type{Code: "IST0102", Name: "NamespaceNotInjected"},
	}
	cases := []struct {
		name    string
		st      *metaapi.IstioStatus
		gen     int64
		want    index.Status
		message string
	}{
		{"no status", &metaapi.IstioStatus{}, 1, index.StatusHealthy, ""},
		{"error message", &metaapi.IstioStatus{ValidationMessages: []*analysisapi.AnalysisMessageBase{warn, errMsg}}, 1, index.StatusUnhealthy, "IST0101"},
		{"warning only", &metaapi.IstioStatus{ValidationMessages: []*analysisapi.AnalysisMessageBase{warn}}, 1, index.StatusHealthy, "IST0102"},
		{"condition false", &metaapi.IstioStatus{Conditions: []*metaapi.IstioCondition{{Type: "Reconciled", Status: "False", Message: "not yet"}}}, 1, index.StatusProgressing, "Reconciled: not yet"},
		{"old generation", &metaapi.IstioStatus{ObservedGeneration: 1}, 2, index.StatusProgressing, "not yet observed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := istioStatus(tc.st, tc.gen, nil)
			if got.Status != tc.want || !strings.Contains(got.Message, tc.message) {
				t.Fatalf("got %s %q, want %s containing %q", got.Status, got.Message, tc.want, tc.message)
			}
		})
	}
}

func TestGenericStatusUsesKstatus(t *testing.T) {
	deploy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": "web", "generation": int64(3)},
		"spec":     map[string]any{"replicas": int64(2)},
		"status":   map[string]any{"observedGeneration": int64(2)},
	}}
	if got := genericStatus(deploy); got.Status != index.StatusProgressing {
		t.Errorf("unobserved generation: %+v", got)
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	if n := len(r.Adapters()); n != 24 {
		t.Fatalf("%d default kinds, want 24", n)
	}
	if err := r.AddGVK("apps/v1/Deployment"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"Deployment", "apps//Deployment", "a/b/c/d", "v1/Pod"} {
		if err := r.AddGVK(bad); err == nil {
			t.Errorf("AddGVK(%q) accepted", bad)
		}
	}
	if err := r.Restrict([]string{"pod", "Kustomization.kustomize.toolkit.fluxcd.io"}); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, a := range r.Adapters() {
		kinds = append(kinds, a.Kind)
	}
	if got := strings.Join(kinds, ","); got != "Pod,Kustomization,Role,ClusterRole,RoleBinding,ClusterRoleBinding" {
		t.Errorf("restricted kinds: %s", got)
	}
	if err := NewRegistry().Restrict([]string{"Podd"}); err == nil || !strings.Contains(err.Error(), "podd") {
		t.Errorf("a typo was accepted: %v", err)
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("héllo", 2); got != "h…" {
		t.Errorf("truncate on a rune boundary: %q", got)
	}
	if got := truncate("short", 10); got != "short" {
		t.Errorf("%q", got)
	}
}
