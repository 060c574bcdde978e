package authz

import (
	"context"
	"fmt"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// Grant is one request of the visibility rule that the cluster's RBAC
// allows, with the grant that allowed it: the binding, the subject of the
// binding that matched the viewer, and the rule of the bound role.
type Grant struct {
	// Request is the request that was allowed (get by name, list in the
	// namespace, or list cluster-wide); its User is the mapped identity.
	Request Attributes
	Source  RuleSource
	Rule    index.PolicyRule
}

// Explanation says why an identity may see an object, in the terms of the
// object's own cluster.
type Explanation struct {
	// Visible is the visibility rule's answer: some request was allowed.
	Visible bool
	// Grants has, for each request of VisibilityAttributes that is
	// allowed, the first rule that allows it, in the order the Kubernetes
	// authorizer walks the bindings (what its "allowed by" reason names).
	Grants []Grant
	// Problems are the resolution errors met on the viewer's own bindings,
	// such as a binding to a missing role (errors.Is ErrRoleNotFound):
	// grants the viewer may expect that give nothing.
	Problems []error
}

// ExplainVisibility answers "why can this user see this object?" by walking
// the same bindings and rules as Authorize for every request of the
// visibility rule. It reads the RBAC rows directly, like Authorize, so it
// suits one object at a time; its Visible agrees with the access sets,
// which are this rule precomputed.
func (e *Evaluator) ExplainVisibility(ctx context.Context, cluster string, u user.Info, gr index.GroupResource, namespaced bool, namespace, name string) (Explanation, error) {
	var (
		out  Explanation
		seen = map[string]bool{}
	)
	for _, attrs := range VisibilityAttributes(u, gr, namespaced, namespace, name) {
		var found *Grant
		e.VisitRulesFor(ctx, cluster, attrs.User, attrs.Namespace, func(src RuleSource, rule *index.PolicyRule, err error) bool {
			if err != nil {
				if src.Binding != nil && !seen[err.Error()] {
					seen[err.Error()] = true
					out.Problems = append(out.Problems, fmt.Errorf("%s: %w", src, err))
				}
				return true
			}
			if RuleAllows(&attrs, rule) {
				found = &Grant{Request: attrs, Source: src, Rule: *rule}
				return false
			}
			return true
		})
		if err := ctx.Err(); err != nil {
			return Explanation{}, fmt.Errorf("explaining visibility: %w", err)
		}
		if found != nil {
			out.Visible = true
			out.Grants = append(out.Grants, *found)
		}
	}
	return out, nil
}

// ExplainVisibility explains the visibility of one object to the viewer,
// after mapping the identity for the cluster (see Evaluator.ExplainVisibility).
func (a *Authorizer) ExplainVisibility(ctx context.Context, cluster string, id *Identity, gr index.GroupResource, namespaced bool, namespace, name string) (Explanation, error) {
	return a.eval.ExplainVisibility(ctx, cluster, a.MappedUser(cluster, id), gr, namespaced, namespace, name)
}
