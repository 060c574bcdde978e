package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// The objects of a simulated leaf cluster (fleetbench fleet). Every cluster
// holds the same mix, built deterministically from the cluster's number,
// so the driver knows what the server holds without asking it. Objects
// are shaped like what kube-apiserver returns (managed fields, owner
// references, a pod's full spec and status), because decoding them is
// much of what a collector pays for.

// simKind is a kind a simulated cluster serves. Built-in kinds are sent as
// protobuf to clients that accept it, as kube-apiserver does; custom
// resources (Flux, Istio) are JSON.
type simKind struct {
	index.Kind
	proto bool
}

// gv returns the kind's apiVersion.
func (k simKind) gv() string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

// gvk returns the kind's group, version and kind.
func (k simKind) gvk() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind.Kind}
}

// simKinds lists every kind a simulated cluster serves: the kinds the
// default collector registry collects, so that a cluster syncs CONNECTED
// with no kind missing.
var simKinds = func() []simKind {
	ks := []simKind{
		{index.Kind{Version: "v1", Kind: "Namespace", Resource: "namespaces"}, true},
		{index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}, true},
		{index.Kind{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true}, true},
		{index.Kind{Group: "discovery.k8s.io", Version: "v1", Kind: "EndpointSlice", Resource: "endpointslices", Namespaced: true}, true},
		{index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRole, Resource: "roles", Namespaced: true}, true},
		{index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRole, Resource: "clusterroles"}, true},
		{index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings", Namespaced: true}, true},
		{index.Kind{Group: index.RBACGroup, Version: "v1", Kind: index.KindClusterRoleBinding, Resource: "clusterrolebindings"}, true},
	}
	for _, k := range indextest.Kinds {
		if k.Group != "" && k.Group != "discovery.k8s.io" {
			ks = append(ks, simKind{Kind: k})
		}
	}
	return ks
}()

// fleetShape is the content of every simulated cluster.
type fleetShape struct {
	Namespaces int // namespaces per cluster
	Pods       int // pods per namespace
	Services   int // services per namespace, each with an EndpointSlice
}

// Cluster-wide RBAC of every simulated cluster, and per namespace: one
// Role and two RoleBindings. Flux and Istio: a GitRepository, a
// Kustomization, a HelmRelease, a VirtualService, a DestinationRule and a
// Gateway per namespace.
const (
	simClusterRoles        = 40
	simClusterRoleBindings = 20
	simRolesPerNS          = 1
	simBindingsPerNS       = 2
)

// count returns how many objects of kind k a cluster holds.
func (s fleetShape) count(k simKind) int {
	switch k.Kind.Kind {
	case "Namespace":
		return s.Namespaces
	case "Pod":
		return s.Namespaces * s.Pods
	case "Service", "EndpointSlice":
		return s.Namespaces * s.Services
	case index.KindRole:
		return s.Namespaces * simRolesPerNS
	case index.KindRoleBinding:
		return s.Namespaces * simBindingsPerNS
	case index.KindClusterRole:
		return simClusterRoles
	case index.KindClusterRoleBinding:
		return simClusterRoleBindings
	case "GitRepository", "Kustomization", "HelmRelease", "VirtualService", "DestinationRule", "Gateway":
		return s.Namespaces
	}
	return 0
}

// perNamespace returns how many objects of kind k each namespace holds
// (0 for cluster-scoped kinds).
func (s fleetShape) perNamespace(k simKind) int {
	if !k.Namespaced {
		return 0
	}
	return s.count(k) / s.Namespaces
}

// objects returns the number of listed objects (RBAC rows are not) and of
// RBAC rows per cluster.
func (s fleetShape) objects() (listed, rbac int) {
	for _, k := range simKinds {
		if k.Group == index.RBACGroup {
			rbac += s.count(k)
		} else {
			listed += s.count(k)
		}
	}
	return listed, rbac
}

// simRef names object i of a kind in a cluster.
type simRef struct {
	cluster, kind, i int
}

// simNamespace returns the name of namespace n.
func simNamespace(n int) string { return "team-" + strconv.Itoa(n) }

// namespaceAndName returns the namespace and name of an object.
func (s fleetShape) namespaceAndName(k simKind, i int) (string, string) {
	per := s.perNamespace(k)
	if per == 0 {
		switch k.Kind.Kind {
		case "Namespace":
			return "", simNamespace(i)
		case index.KindClusterRole:
			return "", "fleet:role-" + strconv.Itoa(i)
		default:
			return "", "fleet:binding-" + strconv.Itoa(i)
		}
	}
	ns, j := simNamespace(i/per), i%per
	switch k.Kind.Kind {
	case "Pod":
		app := j / 3 // three replicas per app
		return ns, fmt.Sprintf("app-%d-%s-%s", app, simHash(uint64(app)*7919+uint64(i/per), 10), simHash(uint64(i)*104729, 5))
	case "Service", "EndpointSlice":
		name := "svc-" + strconv.Itoa(j)
		if k.Kind.Kind == "EndpointSlice" {
			name += "-" + simHash(uint64(i), 5)
		}
		return ns, name
	case index.KindRole:
		return ns, "app-editor"
	case index.KindRoleBinding:
		return ns, "team-binding-" + strconv.Itoa(j)
	case "GitRepository":
		return ns, "repo"
	case "Kustomization":
		return ns, "apps"
	case "HelmRelease":
		return ns, "chart"
	case "VirtualService":
		return ns, "routes"
	case "DestinationRule":
		return ns, "policy"
	default:
		return ns, "gateway"
	}
}

// simHash returns n lowercase alphanumerics derived from x, like the
// suffixes of generated names.
func simHash(x uint64, n int) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, n)
	x = x*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	for i := range b {
		x ^= x >> 29
		x *= 0xbf58476d1ce4e5b9
		b[i] = alphabet[x%uint64(len(alphabet))]
	}
	return string(b)
}

// simCreated is every object's creation time.
var simCreated = metav1.NewTime(time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC))

// meta returns an object's metadata as kube-apiserver would return it.
func (s fleetShape) meta(ref simRef, k simKind, rv uint64, manager string, fields string) metav1.ObjectMeta {
	ns, name := s.namespaceAndName(k, ref.i)
	return metav1.ObjectMeta{
		Name: name, Namespace: ns,
		UID:               types.UID(fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", ref.cluster, ref.kind, ref.i>>12&0xfff, ref.i&0xfff, uint64(ref.cluster)<<32|uint64(ref.i))),
		ResourceVersion:   strconv.FormatUint(rv, 10),
		CreationTimestamp: simCreated,
		ManagedFields: []metav1.ManagedFieldsEntry{{
			Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: k.gv(),
			Time: &simCreated, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)},
		}},
	}
}

// The managed fields of each built-in kind, shaped like a controller's.
const (
	podFields       = `{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{},"f:tier":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"7c1e9a52-3f0b-4d8e-9a61-2b7d5c0e4f18\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:env":{".":{},"k:{\"name\":\"LOG_LEVEL\"}":{".":{},"f:name":{},"f:value":{}}},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{},"f:protocol":{}}},"f:resources":{".":{},"f:limits":{".":{},"f:memory":{}},"f:requests":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}`
	serviceFields   = `{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`
	sliceFields     = `{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"0d3c6b1e-8f2a-4e57-b9c4-6a1f0e2d3b7c\"}":{}}},"f:ports":{}}`
	namespaceFields = `{"f:metadata":{"f:labels":{".":{},"f:kubernetes.io/metadata.name":{},"f:team":{}}}}`
	rbacFields      = `{"f:metadata":{"f:labels":{".":{},"f:app.kubernetes.io/managed-by":{}}},"f:rules":{}}`
)

// builtin returns a built-in object at generation gen (pods only: each
// generation is one more container restart, flipping between running and
// crash-looping).
func (s fleetShape) builtin(ref simRef, k simKind, gen uint32, rv uint64) protoObject {
	switch k.Kind.Kind {
	case "Namespace":
		ns := &corev1.Namespace{ObjectMeta: s.meta(ref, k, rv, "kubectl-create", namespaceFields), Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}
		ns.Labels = map[string]string{"kubernetes.io/metadata.name": ns.Name, "team": "team-" + strconv.Itoa(ref.i%5)}
		ns.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
		return ns
	case "Pod":
		return s.pod(ref, k, gen, rv)
	case "Service":
		svc := &corev1.Service{ObjectMeta: s.meta(ref, k, rv, "kubectl-client-side-apply", serviceFields)}
		svc.Labels = map[string]string{"app": svc.Name}
		ip := fmt.Sprintf("10.96.%d.%d", ref.i/250%250, ref.i%250+1)
		svc.Spec = corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Selector:        map[string]string{"app": svc.Name},
			Ports:           []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
			SessionAffinity: corev1.ServiceAffinityNone, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy:        ptrTo(corev1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptrTo(corev1.ServiceInternalTrafficPolicyCluster),
		}
		return svc
	case "EndpointSlice":
		es := &discoveryv1.EndpointSlice{ObjectMeta: s.meta(ref, k, rv, "endpointslice-controller.k8s.io", sliceFields), AddressType: discoveryv1.AddressTypeIPv4}
		svc := "svc-" + strconv.Itoa(ref.i%s.perNamespace(k))
		es.Labels = map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
		es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc, UID: "0d3c6b1e-8f2a-4e57-b9c4-6a1f0e2d3b7c", Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true)}}
		for e := range 3 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.244.%d.%d", ref.i%250, e+10)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true), Serving: ptrTo(true), Terminating: ptrTo(false)},
				NodeName:   ptrTo("node-" + strconv.Itoa((ref.i+e)%20)),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: es.Namespace, Name: fmt.Sprintf("app-%d-%d", ref.i, e)},
			})
		}
		es.Ports = []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(8080)), Protocol: ptrTo(corev1.ProtocolTCP)}}
		return es
	case index.KindRole:
		r := &rbacv1.Role{ObjectMeta: s.meta(ref, k, rv, "helm", rbacFields)}
		r.Labels = map[string]string{"app.kubernetes.io/managed-by": "Helm"}
		r.Rules = []rbacv1.PolicyRule{
			{Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}, APIGroups: []string{"", "apps"}, Resources: []string{"pods", "services", "deployments", "configmaps"}},
			{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"kustomize.toolkit.fluxcd.io", "helm.toolkit.fluxcd.io"}, Resources: []string{"*"}},
		}
		return r
	case index.KindClusterRole:
		r := &rbacv1.ClusterRole{ObjectMeta: s.meta(ref, k, rv, "helm", rbacFields)}
		r.Labels = map[string]string{"app.kubernetes.io/managed-by": "Helm"}
		r.Rules = []rbacv1.PolicyRule{
			{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{""}, Resources: []string{"pods", "services", "namespaces"}},
			{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{"networking.istio.io"}, Resources: []string{"*"}},
		}
		return r
	case index.KindRoleBinding:
		b := &rbacv1.RoleBinding{ObjectMeta: s.meta(ref, k, rv, "helm", rbacFields)}
		b.RoleRef = rbacv1.RoleRef{APIGroup: index.RBACGroup, Kind: "Role", Name: "app-editor"}
		b.Subjects = []rbacv1.Subject{{Kind: "Group", APIGroup: index.RBACGroup, Name: fmt.Sprintf("team-%d-%d", ref.i, ref.i%simBindingsPerNS)}}
		return b
	default: // ClusterRoleBinding
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: s.meta(ref, k, rv, "helm", rbacFields)}
		b.RoleRef = rbacv1.RoleRef{APIGroup: index.RBACGroup, Kind: "ClusterRole", Name: "fleet:role-" + strconv.Itoa(ref.i)}
		b.Subjects = []rbacv1.Subject{{Kind: "Group", APIGroup: index.RBACGroup, Name: "viewers-" + strconv.Itoa(ref.i)}}
		return b
	}
}

// pod returns a pod of a three-replica app: running and ready at even
// generations, crash-looping at odd ones; every generation is one more
// restart.
func (s fleetShape) pod(ref simRef, k simKind, gen uint32, rv uint64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: s.meta(ref, k, rv, "kube-controller-manager", podFields)}
	per := s.perNamespace(k)
	app := fmt.Sprintf("app-%d", ref.i%per/3)
	p.GenerateName = p.Name[:len(p.Name)-5]
	p.Labels = map[string]string{"app": app, "pod-template-hash": simHash(uint64(ref.i%per/3)*7919+uint64(ref.i/per), 10), "tier": []string{"web", "api", "db"}[ref.i%3]}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.GenerateName[:len(p.GenerateName)-1], UID: "7c1e9a52-3f0b-4d8e-9a61-2b7d5c0e4f18", Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true)}}
	node := "node-" + strconv.Itoa(ref.i%20)
	p.Spec = corev1.PodSpec{
		Containers: []corev1.Container{{
			Name: "main", Image: "registry.example.com/" + app + ":1.4.2",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			Env:   []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			VolumeMounts:             []corev1.VolumeMount{{Name: "kube-api-access", ReadOnly: true, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
			TerminationMessagePath:   corev1.TerminationMessagePathDefault,
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		}},
		Volumes: []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: ptrTo(int64(3607)), Path: "token"}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			},
			DefaultMode: ptrTo(int32(420)),
		}}}},
		RestartPolicy: corev1.RestartPolicyAlways, DNSPolicy: corev1.DNSClusterFirst,
		ServiceAccountName: "default", NodeName: node, SchedulerName: corev1.DefaultSchedulerName,
		TerminationGracePeriodSeconds: ptrTo(int64(30)), SecurityContext: &corev1.PodSecurityContext{},
		Tolerations: []corev1.Toleration{
			{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo(int64(300))},
			{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo(int64(300))},
		},
		Priority: ptrTo(int32(0)), EnableServiceLinks: ptrTo(true), PreemptionPolicy: ptrTo(corev1.PreemptLowerPriority),
	}
	ready := gen%2 == 0
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		st := corev1.ConditionTrue
		if !ok {
			st = corev1.ConditionFalse
		}
		return corev1.PodCondition{Type: t, Status: st, LastTransitionTime: simCreated}
	}
	ip := fmt.Sprintf("10.244.%d.%d", ref.i/250%250, ref.i%250+1)
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, HostIP: "192.168.0." + strconv.Itoa(ref.i%20+10), PodIP: ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &simCreated, QOSClass: corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{
			cond("PodReadyToStartContainers", true), cond(corev1.PodInitialized, true), cond(corev1.PodReady, ready),
			cond(corev1.ContainersReady, ready), cond(corev1.PodScheduled, true),
		},
	}
	cs := corev1.ContainerStatus{
		Name: "main", Ready: ready, RestartCount: int32(gen), Image: p.Spec.Containers[0].Image,
		ImageID:     "registry.example.com/" + app + "@sha256:5f2b0c8e1d7a4936b8c2e0f1a3d5b7c9e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1",
		ContainerID: "containerd://" + simHash(uint64(ref.i)<<8|uint64(gen), 32),
		Started:     ptrTo(ready),
	}
	if ready {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: simCreated}
	} else {
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container=main pod=" + p.Name}
		cs.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", StartedAt: simCreated, FinishedAt: simCreated}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
	return p
}

// custom returns a Flux or Istio object as JSON.
func (s fleetShape) custom(ref simRef, k simKind, rv uint64) []byte {
	ns, name := s.namespaceAndName(k, ref.i)
	m := s.meta(ref, k, rv, "kustomize-controller", `{"f:spec":{}}`)
	meta := map[string]any{
		"name": name, "namespace": ns, "uid": string(m.UID), "resourceVersion": m.ResourceVersion,
		"generation": 1, "creationTimestamp": simCreated.UTC().Format(time.RFC3339),
		"labels": map[string]any{"kustomize.toolkit.fluxcd.io/name": "fleet", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"},
	}
	obj := map[string]any{"apiVersion": k.gv(), "kind": k.Kind.Kind, "metadata": meta}
	host := "svc-0." + ns + ".svc.cluster.local"
	ready := map[string]any{
		"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded", "message": "Applied revision: main@sha1:0123abcd",
		"lastTransitionTime": simCreated.UTC().Format(time.RFC3339), "observedGeneration": 1,
	}
	if ref.i%6 == 4 {
		ready["status"], ready["reason"], ready["message"] = "False", "BuildFailed", "kustomize build failed: accumulating resources: missing file"
	}
	fluxStatus := map[string]any{"observedGeneration": 1, "conditions": []any{ready}, "lastAppliedRevision": "main@sha1:0123abcd"}
	switch k.Kind.Kind {
	case "GitRepository":
		obj["spec"] = map[string]any{"url": "https://git.example.com/" + ns, "interval": "1m", "ref": map[string]any{"branch": "main"}}
		obj["status"] = map[string]any{"observedGeneration": 1, "conditions": []any{ready}, "artifact": map[string]any{"revision": "main@sha1:0123abcd"}}
	case "Kustomization":
		obj["spec"] = map[string]any{"interval": "5m", "path": "./deploy", "prune": true, "sourceRef": map[string]any{"kind": "GitRepository", "name": "repo"}}
		obj["status"] = fluxStatus
	case "HelmRelease":
		obj["spec"] = map[string]any{"interval": "5m", "chart": map[string]any{"spec": map[string]any{"chart": "podinfo", "version": "6.5.0", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "charts"}}}}
		obj["status"] = fluxStatus
	case "VirtualService":
		obj["spec"] = map[string]any{"hosts": []any{host}, "gateways": []any{"gateway"}, "http": []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": host}}}}}}
	case "DestinationRule":
		obj["spec"] = map[string]any{"host": host, "trafficPolicy": map[string]any{"tls": map[string]any{"mode": "ISTIO_MUTUAL"}}}
	default: // Gateway
		obj["spec"] = map[string]any{"selector": map[string]any{"istio": "ingressgateway"}, "servers": []any{map[string]any{"port": map[string]any{"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": []any{"*"}}}}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		panic(err) // plain maps of strings and numbers always marshal
	}
	return b
}

func ptrTo[T any](v T) *T { return &v }
