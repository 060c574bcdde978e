package collector

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/fleetgraph/fleetgraph/index"
)

// Status functions are pure functions over one object, dispatched by kind
// through the registry. They say what a platform engineer scanning a list
// wants to know: is it fine, on its way, broken, or going away, and why.

// terminating reports the status of an object that is being deleted.
func terminating(m *metav1.ObjectMeta) (Normalized, bool) {
	if m.DeletionTimestamp == nil {
		return Normalized{}, false
	}
	return Normalized{Status: index.StatusTerminating, Message: "deletion requested at " + m.DeletionTimestamp.UTC().Format("2006-01-02T15:04:05Z")}, true
}

func namespaceStatus(ns *corev1.Namespace) Normalized {
	if n, ok := terminating(&ns.ObjectMeta); ok {
		return n
	}
	if ns.Status.Phase == corev1.NamespaceTerminating {
		return Normalized{Status: index.StatusTerminating, Message: "namespace is terminating"}
	}
	return Normalized{Status: index.StatusHealthy, Summary: map[string]any{"phase": string(ns.Status.Phase)}}
}

// podFailureReasons are container waiting reasons that will not fix
// themselves: the pod is unhealthy, not merely starting.
var podFailureReasons = map[string]bool{
	"CrashLoopBackOff": true, "ImagePullBackOff": true, "ErrImagePull": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
	"ErrImageNeverPull": true, "PreCreateHookError": true, "PostStartHookError": true,
}

// podStatus follows what `kubectl get pods` shows: a crash-looping or
// image-pull-failing container makes the pod unhealthy, Failed is
// unhealthy, Succeeded is healthy, and a running pod is healthy only when
// every container is ready.
func podStatus(p *corev1.Pod) Normalized {
	var restarts int32
	ready := 0
	for _, c := range p.Status.ContainerStatuses {
		restarts += c.RestartCount
		if c.Ready {
			ready++
		}
	}
	summary := map[string]any{
		"phase":    string(p.Status.Phase),
		"ready":    fmt.Sprintf("%d/%d", ready, len(p.Spec.Containers)),
		"restarts": restarts,
		"node":     p.Spec.NodeName,
	}
	if p.Status.PodIP != "" {
		summary["ip"] = p.Status.PodIP
	}
	n := Normalized{Summary: summary}
	if t, ok := terminating(&p.ObjectMeta); ok {
		t.Summary = summary
		return t
	}
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, c := range statuses {
			if w := c.State.Waiting; w != nil && podFailureReasons[w.Reason] {
				n.Status, n.Message = index.StatusUnhealthy, joinReason(w.Reason, w.Message)
				return n
			}
			if t := c.State.Terminated; t != nil && t.ExitCode != 0 && p.Status.Phase == corev1.PodRunning {
				n.Status, n.Message = index.StatusUnhealthy, joinReason(t.Reason, fmt.Sprintf("container %s exited with code %d", c.Name, t.ExitCode))
				return n
			}
		}
	}
	switch p.Status.Phase {
	case corev1.PodSucceeded:
		n.Status, n.Message = index.StatusHealthy, "completed"
	case corev1.PodFailed:
		n.Status, n.Message = index.StatusUnhealthy, joinReason(p.Status.Reason, p.Status.Message)
	case corev1.PodRunning:
		if ready == len(p.Spec.Containers) {
			n.Status = index.StatusHealthy
		} else {
			n.Status, n.Message = index.StatusProgressing, conditionMessage(p.Status.Conditions, corev1.PodReady)
		}
	case corev1.PodPending:
		n.Status, n.Message = index.StatusProgressing, pendingMessage(p)
	default:
		n.Status, n.Message = index.StatusUnknown, joinReason(p.Status.Reason, p.Status.Message)
	}
	return n
}

// pendingMessage explains why a pod is pending: a waiting container's
// reason, or the scheduler's.
func pendingMessage(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil {
			return joinReason(w.Reason, w.Message)
		}
	}
	if m := conditionMessage(p.Status.Conditions, corev1.PodScheduled); m != "" {
		return m
	}
	return "pending"
}

func conditionMessage(conds []corev1.PodCondition, t corev1.PodConditionType) string {
	for _, c := range conds {
		if c.Type == t && c.Status != corev1.ConditionTrue {
			return joinReason(c.Reason, c.Message)
		}
	}
	return ""
}

func joinReason(reason, message string) string {
	switch {
	case reason == "":
		return message
	case message == "":
		return reason
	default:
		return reason + ": " + message
	}
}

// serviceStatus: a LoadBalancer without an ingress address is still
// progressing; every other service is healthy as soon as it exists.
func serviceStatus(s *corev1.Service) Normalized {
	ports := make([]string, 0, len(s.Spec.Ports))
	for _, p := range s.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
	}
	n := Normalized{Status: index.StatusHealthy, Summary: map[string]any{
		"type": string(s.Spec.Type), "clusterIP": s.Spec.ClusterIP, "ports": ports,
	}}
	if t, ok := terminating(&s.ObjectMeta); ok {
		t.Summary = n.Summary
		return t
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer && len(s.Status.LoadBalancer.Ingress) == 0 {
		n.Status, n.Message = index.StatusProgressing, "waiting for a load balancer address"
	}
	return n
}

// endpointSliceStatus: a slice with endpoints but none ready means the
// service has no working backend; an empty slice is healthy (nothing
// selected, nothing broken).
func endpointSliceStatus(e *discoveryv1.EndpointSlice) Normalized {
	ready := 0
	for _, ep := range e.Endpoints {
		if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
			ready++
		}
	}
	n := Normalized{Status: index.StatusHealthy, Summary: map[string]any{
		"service": e.Labels[discoveryv1.LabelServiceName], "addressType": string(e.AddressType),
		"endpoints": len(e.Endpoints), "ready": ready,
	}}
	if t, ok := terminating(&e.ObjectMeta); ok {
		t.Summary = n.Summary
		return t
	}
	if len(e.Endpoints) > 0 && ready == 0 {
		n.Status, n.Message = index.StatusUnhealthy, "no ready endpoints"
	}
	return n
}

// genericStatus maps kstatus onto fleetgraph statuses, for kinds without a
// rule of their own.
func genericStatus(u *unstructured.Unstructured) Normalized {
	res, err := kstatus.Compute(u)
	if err != nil {
		return Normalized{Status: index.StatusUnknown, Message: err.Error()}
	}
	return Normalized{Status: fromKstatus(res.Status), Message: res.Message}
}

func fromKstatus(s kstatus.Status) index.Status {
	switch s {
	case kstatus.CurrentStatus:
		return index.StatusHealthy
	case kstatus.InProgressStatus:
		return index.StatusProgressing
	case kstatus.FailedStatus:
		return index.StatusUnhealthy
	case kstatus.TerminatingStatus:
		return index.StatusTerminating
	default:
		return index.StatusUnknown
	}
}

// fluxStatus returns the status function of a Flux kind. kstatus decides
// deletion (TERMINATING) and Stalled (UNHEALTHY). Then an unobserved
// generation or Reconciling=True is PROGRESSING, and otherwise the Ready
// condition decides: for Flux, Ready=False means the last reconciliation
// failed, which is UNHEALTHY, whatever kstatus makes of it. Suspended
// objects say so in the message.
func fluxStatus(summary func(map[string]any) map[string]any) func(*unstructured.Unstructured) Normalized {
	return func(u *unstructured.Unstructured) Normalized {
		n := genericStatus(u)
		n.Summary = summary(u.Object)
		if n.Status != index.StatusTerminating && n.Status != index.StatusUnhealthy {
			n.Status, n.Message = fluxReady(u)
		}
		if boolean(u.Object, "spec", "suspend") {
			n.Message = strings.TrimSpace("suspended. " + n.Message)
		}
		return n
	}
}

func fluxReady(u *unstructured.Unstructured) (index.Status, string) {
	generation := u.GetGeneration()
	observed, found, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	if found && observed < generation {
		return index.StatusProgressing, fmt.Sprintf("generation %d not yet reconciled (last reconciled %d)", generation, observed)
	}
	if c, ok := findCondition(u, "Reconciling"); ok && c.Status == string(corev1.ConditionTrue) {
		return index.StatusProgressing, joinReason(c.Reason, c.Message)
	}
	ready, ok := findCondition(u, "Ready")
	switch {
	case !ok:
		return index.StatusProgressing, "not reconciled yet"
	case ready.Status == string(corev1.ConditionTrue):
		return index.StatusHealthy, ready.Message
	case ready.Status == string(corev1.ConditionFalse):
		return index.StatusUnhealthy, joinReason(ready.Reason, ready.Message)
	default:
		return index.StatusProgressing, joinReason(ready.Reason, ready.Message)
	}
}

type condition struct {
	Status, Reason, Message string
}

func findCondition(u *unstructured.Unstructured, typ string) (condition, bool) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != typ {
			continue
		}
		s, _ := m["status"].(string)
		r, _ := m["reason"].(string)
		msg, _ := m["message"].(string)
		return condition{Status: s, Reason: r, Message: msg}, true
	}
	return condition{}, false
}
