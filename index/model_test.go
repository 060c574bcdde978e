package index

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// The model test's size and seed. FLEETGRAPH_MODEL_OPS runs more
// operations (the default is what make test runs), FLEETGRAPH_MODEL_SEED
// replays a failure with the seed it printed.
const (
	modelOpsEnv    = "FLEETGRAPH_MODEL_OPS"
	modelSeedEnv   = "FLEETGRAPH_MODEL_SEED"
	modelOps       = 100_000
	modelSeed      = 20261123
	modelBatch     = 1000 // operations between two rounds of checks
	modelWalkPages = 40   // pages per walk, at most: page sizes grow with the answer
)

// The model fleet: few enough values in every dimension that random
// filters hit, with the cases that have bitten before. Two kinds share the
// name Service in different groups. Cluster c3 is an edge whose discovery
// names core Services "pods", so its Services are what a viewer who may
// list pods there sees, and nothing of it follows another cluster's
// mapping. Kustomizations of c2 may switch to another plural between
// syncs, so a Replace must drop rows of the kind whatever resource they
// were stored with.
var (
	modelClusters   = []string{"c0", "c1", "c2", "c3"}
	modelNamespaces = []string{"ns0", "ns1", "ns2", "ns3", "kube-system"}
	modelNames      = []string{"api", "web", "Db", "cache-api", "worker", "WEB-canary"}
	modelStates     = []ConnectionState{StateConnected, StateDegraded, StateConnecting, StateDisconnected}
	modelMessages   = []string{"", "ok", "Back-off restarting failed container"}
	modelKinds      = []Kind{
		podKind,
		{Version: "v1", Kind: "Service", Resource: "services", Namespaced: true},
		{Group: "serving.knative.dev", Version: "v1", Kind: "Service", Resource: "services", Namespaced: true},
		flux,
		{Group: "networking.istio.io", Version: "v1", Kind: "VirtualService", Resource: "virtualservices", Namespaced: true},
		nodeKind,
	}
	modelKindTerms = []string{
		"Pod", "pod", "pods", "Service", "services", "Service.serving.knative.dev", "Service.", "SERVICE",
		"Kustomization.kustomize.toolkit.fluxcd.io", "Kustomization.wrong.group", "kustomizations", "kustomizations-v2",
		"VirtualService", "virtualservices.networking.istio.io", "Node", "nodes", "Secret",
	}
	modelSelectors = []string{
		"k0=v1", "k1!=v0", "k2 in (v0,v2)", "k0 notin (v1)", "k1", "!k2", "n>4", "n<3", "k0=v0,k1",
		"missing=x", "!missing", "k3==v2,n>1", "app.kubernetes.io/name=web", "k0 in (v0),k1 notin (v1,v2),!k3",
	}
	modelBadSelectors = []string{"k0 in ((v1)", "n>x", "=v", "k0=v0,,"}
	// Cluster rows carry labels from these; cluster selectors ask for them.
	modelClusterLabels    = []map[string]string{nil, {"env": "prod"}, {"env": "dev", "region": "eu"}, {"region": "us"}}
	modelClusterSelectors = []string{"env=prod", "env!=prod", "region in (eu,us)", "!env", "env", "env=dev,region=eu", "tier=gold"}
	modelNameTerms        = []string{"api", "WEB", "-0", "b-1", "canary-00", "zzz", "D"}
	modelGRs              = []GroupResource{
		podsGR,
		{Resource: "services"},
		{Group: "serving.knative.dev", Resource: "services"},
		fluxGR,
		{Group: flux.Group, Resource: "kustomizations-v2"},
		{Group: "networking.istio.io", Resource: "virtualservices"},
		nodesGR,
		{Resource: "secrets"},
	}
)

// fleetModel is the reference: a map of rows and cluster rows, changed
// the way Sink documents it, next to the Store under test.
type fleetModel struct {
	t   *testing.T
	rnd *rand.Rand
	s   *Store
	clk *fakeClock

	objs     map[Key]Object
	keys     []Key       // the keys of objs, for random picks in a reproducible order
	keyAt    map[Key]int // index of each key in keys
	clusters map[string]Cluster
	// resources holds the plural each cluster reports per group and kind.
	resources map[string]map[groupKindName]string
	seq       int // UIDs and resource versions
	ops       map[string]int
	// where says how to replay a failure.
	where string
}

func newFleetModel(t *testing.T, seed uint64) *fleetModel {
	s, clk := newTestStore(t)
	m := &fleetModel{
		t: t, rnd: rand.New(rand.NewPCG(seed, seed)), s: s, clk: clk,
		objs: map[Key]Object{}, keyAt: map[Key]int{}, clusters: map[string]Cluster{},
		resources: map[string]map[groupKindName]string{}, ops: map[string]int{},
	}
	for _, c := range modelClusters {
		m.resources[c] = map[groupKindName]string{}
		for _, k := range modelKinds {
			r := k.Resource
			if c == "c3" && k.Group == "" && k.Kind == "Service" {
				r = "pods"
			}
			m.resources[c][groupKindName{Group: k.Group, Kind: k.Kind}] = r
		}
	}
	return m
}

// TestModel drives a Store with mixed random operations (upserts of new
// and changed rows, unchanged upserts, label changes, deletes, batches,
// Replace with kept, changed, dropped, new and duplicate rows, cluster
// state changes and RemoveCluster) and, after every batch of operations,
// checks every sort order in both directions with a random filter and
// access set: all pages through their cursors, totals, stale clusters,
// facets and the feed position, against the model. Matcher must agree
// with the reference on the same rows.
func TestModel(t *testing.T) {
	ops, seed := modelOps, uint64(modelSeed)
	if v := os.Getenv(modelOpsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", modelOpsEnv, v)
		}
		ops = n
	}
	if v := os.Getenv(modelSeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a number", modelSeedEnv, v)
		}
		seed = n
	}
	t.Logf("model test: %d operations, seed %d (%s=%d %s=%d to replay)", ops, seed, modelSeedEnv, seed, modelOpsEnv, ops)
	m := newFleetModel(t, seed)
	walks := 0
	for done := 0; done < ops; {
		n := min(modelBatch, ops-done)
		for i := range n {
			m.where = fmt.Sprintf("seed %d, operation %d", seed, done+i)
			m.step()
		}
		done += n
		m.where = fmt.Sprintf("seed %d, checks after operation %d", seed, done)
		walks += m.check(done%(10*modelBatch) == 0 || done == ops)
	}
	t.Logf("model test: %d operations %v, %d objects at the end, %d page walks checked", ops, m.ops, len(m.objs), walks)
}

// step performs one random operation on the store and the model.
func (m *fleetModel) step() {
	m.clk.Advance(time.Duration(m.rnd.IntN(3)) * time.Millisecond)
	switch r := m.rnd.IntN(1000); {
	case r < 500:
		m.upsert(m.changed(m.randomKey()))
	case r < 600:
		if k := m.existingKey(); k != nil {
			m.upsert(m.changed(*k))
		}
	case r < 680:
		k := m.existingKey()
		if k == nil {
			return
		}
		o := m.objs[*k]
		o.ResourceVersion = m.nextRV() // a resync: same content
		o.UpdatedAt = time.Time{}
		m.upsert(o)
		m.ops["unchanged"]++
	case r < 880:
		k := m.randomKey()
		if ek := m.existingKey(); ek != nil && m.rnd.IntN(4) > 0 {
			k = *ek
		}
		m.ops["delete"]++
		mustNoErr(m.t, m.s.Delete(ctxb, k))
		m.remove(k)
	case r < 940:
		m.upsertBatch()
	case r < 965:
		m.replace()
	case r < 999:
		m.setClusterState()
	default:
		c := modelClusters[m.rnd.IntN(len(modelClusters))]
		m.ops["removeCluster"]++
		mustNoErr(m.t, m.s.RemoveCluster(ctxb, c))
		m.removeWhere(func(k Key) bool { return k.Cluster == c })
		delete(m.clusters, c)
	}
}

func (m *fleetModel) nextRV() string {
	m.seq++
	return strconv.Itoa(m.seq)
}

// randomKey returns a key of the model fleet, stored or not.
func (m *fleetModel) randomKey() Key {
	k := modelKinds[m.rnd.IntN(len(modelKinds))]
	key := Key{
		Cluster: modelClusters[m.rnd.IntN(len(modelClusters))],
		Group:   k.Group, Kind: k.Kind,
		Name: fmt.Sprintf("%s-%02d", modelNames[m.rnd.IntN(len(modelNames))], m.rnd.IntN(12)),
	}
	if k.Namespaced {
		key.Namespace = modelNamespaces[m.rnd.IntN(len(modelNamespaces))]
	}
	return key
}

// existingKey returns a stored key, or nil when there is none.
func (m *fleetModel) existingKey() *Key {
	if len(m.keys) == 0 {
		return nil
	}
	k := m.keys[m.rnd.IntN(len(m.keys))]
	return &k
}

// remove deletes a key from the model.
func (m *fleetModel) remove(k Key) {
	i, ok := m.keyAt[k]
	if !ok {
		return
	}
	last := m.keys[len(m.keys)-1]
	m.keys[i], m.keyAt[last] = last, i
	m.keys = m.keys[:len(m.keys)-1]
	delete(m.keyAt, k)
	delete(m.objs, k)
}

// removeWhere deletes the keys for which drop is true.
func (m *fleetModel) removeWhere(drop func(Key) bool) {
	for _, k := range slices.Clone(m.keys) {
		if drop(k) {
			m.remove(k)
		}
	}
}

// changed returns the row to write for key k: a new object, or the stored
// one with some fields changed (most often its labels).
func (m *fleetModel) changed(k Key) Object {
	o, ok := m.objs[k]
	if !ok {
		m.ops["create"]++
		o = Object{
			Cluster: k.Cluster, Namespace: k.Namespace, Group: k.Group, Kind: k.Kind, Name: k.Name,
			UID:       "uid-" + m.nextRV(),
			CreatedAt: time.Unix(1_700_000_000+int64(m.rnd.IntN(40)), int64(m.rnd.IntN(3))).UTC(),
			Status:    Statuses[m.rnd.IntN(len(Statuses))],
			Labels:    LabelsOf(m.randomLabels(nil)),
		}
	} else {
		m.ops["update"]++
		switch m.rnd.IntN(6) {
		case 0:
			o.Status = Statuses[m.rnd.IntN(len(Statuses))]
		case 1:
			o.Message = modelMessages[m.rnd.IntN(len(modelMessages))]
		case 2:
			o.Summary = fmt.Appendf(nil, `{"restarts":%d}`, m.rnd.IntN(3))
		case 3:
			o.OwnerRefs = []OwnerRef{{Kind: "ReplicaSet", Name: fmt.Sprintf("rs-%d", m.rnd.IntN(2))}}
		default:
			m.ops["labelChange"]++
			o.Labels = LabelsOf(m.randomLabels(o.Labels.Map()))
		}
	}
	kind := m.kindIn(k.Cluster, k.Group, k.Kind)
	o.Version, o.Resource = kind.Version, kind.Resource
	o.ResourceVersion = m.nextRV()
	o.UpdatedAt = time.Time{}
	return o
}

// kindIn returns a kind as cluster c reports it.
func (m *fleetModel) kindIn(c, group, kind string) Kind {
	for _, k := range modelKinds {
		if k.Group == group && k.Kind == kind {
			k.Resource = m.resources[c][groupKindName{Group: group, Kind: kind}]
			return k
		}
	}
	m.t.Fatalf("%s: no kind %s.%s", m.where, kind, group)
	return Kind{}
}

// randomLabels changes one label of base, or makes new labels when base
// is nil. The result is a new map, or nil for none.
func (m *fleetModel) randomLabels(base map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
		for range m.rnd.IntN(4) {
			out[fmt.Sprintf("k%d", m.rnd.IntN(4))] = fmt.Sprintf("v%d", m.rnd.IntN(3))
		}
		if m.rnd.IntN(2) == 0 {
			out["n"] = strconv.Itoa(m.rnd.IntN(10))
		}
	} else {
		key := []string{"k0", "k1", "k2", "k3", "n", "app.kubernetes.io/name"}[m.rnd.IntN(6)]
		switch {
		case m.rnd.IntN(3) == 0:
			delete(out, key)
		case key == "n":
			out[key] = strconv.Itoa(m.rnd.IntN(10))
		case key == "app.kubernetes.io/name":
			out[key] = []string{"web", "api"}[m.rnd.IntN(2)]
		default:
			out[key] = fmt.Sprintf("v%d", m.rnd.IntN(3))
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// upsert writes o through Upsert and applies it to the model.
func (m *fleetModel) upsert(o Object) {
	mustNoErr(m.t, m.s.Upsert(ctxb, o))
	m.apply(o)
}

// apply is the model of writing one row: a row equal to the stored one,
// ignoring UpdatedAt and ResourceVersion, changes nothing; any other
// row is stored with UpdatedAt set to the time of the write.
func (m *fleetModel) apply(o Object) {
	if old, ok := m.objs[o.Key()]; ok && sameObject(&old, &o, false) {
		return
	}
	o.UpdatedAt = m.clk.Now()
	k := o.Key()
	if _, ok := m.objs[k]; !ok {
		m.keyAt[k] = len(m.keys)
		m.keys = append(m.keys, k)
	}
	m.objs[k] = o
}

// sameObject compares two rows field by field; UpdatedAt and
// ResourceVersion only when all is set.
func sameObject(a, b *Object, all bool) bool {
	if all && (!a.UpdatedAt.Equal(b.UpdatedAt) || a.ResourceVersion != b.ResourceVersion) {
		return false
	}
	return a.Key() == b.Key() && a.Version == b.Version && a.Resource == b.Resource && a.UID == b.UID &&
		a.Labels.Equal(b.Labels) && slices.Equal(a.OwnerRefs, b.OwnerRefs) &&
		a.CreatedAt.Equal(b.CreatedAt) && a.Status == b.Status && a.Message == b.Message &&
		bytes.Equal(a.Summary, b.Summary) && a.Policy == nil && b.Policy == nil
}

// upsertBatch writes 1 to 400 rows in one UpsertBatch, sometimes with a
// key twice (the later row wins), so that both the serial and the
// two-goroutine bulk paths run.
func (m *fleetModel) upsertBatch() {
	n := 1 + m.rnd.IntN(20)
	if m.rnd.IntN(20) == 0 {
		n = bulkMin + m.rnd.IntN(150)
	}
	rows := make([]Object, 0, n)
	for range n {
		if len(rows) > 0 && m.rnd.IntN(50) == 0 {
			prev := rows[m.rnd.IntN(len(rows))]
			prev.Status = Statuses[m.rnd.IntN(len(Statuses))]
			rows = append(rows, prev)
			continue
		}
		rows = append(rows, m.changed(m.randomKey()))
	}
	m.ops["upsertBatch"]++
	mustNoErr(m.t, m.s.UpsertBatch(ctxb, rows))
	for _, o := range rows {
		m.apply(o)
	}
}

// replace sets the full list of one kind in one cluster: most stored rows
// kept (some changed), some dropped, some new, sometimes a key twice, and
// sometimes none at all.
func (m *fleetModel) replace() {
	c := modelClusters[m.rnd.IntN(len(modelClusters))]
	k := modelKinds[m.rnd.IntN(len(modelKinds))]
	gk := groupKindName{Group: k.Group, Kind: k.Kind}
	if c == "c2" && k.Kind == flux.Kind && m.rnd.IntN(2) == 0 {
		// The cluster's discovery now names the kind differently.
		if m.resources[c][gk] == flux.Resource {
			m.resources[c][gk] = "kustomizations-v2"
		} else {
			m.resources[c][gk] = flux.Resource
		}
		m.ops["remap"]++
	}
	kind := m.kindIn(c, k.Group, k.Kind)
	ofKind := func(key Key) bool { return key.Cluster == c && key.Group == k.Group && key.Kind == k.Kind }
	var stored []Key
	for _, key := range m.keys {
		if ofKind(key) {
			stored = append(stored, key)
		}
	}
	var rows []Object
	if m.rnd.IntN(10) > 0 {
		for _, key := range stored {
			switch r := m.rnd.IntN(10); {
			case r < 2: // dropped
			case r < 4:
				rows = append(rows, m.changed(key))
			default:
				o := m.objs[key]
				o.Version, o.Resource = kind.Version, kind.Resource
				o.ResourceVersion, o.UpdatedAt = m.nextRV(), time.Time{}
				rows = append(rows, o)
			}
		}
		for range m.rnd.IntN(30) {
			key := m.randomKey()
			key.Cluster, key.Group, key.Kind = c, k.Group, k.Kind
			key.Namespace = ""
			if k.Namespaced {
				key.Namespace = modelNamespaces[m.rnd.IntN(len(modelNamespaces))]
			}
			rows = append(rows, m.changed(key))
		}
		if len(rows) > 0 && m.rnd.IntN(5) == 0 {
			dup := rows[m.rnd.IntN(len(rows))]
			dup.Message = "duplicate"
			rows = append(rows, dup)
		}
	}
	m.ops["replace"]++
	mustNoErr(m.t, m.s.Replace(ctxb, c, kind, rows))
	// The last row of a key wins and is compared with the row stored
	// before the Replace (UpsertBatch instead applies rows in turn: a key
	// changed and changed back within one batch gets a new UpdatedAt).
	last := map[Key]Object{}
	for _, o := range rows {
		last[o.Key()] = o
	}
	listed := map[Key]bool{}
	for _, o := range rows {
		if lo := last[o.Key()]; !listed[o.Key()] {
			m.apply(lo)
			listed[o.Key()] = true
		}
	}
	m.removeWhere(func(key Key) bool { return ofKind(key) && !listed[key] })
}

// setClusterState writes a cluster row with a random state: the rows of
// a cluster that is neither connected nor degraded are stale.
func (m *fleetModel) setClusterState() {
	name := modelClusters[m.rnd.IntN(len(modelClusters))]
	c := Cluster{
		Name: name, Mode: ModePull, State: modelStates[m.rnd.IntN(len(modelStates))], Since: m.clk.Now(),
		Labels: modelClusterLabels[m.rnd.IntN(len(modelClusterLabels))],
	}
	m.ops["clusterState"]++
	mustNoErr(m.t, m.s.UpsertCluster(ctxb, c))
	m.clusters[name] = c
}

// randomModelFilter returns a filter over every dimension, each present
// about half of the time, with values that exist and values that do not.
func (m *fleetModel) randomFilter() Filter {
	var f Filter
	some := func(values []string) []string {
		var out []string
		for range 1 + m.rnd.IntN(2) {
			out = append(out, values[m.rnd.IntN(len(values))])
		}
		return out
	}
	if m.rnd.IntN(3) == 0 {
		f.Clusters = some(append(slices.Clone(modelClusters), "c9"))
	}
	if m.rnd.IntN(3) == 0 {
		f.Namespaces = some(append(slices.Clone(modelNamespaces), "", "nsX"))
	}
	if m.rnd.IntN(2) == 0 {
		f.Kinds = some(modelKindTerms)
	}
	if m.rnd.IntN(3) == 0 {
		for _, st := range some([]string{"HEALTHY", "PROGRESSING", "UNHEALTHY", "TERMINATING", "UNKNOWN"}) {
			f.Statuses = append(f.Statuses, Status(st))
		}
	}
	if m.rnd.IntN(4) == 0 {
		f.NameContains = modelNameTerms[m.rnd.IntN(len(modelNameTerms))]
	}
	if m.rnd.IntN(2) == 0 {
		f.LabelSelector = modelSelectors[m.rnd.IntN(len(modelSelectors))]
	}
	if m.rnd.IntN(5) == 0 {
		f.ClusterSelector = modelClusterSelectors[m.rnd.IntN(len(modelClusterSelectors))]
	}
	return f
}

// randomAccess returns nil (sees nothing), All, or per cluster one of:
// absent, All, or a mix of resources listed everywhere, per namespace and
// single names (in one namespace, in any, or cluster-scoped).
func (m *fleetModel) randomAccess() *Access {
	switch m.rnd.IntN(20) {
	case 0:
		return nil
	case 1:
		return &Access{}
	case 2, 3, 4:
		return &Access{All: true}
	}
	grs := func() *Resources {
		var out []GroupResource
		for range 1 + m.rnd.IntN(2) {
			out = append(out, modelGRs[m.rnd.IntN(len(modelGRs))])
		}
		return NewResources(out...)
	}
	a := &Access{Clusters: map[string]*ClusterAccess{}}
	for _, c := range modelClusters {
		if m.rnd.IntN(4) == 0 {
			continue
		}
		ca := &ClusterAccess{}
		if m.rnd.IntN(6) == 0 {
			ca.All = true
		}
		if m.rnd.IntN(3) == 0 {
			ca.Everywhere = grs()
		}
		if m.rnd.IntN(2) == 0 {
			ca.Namespaces = map[string]*Resources{}
			for range 1 + m.rnd.IntN(3) {
				ca.Namespaces[modelNamespaces[m.rnd.IntN(len(modelNamespaces))]] = grs()
			}
		}
		if m.rnd.IntN(2) == 0 {
			ca.Named = map[NamedObject]struct{}{}
			for range 1 + m.rnd.IntN(8) {
				k := m.randomKey()
				gr := GroupResource{Group: k.Group, Resource: m.resources[c][groupKindName{Group: k.Group, Kind: k.Kind}]}
				ns := k.Namespace
				if m.rnd.IntN(3) == 0 {
					ns = "" // the name in any namespace
				}
				ca.Named[NamedObject{GroupResource: gr, Namespace: ns, Name: k.Name}] = struct{}{}
			}
		}
		a.Clusters[c] = ca
	}
	return a
}

// refFilter is the reference definition of Filter, written from its
// documentation: every non-empty field must match, and the values inside
// one field are alternatives. Kinds match by kind name or plural,
// ignoring case, and by group when qualified ("Kind.group"); names
// contain the term, ignoring case; label selectors mean what they mean to
// Kubernetes, over the object's labels or its cluster row's.
type refFilter struct {
	f             *Filter
	sel, cluster  labels.Selector // nil when not set
	clusterLabels map[string]map[string]string
}

func (m *fleetModel) newRefFilter(f *Filter) *refFilter {
	r := &refFilter{f: f, clusterLabels: map[string]map[string]string{}}
	for name, c := range m.clusters {
		r.clusterLabels[name] = c.Labels
	}
	for _, p := range []struct {
		text string
		sel  *labels.Selector
	}{{f.LabelSelector, &r.sel}, {f.ClusterSelector, &r.cluster}} {
		if p.text == "" {
			continue
		}
		sel, err := labels.Parse(p.text)
		if err != nil {
			m.t.Fatalf("%s: test selector %q: %v", m.where, p.text, err)
		}
		*p.sel = sel
	}
	return r
}

func (r *refFilter) matches(o *Object) bool {
	f := r.f
	is := func(v string) func(string) bool { return func(w string) bool { return w == v } }
	kind := func(term string) bool {
		name, group, qualified := strings.Cut(term, ".")
		return (strings.EqualFold(name, o.Kind) || strings.EqualFold(name, o.Resource)) && (!qualified || group == o.Group)
	}
	return anyOf(f.Clusters, is(o.Cluster)) && anyOf(f.Namespaces, is(o.Namespace)) && anyOf(f.Kinds, kind) &&
		anyOf(f.Statuses, func(st Status) bool { return st == o.Status }) &&
		strings.Contains(strings.ToLower(o.Name), strings.ToLower(f.NameContains)) &&
		(r.sel == nil || r.sel.Matches(o.Labels)) &&
		(r.cluster == nil || r.cluster.Matches(labels.Set(r.clusterLabels[o.Cluster])))
}

// anyOf reports whether values is empty (the field does not filter) or
// one of them matches.
func anyOf[T any](values []T, match func(T) bool) bool {
	return len(values) == 0 || slices.ContainsFunc(values, match)
}

// check runs one walk per order and direction, and with full set also
// reads every key back. It returns the number of walks.
func (m *fleetModel) check(full bool) int {
	if full {
		m.checkGets()
	}
	m.s.mu.RLock()
	err := checkNamespaceKinds(m.s.x)
	m.s.mu.RUnlock()
	if err != nil {
		m.t.Fatalf("%s: %v", m.where, err)
	}
	walks := 0
	for _, field := range allOrders {
		for _, desc := range []bool{false, true} {
			m.walk(m.randomFilter(), m.randomAccess(), Order{Field: field, Desc: desc})
			walks++
		}
	}
	if m.rnd.IntN(4) == 0 {
		f := m.randomFilter()
		f.LabelSelector = modelBadSelectors[m.rnd.IntN(len(modelBadSelectors))]
		if _, err := m.s.Query(ctxb, Query{Filter: f, Access: &Access{All: true}}); !isInvalidQuery(err) {
			m.t.Fatalf("%s: selector %q: query error %v, want ErrInvalidQuery", m.where, f.LabelSelector, err)
		}
		if _, err := m.s.Facets(ctxb, f, &Access{All: true}); !isInvalidQuery(err) {
			m.t.Fatalf("%s: selector %q: facets error %v, want ErrInvalidQuery", m.where, f.LabelSelector, err)
		}
	}
	return walks
}

// checkGets reads back every stored key of the model, and a sample of
// keys it does not hold.
func (m *fleetModel) checkGets() {
	for k, want := range m.objs {
		got, ok := m.s.Get(k)
		if !ok || !sameObject(got, &want, true) {
			m.t.Fatalf("%s: Get(%s) = %+v, %v; want %+v", m.where, k, got, ok, want)
		}
	}
	for range 200 {
		k := m.randomKey()
		if _, want := m.objs[k]; !want {
			if got, ok := m.s.Get(k); ok {
				m.t.Fatalf("%s: Get(%s) found a row the model does not hold: %+v", m.where, k, got)
			}
		}
	}
	p, err := m.s.Query(ctxb, Query{Access: &Access{All: true}, First: 1})
	mustNoErr(m.t, err)
	if p.TotalCount != len(m.objs) {
		m.t.Fatalf("%s: %d objects, model %d", m.where, p.TotalCount, len(m.objs))
	}
}

// walk pages through one query to its end and compares everything with
// the model: every row (all fields), its order, each page's total,
// HasNextPage, staleness and feed position, then the facets.
func (m *fleetModel) walk(f Filter, a *Access, order Order) {
	ref := m.newRefFilter(&f)
	var want []Object
	for _, o := range m.objs {
		gr := GroupResource{Group: o.Group, Resource: o.Resource}
		if refAllows(a, o.Cluster, gr, o.Namespace, o.Name) && ref.matches(&o) {
			want = append(want, o)
		}
	}
	slices.SortFunc(want, func(x, y Object) int { return refCompare(order, &x, &y) })
	wantStale := m.staleInScope(ref, a)
	desc := fmt.Sprintf("%s: filter %+v order %+v access %s", m.where, f, order, describeAccess(a))
	m.checkMatcher(f, a, ref, desc)

	first := []int{0, 1, 2, 3, 7, 10, 50, 100, 1000}[m.rnd.IntN(9)] // 0: the default size
	pageSize := first
	if pageSize == 0 {
		pageSize = DefaultPageSize
	}
	if len(want)/pageSize > modelWalkPages {
		first = len(want)/modelWalkPages + 1
		pageSize = first
	}
	// Half the walks ask for the pages alone: they must not change.
	noTotal := m.rnd.IntN(2) == 0
	wantTotal := len(want)
	if noTotal {
		wantStale, wantTotal = nil, 0
	}
	var got []Object
	after := ""
	for pages := 0; ; pages++ {
		p, err := m.s.Query(ctxb, Query{Filter: f, Order: order, First: first, After: after, Access: a, NoTotal: noTotal})
		if err != nil {
			m.t.Fatalf("%s: page %d: %v", desc, pages, err)
		}
		if p.TotalCount != wantTotal {
			m.t.Fatalf("%s: page %d (NoTotal %v): total %d, want %d", desc, pages, noTotal, p.TotalCount, wantTotal)
		}
		if p.Seq != m.s.LastSeq() {
			m.t.Fatalf("%s: page at seq %d, store at %d", desc, p.Seq, m.s.LastSeq())
		}
		if !slices.Equal(p.StaleClusters, wantStale) || (p.StaleClusters == nil) != (wantStale == nil) {
			m.t.Fatalf("%s: stale clusters %v, want %v", desc, p.StaleClusters, wantStale)
		}
		rest := len(want) - len(got)
		if len(p.Edges) != min(pageSize, rest) || p.HasNextPage != (rest > pageSize) {
			m.t.Fatalf("%s: page %d of size %d: %d edges, hasNextPage %v; %d rows left", desc, pages, pageSize, len(p.Edges), p.HasNextPage, rest)
		}
		for _, e := range p.Edges {
			w := &want[len(got)]
			if !sameObject(e.Object, w, true) {
				mo, ok := m.objs[e.Object.Key()]
				m.t.Fatalf("%s: row %d = %+v, want %+v (model holds the row: %v %+v)", desc, len(got), *e.Object, *w, ok, mo)
			}
			if c, ok := m.clusters[w.Cluster]; e.Stale != (ok && c.Stale()) {
				m.t.Fatalf("%s: row %s stale = %v", desc, w.Key(), e.Stale)
			}
			got = append(got, *e.Object)
		}
		if !p.HasNextPage {
			break
		}
		after = p.Edges[len(p.Edges)-1].Cursor
	}
	checkFacets(m.t, m.s, f, a, want)
	wantStale = m.staleInScope(ref, a)
	fc, err := m.s.Facets(ctxb, f, a)
	mustNoErr(m.t, err)
	if !slices.Equal(fc.StaleClusters, wantStale) || fc.Seq != m.s.LastSeq() {
		m.t.Fatalf("%s: facets stale clusters %v at seq %d, want %v at %d", desc, fc.StaleClusters, fc.Seq, wantStale, m.s.LastSeq())
	}
}

// checkMatcher checks that Matcher, the per-event filter of
// subscriptions, agrees with the reference on a sample of rows.
func (m *fleetModel) checkMatcher(f Filter, a *Access, ref *refFilter, desc string) {
	mt, err := m.s.NewMatcher(f, a)
	if err != nil {
		m.t.Fatalf("%s: NewMatcher: %v", desc, err)
	}
	for range 50 {
		k := m.existingKey()
		if k == nil {
			return
		}
		o := m.objs[*k]
		gr := GroupResource{Group: o.Group, Resource: o.Resource}
		if want := refAllows(a, o.Cluster, gr, o.Namespace, o.Name) && ref.matches(&o); mt.Match(&o) != want {
			m.t.Fatalf("%s: Matcher.Match(%s) = %v, want %v", desc, o.Key(), !want, want)
		}
	}
}

// staleInScope is the reference for Page.StaleClusters: the stale
// clusters the filter names (or all, with no cluster filter) and its
// cluster selector matches, that the viewer has any access to, in name
// order.
func (m *fleetModel) staleInScope(ref *refFilter, a *Access) []string {
	out := []string{}
	for name, c := range m.clusters {
		if !c.Stale() || !anyOf(ref.f.Clusters, func(n string) bool { return n == name }) ||
			(ref.cluster != nil && !ref.cluster.Matches(labels.Set(c.Labels))) {
			continue
		}
		if a == nil || (!a.All && a.Clusters[name] == nil) {
			continue
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// describeAccess prints an access set for a failure message.
func describeAccess(a *Access) string {
	if a == nil {
		return "nil"
	}
	if a.All {
		return "all"
	}
	var b strings.Builder
	for _, c := range slices.Sorted(maps.Keys(a.Clusters)) {
		ca := a.Clusters[c]
		fmt.Fprintf(&b, "%s{all:%v everywhere:%v namespaces:{", c, ca.All, slices.Collect(ca.Everywhere.All()))
		for _, ns := range slices.Sorted(maps.Keys(ca.Namespaces)) {
			fmt.Fprintf(&b, "%s:%v ", ns, slices.Collect(ca.Namespaces[ns].All()))
		}
		fmt.Fprintf(&b, "} named:%v} ", ca.Named)
	}
	return b.String()
}

func isInvalidQuery(err error) bool { return errors.Is(err, ErrInvalidQuery) }
