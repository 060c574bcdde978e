package authz

import (
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// Identity is an authenticated viewer, normalized once per request. It
// carries a precomputed cache key (name and the sorted set of groups, the
// only parts of a user that RBAC reads), so a cached access lookup does
// not rebuild or allocate it.
type Identity struct {
	info user.Info
	key  string
	// anyKey is key already boxed, for sync.Map lookups without
	// allocation.
	anyKey any
	// last remembers where this Identity's answer sits in the Authorizer's
	// cache: a pointer into it, never a copy, honoured only while the
	// fleetState it was read from is the current one. A websocket's
	// Identity asks for its access on every operation and every policy
	// event of every subscription; this makes those lookups a few pointer
	// compares instead of hashing the key.
	last atomic.Pointer[identityHit]
}

// identityHit is one remembered place in the cache.
type identityHit struct {
	a   *Authorizer
	st  *fleetState
	acc *index.Access
}

// NewIdentity wraps what an authenticator returned. The user must not be
// mutated afterwards.
func NewIdentity(u user.Info) *Identity {
	groups := slices.Clone(u.GetGroups())
	slices.Sort(groups)
	groups = slices.Compact(groups)
	var b strings.Builder
	writeField(&b, u.GetName())
	for _, g := range groups {
		writeField(&b, g)
	}
	key := b.String()
	return &Identity{info: u, key: key, anyKey: key}
}

// writeField appends a length-prefixed field, so that distinct identities
// always have distinct keys whatever characters names contain.
func writeField(b *strings.Builder, s string) {
	b.WriteString(strconv.Itoa(len(s)))
	b.WriteByte(':')
	b.WriteString(s)
}

// User returns the identity as the authenticator returned it, before any
// per-cluster mapping.
func (id *Identity) User() user.Info { return id.info }

// Key returns the cache key: equal for identities that RBAC cannot tell
// apart (same name, same set of groups), different otherwise.
func (id *Identity) Key() string { return id.key }

// Mapping turns the identity fleetgraph authenticated into the identity a
// member cluster knows, the way that cluster's kube-apiserver would have
// built it. A fleet often authenticates people once (OIDC) while each
// cluster was set up with its own --oidc-username-prefix and
// --oidc-groups-prefix; the same prefixes must apply here, or RoleBindings
// written for "oidc:alice" would never match.
//
// The zero Mapping adds no prefixes.
type Mapping struct {
	// UsernamePrefix is put in front of the username, like
	// --oidc-username-prefix.
	UsernamePrefix string
	// GroupsPrefix is put in front of every group, like
	// --oidc-groups-prefix.
	GroupsPrefix string
}

// Map returns the identity as the cluster sees it:
//
//  1. the prefixes are applied (never to system:anonymous, which no
//     authenticator prefixes);
//  2. a username of the form system:serviceaccount:<ns>:<name> gets the
//     groups system:serviceaccounts and system:serviceaccounts:<ns>, which
//     the ServiceAccount token authenticator adds;
//  3. system:authenticated is added unless the user is system:anonymous or
//     already has system:authenticated or system:unauthenticated, as the
//     apiserver's authenticated-group adder does.
//
// A prefix is applied before step 2, so a prefixed name can never pass for
// a ServiceAccount.
func (m Mapping) Map(u user.Info) user.Info {
	name := u.GetName()
	if name == user.Anonymous {
		return u
	}
	out := &user.DefaultInfo{
		Name:   m.UsernamePrefix + name,
		UID:    u.GetUID(),
		Groups: make([]string, 0, len(u.GetGroups())+3),
		Extra:  u.GetExtra(),
	}
	for _, g := range u.GetGroups() {
		out.Groups = append(out.Groups, m.GroupsPrefix+g)
	}
	if ns, ok := serviceAccountNamespace(out.Name); ok {
		for _, g := range []string{AllServiceAccountsGroup, ServiceAccountGroupPrefix + ns} {
			if !slices.Contains(out.Groups, g) {
				out.Groups = append(out.Groups, g)
			}
		}
	}
	if !slices.Contains(out.Groups, user.AllAuthenticated) && !slices.Contains(out.Groups, user.AllUnauthenticated) {
		out.Groups = append(out.Groups, user.AllAuthenticated)
	}
	return out
}

// serviceAccountNamespace returns the namespace of a well-formed
// ServiceAccount username: the prefix followed by exactly two non-empty,
// colon-free parts.
func serviceAccountNamespace(username string) (string, bool) {
	rest, ok := strings.CutPrefix(username, ServiceAccountUsernamePrefix)
	if !ok {
		return "", false
	}
	ns, name, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || name == "" || strings.Contains(name, ":") {
		return "", false
	}
	return ns, true
}
