package authz

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// Resolution errors. They are never fatal: RBAC rules only add permissions,
// so a binding whose role cannot be resolved simply grants nothing, and the
// other bindings are still evaluated. Match them with errors.Is.
var (
	// ErrRoleNotFound means a binding references a Role or ClusterRole
	// that the cluster does not have (yet, or any more). It denies.
	ErrRoleNotFound = errors.New("role not found")
	// ErrUnsupportedRoleRef means a binding's roleRef kind is neither Role
	// nor ClusterRole, or a ClusterRoleBinding references a Role.
	ErrUnsupportedRoleRef = errors.New("unsupported role reference")
)

// RuleReader is the part of PolicySource the evaluator walks.
type RuleReader interface {
	RoleGetter
	ClusterRoleGetter
	RoleBindingLister
	ClusterRoleBindingLister
}

// RuleSource says which binding, through which of its subjects, contributed
// a rule. It is what a Decision's reason names, so that a user can find the
// grant that let a request through.
type RuleSource struct {
	Binding *index.Binding
	Subject *index.Subject
}

// String describes the source the way the Kubernetes authorizer does, for
// example `RoleBinding "view/ns1" of ClusterRole "view" to User "alice"`.
func (s RuleSource) String() string {
	if s.Binding == nil || s.Subject == nil {
		return "<unknown>"
	}
	subject := fmt.Sprintf("%s %q", s.Subject.Kind, s.Subject.Name)
	if s.Subject.Kind == SubjectServiceAccount {
		ns := s.Subject.Namespace
		if ns == "" {
			ns = s.Binding.Namespace
		}
		subject = fmt.Sprintf("%s %q", s.Subject.Kind, s.Subject.Name+"/"+ns)
	}
	if s.Binding.Namespace == "" {
		return fmt.Sprintf("ClusterRoleBinding %q of %s %q to %s",
			s.Binding.Name, s.Binding.RoleRef.Kind, s.Binding.RoleRef.Name, subject)
	}
	return fmt.Sprintf("RoleBinding %q of %s %q to %s",
		s.Binding.Name+"/"+s.Binding.Namespace, s.Binding.RoleRef.Kind, s.Binding.RoleRef.Name, subject)
}

// Visitor is called by VisitRulesFor with each rule that applies, or with a
// resolution error (rule nil). Returning false stops the walk, which is how
// Authorize stops at the first rule that allows.
type Visitor func(src RuleSource, rule *index.PolicyRule, err error) bool

// Evaluator answers single RBAC questions for any cluster whose rows the
// reader holds. It keeps no state, so it is always as fresh as the reader;
// for visibility of many objects use the cached access sets of Authorizer.
type Evaluator struct {
	rules RuleReader
}

// NewEvaluator returns an Evaluator that reads RBAC rows from r.
func NewEvaluator(r RuleReader) *Evaluator {
	return &Evaluator{rules: r}
}

// Decision is the outcome of Authorize.
type Decision struct {
	// Allowed is true when some rule allows the request. RBAC never
	// denies explicitly: false means no rule allowed it.
	Allowed bool
	// Reason names the binding that allowed the request.
	Reason string
}

// RoleRules resolves a binding's role reference to its rules.
// bindingNamespace is the RoleBinding's namespace, or "" for a
// ClusterRoleBinding. A RoleBinding's Role lives in the binding's own
// namespace; a ClusterRole is shared by all namespaces.
func (e *Evaluator) RoleRules(cluster string, ref index.RoleRef, bindingNamespace string) ([]index.PolicyRule, error) {
	return roleRules(e.rules, cluster, ref, bindingNamespace)
}

func roleRules(r interface {
	RoleGetter
	ClusterRoleGetter
}, cluster string, ref index.RoleRef, bindingNamespace string,
) ([]index.PolicyRule, error) {
	switch ref.Kind {
	case RoleRefRole:
		if bindingNamespace == "" {
			return nil, fmt.Errorf("%w: cluster-wide binding to Role %q", ErrUnsupportedRoleRef, ref.Name)
		}
		role, ok := r.GetRole(cluster, bindingNamespace, ref.Name)
		if !ok {
			return nil, fmt.Errorf("%w: Role %q in namespace %q of cluster %q", ErrRoleNotFound, ref.Name, bindingNamespace, cluster)
		}
		return role.Rules, nil
	case RoleRefClusterRole:
		role, ok := r.GetClusterRole(cluster, ref.Name)
		if !ok {
			return nil, fmt.Errorf("%w: ClusterRole %q of cluster %q", ErrRoleNotFound, ref.Name, cluster)
		}
		return role.Rules, nil
	default:
		return nil, fmt.Errorf("%w: kind %q (name %q)", ErrUnsupportedRoleRef, ref.Kind, ref.Name)
	}
}

// VisitRulesFor walks every rule that applies to the user for a request in
// namespace ("" for cluster-wide requests): first the rules of
// ClusterRoleBindings, then those of the namespace's RoleBindings. Errors
// are passed to the visitor and the walk goes on, because rules are
// additive. It stops when the visitor returns false or ctx is done.
func (e *Evaluator) VisitRulesFor(ctx context.Context, cluster string, u user.Info, namespace string, visit Visitor) {
	if !e.visitBindings(ctx, cluster, u, e.rules.ListClusterRoleBindings(cluster), "", visit) {
		return
	}
	if namespace != "" {
		e.visitBindings(ctx, cluster, u, e.rules.ListRoleBindings(cluster, namespace), namespace, visit)
	}
}

// visitBindings walks one list of bindings and reports whether to go on.
// namespace is "" for ClusterRoleBindings; RoleBindings of other namespaces
// are skipped, so a lister that returns too much cannot widen access.
func (e *Evaluator) visitBindings(ctx context.Context, cluster string, u user.Info, bindings []*index.Binding, namespace string, visit Visitor) bool {
	for _, b := range bindings {
		if err := ctx.Err(); err != nil {
			visit(RuleSource{}, nil, fmt.Errorf("evaluating RBAC: %w", err))
			return false
		}
		if b.Namespace != namespace {
			continue
		}
		i, ok := appliesTo(u, b)
		if !ok {
			continue
		}
		rules, err := e.RoleRules(cluster, b.RoleRef, b.Namespace)
		if err != nil {
			if !visit(RuleSource{Binding: b, Subject: &b.Subjects[i]}, nil, err) {
				return false
			}
			continue
		}
		src := RuleSource{Binding: b, Subject: &b.Subjects[i]}
		for j := range rules {
			if !visit(src, &rules[j], nil) {
				return false
			}
		}
	}
	return true
}

// Authorize decides one request exactly as the Kubernetes RBAC authorizer
// would in that cluster. When it denies, the returned error joins the
// resolution errors met on the way (for example ErrRoleNotFound), which
// explain why a grant the user expected did not apply; the decision stands
// either way.
func (e *Evaluator) Authorize(ctx context.Context, cluster string, attrs *Attributes) (Decision, error) {
	var (
		d    Decision
		errs []error
	)
	e.VisitRulesFor(ctx, cluster, attrs.User, attrs.Namespace, func(src RuleSource, rule *index.PolicyRule, err error) bool {
		if rule != nil && RuleAllows(attrs, rule) {
			d = Decision{Allowed: true, Reason: "RBAC: allowed by " + src.String()}
			return false
		}
		if err != nil {
			errs = append(errs, err)
		}
		return true
	})
	if d.Allowed {
		return d, nil
	}
	return d, errors.Join(errs...)
}
