package graph

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// liveTimeout bounds one live GET: long enough for a loaded API server,
// short enough that a hung cluster does not hold a request for minutes.
const liveTimeout = 15 * time.Second

// object answers Query.object: a GET on the leaf cluster as the viewer.
// Seed 003 asks that details bypass the query module, so the index is used
// only to resolve the kind to a resource; the leaf's own RBAC decides, and
// its 403 reaches the client as FORBIDDEN.
func (s *service) object(ctx context.Context, cluster, kind string, namespace *string, name string) (*model.ObjectDetail, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	if !s.clusterVisible(v, cluster) {
		// Before anything else looks at the cluster: a made-up cluster
		// and a real one the viewer sees nothing in answer the same.
		return nil, errNoCluster(cluster)
	}
	k, ns, err := s.objectKind(cluster, kind, namespace)
	if err != nil {
		return nil, err
	}
	release, err := s.admission.liveRead(ctx, v)
	if err != nil {
		return nil, err
	}
	defer release()
	if s.leaf == nil {
		return nil, newError(CodeClusterUnavailable, nil, "live reads are not configured on this server")
	}
	base, err := s.leaf.RESTConfig(cluster)
	if err != nil {
		return nil, newError(CodeClusterUnavailable, err, "cluster %q is not available", cluster)
	}
	cfg := rest.CopyConfig(base)
	cfg.Impersonate = impersonation(s.authz.MappedUser(cluster, v.id))
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, newError(CodeClusterUnavailable, err, "cluster %q: building a client", cluster)
	}
	ctx, cancel := context.WithTimeout(ctx, liveTimeout)
	defer cancel()
	gvr := schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Resource}
	obj, err := client.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, liveError(err, cluster, k, cfg.Impersonate.UserName)
	}
	unstructured.RemoveNestedField(obj.Object, "metadata", "managedFields")
	manifest, err := obj.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encoding %s %s/%s: %w", k.GroupKind(), ns, name, err)
	}
	return &model.ObjectDetail{
		Cluster:         cluster,
		Group:           k.Group,
		Version:         k.Version,
		Kind:            k.Kind,
		Resource:        k.Resource,
		Namespace:       optString(obj.GetNamespace()),
		Name:            obj.GetName(),
		UID:             string(obj.GetUID()),
		ResourceVersion: obj.GetResourceVersion(),
		Manifest:        model.JSON(manifest),
		FetchedAt:       s.now().UTC(),
	}, nil
}

// errNoCluster answers a live read in a cluster that does not exist or in
// which the viewer may see nothing; the two are indistinguishable.
func errNoCluster(cluster string) error {
	return newError(CodeForbidden, nil, "cluster %q does not exist or you may see nothing in it", cluster).with("cluster", cluster).with("status", 403)
}

// impersonation is the viewer as the leaf should see them. Only the user
// name and groups are sent, which is all RBAC reads; UID and extra fields
// would need more impersonation permissions for no change in the answer.
// system:authenticated is left out because the API server adds it to every
// impersonated user.
func impersonation(u user.Info) rest.ImpersonationConfig {
	groups := slices.DeleteFunc(slices.Clone(u.GetGroups()), func(g string) bool { return g == user.AllAuthenticated })
	return rest.ImpersonationConfig{UserName: u.GetName(), Groups: groups}
}

// liveError maps a leaf error. A 403 about users, groups or serviceaccounts
// (not about the resource asked for) comes from the impersonation filter:
// fleetgraph's own credentials may not impersonate, which an operator must
// fix. Any other 403 is the leaf denying the viewer.
func liveError(err error, cluster string, k index.Kind, as string) error {
	var st apierrors.APIStatus
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsForbidden(err) && errors.As(err, &st) && impersonationDenied(st.Status().Details, k):
		return newError(CodeImpersonationDenied, err,
			"fleetgraph's credentials for cluster %q may not impersonate %q (grant the verb impersonate on users and groups)", cluster, as).
			with("cluster", cluster).with("status", 403)
	case apierrors.IsForbidden(err):
		return newError(CodeForbidden, err, "cluster %q denied %s", cluster, k.GroupKind()).
			with("cluster", cluster).with("status", 403)
	case apierrors.IsUnauthorized(err):
		return newError(CodeClusterUnavailable, err, "cluster %q rejected fleetgraph's credentials", cluster).
			with("cluster", cluster).with("status", 401)
	}
	return newError(CodeClusterUnavailable, err, "cluster %q", cluster).with("cluster", cluster)
}

// impersonationDenied reports whether a Forbidden status was raised by the
// impersonation filter rather than by the GET itself.
func impersonationDenied(d *metav1.StatusDetails, k index.Kind) bool {
	if d == nil || d.Group != "" || (k.Group == "" && d.Kind == k.Resource) {
		return false
	}
	switch d.Kind {
	case "users", "groups", "serviceaccounts":
		return true
	}
	return false
}

// objectKind resolves the kind a client named for one object of cluster
// (see resolveKind) and the object's namespace, which a namespaced kind
// requires and a cluster-scoped one refuses.
func (s *service) objectKind(cluster, kind string, namespace *string) (index.Kind, string, error) {
	k, err := resolveKind(s.store.Kinds(cluster), cluster, kind)
	if err != nil {
		return index.Kind{}, "", err
	}
	ns := ""
	if namespace != nil {
		ns = *namespace
	}
	switch {
	case k.Namespaced && ns == "":
		return index.Kind{}, "", newError(CodeBadUserInput, nil, "%s is namespaced: namespace is required", k.GroupKind())
	case !k.Namespaced && ns != "":
		return index.Kind{}, "", newError(CodeBadUserInput, nil, "%s is cluster-scoped: omit namespace", k.GroupKind())
	}
	return k, ns, nil
}

// resolveKind finds the kind a client named: "Pod", "pods", or
// "Kustomization.kustomize.toolkit.fluxcd.io", among the kinds collected on
// the cluster (which carry the resource and scope from discovery).
func resolveKind(kinds []index.Kind, cluster, term string) (index.Kind, error) {
	name, group, qualified := strings.Cut(term, ".")
	var found []index.Kind
	for _, k := range kinds {
		if qualified && k.Group != group {
			continue
		}
		if strings.EqualFold(k.Kind, name) || strings.EqualFold(k.Resource, name) {
			found = append(found, k)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return index.Kind{}, newError(CodeBadUserInput, nil, "kind %q is not collected on cluster %q", term, cluster)
	}
	names := make([]string, len(found))
	for i, k := range found {
		names[i] = k.GroupKind()
	}
	return index.Kind{}, newError(CodeBadUserInput, nil, "kind %q is ambiguous on cluster %q: use one of %s", term, cluster, strings.Join(names, ", "))
}
