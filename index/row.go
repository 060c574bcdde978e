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
// keeps about 150 bytes of row plus the key, uid, resource version and
// labels bytes per object: cluster, namespace and kind strings are interned
// ids, labels are sorted pair ids, times are Unix nanoseconds, and the name
// is a slice of the key. Updates build a new objRow; the old one stays
// valid for readers and change events that still hold it.
//
// The key, the uid, the resource version and the label pair ids share one
// allocation (key and tail are adjacent slices of it) rather than four:
// the garbage collector's work grows with the number of objects and
// pointers in the heap, and at 1M rows each collection cycle marked about
// seven objects per row. Copying the uid and resource version also stops a
// row from pinning the caller's buffers.
type objRow struct {
	key     string // compoundKey(cluster, group, kind, namespace, name)
	kind    *kindInfo
	tail    string // uid, resource version, then 4-byte little-endian label pair ids, sorted
	owners  []OwnerRef
	message string // the caller's string until the row is stored, then the msgDict copy
	summary []byte
	created int64 // Unix nanoseconds, 0 for the zero time
	updated int64
	rid     uint32 // dense row id used by posting lists; stable while the object exists
	cid     uint32
	nsid    uint32 // 0 for cluster-scoped objects
	uidLen  uint32
	rvLen   uint32
	nameOff uint16 // offset of the name in key
	status  uint8  // index into Statuses
}

// name returns the object name: the last key part.
func (r *objRow) name() string {
	return r.key[r.nameOff : len(r.key)-1]
}

func (r *objRow) uid() string { return r.tail[:r.uidLen] }
func (r *objRow) rv() string  { return r.tail[r.uidLen : r.uidLen+r.rvLen] }

// labelBytes returns the encoded label pair ids; equal strings mean equal
// labels.
func (r *objRow) labelBytes() string { return r.tail[r.uidLen+r.rvLen:] }

// numLabels returns the number of labels.
func (r *objRow) numLabels() int { return len(r.labelBytes()) / 4 }

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

// rowStrings encodes the key and tail of a row in one allocation; ids must
// be sorted.
func rowStrings(k Key, uid, rv string, ids []uint32) (key, tail string) {
	n := len(k.Cluster) + len(k.Group) + len(k.Kind) + len(k.Namespace) + len(k.Name) + 5
	b := make([]byte, 0, n+len(uid)+len(rv)+4*len(ids))
	b = appendObjectKey(b, k)
	b = append(b, uid...)
	b = append(b, rv...)
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	s := unsafe.String(unsafe.SliceData(b), len(b)) // b is not used again
	return s[:n], s[n:]
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
		slices.Equal(o.OwnerRefs, old.owners) && bytes.Equal(o.Summary, old.summary)
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

// objectKey returns the key of k in the object index.
func objectKey(k Key) string {
	return compoundKey(k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
}

// appendObjectKey appends objectKey(k) to b, for lookups that need not
// allocate.
func appendObjectKey(b []byte, k Key) []byte {
	return appendKey(b, k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
}

// maxKeyLen bounds a key so that name offsets fit in 16 bits; Kubernetes
// names are at most 253 bytes.
const maxKeyLen = 4096

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
	key, tail := rowStrings(o.Key(), o.UID, o.ResourceVersion, ids)
	r := &objRow{
		key:     key,
		nameOff: uint16(len(key) - 1 - len(o.Name)),
		kind:    x.kinds.intern(Kind{Group: o.Group, Version: o.Version, Kind: o.Kind, Resource: o.Resource, Namespaced: o.Namespace != ""}),
		cid:     x.clusters.intern(o.Cluster),
		nsid:    x.namespaces.intern(o.Namespace),
		status:  statusIndex(o.Status),
		tail:    tail,
		uidLen:  uint32(len(o.UID)),
		rvLen:   uint32(len(o.ResourceVersion)),
		owners:  o.OwnerRefs,
		created: unixNano(o.CreatedAt),
		updated: unixNano(o.UpdatedAt),
		message: o.Message,
		summary: o.Summary,
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
// Labels map of its own (pages share theirs: labelMaps).
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
		OwnerRefs:       r.owners,
		CreatedAt:       fromUnixNano(r.created),
		UpdatedAt:       fromUnixNano(r.updated),
		ResourceVersion: r.rv(),
		Status:          Statuses[r.status],
		Message:         r.message,
		Summary:         r.summary,
	}
}
