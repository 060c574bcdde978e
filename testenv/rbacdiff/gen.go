package rbacdiff

import (
	"fmt"
	"math/rand/v2"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/authz"
)

// Chooser makes the generator's choices: a seeded PRNG for the
// differential test, the fuzzer's bytes for the fuzz target.
type Chooser interface {
	// Intn returns a number in [0, n); n > 0.
	Intn(n int) int
}

// RandChooser draws choices from a seeded PRNG.
type RandChooser struct{ R *rand.Rand }

// Intn implements Chooser.
func (c RandChooser) Intn(n int) int { return c.R.IntN(n) }

// ByteChooser draws choices from fuzzer input, one byte each, and returns 0
// once the input is used up, so every input decodes to a valid case.
type ByteChooser struct {
	Data []byte
	pos  int
}

// Intn implements Chooser.
func (c *ByteChooser) Intn(n int) int {
	if c.pos >= len(c.Data) {
		return 0
	}
	b := int(c.Data[c.pos])
	c.pos++
	if n > 256 {
		if c.pos < len(c.Data) {
			b = b<<8 | int(c.Data[c.pos])
			c.pos++
		}
	}
	return b % n
}

// vocabulary is what random rules, subjects and requests are made of. The
// lists are small on purpose, so that random rules and random requests
// collide often, and they hold every tricky value: wildcards,
// subresources and "*/subresource", upper-case look-alikes, the empty
// string, ServiceAccount names and system groups.
type vocabulary struct {
	namespaces        []string
	requestNamespaces []string // namespaces and "" (cluster-wide)
	users             []string
	groups            []string
	verbs             []string
	apiGroups         []string
	ruleRes           []string
	reqRes            []string
	subres            []string
	names             []string
	ruleNames         [][]string
	urls              []string
	paths             []string
	roleNames         []string
	subjectKinds      []string
	saNames           []string
	saNamespaces      []string
	refKinds          []string
}

func defaultVocabulary() *vocabulary {
	return &vocabulary{
		namespaces:        []string{"ns1", "ns2", "kube-system", "default"},
		requestNamespaces: []string{"ns1", "ns2", "kube-system", "default", ""},
		users:             []string{"alice", "bob", "admin", "system:serviceaccount:ns1:sa1", "system:serviceaccount:ns2:sa1", "system:serviceaccount:kube-system:default", "system:anonymous", "system:kube-scheduler", "system:node:node1", ""},
		groups:            []string{"devs", "admins", "system:authenticated", "system:unauthenticated", "system:serviceaccounts", "system:serviceaccounts:ns1", "system:masters", "system:nodes", "system:monitoring"},
		verbs:             []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*", "GET", "use"},
		apiGroups:         []string{"", "", "apps", "extensions", "*", "metrics.k8s.io", "kustomize.toolkit.fluxcd.io", "rbac.authorization.k8s.io", "policy", "example.com"},
		ruleRes:           []string{"pods", "pods/log", "pods/status", "pods/exec", "*", "*/scale", "*/status", "deployments", "deployments/scale", "namespaces", "namespaces/status", "nodes", "secrets", "configmaps", "services", "kustomizations", "clusterroles", "Pods", "pods/*", "widgets", "gadgets"},
		reqRes:            []string{"pods", "deployments", "namespaces", "nodes", "secrets", "configmaps", "services", "kustomizations", "clusterroles", "Pods", "replicasets", "anything", "widgets", "gadgets"},
		subres:            []string{"", "", "", "status", "scale", "log", "exec"},
		names:             []string{"", "a", "b", "ns1", "cm1", "default"},
		ruleNames:         [][]string{nil, nil, nil, {"a"}, {"a", "b"}, {""}, {"ns1"}, {"default", "cm1"}},
		urls:              []string{"/healthz", "/healthz/*", "/api", "/api/*", "/apis", "/apis/*", "*", "/metrics", "/version/"},
		paths:             []string{"/healthz", "/healthz/ready", "/api", "/api/v1", "/apis", "/apis/apps", "/metrics", "/version", "/version/", "/"},
		roleNames:         []string{"r1", "r2", "r3", "view", "edit", "admin", "cluster-admin"},
		subjectKinds:      []string{rbacv1.UserKind, rbacv1.GroupKind, rbacv1.ServiceAccountKind, rbacv1.ServiceAccountKind, "Foo"},
		saNames:           []string{"sa1", "sa2", "default"},
		saNamespaces:      []string{"", "", "ns1", "ns2", "kube-system"},
		refKinds:          []string{"ClusterRole", "ClusterRole", "Role", "Role", "Bogus"},
	}
}

// Gen generates random policies and requests.
type Gen struct {
	v *vocabulary
	C Chooser
	// Extra strings (from the fuzzer) are mixed into the vocabularies.
	Extra []string
	// Seeds are whole policies (upstream cases, bootstrap) that a
	// generated policy may start from.
	Seeds []*Policy
}

// NewGen returns a generator making its choices with c.
func NewGen(c Chooser, extra []string, seeds []*Policy) *Gen {
	return &Gen{v: defaultVocabulary(), C: c, Extra: extra, Seeds: seeds}
}

func (g *Gen) pick(v []string) string {
	if len(g.Extra) > 0 && g.C.Intn(8) == 0 {
		return g.Extra[g.C.Intn(len(g.Extra))]
	}
	return v[g.C.Intn(len(v))]
}

func (g *Gen) some(v []string, maxN int) []string {
	n := 1 + g.C.Intn(maxN)
	out := make([]string, 0, n)
	for range n {
		out = append(out, g.pick(v))
	}
	return out
}

// Rule returns a random policy rule: a resource rule, a non-resource rule,
// or rarely both.
func (g *Gen) Rule() rbacv1.PolicyRule {
	r := rbacv1.PolicyRule{Verbs: g.some(g.v.verbs, 3)}
	switch g.C.Intn(8) {
	case 0:
		r.NonResourceURLs = g.some(g.v.urls, 2)
	case 1:
		r.NonResourceURLs = g.some(g.v.urls, 2)
		r.APIGroups, r.Resources = g.some(g.v.apiGroups, 2), g.some(g.v.ruleRes, 2)
	default:
		r.APIGroups, r.Resources = g.some(g.v.apiGroups, 2), g.some(g.v.ruleRes, 3)
		r.ResourceNames = g.v.ruleNames[g.C.Intn(len(g.v.ruleNames))]
		if len(g.Extra) > 0 && g.C.Intn(6) == 0 {
			r.ResourceNames = append(r.ResourceNames, g.Extra[g.C.Intn(len(g.Extra))])
		}
	}
	if g.C.Intn(10) == 0 {
		r.Verbs = nil // an empty list matches nothing
	}
	return r
}

func (g *Gen) rules() []rbacv1.PolicyRule {
	out := make([]rbacv1.PolicyRule, 1+g.C.Intn(3))
	for i := range out {
		out[i] = g.Rule()
	}
	return out
}

func (g *Gen) subjects() []rbacv1.Subject {
	out := make([]rbacv1.Subject, 1+g.C.Intn(3))
	for i := range out {
		kind := g.pick(g.v.subjectKinds)
		s := rbacv1.Subject{Kind: kind}
		switch kind {
		case rbacv1.UserKind:
			s.Name = g.pick(g.v.users)
		case rbacv1.GroupKind:
			s.Name = g.pick(g.v.groups)
		case rbacv1.ServiceAccountKind:
			s.Name, s.Namespace = g.pick(g.v.saNames), g.pick(g.v.saNamespaces)
		default:
			s.Name = g.pick(g.v.users)
		}
		out[i] = s
	}
	return out
}

// roleRef returns a reference, most often to a role of p that exists in
// the binding's namespace, sometimes to a missing one or of a bad kind.
func (g *Gen) roleRef(p *Policy, namespace string) rbacv1.RoleRef {
	ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: g.pick(g.v.refKinds), Name: g.pick(g.v.roleNames)}
	if namespace == "" && ref.Kind == "Role" && g.C.Intn(4) != 0 {
		ref.Kind = "ClusterRole"
	}
	if g.C.Intn(4) == 0 {
		return ref
	}
	switch ref.Kind {
	case "ClusterRole":
		if len(p.ClusterRoles) > 0 {
			ref.Name = p.ClusterRoles[g.C.Intn(len(p.ClusterRoles))].Name
		}
	case "Role":
		var names []string
		for _, r := range p.Roles {
			if r.Namespace == namespace {
				names = append(names, r.Name)
			}
		}
		if len(names) > 0 {
			ref.Name = names[g.C.Intn(len(names))]
		}
	}
	return ref
}

// Policy returns a random policy, sometimes built on a seed policy.
func (g *Gen) Policy() *Policy {
	p := &Policy{}
	if len(g.Seeds) > 0 && g.C.Intn(4) == 0 {
		s := g.Seeds[g.C.Intn(len(g.Seeds))]
		p.Roles = append(p.Roles, s.Roles...)
		p.RoleBindings = append(p.RoleBindings, s.RoleBindings...)
		p.ClusterRoles = append(p.ClusterRoles, s.ClusterRoles...)
		p.ClusterRoleBindings = append(p.ClusterRoleBindings, s.ClusterRoleBindings...)
	}
	for range g.C.Intn(4) {
		p.Roles = append(p.Roles, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: g.pick(g.v.namespaces), Name: g.pick(g.v.roleNames)}, Rules: g.rules(),
		})
	}
	for range g.C.Intn(4) {
		p.ClusterRoles = append(p.ClusterRoles, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: g.pick(g.v.roleNames)}, Rules: g.rules(),
		})
	}
	for i := range g.C.Intn(5) {
		ns := g.pick(g.v.namespaces)
		if len(p.Roles) > 0 && g.C.Intn(2) == 0 {
			ns = p.Roles[g.C.Intn(len(p.Roles))].Namespace
		}
		p.RoleBindings = append(p.RoleBindings, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("rb%d", i)},
			RoleRef:    g.roleRef(p, ns), Subjects: g.subjects(),
		})
	}
	for i := range g.C.Intn(3) {
		p.ClusterRoleBindings = append(p.ClusterRoleBindings, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("crb%d", i)},
			RoleRef:    g.roleRef(p, ""), Subjects: g.subjects(),
		})
	}
	return p
}

// User returns a random identity, often one that some binding of p names,
// and half of the time passed through authz.Mapping (which adds
// system:authenticated and the ServiceAccount groups).
func (g *Gen) User(p *Policy) user.Info {
	u := &user.DefaultInfo{Name: g.pick(g.v.users)}
	for range g.C.Intn(3) {
		u.Groups = append(u.Groups, g.pick(g.v.groups))
	}
	if bindings := bindingsOf(p); len(bindings) > 0 && g.C.Intn(3) != 0 {
		b := bindings[g.C.Intn(len(bindings))]
		if len(b.subjects) > 0 {
			Become(u, b.subjects[g.C.Intn(len(b.subjects))], b.namespace)
		}
	}
	return g.maybeMap(u)
}

func (g *Gen) maybeMap(u *user.DefaultInfo) user.Info {
	if g.C.Intn(2) == 0 {
		return authz.Mapping{}.Map(u)
	}
	return u
}

// Become makes u match the subject of a binding in namespace. It reports
// false for a subject of a kind that matches nobody.
func Become(u *user.DefaultInfo, s rbacv1.Subject, namespace string) bool {
	switch s.Kind {
	case rbacv1.UserKind:
		u.Name = s.Name
	case rbacv1.GroupKind:
		u.Groups = append(u.Groups, s.Name)
	case rbacv1.ServiceAccountKind:
		ns := s.Namespace
		if ns == "" {
			ns = namespace
		}
		u.Name = authz.ServiceAccountUsername(ns, s.Name)
	default:
		return false
	}
	return true
}

// binding is a RoleBinding or ClusterRoleBinding seen the same way.
type binding struct {
	namespace string
	ref       rbacv1.RoleRef
	subjects  []rbacv1.Subject
}

func bindingsOf(p *Policy) []binding {
	var out []binding
	for _, b := range p.RoleBindings {
		out = append(out, binding{b.Namespace, b.RoleRef, b.Subjects})
	}
	for _, b := range p.ClusterRoleBindings {
		out = append(out, binding{"", b.RoleRef, b.Subjects})
	}
	return out
}

// rulesOf returns the rules a binding's reference resolves to, the way
// Kubernetes resolves it (first match, Role in the binding's namespace).
func rulesOf(p *Policy, b binding) []rbacv1.PolicyRule {
	switch b.ref.Kind {
	case "ClusterRole":
		for _, r := range p.ClusterRoles {
			if r.Name == b.ref.Name {
				return r.Rules
			}
		}
	case "Role":
		for _, r := range p.Roles {
			if r.Namespace == b.namespace && r.Name == b.ref.Name {
				return r.Rules
			}
		}
	}
	return nil
}

// Case returns a random identity and request. Two times in three it is
// aimed: a binding of p, a subject of it as the user, a rule of its role as
// the request, in the binding's namespace; then one field may be changed,
// to probe the edges (a near miss is as useful as a hit).
func (g *Gen) Case(p *Policy) authz.Attributes {
	bindings := bindingsOf(p)
	if len(bindings) == 0 || g.C.Intn(3) == 0 {
		u := g.User(p)
		return g.Request(p, u)
	}
	b := bindings[g.C.Intn(len(bindings))]
	u := &user.DefaultInfo{Name: g.pick(g.v.users)}
	if len(b.subjects) > 0 {
		Become(u, b.subjects[g.C.Intn(len(b.subjects))], b.namespace)
	}
	rules := rulesOf(p, b)
	if len(rules) == 0 {
		return g.Request(p, g.maybeMap(u))
	}
	a := g.fromRule(&rules[g.C.Intn(len(rules))], g.maybeMap(u))
	if a.ResourceRequest {
		a.Namespace = b.namespace
		if b.namespace == "" {
			a.Namespace = g.pick(g.v.requestNamespaces)
		}
		if a.Resource == "namespaces" && a.Name != "" && g.C.Intn(2) == 0 {
			a.Namespace = a.Name
		}
	}
	switch g.C.Intn(9) {
	case 0:
		a.Verb = g.pick(g.v.verbs)
	case 1:
		a.Resource = g.pick(g.v.reqRes)
	case 2:
		a.Subresource = g.pick(g.v.subres)
	case 3:
		a.Name = g.pick(g.v.names)
	case 4:
		a.Namespace = g.pick(g.v.requestNamespaces)
	case 5:
		a.APIGroup = g.pick(g.v.apiGroups)
	}
	return a
}

// fromRule returns a request the rule is likely to allow.
func (g *Gen) fromRule(r *rbacv1.PolicyRule, u user.Info) authz.Attributes {
	one := func(from, vocab []string) string {
		if len(from) > 0 && g.C.Intn(6) != 0 {
			return from[g.C.Intn(len(from))]
		}
		return g.pick(vocab)
	}
	a := authz.Attributes{User: u, Verb: one(r.Verbs, g.v.verbs)}
	if a.Verb == "*" {
		a.Verb = g.pick(g.v.verbs)
	}
	if len(r.Resources) == 0 || (len(r.NonResourceURLs) > 0 && g.C.Intn(2) == 0) {
		a.Path = one(r.NonResourceURLs, g.v.paths)
		if a.Path == "*" || (len(a.Path) > 0 && a.Path[len(a.Path)-1] == '*') {
			a.Path = a.Path[:len(a.Path)-1] + g.pick([]string{"", "x", "x/y"})
		}
		return a
	}
	a.ResourceRequest = true
	a.APIGroup = one(r.APIGroups, g.v.apiGroups)
	if a.APIGroup == "*" {
		a.APIGroup = g.pick(g.v.apiGroups)
	}
	a.Resource, a.Subresource = g.resource(one(r.Resources, g.v.reqRes), false)
	if len(r.ResourceNames) > 0 {
		a.Name = r.ResourceNames[g.C.Intn(len(r.ResourceNames))]
	} else {
		a.Name = g.pick(g.v.names)
	}
	return a
}

// Request returns a random request for u, sometimes shaped after a rule of
// p.
func (g *Gen) Request(p *Policy, u user.Info) authz.Attributes {
	a := authz.Attributes{User: u, ResourceRequest: g.C.Intn(8) != 0}
	var rules []rbacv1.PolicyRule
	for _, r := range p.Roles {
		rules = append(rules, r.Rules...)
	}
	for _, r := range p.ClusterRoles {
		rules = append(rules, r.Rules...)
	}
	var from *rbacv1.PolicyRule
	if len(rules) > 0 && g.C.Intn(3) != 0 {
		from = &rules[g.C.Intn(len(rules))]
	}
	choose := func(fromRule []string, vocab []string) string {
		if from != nil && len(fromRule) > 0 && g.C.Intn(4) != 0 {
			return fromRule[g.C.Intn(len(fromRule))]
		}
		return g.pick(vocab)
	}
	a.Verb = choose(ruleField(from, func(r *rbacv1.PolicyRule) []string { return r.Verbs }), g.v.verbs)
	if !a.ResourceRequest {
		a.Path = choose(ruleField(from, func(r *rbacv1.PolicyRule) []string { return r.NonResourceURLs }), g.v.paths)
		return a
	}
	a.APIGroup = choose(ruleField(from, func(r *rbacv1.PolicyRule) []string { return r.APIGroups }), g.v.apiGroups)
	a.Resource, a.Subresource = g.resource(choose(ruleField(from, func(r *rbacv1.PolicyRule) []string { return r.Resources }), g.v.reqRes), true)
	a.Name = choose(ruleField(from, func(r *rbacv1.PolicyRule) []string { return r.ResourceNames }), g.v.names)
	a.Namespace = g.pick(g.v.requestNamespaces)
	if a.Resource == "namespaces" && a.Name != "" && g.C.Intn(2) == 0 {
		a.Namespace = a.Name // what the apiserver sets for namespaces/<name>
	}
	return a
}

// resource turns a rule's resource entry into a request's resource and
// subresource: "pods/log" is pods with log, a wildcard part becomes a
// random value, and anySub also randomizes a missing subresource.
func (g *Gen) resource(entry string, anySub bool) (string, string) {
	res, sub, _ := strings.Cut(entry, "/")
	if res == "*" {
		res = g.pick(g.v.reqRes)
	}
	if sub == "*" || (anySub && sub == "") {
		sub = g.pick(g.v.subres)
	}
	return res, sub
}

func ruleField(r *rbacv1.PolicyRule, f func(*rbacv1.PolicyRule) []string) []string {
	if r == nil {
		return nil
	}
	return f(r)
}
