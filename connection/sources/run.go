package sources

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
)

// Names are the sources that read a management cluster, in the order
// --source lists them.
var Names = []string{GitopsClusterSource, CAPISource, ArgoCDSource, ClusterProfileSource, SecretsSource}

// New returns the source of a name in Names.
func New(name string, opts Options) (Source, error) {
	switch name {
	case GitopsClusterSource:
		return NewGitopsClusters(opts), nil
	case CAPISource:
		return NewCAPI(opts), nil
	case ArgoCDSource:
		return NewArgoCD(opts), nil
	case ClusterProfileSource:
		return NewClusterProfiles(opts), nil
	case SecretsSource:
		return NewSecrets(opts), nil
	}
	return nil, fmt.Errorf("unknown source %q (want %s or %s)", name, strings.Join(Names, ", "), KubeconfigSource)
}

// Run runs sources until ctx ends, each on its own goroutine, and returns
// when all have. Registry.Ready reports each until it has listed once. The
// first source that fails (a configuration that can never work) ends the
// others' context too, and its error is returned.
func Run(ctx context.Context, r *Registry, srcs ...Source) error {
	for _, s := range srcs {
		r.Expect(s.Name())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(srcs))
	for i, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Run(ctx, r); err != nil {
				errs[i] = fmt.Errorf("source %s: %w", s.Name(), err)
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Access is what a source needs to read in the management cluster:
// cluster-wide rules, and rules that apply in one namespace only.
type Access struct {
	Cluster    []rbacv1.PolicyRule
	Namespaced map[string][]rbacv1.PolicyRule
}

// read is the verbs of an informer: list and watch.
var read = []string{"list", "watch"}

// SourceAccess returns the least access a source needs in the management
// cluster with opts: list and watch on its objects, and on the Secrets it
// reads (plus get where it reads a Secret's data on demand); in one
// namespace when the source is limited to one.
func SourceAccess(name string, opts Options) (Access, error) {
	secretsGetListWatch := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}}
	secretsListWatch := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: read}
	crd := func(group, resource string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: read}
	}
	var rules []rbacv1.PolicyRule
	ns := opts.Namespace
	switch name {
	case KubeconfigSource:
		return Access{}, nil
	case GitopsClusterSource:
		rules = []rbacv1.PolicyRule{crd(GitopsGroup, GitopsResource), secretsGetListWatch}
	case CAPISource:
		rules = []rbacv1.PolicyRule{crd(CAPIGroup, CAPIResource), secretsGetListWatch}
	case ClusterProfileSource:
		rules = []rbacv1.PolicyRule{crd(ClusterProfileGroup, ClusterProfileResource)}
	case ArgoCDSource:
		rules, ns = []rbacv1.PolicyRule{secretsListWatch}, opts.ArgoCDNamespace
		if ns == "" {
			ns = DefaultArgoCDNamespace
		}
	case SecretsSource:
		if opts.SecretsNamespace == "" {
			return Access{}, fmt.Errorf("source %s: the namespace of the cluster Secrets is required", SecretsSource)
		}
		rules, ns = []rbacv1.PolicyRule{secretsListWatch}, opts.SecretsNamespace
	default:
		_, err := New(name, opts)
		return Access{}, err
	}
	if ns == "" {
		return Access{Cluster: rules}, nil
	}
	return Access{Namespaced: map[string][]rbacv1.PolicyRule{ns: rules}}, nil
}

// Valid reports whether name is a source name.
func Valid(name string) bool { return name == KubeconfigSource || slices.Contains(Names, name) }
