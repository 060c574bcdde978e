package index

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrInvalidRow is returned (wrapped) for a row the index cannot store:
// missing identity fields, a \x00 in a key part, or a row whose cluster or
// kind does not match the Replace it came with.
var ErrInvalidRow = errors.New("index: invalid row")

// objRow is the compact, immutable in-memory form of an Object. The index
// keeps about 200 bytes of row plus the message, uid and key bytes per
// object: cluster, namespace and kind strings are interned ids, labels are
// sorted pair ids, times are Unix nanoseconds, and the name is a slice of
// the key. Updates build a new objRow; the old one stays valid for readers
// and change events that still hold it.
type objRow struct {
	key     string // compoundKey(cluster, group, kind, namespace, name)
	kind    *kindInfo
	rid     uint32 // dense row id used by posting lists; stable while the object exists
	cid     uint32
	nsid    uint32 // 0 for cluster-scoped objects
	status  uint8  // index into Statuses
	nameOff uint16 // offset of the name in key
	uid     string
	labels  []uint32 // sorted label pair ids
	owners  []OwnerRef
	created int64 // Unix nanoseconds, 0 for the zero time
	updated int64
	rv      string
	// message is the caller's string until the row is stored, then the
	// msgDict copy (see objIndex.insert).
	message string
	summary []byte
}

// name returns the object name: the last key part.
func (r *objRow) name() string {
	return r.key[r.nameOff : len(r.key)-1]
}

// sameContent reports whether two rows are equal for change detection:
// everything but UpdatedAt and ResourceVersion.
func (r *objRow) sameContent(o *objRow) bool {
	return r.key == o.key && r.kind == o.kind && r.status == o.status && r.uid == o.uid &&
		r.created == o.created && r.message == o.message && slices.Equal(r.labels, o.labels) &&
		slices.Equal(r.owners, o.owners) && bytes.Equal(r.summary, o.summary)
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

// objectKey returns the memdb key of k.
func objectKey(k Key) string {
	return compoundKey(k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
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

// buildRow converts o, whose objectKey is key, into a row, interning its
// cluster, namespace, kind and labels. It must be called with the write
// lock held. The row has no rid yet, and its message is interned only when
// the row is stored.
func (x *objIndex) buildRow(o *Object, key string) *objRow {
	r := &objRow{
		key:     key,
		nameOff: uint16(len(key) - 1 - len(o.Name)),
		kind:    x.kinds.intern(Kind{Group: o.Group, Version: o.Version, Kind: o.Kind, Resource: o.Resource, Namespaced: o.Namespace != ""}),
		cid:     x.clusters.intern(o.Cluster),
		nsid:    x.namespaces.intern(o.Namespace),
		status:  statusIndex(o.Status),
		uid:     o.UID,
		owners:  o.OwnerRefs,
		created: unixNano(o.CreatedAt),
		updated: unixNano(o.UpdatedAt),
		rv:      o.ResourceVersion,
		message: o.Message,
		summary: o.Summary,
	}
	if len(o.Labels) > 0 {
		r.labels = make([]uint32, 0, len(o.Labels))
		for k, v := range o.Labels {
			r.labels = append(r.labels, x.labels.intern(k, v))
		}
		slices.Sort(r.labels)
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

// fillObject sets *o to the Object of a row, under the read lock.
func (x *objIndex) fillObject(o *Object, r *objRow) {
	*o = Object{
		Cluster:         x.clusters.str(r.cid),
		Namespace:       x.namespaces.str(r.nsid),
		Group:           r.kind.Group,
		Version:         r.kind.Version,
		Kind:            r.kind.Kind.Kind,
		Resource:        r.kind.Resource,
		Name:            r.name(),
		UID:             r.uid,
		OwnerRefs:       r.owners,
		CreatedAt:       fromUnixNano(r.created),
		UpdatedAt:       fromUnixNano(r.updated),
		ResourceVersion: r.rv,
		Status:          Statuses[r.status],
		Message:         r.message,
		Summary:         r.summary,
	}
	if len(r.labels) > 0 {
		o.Labels = make(map[string]string, len(r.labels))
		for _, id := range r.labels {
			o.Labels[x.labels.key(id)] = x.labels.value(id)
		}
	}
}
