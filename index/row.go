package index

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
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
// keeps 80 bytes of row plus its data bytes per object: cluster, namespace
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
// pinning the caller's buffers. The parts of data are found by a header of
// lengths at its start (see span) rather than by string and slice headers
// (16 or 24 bytes each) or offsets in the row, and the owner references by
// a pointer and a count: that took a row from 144 bytes (its allocation
// size class) to 80, about 64 MB at 1M objects. The header costs about 4
// bytes of data; the 14 bytes of offsets it replaced took the row past
// 80 bytes, to the 96-byte size class.
type objRow struct {
	data    string // header, name, uid, resource version, label pair ids (4-byte little-endian, sorted), summary
	kind    *kindInfo
	owners  *OwnerRef // the first of nOwners, nil for none
	message string    // the caller's string until the row is stored, then the msgDict copy
	created int64     // Unix nanoseconds, 0 for the zero time
	updated int64
	rid     uint32 // dense row id used by posting lists; stable while the object exists
	cid     uint32
	nsid    uint32 // 0 for cluster-scoped objects
	// The number of owner references is nOwners | ownersHi<<16, at most
	// maxOwners: 24 bits in the bytes an 80-byte row has to spare.
	nOwners  uint16
	status   uint8 // index into Statuses
	ownersHi uint8
}

// span returns where the parts of r.data are: the name is
// data[start:nameEnd], the uid data[nameEnd:uidEnd], the resource version
// data[uidEnd:rvEnd], the label pair ids data[rvEnd:labelsEnd] and the
// summary data[labelsEnd:]. The data starts with four uvarints, the
// lengths of the name, uid and resource version and the number of labels
// (rowData); nearly always each is one byte.
func (r *objRow) span() (start, nameEnd, uidEnd, rvEnd, labelsEnd int) {
	if d := r.data; len(d) >= 4 && d[0]|d[1]|d[2]|d[3] < 0x80 {
		nameEnd = 4 + int(d[0])
		uidEnd = nameEnd + int(d[1])
		rvEnd = uidEnd + int(d[2])
		return 4, nameEnd, uidEnd, rvEnd, rvEnd + 4*int(d[3])
	}
	return r.spanLong()
}

// spanLong is span for a header with a length of 128 or more.
//
//go:noinline
func (r *objRow) spanLong() (start, nameEnd, uidEnd, rvEnd, labelsEnd int) {
	var n [4]int
	for k := range n {
		for shift := 0; ; shift += 7 {
			b := r.data[start]
			start++
			n[k] |= int(b&0x7f) << shift
			if b < 0x80 {
				break
			}
		}
	}
	nameEnd = start + n[0]
	uidEnd = nameEnd + n[1]
	rvEnd = uidEnd + n[2]
	return start, nameEnd, uidEnd, rvEnd, rvEnd + 4*n[3]
}

// name returns the object name: the last key part. Name orders call it
// in every comparison their prefixes do not decide, so it reads the
// header's first byte rather than all of it when it can.
func (r *objRow) name() string {
	if d := r.data; len(d) >= 4 && d[0]|d[1]|d[2]|d[3] < 0x80 {
		return d[4 : 4+int(d[0])]
	}
	start, nameEnd, _, _, _ := r.spanLong()
	return r.data[start:nameEnd]
}

func (r *objRow) uid() string {
	_, nameEnd, uidEnd, _, _ := r.span()
	return r.data[nameEnd:uidEnd]
}

func (r *objRow) rv() string {
	_, _, uidEnd, rvEnd, _ := r.span()
	return r.data[uidEnd:rvEnd]
}

// labelBytes returns the encoded label pair ids; equal strings mean equal
// labels.
func (r *objRow) labelBytes() string {
	_, _, _, rvEnd, labelsEnd := r.span()
	return r.data[rvEnd:labelsEnd]
}

// labels returns the row's label pair ids. Loops over them take it once:
// finding the labels in data costs more than reading one.
func (r *objRow) labels() labelIDList { return labelIDList(r.labelBytes()) }

// numLabels returns the number of labels.
func (r *objRow) numLabels() int { return r.labels().len() }

// labelIDList is a row's label pair ids, 4-byte little-endian and sorted.
type labelIDList string

// len returns the number of labels.
func (l labelIDList) len() int { return len(l) / 4 }

// at returns the pair id of label i, in increasing pair id order.
func (l labelIDList) at(i int) uint32 {
	b := l[4*i:]
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// labelIDs appends the row's label pair ids to dst.
func (r *objRow) labelIDs(dst []uint32) []uint32 {
	ls := r.labels()
	for i := range ls.len() {
		dst = append(dst, ls.at(i))
	}
	return dst
}

// summary returns the row's summary, nil for none. It shares the row's
// bytes: like every part of an Object the index returns, callers must not
// change it.
func (r *objRow) summary() []byte {
	_, _, _, _, labelsEnd := r.span()
	s := r.data[labelsEnd:]
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

// rowData encodes the data of a row in one allocation (see objRow and
// span); ids must be sorted.
func rowData(name, uid, rv string, ids []uint32, summary []byte) string {
	n := uvarintLen(len(name)) + uvarintLen(len(uid)) + uvarintLen(len(rv)) + uvarintLen(len(ids))
	b := make([]byte, 0, n+len(name)+len(uid)+len(rv)+4*len(ids)+len(summary))
	for _, l := range [4]int{len(name), len(uid), len(rv), len(ids)} {
		b = binary.AppendUvarint(b, uint64(l))
	}
	b = append(b, name...)
	b = append(b, uid...)
	b = append(b, rv...)
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	b = append(b, summary...)
	return unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again
}

// uvarintLen returns the length of the uvarint encoding of n.
func uvarintLen(n int) int { return (bits.Len64(uint64(n)|1) + 6) / 7 }

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
func (x *objIndex) sameLabels(labels Labels, r *objRow) bool {
	ls := r.labels()
	if labels.Len() != ls.len() {
		return false
	}
	for i := range ls.len() {
		pid := ls.at(i)
		if v, ok := labels.Lookup(x.labels.key(pid)); !ok || v != x.labels.value(pid) {
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

// maxKeyLen bounds a key, and so the cursors that carry it; Kubernetes
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

// ValidateRow checks a row as the index does before it takes it
// (UpsertBatch, ApplySnapshot): its identity fields (ValidateKey), that
// its parts fit an objRow, and that an RBAC row is namespaced as its kind
// is. An error wraps ErrInvalidRow. An edge holds its rows to it before
// sending them (connection/edge's Quotas.checkRow), so that a row the
// manager's index would refuse does not end the session.
func ValidateRow(o *Object) error {
	if err := ValidateKey(o.Key()); err != nil {
		return err
	}
	if !ownersFit(len(o.OwnerRefs)) {
		return fmt.Errorf("%w: %s: more than %d owner references", ErrInvalidRow, o.Key(), maxOwners)
	}
	if IsPolicyKind(o.Group, o.Kind) {
		return checkPolicyScope(o)
	}
	return nil
}

// ValidateKey checks the identity fields of a row as the index does
// before it takes the row or a delete of its key: cluster, kind and name
// present, at most 4 KiB in all, no NUL. An error wraps ErrInvalidRow.
// The index checks a delete's key with it; ValidateRow checks a row's.
func ValidateKey(k Key) error {
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
func (x *objIndex) internLabels(dst []uint32, labels Labels) []uint32 {
	n := len(dst)
	for _, kv := range labels.kv {
		dst = append(dst, x.labels.intern(kv.key, kv.value))
	}
	slices.Sort(dst[n:])
	return dst
}

// hasLabels reports whether the row's label pair ids are ids.
func (r *objRow) hasLabels(ids []uint32) bool {
	ls := r.labels()
	if ls.len() != len(ids) {
		return false
	}
	for i, id := range ids {
		if ls.at(i) != id {
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
	r := &objRow{
		data:    rowData(o.Name, o.UID, o.ResourceVersion, ids, o.Summary),
		kind:    x.kinds.intern(Kind{Group: o.Group, Version: o.Version, Kind: o.Kind, Resource: o.Resource, Namespaced: o.Namespace != ""}),
		cid:     x.clusters.intern(o.Cluster),
		nsid:    x.namespaces.intern(o.Namespace),
		status:  statusIndex(o.Status),
		created: unixNano(o.CreatedAt),
		updated: unixNano(o.UpdatedAt),
		message: o.Message,
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

// fillObject sets *o to the Object of a row, under the read lock, with
// Labels of its own (a page's share an array: pageObjects).
func (x *objIndex) fillObject(o *Object, r *objRow) {
	x.fillFields(o, r)
	o.Labels = x.labels.labelsOfRow(r)
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
