// Package indextest generates deterministic synthetic fleets for the index
// and graph benchmarks and for tests that need many realistic rows.
//
// Any object of a fleet can be computed on its own from its number, so a
// benchmark can stream a million rows in batches without holding them, and
// a churn driver can rebuild any object with new content.
package indextest

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
)

// Fleet describes a synthetic fleet: Clusters × Namespaces × PerNamespace
// objects. The default (DefaultFleet) is the 1M-object fleet of the index
// benchmark:
//
//   - kinds: Pod 50%, Service 15%, EndpointSlice 15%, Flux kinds 10%,
//     Istio kinds 10%;
//   - statuses: HEALTHY 90%, PROGRESSING 5%, UNHEALTHY 5%;
//   - 3–8 labels from 500 keys and 5,000 values, skewed the way real
//     labels are (every object has app=..., a few keys and values are
//     common, most are rare); app=v0 is on about 1.4% of objects;
//   - messages of 0–200 bytes: healthy objects carry one of 64 stock
//     messages, others a message naming the object, each a fresh string
//     as a collector would produce it.
type Fleet struct {
	Clusters     int
	Namespaces   int
	PerNamespace int
	// Seed varies the content; the same seed gives the same fleet.
	Seed uint64
}

// DefaultFleet is the 100 × 1,000 × 10 = 1,000,000 object fleet.
func DefaultFleet() Fleet {
	return Fleet{Clusters: 100, Namespaces: 1000, PerNamespace: 10, Seed: 1}
}

// Size returns the number of objects.
func (f Fleet) Size() int { return f.Clusters * f.Namespaces * f.PerNamespace }

// ClusterName returns the name of cluster c.
func ClusterName(c int) string {
	var buf [32]byte
	return string(appendPadded(append(buf[:0], "cluster-"...), c, 3))
}

// NamespaceName returns the name of namespace n; every cluster has the
// same namespace names, as fleets that deploy the same apps do.
func NamespaceName(n int) string {
	var buf [32]byte
	return string(appendNamespace(buf[:0], n))
}

func appendNamespace(b []byte, n int) []byte { return appendPadded(append(b, "ns-"...), n, 4) }

// Kinds lists the kinds of the fleet with their discovery data.
var Kinds = []index.Kind{
	{Group: "", Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true},
	{Group: "", Version: "v1", Kind: "Service", Resource: "services", Namespaced: true},
	{Group: "discovery.k8s.io", Version: "v1", Kind: "EndpointSlice", Resource: "endpointslices", Namespaced: true},
	{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization", Resource: "kustomizations", Namespaced: true},
	{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository", Resource: "gitrepositories", Namespaced: true},
	{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Kind: "OCIRepository", Resource: "ocirepositories", Namespaced: true},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmRepository", Resource: "helmrepositories", Namespaced: true},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "HelmChart", Resource: "helmcharts", Namespaced: true},
	{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "Bucket", Resource: "buckets", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1", Kind: "VirtualService", Resource: "virtualservices", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1", Kind: "DestinationRule", Resource: "destinationrules", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1", Kind: "Gateway", Resource: "gateways", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1", Kind: "ServiceEntry", Resource: "serviceentries", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1", Kind: "Sidecar", Resource: "sidecars", Namespaced: true},
	{Group: "networking.istio.io", Version: "v1alpha3", Kind: "EnvoyFilter", Resource: "envoyfilters", Namespaced: true},
	{Group: "security.istio.io", Version: "v1", Kind: "PeerAuthentication", Resource: "peerauthentications", Namespaced: true},
	{Group: "security.istio.io", Version: "v1", Kind: "RequestAuthentication", Resource: "requestauthentications", Namespaced: true},
	{Group: "extensions.istio.io", Version: "v1alpha1", Kind: "WasmPlugin", Resource: "wasmplugins", Namespaced: true},
}

const (
	fluxFirst, fluxCount   = 3, 7
	istioFirst, istioCount = 10, 9
	labelKeys              = 500
	labelValues            = 5000
	stockMessages          = 64
	baseUnix               = 1_700_000_000
)

// mix is splitmix64: a fast, well-spread hash for deterministic choices.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// rng is a tiny deterministic generator seeded per object.
type rng struct{ s uint64 }

func (r *rng) next() uint64   { r.s = mix(r.s); return r.s }
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// skewed returns an index in [0, n) where low indexes are much more likely
// (density ~ 1/sqrt(i)), like real label keys and values.
func (r *rng) skewed(n int) int {
	u := float64(r.next()>>11) / (1 << 53)
	return int(u * u * float64(n))
}

// Key returns the key of object i, Object(i).Key(), without building the
// rest of the object.
func (f Fleet) Key(i int) index.Key {
	k := Kinds[f.KindOf(i)]
	name, _ := f.name(i, k)
	return index.Key{Cluster: ClusterName(f.ClusterOf(i)), Group: k.Group, Kind: k.Kind, Namespace: NamespaceName(f.NamespaceOf(i)), Name: name}
}

// name returns the name of object i, of kind k, and its generator as the
// name leaves it, for the rest of the object.
//
// Strings are built with append rather than fmt: the generator runs
// between the timed ingest batches, and its garbage would otherwise be
// collected inside them. Every string is still a fresh one, as a
// collector decoding objects produces.
func (f Fleet) name(i int, k index.Kind) (string, rng) {
	r := rng{s: mix(f.Seed ^ uint64(i)*0x2545f4914f6cdd1d)}
	r.next()
	r.next()
	var buf [64]byte
	b := appendLower(buf[:0], k.Kind)
	b = strconv.AppendInt(append(b, '-'), int64(r.skewed(2000)), 10)
	b = appendHex(append(b, '-'), r.next()&0xfffff, 5)
	return string(b), r
}

// KindOf returns the index in Kinds of object i.
func (f Fleet) KindOf(i int) int {
	r := rng{s: mix(f.Seed ^ uint64(i)*0x2545f4914f6cdd1d)}
	switch p := r.intn(100); {
	case p < 50:
		return 0
	case p < 65:
		return 1
	case p < 80:
		return 2
	case p < 90:
		return fluxFirst + r.intn(fluxCount)
	default:
		return istioFirst + r.intn(istioCount)
	}
}

// Object returns object i (0 <= i < Size()) at version 0.
func (f Fleet) Object(i int) index.Object { return f.Version(i, 0) }

// Version returns object i with content version v: versions above 0 change
// status, message and resource version the way status churn does, and
// every eighth version also changes one label.
func (f Fleet) Version(i, v int) index.Object {
	c, n := f.ClusterOf(i), f.NamespaceOf(i)
	k := Kinds[f.KindOf(i)]
	name, r := f.name(i, k)
	var buf [256]byte
	labels := make(map[string]string, 8)
	labels["app"] = number('v', r.skewed(labelValues))
	for want := 3 + r.intn(6); len(labels) < want; {
		key := number('k', r.skewed(labelKeys))
		labels[key] = number('v', r.skewed(labelValues))
	}
	vr := rng{s: mix(r.next() ^ uint64(v))}
	status := index.StatusHealthy
	switch p := vr.intn(100); {
	case p >= 95:
		status = index.StatusUnhealthy
	case p >= 90:
		status = index.StatusProgressing
	}
	if v > 0 && v%8 == 0 {
		labels["rev"] = strconv.Itoa(v)
	}
	msgLen := vr.intn(201)
	var msg string
	if status == index.StatusHealthy {
		msg = stockMessage(int(r.next()%stockMessages), msgLen)
	} else {
		b := append(append(buf[:0], status...), ' ')
		b = append(append(appendNamespace(b, n), '/'), name...)
		b = append(b, ": "...)
		for range msgLen {
			b = append(b, 'x')
		}
		msg = string(b[:min(len(b), 200)])
	}
	return index.Object{
		Cluster:         ClusterName(c),
		Namespace:       NamespaceName(n),
		Group:           k.Group,
		Version:         k.Version,
		Kind:            k.Kind,
		Resource:        k.Resource,
		Name:            name,
		UID:             uid(r.next(), r.next()),
		Labels:          index.LabelsOf(labels),
		CreatedAt:       time.Unix(baseUnix+int64(i), 0).UTC(),
		ResourceVersion: strconv.Itoa(1000 + i*16 + v),
		Status:          status,
		Message:         msg,
	}
}

// stockMessage returns a fresh copy of one of the stock messages, cut to
// at most n bytes.
func stockMessage(id, n int) string {
	var buf [256]byte
	b := strconv.AppendInt(append(buf[:0], "stock message "...), int64(id), 10)
	b = append(b, ": "...)
	for range 12 {
		b = append(b, "ready and serving; "...)
	}
	return string(b[:min(n, len(b), 8+id*3)])
}

// number returns prefix followed by n in decimal, a fresh string.
func number(prefix byte, n int) string {
	var buf [24]byte
	return string(strconv.AppendInt(append(buf[:0], prefix), int64(n), 10))
}

// appendPadded appends n >= 0 in decimal, zero-padded to width digits
// (%0*d).
func appendPadded(b []byte, n, width int) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], int64(n), 10)
	for range width - len(d) {
		b = append(b, '0')
	}
	return append(b, d...)
}

// appendHex appends v in lower-case hex, zero-padded to width digits
// (%0*x).
func appendHex(b []byte, v uint64, width int) []byte {
	const digits = "0123456789abcdef"
	var tmp [16]byte
	i := len(tmp)
	for v != 0 || i == len(tmp) {
		i--
		tmp[i] = digits[v&15]
		v >>= 4
	}
	for range width - (len(tmp) - i) {
		b = append(b, '0')
	}
	return append(b, tmp[i:]...)
}

// appendLower appends s in lower case (ASCII).
func appendLower(b []byte, s string) []byte {
	for i := range len(s) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

func uid(a, b uint64) string {
	var buf [40]byte
	u := appendHex(buf[:0], a>>32, 8)
	u = appendHex(append(u, '-'), (a>>16)&0xffff, 4)
	u = appendHex(append(u, '-'), a&0xffff, 4)
	u = appendHex(append(u, '-'), b>>48, 4)
	u = appendHex(append(u, '-'), b&0xffffffffffff, 12)
	return string(u)
}

// Each calls fn with consecutive batches of up to batch objects, reusing
// the slice between calls.
func (f Fleet) Each(batch int, fn func([]index.Object) error) error {
	buf := make([]index.Object, 0, batch)
	for i := 0; i < f.Size(); i++ {
		buf = append(buf, f.Object(i))
		if len(buf) == batch || i == f.Size()-1 {
			if err := fn(buf); err != nil {
				return err
			}
			clear(buf)
			buf = buf[:0]
		}
	}
	return nil
}

// ReadRules returns RBAC rules that read (get, list, watch) every kind of
// the fleet, one rule per API group in group order: the role that
// benchmarks and the big-fleet demo bind their viewers to.
func ReadRules() []index.PolicyRule {
	byGroup := map[string][]string{}
	for _, k := range Kinds {
		byGroup[k.Group] = append(byGroup[k.Group], k.Resource)
	}
	var rules []index.PolicyRule
	for _, g := range slices.Sorted(maps.Keys(byGroup)) {
		rules = append(rules, index.PolicyRule{Verbs: []string{"get", "list", "watch"}, APIGroups: []string{g}, Resources: byGroup[g]})
	}
	return rules
}

// ReplaceCluster writes the objects of cluster c (0-based) into s with one
// Replace per kind, as a collector's first sync does.
func (f Fleet) ReplaceCluster(ctx context.Context, s index.Sink, c int) error {
	per := f.Namespaces * f.PerNamespace
	byKind := make([][]index.Object, len(Kinds))
	for i := c * per; i < (c+1)*per; i++ {
		k := f.KindOf(i)
		byKind[k] = append(byKind[k], f.Object(i))
	}
	for k, rows := range byKind {
		if err := s.Replace(ctx, ClusterName(c), Kinds[k], rows); err != nil {
			return err
		}
	}
	return nil
}

// AllResources returns every GroupResource of the fleet's kinds, for
// building access sets.
func AllResources() *index.Resources {
	var grs []index.GroupResource
	for _, k := range Kinds {
		grs = append(grs, index.GroupResource{Group: k.Group, Resource: k.Resource})
	}
	return index.NewResources(grs...)
}

// NamespaceAccess returns an Access that may list every fleet resource in
// nsPerCluster namespaces of each of the first clusters clusters, the
// namespaces spread over the cluster's range.
func (f Fleet) NamespaceAccess(clusters, nsPerCluster int) *index.Access {
	grs := AllResources()
	a := &index.Access{Clusters: map[string]*index.ClusterAccess{}}
	step := max(1, f.Namespaces/nsPerCluster)
	for c := 0; c < clusters; c++ {
		ca := &index.ClusterAccess{Namespaces: map[string]*index.Resources{}}
		for j := 0; j < nsPerCluster; j++ {
			ca.Namespaces[NamespaceName((j*step)%f.Namespaces)] = grs
		}
		a.Clusters[ClusterName(c*max(1, f.Clusters/clusters))] = ca
	}
	return a
}

// Changed reports whether b is a change of a that the index publishes:
// its status, message or labels differ. A new resource version alone is
// not one (the index skips such a row as unchanged), so churn drivers
// that count updates as changes must draw them with NextChange.
func Changed(a, b index.Object) bool {
	return a.Status != b.Status || a.Message != b.Message || !a.Labels.Equal(b.Labels)
}

// NextChange returns the first version of object i after version v that
// is a change of version v (see Changed), and its number.
func (f Fleet) NextChange(i, v int) (index.Object, int) {
	cur := f.Version(i, v)
	for w := v + 1; ; w++ {
		if o := f.Version(i, w); Changed(cur, o) {
			return o, w
		}
	}
}

// Changes returns n updates of objects drawn with pick (a number in
// [0, Size())), each a change of the version the sequence gave that object
// before (version 0, which Each and Object return, for the first), so that
// applying them in order to a store holding the fleet publishes exactly n
// changes. Updates of one object must be applied in sequence order.
func (f Fleet) Changes(n int, pick func() int) []index.Object {
	version := map[int]int{}
	out := make([]index.Object, n)
	for j := range out {
		i := pick()
		out[j], version[i] = f.NextChange(i, version[i])
	}
	return out
}

// ClusterOf returns the number of the cluster object i belongs to.
func (f Fleet) ClusterOf(i int) int { return i / (f.Namespaces * f.PerNamespace) }

// NamespaceOf returns the namespace number of object i (see NamespaceName).
func (f Fleet) NamespaceOf(i int) int { return (i / f.PerNamespace) % f.Namespaces }
