package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// ErrInvalidRow is returned (wrapped) for a row the index cannot store:
// missing identity fields, a \x00 in a key part, or a row whose cluster or
// kind does not match the Replace it came with.
var ErrInvalidRow = errors.New("index: invalid row")

// objRow is the compact, immutable in-memory form of an Object. The index
// keeps 96 bytes of row plus its data bytes per object: cluster, namespace
// and kind strings are interned ids, labels are sorted pair ids and times
// are Unix nanoseconds. Updates build a new objRow; the old one stays valid
// for readers and change events that still hold it.
//
// A row keeps only the name of its key: the cluster, group, kind and
// namespace are the ids' strings (see keyOf), and comparing keys compares
// ids first (compareRows). Keeping the whole key, as rows did before, cost
// its other parts again in every row: about 35 bytes an object in the
// benchmark fleet.
//
// The name, the uid, the resource version, the label pair ids and the
// summary share one allocation (data) rather than five: the garbage
// collector's work grows with the number of objects and pointers in the
// heap, and at 1M rows each collection cycle marked about seven objects per
// row. Copying the uid, resource version and summary also stops a row from
// pinning the caller's buffers. The parts of data are found by offsets
// rather than by string and slice headers (16 or 24 bytes each), and the
// owner references by a pointer and a count: that took a row from 144
// bytes (its allocation size class) to 96, about 48 MB at 1M objects.
type objRow struct {
	data    string // name, uid, resource version, label pair ids (4-byte little-endian, sorted), summary
	kind    *kindInfo
	owners  *OwnerRef // the first of nOwners, nil for none
	message string    // the caller's string until the row is stored, then the msgDict copy
	created int64     // Unix nanoseconds, 0 for the zero time
	updated int64
	rid     uint32 // dense row id used by posting lists; stable while the object exists
	cid     uint32
	nsid    uint32 // 0 for cluster-scoped objects
	// The name is data[:nameLen], the uid data[nameLen:uidEnd], the
	// resource version data[uidEnd:rvEnd], the label pair ids
	// data[rvEnd:labelsEnd] and the summary data[labelsEnd:].
	uidEnd, rvEnd, labelsEnd uint32
	nameLen                  uint16 // names are at most maxKeyLen bytes
	// The number of owner references is nOwners | ownersHi<<16, at most
	// maxOwners: 24 bits in the bytes a 96-byte row has to spare.
	nOwners  uint16
	status   uint8 // index into Statuses
	ownersHi uint8
}

// name returns the object name: the last key part.
func (r *objRow) name() string { return r.data[:r.nameLen] }

func (r *objRow) uid() string { return r.data[r.nameLen:r.uidEnd] }
func (r *objRow) rv() string  { return r.data[r.uidEnd:r.rvEnd] }

// labelBytes returns the encoded label pair ids; equal strings mean equal
// labels.
func (r *objRow) labelBytes() string { return r.data[r.rvEnd:r.labelsEnd] }

// numLabels returns the number of labels.
func (r *objRow) numLabels() int { return int(r.labelsEnd-r.rvEnd) / 4 }

// label returns the pair id of label i, in increasing pair id order.
func (r *objRow) label(i int) uint32 {
	b := r.labelBytes()[4*i:]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// labelIDs appends the row's label pair ids to dst.
func (r *objRow) labelIDs(dst []uint32) []uint32 {
	for i := range r.numLabels() {
		dst = append(dst, r.label(i))
	}
	return dst
}

// summary returns the row's summary, nil for none. It shares the row's
// bytes: like every part of an Object the index returns, callers must not
// change it.
func (r *objRow) summary() []byte {
	s := r.data[r.labelsEnd:]
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// ownerRefs returns the row's owner references, nil for none, sharing the
// slice the row was built from.
func (r *objRow) ownerRefs() []OwnerRef {
	if r.owners == nil {
		return nil
	}
	return unsafe.Slice(r.owners, int(r.nOwners)|int(r.ownersHi)<<16)
}

// rowData encodes the data of a row in one allocation (see objRow); ids
// must be sorted. It returns the data and the ends of the uid, resource
// version and labels.
func rowData(name, uid, rv string, ids []uint32, summary []byte) (data string, uidEnd, rvEnd, labelsEnd int) {
	b := make([]byte, 0, len(name)+len(uid)+len(rv)+4*len(ids)+len(summary))
	b = append(b, name...)
	b = append(b, uid...)
	uidEnd = len(b)
	b = append(b, rv...)
	rvEnd = len(b)
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	labelsEnd = len(b)
	b = append(b, summary...)
	return unsafe.String(unsafe.SliceData(b), len(b)), uidEnd, rvEnd, labelsEnd // b is not used again
}

// sameFields reports whether o, whose key is old's, has the content of
// the stored row old but for its labels (see sameLabels), UpdatedAt and
// ResourceVersion: with sameLabels, the change detection of Replace and
// Upsert. It compares the Object with the row directly, so an unchanged row
// (most rows of a relist) costs no interning and no allocation.
func sameFields(o *Object, old *objRow) bool {
	k := old.kind
	return statusIndex(o.Status) == old.status && o.UID == old.uid() &&
		unixNano(o.CreatedAt) == old.created && o.Message == old.message &&
		o.Version == k.Version && o.Resource == k.Resource && (o.Namespace != "") == k.Namespaced &&
		slices.Equal(o.OwnerRefs, old.ownerRefs()) && bytes.Equal(o.Summary, old.summary())
}

// sameLabels reports whether labels are the labels of row r.
func (x *objIndex) sameLabels(labels map[string]string, r *objRow) bool {
	if len(labels) != r.numLabels() {
		return false
	}
	for i := range r.numLabels() {
		pid := r.label(i)
		if v, ok := labels[x.labels.key(pid)]; !ok || v != x.labels.value(pid) {
			return false
		}
	}
	return true
}

// statusIndex maps a Status to its index in Statuses; anything unknown
// (including the invalid zero value) is stored as StatusUnknown.
func statusIndex(s Status) uint8 {
	for i, v := range Statuses {
		if v == s {
			return uint8(i)
		}
	}
	return statusUnknownIndex
}

const statusUnknownIndex = 4 // index of StatusUnknown in Statuses

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// appendObjectKey appends the compoundKey of k's parts (cluster, group,
// kind, namespace, name) to b: what the key index hashes and cursors
// carry.
func appendObjectKey(b []byte, k Key) []byte {
	return appendKey(b, k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
}

// objectKeyLen returns the length of k's appendObjectKey encoding.
func objectKeyLen(k *Key) int {
	return len(k.Cluster) + len(k.Group) + len(k.Kind) + len(k.Namespace) + len(k.Name) + 5
}

// parseObjectKey is the inverse of appendObjectKey: it reports false
// unless key is five NUL-terminated parts. The parts share key's bytes.
func parseObjectKey(key string) (Key, bool) {
	var parts [5]string
	for i := range parts {
		end := strings.IndexByte(key, 0)
		if end < 0 {
			return Key{}, false
		}
		parts[i], key = key[:end], key[end+1:]
	}
	if key != "" {
		return Key{}, false
	}
	return Key{Cluster: parts[0], Group: parts[1], Kind: parts[2], Namespace: parts[3], Name: parts[4]}, true
}

// keyOf returns the key of row r, its strings shared with the
// dictionaries and the row: it allocates nothing. It must be called with
// the lock held (read or write).
func (x *objIndex) keyOf(r *objRow) Key {
	return Key{
		Cluster: x.clusters.str(r.cid), Group: r.kind.Group, Kind: r.kind.Kind.Kind,
		Namespace: x.namespaces.str(r.nsid), Name: r.name(),
	}
}

// hasKey reports whether row r has key k, comparing the name first (the
// part most keys differ in) and the namespace last (the dictionary least
// likely to be in cache).
func (x *objIndex) hasKey(r *objRow, k *Key) bool {
	return r.name() == k.Name && r.kind.Kind.Kind == k.Kind && r.kind.Group == k.Group &&
		x.clusters.str(r.cid) == k.Cluster && x.namespaces.str(r.nsid) == k.Namespace
}

// compareKeys orders keys part by part: cluster, group, kind, namespace,
// then name. It is the order of their appendObjectKey encodings (parts hold
// no NUL, which ends each part), the order cursors were made in.
func compareKeys(a, b *Key) int {
	if c := strings.Compare(a.Cluster, b.Cluster); c != 0 {
		return c
	}
	if c := strings.Compare(a.Group, b.Group); c != 0 {
		return c
	}
	if c := strings.Compare(a.Kind, b.Kind); c != 0 {
		return c
	}
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

// compareRowKey is compareKeys of row r's key and k, reading only the
// parts it needs.
func (x *objIndex) compareRowKey(r *objRow, k *Key) int {
	if c := strings.Compare(x.clusters.str(r.cid), k.Cluster); c != 0 {
		return c
	}
	if c := strings.Compare(r.kind.Group, k.Group); c != 0 {
		return c
	}
	if c := strings.Compare(r.kind.Kind.Kind, k.Kind); c != 0 {
		return c
	}
	if c := strings.Compare(x.namespaces.str(r.nsid), k.Namespace); c != 0 {
		return c
	}
	return strings.Compare(r.name(), k.Name)
}

// compareRows is compareKeys of two rows' keys. Parts whose ids are equal
// are equal, so rows of one cluster, kind and namespace compare by name
// without reading a dictionary.
func (x *objIndex) compareRows(a, b *objRow) int {
	if a.cid != b.cid {
		if c := strings.Compare(x.clusters.str(a.cid), x.clusters.str(b.cid)); c != 0 {
			return c
		}
	}
	if a.kind != b.kind { // another version or resource may share the group and kind
		if c := strings.Compare(a.kind.Group, b.kind.Group); c != 0 {
			return c
		}
		if c := strings.Compare(a.kind.Kind.Kind, b.kind.Kind.Kind); c != 0 {
			return c
		}
	}
	if a.nsid != b.nsid {
		if c := strings.Compare(x.namespaces.str(a.nsid), x.namespaces.str(b.nsid)); c != 0 {
			return c
		}
	}
	return strings.Compare(a.name(), b.name())
}

// maxKeyLen bounds a key so that name lengths fit in 16 bits; Kubernetes
// names are at most 253 bytes.
const maxKeyLen = 4096

// maxOwners bounds the owner references of a row so that their count fits
// in 24 bits. No object Kubernetes stores reaches it: a reference needs a
// non-empty apiVersion, kind, name and uid, at least 8 bytes even in
// protobuf, and etcd keeps objects of at most 1.5 MB, so under 200,000
// references. (A 16-bit count did not hold: about 17-byte references fit
// 65,536 times in a ConfigMap, and one such row made its kind's Replace
// fail.)
const maxOwners = 1<<24 - 1

// ownersFit reports whether n owner references fit an objRow.
func ownersFit(n int) bool { return n <= maxOwners }

// maxDataLen bounds the uid, resource version, labels and summary of a
// row, so that their offsets fit in 32 bits.
const maxDataLen = 1<<32 - 1 - maxKeyLen - 5

// validateRow checks the identity fields of a row (validateKey) and that
// its parts fit an objRow.
func validateRow(o *Object) error {
	if err := validateKey(o.Key()); err != nil {
		return err
	}
	if !ownersFit(len(o.OwnerRefs)) {
		return fmt.Errorf("%w: %s: more than %d owner references", ErrInvalidRow, o.Key(), maxOwners)
	}
	if n := uint64(len(o.UID)) + uint64(len(o.ResourceVersion)) + 4*uint64(len(o.Labels)) + uint64(len(o.Summary)); n > maxDataLen {
		return fmt.Errorf("%w: %s: uid, resource version, labels and summary longer than %d bytes", ErrInvalidRow, o.Key(), maxDataLen)
	}
	return nil
}

// validateKey checks the identity fields of a row.
func validateKey(k Key) error {
	if k.Cluster == "" || k.Kind == "" || k.Name == "" {
		return fmt.Errorf("%w: %s: cluster, kind and name are required", ErrInvalidRow, k)
	}
	if n := len(k.Cluster) + len(k.Group) + len(k.Kind) + len(k.Namespace) + len(k.Name); n > maxKeyLen {
		return fmt.Errorf("%w: %s: key longer than %d bytes", ErrInvalidRow, k, maxKeyLen)
	}
	for _, p := range []string{k.Cluster, k.Group, k.Kind, k.Namespace, k.Name} {
		if strings.IndexByte(p, 0) >= 0 {
			return fmt.Errorf("%w: %q: key parts must not contain NUL", ErrInvalidRow, k.String())
		}
	}
	return nil
}

// internLabels appends the sorted pair ids of labels to dst.
func (x *objIndex) internLabels(dst []uint32, labels map[string]string) []uint32 {
	n := len(dst)
	for k, v := range labels {
		dst = append(dst, x.labels.intern(k, v))
	}
	slices.Sort(dst[n:])
	return dst
}

// hasLabels reports whether the row's label pair ids are ids.
func (r *objRow) hasLabels(ids []uint32) bool {
	if r.numLabels() != len(ids) {
		return false
	}
	for i, id := range ids {
		if r.label(i) != id {
			return false
		}
	}
	return true
}

// buildRow converts o, whose sorted label pair ids are ids, into a row,
// interning its cluster, namespace and kind. It must be called with the
// write lock held. The row has no rid yet, and its message is interned
// only when the row is stored.
func (x *objIndex) buildRow(o *Object, ids []uint32) *objRow {
	data, uidEnd, rvEnd, labelsEnd := rowData(o.Name, o.UID, o.ResourceVersion, ids, o.Summary)
	r := &objRow{
		data:      data,
		nameLen:   uint16(len(o.Name)),
		uidEnd:    uint32(uidEnd),
		rvEnd:     uint32(rvEnd),
		labelsEnd: uint32(labelsEnd),
		kind:      x.kinds.intern(Kind{Group: o.Group, Version: o.Version, Kind: o.Kind, Resource: o.Resource, Namespaced: o.Namespace != ""}),
		cid:       x.clusters.intern(o.Cluster),
		nsid:      x.namespaces.intern(o.Namespace),
		status:    statusIndex(o.Status),
		created:   unixNano(o.CreatedAt),
		updated:   unixNano(o.UpdatedAt),
		message:   o.Message,
	}
	if len(o.OwnerRefs) > 0 {
		n := len(o.OwnerRefs)
		r.owners, r.nOwners, r.ownersHi = &o.OwnerRefs[0], uint16(n), uint8(n>>16)
	}
	return r
}

// object materializes the row as an Object. It must be called with the
// read lock held (the dictionaries are read).
func (x *objIndex) object(r *objRow) *Object {
	o := &Object{}
	x.fillObject(o, r)
	return o
}

// fillObject sets *o to the Object of a row, under the read lock, with a
// Labels map of its own (pages share theirs: pageCache).
func (x *objIndex) fillObject(o *Object, r *objRow) {
	x.fillFields(o, r)
	o.Labels = x.labels.labelMap(r)
}

// fillFields sets *o to the Object of a row but for its Labels, under the
// read lock.
func (x *objIndex) fillFields(o *Object, r *objRow) {
	*o = Object{
		Cluster:         x.clusters.str(r.cid),
		Namespace:       x.namespaces.str(r.nsid),
		Group:           r.kind.Group,
		Version:         r.kind.Version,
		Kind:            r.kind.Kind.Kind,
		Resource:        r.kind.Resource,
		Name:            r.name(),
		UID:             r.uid(),
		OwnerRefs:       r.ownerRefs(),
		CreatedAt:       fromUnixNano(r.created),
		UpdatedAt:       fromUnixNano(r.updated),
		ResourceVersion: r.rv(),
		Status:          Statuses[r.status],
		Message:         r.message,
		Summary:         r.summary(),
	}
}
