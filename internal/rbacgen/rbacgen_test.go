package rbacgen

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/fleetgraph/fleetgraph/collector"
	"github.com/fleetgraph/fleetgraph/connection/sources"
)

func TestResource(t *testing.T) {
	for kind, want := range map[string]string{
		"Pod": "pods", "Gateway": "gateways", "ServiceEntry": "serviceentries", "GitRepository": "gitrepositories",
		"Ingress": "ingresses", "NetworkPolicy": "networkpolicies", "Endpoints": "endpoints", "GatewayClass": "gatewayclasses",
		"Mesh": "meshes", "Box": "boxes", "HTTPRoute": "httproutes", "Key": "keys",
	} {
		if got := Resource(kind); got != want {
			t.Errorf("Resource(%s) = %s, want %s", kind, got, want)
		}
	}
}

func TestObjects(t *testing.T) {
	reg, err := collector.RegistryFor([]string{"Pod"}, []string{"apps/v1/Deployment"})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects(Options{
		Targets: []string{TargetLeaf, TargetManager}, ServiceAccount: "fg", Namespace: "ops",
		Registry: reg, Details: false, Sources: []string{sources.CAPISource, sources.ArgoCDSource},
		SourceOptions: sources.Options{ArgoCDNamespace: "argo"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var collector *rbacv1.ClusterRole
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			names = append(names, "ClusterRole "+o.Name)
			if o.Name == "fleetgraph-collector" {
				collector = o
			}
		case *rbacv1.ClusterRoleBinding:
			names = append(names, "ClusterRoleBinding "+o.Name)
			if s := o.Subjects[0]; s.Name != "fg" || s.Namespace != "ops" || o.RoleRef.Name != o.Name {
				t.Errorf("binding %s: %+v %+v", o.Name, o.Subjects, o.RoleRef)
			}
		case *rbacv1.Role:
			names = append(names, "Role "+o.Namespace+"/"+o.Name)
		case *rbacv1.RoleBinding:
			names = append(names, "RoleBinding "+o.Namespace+"/"+o.Name)
		}
	}
	want := "ClusterRole fleetgraph-collector, ClusterRoleBinding fleetgraph-collector, ClusterRole fleetgraph-sources, ClusterRoleBinding fleetgraph-sources, Role argo/fleetgraph-sources, RoleBinding argo/fleetgraph-sources"
	if got := strings.Join(names, ", "); got != want {
		t.Errorf("objects:\n%s\nwant\n%s", got, want)
	}
	var resources []string
	for _, r := range collector.Rules {
		resources = append(resources, r.Resources...)
		for _, v := range r.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("rule %+v grants %s", r, v)
			}
		}
	}
	// Pod, the RBAC kinds --kinds never drops, the extra kind; no
	// impersonation with details off; no Secrets.
	if got := strings.Join(resources, ","); got != "pods,roles,clusterroles,rolebindings,clusterrolebindings,deployments" {
		t.Errorf("collector resources %s", got)
	}

	if _, err := Objects(Options{Targets: []string{"cloud"}, ServiceAccount: "a", Namespace: "b"}); err == nil {
		t.Error("an unknown target was accepted")
	}
	if _, err := Objects(Options{Targets: []string{TargetManager}, ServiceAccount: "a", Namespace: "b", Sources: []string{sources.SecretsSource}}); err == nil {
		t.Error("the secrets source without its namespace was accepted")
	}
}
