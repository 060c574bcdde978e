package authz

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// kindTable is a cluster's kinds reduced to what visibility needs: each
// GroupResource once, whether it is namespaced, its bit in a grSet, and an
// index by plural so that rules naming explicit resources do not scan every
// kind.
type kindTable struct {
	all        []kindEntry
	byResource map[string][]kindEntry
}

type kindEntry struct {
	gr         index.GroupResource
	namespaced bool
	bit        int // position in kindTable.all
}

func newKindTable(kinds []index.Kind) *kindTable {
	t := &kindTable{byResource: make(map[string][]kindEntry, len(kinds))}
	seen := make(map[index.GroupResource]int, len(kinds))
	for _, k := range kinds {
		// RBAC rows are never listed as objects, so a grant on them
		// shows nothing: leaving them out keeps a cluster whose only
		// grants are on RBAC kinds out of Query.clusters.
		if k.Resource == "" || index.IsPolicyKind(k.Group, k.Kind) {
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
		t.all = append(t.all, kindEntry{gr: gr, namespaced: k.Namespaced, bit: len(t.all)})
	}
	for _, e := range t.all {
		t.byResource[e.gr.Resource] = append(t.byResource[e.gr.Resource], e)
	}
	return t
}

// candidates calls visit with the kinds a rule's resources could match:
// every kind when the rule has "*", else those whose plural the rule names.
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

// grSet is a set of a cluster's resources as a bit set over kindTable.all.
// Unions of grants are computed on these, and turned into the
// index.Resources of index.ClusterAccess once per distinct set (see
// setInterner).
type grSet []uint64

func newGRSet(kinds *kindTable) grSet { return make(grSet, (len(kinds.all)+63)/64) }

func (s grSet) add(bit int)      { s[bit/64] |= 1 << (bit % 64) }
func (s grSet) has(bit int) bool { return s[bit/64]&(1<<(bit%64)) != 0 }
func (s grSet) union(o grSet) {
	for i := range o {
		s[i] |= o[i]
	}
}

func (s grSet) empty() bool {
	for _, w := range s {
		if w != 0 {
			return false
		}
	}
	return true
}

// key returns the set as a string usable as a map key.
func (s grSet) key() string {
	var b strings.Builder
	for _, w := range s {
		b.WriteString(strconv.FormatUint(w, 36))
		b.WriteByte('.')
	}
	return b.String()
}

// setInterner hands out one shared, immutable index.Resources per distinct
// grSet of a compiled policy, so that the 2,000 namespaces of a user who
// has the same two roles in each point at a single set instead of holding
// 2,000 copies, and the index resolves that set once (index.Resources
// documents the sharing).
type setInterner struct {
	kinds *kindTable
	mu    sync.Mutex
	sets  map[string]*index.Resources
}

func (in *setInterner) get(s grSet) *index.Resources {
	if s.empty() {
		return nil
	}
	key := s.key()
	in.mu.Lock()
	defer in.mu.Unlock()
	if r, ok := in.sets[key]; ok {
		return r
	}
	var grs []index.GroupResource
	for _, k := range in.kinds.all {
		if s.has(k.bit) {
			grs = append(grs, k.gr)
		}
	}
	r := index.NewResources(grs...)
	in.sets[key] = r
	return r
}

// grant is what one role's rules make visible, precomputed once per policy
// revision and shared by every binding of every role with the same rules.
// It is never mutated after compileGrant returns, so access sets may alias
// its sets and maps.
type grant struct {
	// all: some rule allows get of any name or list, on every resource of
	// every group. Through a ClusterRoleBinding that shows everything.
	all bool
	// everywhere holds every resource the rules let the subject list, or
	// get by any name; through a ClusterRoleBinding that is cluster-wide.
	everywhere    grSet
	everywhereSet *index.Resources
	// inNamespace is the namespaced part of everywhere: what a
	// RoleBinding shows in its namespace.
	inNamespace    grSet
	inNamespaceSet *index.Resources
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
	return !g.all && g.everywhere.empty() && len(g.clusterNamed) == 0 && !g.namespaceGetAny
}

// compileGrant evaluates the rules against the cluster's kinds with the
// same matchers as RuleAllows, for the only requests visibility asks about:
// get by name and list, without subresource.
func compileGrant(rules []index.PolicyRule, kinds *kindTable, sets *setInterner) *grant {
	g := &grant{everywhere: newGRSet(kinds), inNamespace: newGRSet(kinds)}
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
				g.everywhere.add(k.bit)
				if k.namespaced {
					g.inNamespace.add(k.bit)
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
	g.everywhereSet = sets.get(g.everywhere)
	g.inNamespaceSet = sets.get(g.inNamespace)
	return g
}

// rulesKey returns a string that is equal for equal rule lists, so that
// roles with the same rules (the same Role copied into every namespace, a
// common pattern) are compiled once.
func rulesKey(rules []index.PolicyRule) string {
	var b strings.Builder
	field := func(ss []string) {
		b.WriteString(strconv.Itoa(len(ss)))
		for _, s := range ss {
			b.WriteByte('|')
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
		b.WriteByte(';')
	}
	for _, r := range rules {
		field(r.Verbs)
		field(r.APIGroups)
		field(r.Resources)
		field(r.ResourceNames)
		field(r.NonResourceURLs)
		b.WriteByte('\n')
	}
	return b.String()
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
	kinds   *kindTable
	sets    *setInterner
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
	kinds := newKindTable(src.Kinds(cluster))
	p := &compiledPolicy{
		rev:     rev,
		kinds:   kinds,
		sets:    &setInterner{kinds: kinds, sets: make(map[string]*index.Resources)},
		byUser:  make(map[string][]*compiledBinding),
		byGroup: make(map[string][]*compiledBinding),
	}
	type roleKey struct {
		kind, namespace, name string
	}
	grants := make(map[roleKey]*grant) // by role
	byRules := make(map[string]*grant) // by rule content
	bindings := make(map[*grant]*compiledBinding)
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
				rk := rulesKey(rules)
				if g, ok = byRules[rk]; !ok {
					g = compileGrant(rules, kinds, p.sets)
					if g.empty() {
						g = nil
					}
					byRules[rk] = g
				}
			}
			grants[key] = g
		}
		if g == nil {
			return
		}
		cb := &compiledBinding{namespace: b.Namespace, grant: g}
		if b.Namespace == "" {
			// ClusterRoleBindings to the same grant are interchangeable.
			if shared, ok := bindings[g]; ok {
				cb = shared
			} else {
				bindings[g] = cb
			}
		}
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

// union accumulates the union of grant sets: while only one grant
// contributes, its interned set is used as is; from the second distinct
// grant on, bits are merged and interned at the end.
type union struct {
	first *grant
	bits  grSet // nil until a second distinct grant arrives
}

func (u *union) add(g *grant, set func(*grant) grSet) {
	switch {
	case u.first == nil:
		u.first = g
	case u.first == g && u.bits == nil:
	default:
		if u.bits == nil {
			u.bits = slices.Clone(set(u.first))
		}
		u.bits.union(set(g))
	}
}

func (u *union) result(sets *setInterner, m func(*grant) *index.Resources) *index.Resources {
	switch {
	case u.first == nil:
		return nil
	case u.bits == nil:
		return m(u.first)
	default:
		return sets.get(u.bits)
	}
}

func everywhereBits(g *grant) grSet            { return g.everywhere }
func inNamespaceBits(g *grant) grSet           { return g.inNamespace }
func everywhereSet(g *grant) *index.Resources  { return g.everywhereSet }
func inNamespaceSet(g *grant) *index.Resources { return g.inNamespaceSet }

// accessFor builds the access set of one (already mapped) identity.
func (p *compiledPolicy) accessFor(u user.Info) *index.ClusterAccess {
	var (
		everywhere union
		clusterNm  []*grant
		named      map[index.NamedObject]struct{}
		namespaces map[string]union
	)
	visit := func(bs []*compiledBinding) bool {
		for _, b := range bs {
			g := b.grant
			if b.namespace == "" {
				if g.all {
					return false
				}
				everywhere.add(g, everywhereBits)
				if len(g.clusterNamed) > 0 && !slices.Contains(clusterNm, g) {
					clusterNm = append(clusterNm, g)
				}
				continue
			}
			if g.inNamespaceSet != nil {
				if namespaces == nil {
					namespaces = make(map[string]union)
				}
				un := namespaces[b.namespace]
				un.add(g, inNamespaceBits)
				namespaces[b.namespace] = un
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
	ca := &index.ClusterAccess{Everywhere: everywhere.result(p.sets, everywhereSet)}
	switch {
	case len(named) == 0 && len(clusterNm) == 1:
		ca.Named = clusterNm[0].clusterNamed
	default:
		for _, g := range clusterNm {
			if named == nil {
				named = make(map[index.NamedObject]struct{}, len(g.clusterNamed))
			}
			maps.Copy(named, g.clusterNamed)
		}
		ca.Named = named
	}
	if len(namespaces) > 0 {
		ca.Namespaces = make(map[string]*index.Resources, len(namespaces))
		for ns, un := range namespaces {
			ca.Namespaces[ns] = un.result(p.sets, inNamespaceSet)
		}
	}
	return ca
}
