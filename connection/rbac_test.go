package connection

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/connection/internal/conntest"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// TestAuthzMatchesRealClusterRBAC collects a cluster's objects and RBAC
// into the index, then checks, for several users, that the objects authz
// calls visible are exactly those the user can read through the real API
// with their own token: get by name, list in the namespace, or list
// cluster-wide.
func TestAuthzMatchesRealClusterRBAC(t *testing.T) {
	t.Parallel()
	users := []testcluster.User{
		{Name: "alice", Groups: []string{"team-a"}},
		{Name: "bob", Groups: []string{"team-b"}},
		{Name: "carol"},
		{Name: "dave"},
		{Name: "frank"},
		{Name: "erin", Groups: []string{"team-a", "auditors"}},
	}
	c := startClusters(t, testcluster.Options{Name: "rbac-real", Users: users})[0]
	seeded(t, c, true, false, 4)
	ctx := t.Context()
	rbac := c.Client().RbacV1()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	subject := func(kind, name, ns string) rbacv1.Subject {
		s := rbacv1.Subject{Kind: kind, Name: name, Namespace: ns}
		if kind != rbacv1.ServiceAccountKind {
			s.APIGroup = rbacv1.GroupName
		}
		return s
	}
	roleBinding := func(ns, name, roleKind, role string, subjects ...rbacv1.Subject) {
		must(rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: roleKind, Name: role},
			Subjects:   subjects,
		}, metav1.CreateOptions{}))
	}
	clusterRole := func(name string, labels map[string]string, agg *rbacv1.AggregationRule, rules ...rbacv1.PolicyRule) {
		must(rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, AggregationRule: agg, Rules: rules,
		}, metav1.CreateOptions{}))
	}

	// alice: the aggregated built-in view role in ns-0, via a RoleBinding.
	roleBinding("ns-0", "alice-view", "ClusterRole", "view", subject(rbacv1.UserKind, "alice", ""))
	// team-b: list services everywhere, via a ClusterRoleBinding.
	clusterRole("svc-lister", nil, nil, rbacv1.PolicyRule{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"services"}})
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "team-b-services"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "svc-lister"},
		Subjects:   []rbacv1.Subject{subject(rbacv1.GroupKind, "team-b", "")},
	}, metav1.CreateOptions{}))
	// carol: get two named pods in ns-1, and her namespace object ns-2.
	must(rbac.Roles("ns-1").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "two-pods"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"pod-0", "pod-2"}}},
	}, metav1.CreateOptions{}))
	roleBinding("ns-1", "carol-two-pods", "Role", "two-pods", subject(rbacv1.UserKind, "carol", ""))
	clusterRole("ns-getter", nil, nil, rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"namespaces"}})
	roleBinding("ns-2", "carol-ns", "ClusterRole", "ns-getter", subject(rbacv1.UserKind, "carol", ""))
	// dave: an aggregated custom role that gathers Flux read access.
	clusterRole("flux-parent", nil, &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"example.org/flux": "true"}}}})
	clusterRole("flux-child", map[string]string{"example.org/flux": "true"}, nil,
		rbacv1.PolicyRule{Verbs: []string{"get", "list"}, APIGroups: []string{"kustomize.toolkit.fluxcd.io"}, Resources: []string{"*"}})
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "dave-flux"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "flux-parent"},
		Subjects:   []rbacv1.Subject{subject(rbacv1.UserKind, "dave", "")},
	}, metav1.CreateOptions{}))
	// erin: nothing of her own; team-a gets a wildcard role in ns-3.
	must(rbac.Roles("ns-3").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "all"},
		Rules:      []rbacv1.PolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"}}},
	}, metav1.CreateOptions{}))
	roleBinding("ns-3", "team-a-all", "Role", "all", subject(rbacv1.GroupKind, "team-a", ""))
	// frank: a ClusterRoleBinding to a rule with resourceNames on a
	// namespaced resource: that name, in every namespace.
	clusterRole("pod-1-everywhere", nil, nil, rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}, ResourceNames: []string{"pod-1"}})
	must(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "frank-pod-1"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "pod-1-everywhere"},
		Subjects:   []rbacv1.Subject{subject(rbacv1.UserKind, "frank", "")},
	}, metav1.CreateOptions{}))
	// A service account in ns-3, bound by name with the namespace
	// defaulted, and through its namespace's group.
	must(c.Client().CoreV1().ServiceAccounts("ns-3").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}))
	roleBinding("ns-3", "robot-view", "ClusterRole", "view", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "robot", Namespace: "ns-3"})
	roleBinding("ns-2", "ns3-sas-services", "ClusterRole", "svc-lister", subject(rbacv1.GroupKind, "system:serviceaccounts:ns-3", ""))
	tr, err := c.Client().CoreV1().ServiceAccounts("ns-3").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, Options{}, specFor(c))
	h.rec.WaitFor(t, c.Name, index.StateConnected, 1, 60*time.Second)
	// Let aggregation and the last bindings reach the index.
	time.Sleep(2 * time.Second)
	az := authz.NewAuthorizer(h.store, authz.Options{})
	all := conntest.AllRows(t, h.store, c.Name)

	type viewer struct {
		name   string
		info   user.Info
		config *rest.Config
	}
	viewers := []viewer{}
	for _, u := range users {
		viewers = append(viewers, viewer{u.Name, &user.DefaultInfo{Name: u.Name, Groups: u.Groups}, c.UserConfig(u.Name)})
	}
	saConfig := rest.CopyConfig(c.UserConfig("alice"))
	saConfig.BearerToken = tr.Status.Token
	viewers = append(viewers, viewer{"robot", &user.DefaultInfo{Name: "system:serviceaccount:ns-3:robot"}, saConfig})

	for _, v := range viewers {
		t.Run(v.name, func(t *testing.T) {
			access := az.ClusterAccess(c.Name, authz.NewIdentity(v.info))
			real := readable(t, v.config, h.store.Kinds(c.Name), all)
			var want, got []string
			for _, o := range all {
				k := fmt.Sprintf("%s %s/%s", o.Resource, o.Namespace, o.Name)
				if real[k] {
					want = append(want, k)
				}
				if access.Allows(index.GroupResource{Group: o.Group, Resource: o.Resource}, o.Namespace, o.Name) {
					got = append(got, k)
				}
			}
			if !slices.Equal(want, got) {
				t.Fatalf("visible sets differ\nAPI server: %d %v\nauthz:      %d %v", len(want), want, len(got), got)
			}
			if len(want) == 0 {
				t.Fatalf("%s can read nothing: the test proves nothing", v.name)
			}
			t.Logf("%s sees %d of %d objects", v.name, len(want), len(all))
		})
	}
}

// readable asks the API server, with the viewer's own credentials, which
// of the objects the viewer can read: list cluster-wide, list in the
// namespace, or get by name.
func readable(t *testing.T, cfg *rest.Config, kinds []index.Kind, objs []*index.Object) map[string]bool {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()
	gvrOf := map[string]schema.GroupVersionResource{}
	for _, k := range kinds {
		gvrOf[k.Group+"/"+k.Resource] = schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Resource}
	}
	allowed := func(err error) bool {
		if err != nil && !apierrors.IsForbidden(err) && !apierrors.IsNotFound(err) {
			t.Fatalf("unexpected API error: %v", err)
		}
		return err == nil
	}
	clusterWide := map[string]bool{}
	inNamespace := map[string]bool{}
	out := map[string]bool{}
	for _, o := range objs {
		gvr := gvrOf[o.Group+"/"+o.Resource]
		key := o.Group + "/" + o.Resource
		cw, ok := clusterWide[key]
		if !ok {
			_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			cw = allowed(err)
			clusterWide[key] = cw
		}
		visible := cw
		if !visible && o.Namespace != "" {
			nk := key + "/" + o.Namespace
			ns, ok := inNamespace[nk]
			if !ok {
				_, err := dyn.Resource(gvr).Namespace(o.Namespace).List(ctx, metav1.ListOptions{Limit: 1})
				ns = allowed(err)
				inNamespace[nk] = ns
			}
			visible = ns
		}
		if !visible {
			var err error
			if o.Namespace != "" {
				_, err = dyn.Resource(gvr).Namespace(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			} else {
				_, err = dyn.Resource(gvr).Get(ctx, o.Name, metav1.GetOptions{})
			}
			visible = allowed(err)
		}
		if visible {
			out[fmt.Sprintf("%s %s/%s", o.Resource, o.Namespace, o.Name)] = true
		}
	}
	return out
}
