package conntest

import (
	"context"
	"fmt"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// Burst creates, changes and deletes objects of several kinds in a cluster
// seeded by testcluster.Seed (pods, services, a Kustomization and a
// VirtualService), for tests that check the index follows. It reports
// failures with Errorf, so it may run on its own goroutine.
func Burst(t testing.TB, c *testcluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	dyn := dynamic.NewForConfigOrDie(c.DirectConfig)
	for i := range 10 {
		if _, err := kube.CoreV1().Pods("ns-1").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%d", i), Labels: map[string]string{"burst": "yes"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Errorf("create pod: %v", err)
		}
	}
	for _, svc := range []string{"svc-0", "svc-1"} {
		if err := kube.CoreV1().Services("ns-2").Delete(ctx, svc, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete service: %v", err)
		}
	}
	for i := range 4 {
		pod, err := kube.CoreV1().Pods("ns-3").Get(ctx, fmt.Sprintf("pod-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Errorf("get pod: %v", err)
			continue
		}
		labels := maps.Clone(pod.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels["changed"] = "yes"
		pod.Labels = labels
		if _, err := kube.CoreV1().Pods("ns-3").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Errorf("update pod: %v", err)
		}
	}
	ks := dyn.Resource(testcluster.GVRKustomization).Namespace("ns-0")
	obj, err := ks.Get(ctx, "apps", metav1.GetOptions{})
	if err != nil {
		t.Errorf("get kustomization: %v", err)
		return
	}
	obj.Object["status"] = map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "False", "reason": "BuildFailed", "message": "burst broke it",
		"lastTransitionTime": "2026-01-01T00:00:00Z",
	}}}
	if _, err := ks.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Errorf("update kustomization status: %v", err)
	}
	if err := dyn.Resource(testcluster.GVRVirtualService).Namespace("ns-1").Delete(ctx, "routes", metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete virtualservice: %v", err)
	}
}
