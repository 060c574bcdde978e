package graph

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/graph/model"
	"github.com/fleetgraph/fleetgraph/index"
)

// whyVisible answers Query.whyVisible from authz's explanation: the
// binding, subject and rule behind each allowed request of the visibility
// rule. It reads the RBAC rows fleetgraph collected (the ones every list is
// filtered by), not the live cluster.
func (s *service) whyVisible(ctx context.Context, cluster, kind string, namespace *string, name string) (*model.VisibilityExplanation, error) {
	v, err := viewerFrom(ctx)
	if err != nil {
		return nil, err
	}
	out := &model.VisibilityExplanation{
		Cluster: cluster, Kind: kind, Namespace: namespace, Name: name,
		Grants: []*model.VisibilityGrant{}, Problems: []string{},
	}
	if v.admin {
		for _, g := range v.id.User().GetGroups() {
			if slices.Contains(s.adminGroups, g) {
				out.FleetAdminGroup = &g
				break
			}
		}
	}
	if !v.admin && !s.clusterVisible(v, cluster) {
		// Like Query.cluster: a cluster the viewer sees nothing in is
		// indistinguishable from one that does not exist.
		out.Summary = fmt.Sprintf("Nothing in cluster %q lets you read any object, so you cannot see this one.", cluster)
		return out, nil
	}
	k, ns, err := s.objectKind(cluster, kind, namespace)
	if err != nil {
		return nil, err
	}
	x, err := s.authz.ExplainVisibility(ctx, cluster, v.id, index.GroupResource{Group: k.Group, Resource: k.Resource}, k.Namespaced, ns, name)
	if err != nil {
		return nil, err
	}
	out.Visible = x.Visible || v.admin
	for _, g := range x.Grants {
		out.Grants = append(out.Grants, toGrant(g))
	}
	for _, p := range x.Problems {
		out.Problems = append(out.Problems, p.Error())
	}
	out.Summary = whySummary(out, k, cluster)
	return out, nil
}

func toGrant(g authz.Grant) *model.VisibilityGrant {
	b, sub := g.Source.Binding, g.Source.Subject
	binding := &model.RBACBinding{Kind: "ClusterRoleBinding", Name: b.Name}
	if b.Namespace != "" {
		binding.Kind, binding.Namespace = "RoleBinding", &b.Namespace
	}
	subject := &model.RBACSubject{Kind: sub.Kind, Name: sub.Name}
	if sub.Kind == authz.SubjectServiceAccount {
		ns := sub.Namespace
		if ns == "" {
			ns = b.Namespace
		}
		subject.Namespace = &ns
	}
	return &model.VisibilityGrant{
		Verb:        g.Request.Verb,
		Scope:       scope(g.Request),
		Description: g.Source.String(),
		Binding:     binding,
		Role:        &model.RBACRoleRef{Kind: b.RoleRef.Kind, Name: b.RoleRef.Name},
		Subject:     subject,
		Rule: &model.RBACRule{
			Verbs: nonNil(g.Rule.Verbs), APIGroups: nonNil(g.Rule.APIGroups),
			Resources: nonNil(g.Rule.Resources), ResourceNames: nonNil(g.Rule.ResourceNames),
		},
	}
}

// scope says what one request covers, in words.
func scope(a authz.Attributes) string {
	res := a.Resource
	if a.APIGroup != "" {
		res += "." + a.APIGroup
	}
	// A Namespace's own name is its get request's namespace attribute.
	isNamespace := a.APIGroup == "" && a.Resource == "namespaces"
	switch {
	case a.Name != "" && a.Namespace != "" && !isNamespace:
		return fmt.Sprintf("%s %q in namespace %s", res, a.Name, a.Namespace)
	case a.Name != "":
		return fmt.Sprintf("%s %q", res, a.Name)
	case a.Namespace != "":
		return fmt.Sprintf("%s in namespace %s", res, a.Namespace)
	}
	return res + " in all namespaces"
}

func whySummary(x *model.VisibilityExplanation, k index.Kind, cluster string) string {
	what := fmt.Sprintf("%s %s", k.GroupKind(), x.Name)
	if x.Namespace != nil && *x.Namespace != "" {
		what = fmt.Sprintf("%s %s/%s", k.GroupKind(), *x.Namespace, x.Name)
	}
	var reasons []string
	for _, g := range x.Grants {
		reasons = append(reasons, fmt.Sprintf("%s allows %s of %s", g.Description, g.Verb, g.Scope))
	}
	switch {
	case x.FleetAdminGroup != nil:
		s := fmt.Sprintf("You can see %s because you are a fleet admin (group %s): fleet admins see every object.", what, *x.FleetAdminGroup)
		if len(reasons) > 0 {
			s += " In cluster " + cluster + ", " + strings.Join(reasons, "; ") + "."
		}
		return s
	case x.Visible:
		return fmt.Sprintf("You can see %s because, in cluster %s, %s.", what, cluster, strings.Join(reasons, "; "))
	}
	return fmt.Sprintf("Nothing in cluster %s lets you get %s or list %s in its namespace or in all namespaces, so you cannot see it.", cluster, what, k.Resource)
}
