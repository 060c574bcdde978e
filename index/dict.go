package index

// strDict interns strings as dense ids. The index keeps numeric ids in rows
// and posting lists instead of strings: a cluster, namespace or label is
// stored once however many rows use it.
//
// Dictionaries are append-only for the life of the Store: ids are never
// reused, so a row or change event that outlives the strings' last user
// still resolves to the right text. The cost is that strings no longer used
// (a deleted namespace, an old pod-template-hash) keep their entry, about
// 60 bytes each plus the text.
type strDict struct {
	ids  map[string]uint32
	strs []string
}

func newStrDict() *strDict {
	return &strDict{ids: map[string]uint32{}}
}

// intern returns the id of s, adding it when new.
func (d *strDict) intern(s string) uint32 {
	if id, ok := d.ids[s]; ok {
		return id
	}
	id := uint32(len(d.strs))
	s = cloneString(s)
	d.strs = append(d.strs, s)
	d.ids[s] = id
	return id
}

// lookup returns the id of s if it was ever interned.
func (d *strDict) lookup(s string) (uint32, bool) {
	id, ok := d.ids[s]
	return id, ok
}

// str returns the string of id.
func (d *strDict) str(id uint32) string { return d.strs[id] }

// len returns how many strings were interned.
func (d *strDict) len() int { return len(d.strs) }

// cloneString copies s so that an interned string does not pin the larger
// buffer (a decoded JSON document, a protobuf message) it was sliced from.
func cloneString(s string) string {
	if s == "" {
		return ""
	}
	return string([]byte(s))
}

// kindInfo is the interned description of one (group, version, kind,
// resource, scope) as rows carry it. Rows point at it, so version, resource
// and the group/resource pair used by access checks cost 8 bytes per row.
type kindInfo struct {
	Kind
	// kid identifies (group, kind) regardless of version: it is the unit
	// of the kind filter, the kind facet and the count cells.
	kid uint32
	gr  GroupResource
}

// kindDict interns kindInfo values and (group, kind) ids.
type kindDict struct {
	infos map[Kind]*kindInfo
	kids  map[groupKindName]uint32
	// byKid and grOf are indexed by kid; grOf is the resource of the
	// first version seen (a kind keeps its plural across versions).
	byKid []groupKindName
	grOf  []GroupResource
}

// groupKindName is the (group, kind) pair that a kid stands for.
type groupKindName struct {
	Group string
	Kind  string
}

// String returns "Kind" or "Kind.group", the filter and facet form.
func (g groupKindName) String() string {
	return Kind{Group: g.Group, Kind: g.Kind}.GroupKind()
}

func newKindDict() *kindDict {
	return &kindDict{infos: map[Kind]*kindInfo{}, kids: map[groupKindName]uint32{}}
}

// intern returns the shared kindInfo for k.
func (d *kindDict) intern(k Kind) *kindInfo {
	if ki, ok := d.infos[k]; ok {
		return ki
	}
	k = Kind{
		Group: cloneString(k.Group), Version: cloneString(k.Version), Kind: cloneString(k.Kind),
		Resource: cloneString(k.Resource), Namespaced: k.Namespaced,
	}
	gk := groupKindName{Group: k.Group, Kind: k.Kind}
	kid, ok := d.kids[gk]
	if !ok {
		kid = uint32(len(d.byKid))
		d.kids[gk] = kid
		d.byKid = append(d.byKid, gk)
		d.grOf = append(d.grOf, GroupResource{Group: k.Group, Resource: k.Resource})
	}
	ki := &kindInfo{Kind: k, kid: kid, gr: GroupResource{Group: k.Group, Resource: k.Resource}}
	d.infos[k] = ki
	return ki
}

// labelPair is one interned key=value: ids into the key and value
// dictionaries.
type labelPair struct {
	kid uint32
	vid uint32
}

// labelDict interns label keys, values and key=value pairs. Rows hold
// sorted pair ids (4 bytes per label) and the label index keeps one posting
// list per pair and per key. Pairs are keyed by (key id, value id) so that
// a pair costs about 24 bytes here whatever its strings.
type labelDict struct {
	keys    *strDict
	values  *strDict
	pairIDs map[uint64]uint32
	pairs   []labelPair
}

func newLabelDict() *labelDict {
	return &labelDict{keys: newStrDict(), values: newStrDict(), pairIDs: map[uint64]uint32{}}
}

// intern returns the pair id of key=value.
func (d *labelDict) intern(key, value string) uint32 {
	kid, vid := d.keys.intern(key), d.values.intern(value)
	pk := uint64(kid)<<32 | uint64(vid)
	if id, ok := d.pairIDs[pk]; ok {
		return id
	}
	id := uint32(len(d.pairs))
	d.pairs = append(d.pairs, labelPair{kid: kid, vid: vid})
	d.pairIDs[pk] = id
	return id
}

// lookup returns the pair id of key=value if it was ever interned.
func (d *labelDict) lookup(key, value string) (uint32, bool) {
	kid, ok := d.keys.lookup(key)
	if !ok {
		return 0, false
	}
	vid, ok := d.values.lookup(value)
	if !ok {
		return 0, false
	}
	id, ok := d.pairIDs[uint64(kid)<<32|uint64(vid)]
	return id, ok
}

// key and value return the strings of a pair.
func (d *labelDict) key(pid uint32) string   { return d.keys.str(d.pairs[pid].kid) }
func (d *labelDict) value(pid uint32) string { return d.values.str(d.pairs[pid].vid) }
