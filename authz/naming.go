package authz

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"
)

// ErrReservedName means an authenticator was about to establish an
// identity with a name Kubernetes reserves for itself (a user or group
// starting with "system:", which covers ServiceAccounts, nodes, anonymous
// and system:masters) without being allowed to. The credential is rejected.
var ErrReservedName = errors.New("reserved system: name")

// SystemPrefix starts every user and group name Kubernetes reserves.
const SystemPrefix = "system:"

// Naming is how one authenticator names the identities it establishes,
// before any per-cluster Mapping. Each authenticator has its own, so that
// two authenticators cannot hand out the same identity by accident: an
// OIDC user "alice" is "https://issuer#alice" by default, never the static
// token file's "alice".
//
// The zero Naming adds no prefixes and refuses reserved names.
type Naming struct {
	// UsernamePrefix is put in front of every username.
	UsernamePrefix string
	// GroupsPrefix is put in front of every group.
	GroupsPrefix string
	// AllowSystemNames lets the authenticator establish usernames and
	// groups starting with "system:" after the prefixes are applied: a
	// ServiceAccount (system:serviceaccount:<ns>:<name>, which Mapping
	// gives the ServiceAccount groups), system:masters, and so on. Off by
	// default, so that a token or a claim cannot make its holder a
	// ServiceAccount or a member of a system group; turn it on only for a
	// source the operator writes (a token file) or fully trusts.
	AllowSystemNames bool
}

// apply prefixes u's name and groups in place and checks them against the
// reserved names.
func (n Naming) apply(u *user.DefaultInfo) error {
	u.Name = n.UsernamePrefix + u.Name
	for i, g := range u.Groups {
		u.Groups[i] = n.GroupsPrefix + g
	}
	if n.AllowSystemNames {
		return nil
	}
	if strings.HasPrefix(u.Name, SystemPrefix) {
		return fmt.Errorf("%w: user %q (this authenticator may not assert system: identities)", ErrReservedName, u.Name)
	}
	for _, g := range u.Groups {
		if strings.HasPrefix(g, SystemPrefix) {
			return fmt.Errorf("%w: group %q of user %q (this authenticator may not assert system: groups)", ErrReservedName, g, u.Name)
		}
	}
	return nil
}

// Revocable is implemented by the user.Info of credentials that can be
// withdrawn before they expire, as a line of a token file can. A websocket
// authenticated once must end when Revoked is closed, or it would keep
// streaming to a caller the server now refuses.
type Revocable interface {
	// Revoked is closed when the credentials stop being valid.
	Revoked() <-chan struct{}
}

// RevokedChan returns the channel closed when the credentials u was
// authenticated with are revoked, or nil when they cannot be.
func RevokedChan(u user.Info) <-chan struct{} {
	if r, ok := u.(Revocable); ok {
		return r.Revoked()
	}
	return nil
}
