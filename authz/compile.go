package authz

import (
	"maps"
	"slices"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// kindTable is a cluster's kinds reduced to what visibility needs: each
// GroupResource once, whether it is namespaced, and an index by plural so
// that rules naming explicit resources do not scan every kind.
type kindTable struct {
	all        []kindEntry
	byResource map[string][]kindEntry
}

type kindEntry struct {
	gr         index.GroupResource
	namespaced bool
}

func newKindTable(kinds []index.Kind) *kindTable {
	t := &kindTable{byResource: make(map[string][]kindEntry, len(kinds))}
	seen := make(map[index.GroupResource]int, len(kinds))
	for _, k := range kinds {
		if k.Resource == "" {
			continue
		}
		gr := index.GroupResource{Group: k.Group, Resource: k.Resource}
		if i, ok := seen[gr]; ok {
			// Several versions of one resource: scope is a property of
			// the resource, but trust "namespaced" if any version says so.
			t.all[i].namespaced = t.all[i].namespaced || k.Namespaced
			continue
		}
		seen[gr] = len(t.all)
		t.all = append(t.all, kindEntry{gr: gr, namespaced: k.Namespaced})
	}
	for _, e := range t.all {
		t.byResource[e.gr.Resource] = append(t.byResource[e.gr.Resource], e)
	}
	return t
}

// candidates returns the kinds a rule's resources could match: every kind
// when the rule has "*", else those whose plural the rule names.
func (t *kindTable) candidates(rule *index.PolicyRule, visit func(kindEntry)) {
	if slices.Contains(rule.Resources, ResourceAll) {
		for _, e := range t.all {
			visit(e)
		}
		return
	}
	for _, r := range rule.Resources {
		for _, e := range t.byResource[r] {
			visit(e)
		}
	}
}

// grant is what one role's rules make visible, precomputed once per policy
// revision and shared by every binding of the role. Its maps are never
// mutated after compileGrant returns, so access sets may alias them.
type grant struct {
	// all: some rule allows get of any name or list, on every resource of
	// every group. Through a ClusterRoleBinding that shows everything.
	all bool
	// everywhere holds every resource the rules let the subject list, or
	// get by any name; through a ClusterRoleBinding that is cluster-wide.
	everywhere map[index.GroupResource]struct{}
	// inNamespace is the namespaced part of everywhere: what a
	// RoleBinding shows in its namespace.
	inNamespace map[index.GroupResource]struct{}
	// clusterNamed holds get-by-resourceNames grants as they apply
	// through a ClusterRoleBinding: Namespace "" (any namespace for
	// namespaced resources, see Allows).
	clusterNamed map[index.NamedObject]struct{}
	// namespacedNames holds the get-by-resourceNames grants on namespaced
	// resources, to be placed in a RoleBinding's namespace.
	namespacedNames []index.NamedObject
	// namespaceGetAny and namespaceNames say whether a RoleBinding in
	// namespace X shows Namespace X: get namespaces/X carries X as its
	// namespace attribute.
	namespaceGetAny bool
	namespaceNames  []string
}

func (g *grant) empty() bool {
	return !g.all && len(g.everywhere) == 0 && len(g.clusterNamed) == 0 && !g.namespaceGetAny
}

// compileGrant evaluates the rules against the cluster's kinds with the
// same matchers as RuleAllows, for the only requests visibility asks about:
// get by name and list, without subresource.
func compileGrant(rules []index.PolicyRule, kinds *kindTable) *grant {
	g := &grant{}
	for i := range rules {
		rule := &rules[i]
		getOK := VerbMatches(rule, verbGet)
		listOK := VerbMatches(rule, verbList) && ResourceNameMatches(rule, "")
		if !getOK && !listOK {
			continue
		}
		getAny := getOK && len(rule.ResourceNames) == 0
		wide := getAny || listOK
		if wide && slices.Contains(rule.APIGroups, APIGroupAll) && slices.Contains(rule.Resources, ResourceAll) {
			g.all = true
		}
		kinds.candidates(rule, func(k kindEntry) {
			if !APIGroupMatches(rule, k.gr.Group) || !ResourceMatches(rule, k.gr.Resource, "") {
				return
			}
			if wide {
				g.everywhere = addKey(g.everywhere, k.gr)
				if k.namespaced {
					g.inNamespace = addKey(g.inNamespace, k.gr)
				}
			}
			if isNamespaces(k.gr) && getAny {
				g.namespaceGetAny = true
			}
			if !getOK || getAny {
				return
			}
			for _, name := range rule.ResourceNames {
				if name == "" {
					continue // objects always have a name
				}
				g.clusterNamed = addKey(g.clusterNamed, index.NamedObject{GroupResource: k.gr, Name: name})
				switch {
				case k.namespaced:
					g.namespacedNames = append(g.namespacedNames, index.NamedObject{GroupResource: k.gr, Name: name})
				case isNamespaces(k.gr):
					g.namespaceNames = append(g.namespaceNames, name)
				}
			}
		})
	}
	return g
}

func addKey[K comparable](m map[K]struct{}, k K) map[K]struct{} {
	if m == nil {
		m = make(map[K]struct{})
	}
	m[k] = struct{}{}
	return m
}

// compiledBinding is one binding reduced to where it applies and what its
// role shows. namespace is "" for a ClusterRoleBinding.
type compiledBinding struct {
	namespace string
	grant     *grant
}

// compiledPolicy is a cluster's RBAC at one revision, indexed by subject:
// building one identity's access set touches only the bindings that name
// the identity or one of its groups, never the whole policy.
type compiledPolicy struct {
	rev     uint64
	byUser  map[string][]*compiledBinding
	byGroup map[string][]*compiledBinding
	// errs are the resolution errors met while compiling (missing roles,
	// bad role references). They deny and are kept for diagnostics.
	errs []error
}

// compilePolicy reads the cluster's RBAC rows and kinds once. rev must have
// been read before the rows, so that a change racing with the read leaves
// the result labeled stale, never fresh.
func compilePolicy(src PolicySource, cluster string, rev uint64) *compiledPolicy {
	p := &compiledPolicy{
		rev:     rev,
		byUser:  make(map[string][]*compiledBinding),
		byGroup: make(map[string][]*compiledBinding),
	}
	kinds := newKindTable(src.Kinds(cluster))
	type roleKey struct {
		kind, namespace, name string
	}
	grants := make(map[roleKey]*grant)
	add := func(b *index.Binding) {
		key := roleKey{kind: b.RoleRef.Kind, name: b.RoleRef.Name}
		if b.RoleRef.Kind == RoleRefRole {
			key.namespace = b.Namespace
		}
		g, ok := grants[key]
		if !ok {
			rules, err := roleRules(src, cluster, b.RoleRef, b.Namespace)
			if err != nil {
				p.errs = append(p.errs, err)
			} else {
				g = compileGrant(rules, kinds)
				if g.empty() {
					g = nil
				}
			}
			grants[key] = g
		}
		if g == nil {
			return
		}
		cb := &compiledBinding{namespace: b.Namespace, grant: g}
		for i := range b.Subjects {
			s := &b.Subjects[i]
			switch s.Kind {
			case SubjectUser:
				p.byUser[s.Name] = appendOnce(p.byUser[s.Name], cb)
			case SubjectGroup:
				p.byGroup[s.Name] = appendOnce(p.byGroup[s.Name], cb)
			case SubjectServiceAccount:
				ns := s.Namespace
				if ns == "" {
					ns = b.Namespace
				}
				if ns == "" {
					continue // never applies, as in Kubernetes
				}
				name := ServiceAccountUsername(ns, s.Name)
				p.byUser[name] = appendOnce(p.byUser[name], cb)
			}
		}
	}
	for _, b := range src.ListClusterRoleBindings(cluster) {
		if b.Namespace == "" {
			add(b)
		}
	}
	for _, b := range src.ListRoleBindings(cluster, "") {
		if b.Namespace != "" {
			add(b)
		}
	}
	return p
}

// appendOnce appends cb unless it is already last, which is where a
// binding naming the same subject twice would have put it.
func appendOnce(s []*compiledBinding, cb *compiledBinding) []*compiledBinding {
	if n := len(s); n > 0 && s[n-1] == cb {
		return s
	}
	return append(s, cb)
}

// sharedSet accumulates a union of grant maps without copying while only
// one grant contributes, which is the common case (one role per namespace),
// and copies on the first merge.
type sharedSet[K comparable] struct {
	m     map[K]struct{}
	from  *grant
	owned bool
}

func (s *sharedSet[K]) add(from *grant, src map[K]struct{}) {
	if len(src) == 0 || (s.from == from && !s.owned) {
		return
	}
	if s.m == nil {
		s.m, s.from = src, from
		return
	}
	if !s.owned {
		s.m = maps.Clone(s.m)
		s.owned = true
	}
	maps.Copy(s.m, src)
}

// accessFor builds the access set of one (already mapped) identity.
func (p *compiledPolicy) accessFor(u user.Info) *index.ClusterAccess {
	var (
		everywhere sharedSet[index.GroupResource]
		clusterNm  sharedSet[index.NamedObject]
		named      map[index.NamedObject]struct{}
		namespaces map[string]*sharedSet[index.GroupResource]
	)
	visit := func(bs []*compiledBinding) bool {
		for _, b := range bs {
			g := b.grant
			if b.namespace == "" {
				if g.all {
					return false
				}
				everywhere.add(g, g.everywhere)
				clusterNm.add(g, g.clusterNamed)
				continue
			}
			if len(g.inNamespace) > 0 {
				if namespaces == nil {
					namespaces = make(map[string]*sharedSet[index.GroupResource])
				}
				s := namespaces[b.namespace]
				if s == nil {
					s = &sharedSet[index.GroupResource]{}
					namespaces[b.namespace] = s
				}
				s.add(g, g.inNamespace)
			}
			for _, n := range g.namespacedNames {
				n.Namespace = b.namespace
				named = addKey(named, n)
			}
			if g.namespaceGetAny || slices.Contains(g.namespaceNames, b.namespace) {
				named = addKey(named, index.NamedObject{
					GroupResource: index.GroupResource{Resource: "namespaces"},
					Name:          b.namespace,
				})
			}
		}
		return true
	}
	if !visit(p.byUser[u.GetName()]) {
		return &index.ClusterAccess{All: true}
	}
	for _, grp := range u.GetGroups() {
		if !visit(p.byGroup[grp]) {
			return &index.ClusterAccess{All: true}
		}
	}
	ca := &index.ClusterAccess{Everywhere: everywhere.m}
	switch {
	case len(named) == 0:
		ca.Named = clusterNm.m
	default:
		maps.Copy(named, clusterNm.m)
		ca.Named = named
	}
	if len(namespaces) > 0 {
		ca.Namespaces = make(map[string]map[index.GroupResource]struct{}, len(namespaces))
		for ns, s := range namespaces {
			ca.Namespaces[ns] = s.m
		}
	}
	return ca
}
