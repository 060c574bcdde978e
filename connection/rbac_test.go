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
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/internal/conntest"
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
	// Wait for aggregation, and for the index to hold the cluster's RBAC
	// as the API server has it.
	conntest.Eventually(t, 30*time.Second, "aggregated roles filled and RBAC in the index", func() error {
		return rbacInIndex(ctx, c, h.store, "view", "flux-parent")
	})
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

// rbacInIndex reports how the index's RBAC rows of c differ from the API
// server's Roles, ClusterRoles and bindings, or that one of the aggregated
// ClusterRoles has no rules yet.
func rbacInIndex(ctx context.Context, c *testcluster.Cluster, store *index.Store, aggregated ...string) error {
	api := c.Client().RbacV1()
	sameRules := func(what string, want []rbacv1.PolicyRule, got *index.Role, ok bool) error {
		if !ok {
			return fmt.Errorf("%s is not in the index", what)
		}
		if len(got.Rules) != len(want) {
			return fmt.Errorf("%s: %d rules in the index, %d in the API", what, len(got.Rules), len(want))
		}
		for i, w := range want {
			g := got.Rules[i]
			if !slices.Equal(g.Verbs, w.Verbs) || !slices.Equal(g.APIGroups, w.APIGroups) || !slices.Equal(g.Resources, w.Resources) ||
				!slices.Equal(g.ResourceNames, w.ResourceNames) || !slices.Equal(g.NonResourceURLs, w.NonResourceURLs) {
				return fmt.Errorf("%s: rule %d is %+v in the index, %+v in the API", what, i, g, w)
			}
		}
		return nil
	}
	sameBinding := func(what string, ref rbacv1.RoleRef, subjects []rbacv1.Subject, got *index.Binding) error {
		if got.RoleRef.Kind != ref.Kind || got.RoleRef.Name != ref.Name || len(got.Subjects) != len(subjects) {
			return fmt.Errorf("%s differs in the index: %+v", what, got)
		}
		for i, s := range subjects {
			if g := got.Subjects[i]; g.Kind != s.Kind || g.Name != s.Name || g.Namespace != s.Namespace {
				return fmt.Errorf("%s: subject %d is %+v in the index, %+v in the API", what, i, g, s)
			}
		}
		return nil
	}
	crs, err := api.ClusterRoles().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, r := range crs.Items {
		if slices.Contains(aggregated, r.Name) && len(r.Rules) == 0 {
			return fmt.Errorf("ClusterRole %s is not aggregated yet", r.Name)
		}
		got, ok := store.GetClusterRole(c.Name, r.Name)
		if err := sameRules("ClusterRole "+r.Name, r.Rules, got, ok); err != nil {
			return err
		}
	}
	roles, err := api.Roles("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, r := range roles.Items {
		got, ok := store.GetRole(c.Name, r.Namespace, r.Name)
		if err := sameRules("Role "+r.Namespace+"/"+r.Name, r.Rules, got, ok); err != nil {
			return err
		}
	}
	rbs, err := api.RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	indexed := map[string]*index.Binding{}
	for _, b := range store.ListRoleBindings(c.Name, "") {
		indexed[b.Namespace+"/"+b.Name] = b
	}
	for _, b := range store.ListClusterRoleBindings(c.Name) {
		indexed["/"+b.Name] = b
	}
	crbs, err := api.ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if n := len(rbs.Items) + len(crbs.Items); n != len(indexed) {
		return fmt.Errorf("%d bindings in the index, %d in the API", len(indexed), n)
	}
	for _, b := range rbs.Items {
		key := b.Namespace + "/" + b.Name
		got, ok := indexed[key]
		if !ok {
			return fmt.Errorf("RoleBinding %s is not in the index", key)
		}
		if err := sameBinding("RoleBinding "+key, b.RoleRef, b.Subjects, got); err != nil {
			return err
		}
	}
	for _, b := range crbs.Items {
		got, ok := indexed["/"+b.Name]
		if !ok {
			return fmt.Errorf("ClusterRoleBinding %s is not in the index", b.Name)
		}
		if err := sameBinding("ClusterRoleBinding "+b.Name, b.RoleRef, b.Subjects, got); err != nil {
			return err
		}
	}
	return nil
}
