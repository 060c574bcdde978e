package authz

import (
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/fleetgraph/fleetgraph/index"
)

// The RBAC wildcards. They are the same string, but each names what it
// stands for where it is used, as the Kubernetes API does.
const (
	// VerbAll in a rule's verbs matches every verb.
	VerbAll = "*"
	// APIGroupAll in a rule's apiGroups matches every API group.
	APIGroupAll = "*"
	// ResourceAll in a rule's resources matches every resource and
	// subresource.
	ResourceAll = "*"
	// NonResourceAll in a rule's nonResourceURLs matches every path.
	NonResourceAll = "*"
)

// Attributes is one request to authorize, with the fields the Kubernetes
// authorizer.Attributes exposes to RBAC. fleetgraph cannot import the
// apiserver authorizer types (they pull in client code), so this is the
// plain-struct equivalent; the differential test converts it one to one.
type Attributes struct {
	// User is the identity, already mapped for the cluster (see Mapping).
	User user.Info
	// Verb is the API verb: get, list, watch, create, update, patch,
	// delete, deletecollection, or a custom verb. Matching is exact and
	// case-sensitive, as in Kubernetes.
	Verb string
	// Namespace is the namespace attribute of the request. It is empty for
	// cluster-wide requests. For a request on namespaces/<name> it is
	// <name>, as the apiserver's request parser sets it.
	Namespace string
	// APIGroup is the API group of the resource; "" is the core group.
	APIGroup string
	// Resource is the plural resource name, for example "pods".
	Resource string
	// Subresource is, for example, "status" or "scale"; empty for the main
	// resource.
	Subresource string
	// Name is the object name; empty for list, watch and create.
	Name string
	// ResourceRequest is false for requests on non-resource URLs such as
	// /healthz, which only Path and Verb describe.
	ResourceRequest bool
	// Path is the URL path of a non-resource request.
	Path string
}

// RuleAllows reports whether one policy rule allows the request. It is the
// single && chain of small, pure matchers that the Kubernetes RBAC
// authorizer uses, so that each matcher can be tested and reasoned about
// alone.
func RuleAllows(attrs *Attributes, rule *index.PolicyRule) bool {
	if attrs.ResourceRequest {
		combined := attrs.Resource
		if attrs.Subresource != "" {
			combined = attrs.Resource + "/" + attrs.Subresource
		}
		return VerbMatches(rule, attrs.Verb) &&
			APIGroupMatches(rule, attrs.APIGroup) &&
			ResourceMatches(rule, combined, attrs.Subresource) &&
			ResourceNameMatches(rule, attrs.Name)
	}
	return VerbMatches(rule, attrs.Verb) &&
		NonResourceURLMatches(rule, attrs.Path)
}

// RulesAllow reports whether any of the rules allows the request; rules are
// additive, so one match is enough.
func RulesAllow(attrs *Attributes, rules []index.PolicyRule) bool {
	for i := range rules {
		if RuleAllows(attrs, &rules[i]) {
			return true
		}
	}
	return false
}

// VerbMatches reports whether the rule names the verb or the wildcard.
func VerbMatches(rule *index.PolicyRule, verb string) bool {
	for _, v := range rule.Verbs {
		if v == VerbAll || v == verb {
			return true
		}
	}
	return false
}

// APIGroupMatches reports whether the rule names the API group or the
// wildcard. The core group is the empty string, which a rule must list
// explicitly as "".
func APIGroupMatches(rule *index.PolicyRule, group string) bool {
	for _, g := range rule.APIGroups {
		if g == APIGroupAll || g == group {
			return true
		}
	}
	return false
}

// ResourceMatches reports whether the rule covers the resource. combined is
// "resource" or "resource/subresource". A rule entry matches when it is the
// wildcard, equals combined exactly, or is "*/subresource" for the
// request's subresource. "pods" does not cover "pods/status", and
// "*/scale" does not cover a request without a subresource.
func ResourceMatches(rule *index.PolicyRule, combined, subresource string) bool {
	for _, r := range rule.Resources {
		if r == ResourceAll || r == combined {
			return true
		}
		if subresource != "" && len(r) == len(subresource)+2 &&
			strings.HasPrefix(r, "*/") && strings.HasSuffix(r, subresource) {
			return true
		}
	}
	return false
}

// ResourceNameMatches reports whether the rule's resourceNames allow the
// object name. A rule without resourceNames allows every name, including
// none; a rule with resourceNames allows only those names, so it never
// matches a nameless list or watch (unless it literally lists "").
func ResourceNameMatches(rule *index.PolicyRule, name string) bool {
	if len(rule.ResourceNames) == 0 {
		return true
	}
	for _, n := range rule.ResourceNames {
		if n == name {
			return true
		}
	}
	return false
}

// NonResourceURLMatches reports whether the rule covers a non-resource
// path: the wildcard, an exact path, or a prefix ending in "*".
func NonResourceURLMatches(rule *index.PolicyRule, path string) bool {
	for _, u := range rule.NonResourceURLs {
		if u == NonResourceAll || u == path {
			return true
		}
		if strings.HasSuffix(u, "*") && strings.HasPrefix(path, strings.TrimRight(u, "*")) {
			return true
		}
	}
	return false
}
