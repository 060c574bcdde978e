package replication

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fleetgraph/fleetgraph/index"
)

// The stream's encoding. A message on a cluster's subject is
//
//	byte 0    its format version: formatV1 or formatV2
//	byte 1    compression: compressNone or compressZstd
//	the rest  an envelope in the protocol buffers wire format, compressed
//
// The envelope names the cluster, the owner that wrote it (its epoch and
// lease), the sequence number of the message it follows on the subject,
// whether it is part of a snapshot, and carries operations: the index.Sink
// calls the owner's index applied, each with the time it applied it. Field
// numbers are below; readers skip fields they do not know, so fields can be
// added without a new version, and a message of a version the reader does
// not know is refused with an error that names both.
//
// Format 2 adds label tables to snapshots: a part of a snapshot carries
// the label keys and values of its rows once (opFieldLabelStr), its
// distinct key=value pairs as pairs of indexes into them
// (opFieldLabelPair), and each row its labels as indexes into the pairs
// (rowLabelRef) instead of as strings (rowLabel). A new replica then
// decodes and interns each distinct label of a cluster once rather than
// once per row that carries it (index.LabelTable). A reader of format 1
// would skip those fields and lose the labels, hence the new version; a
// message that needs no table (every operation but snapshots) is still
// written as format 1, and this fleetgraph reads both.
//
// There is no .proto file and no generated code: the messages are small
// and fixed, and protowire (google.golang.org/protobuf, already a
// dependency of client-go) reads and writes the format directly.
const (
	formatV1 = 1
	formatV2 = 2
	// formatVersion is the newest format: what snapshots are written in
	// and the highest version this fleetgraph reads.
	formatVersion = formatV2

	compressNone = 0
	compressZstd = 1
)

// Envelope fields.
const (
	envCluster = 1 // string
	envEpoch   = 2 // varint: the owner's epoch; higher wins
	envOwner   = 3 // string: the collector and its incarnation
	envLease   = 4 // varint: the generation of the owner's lease (0 without leases)
	envPrev    = 5 // varint: stream sequence of the previous message on the subject
	envFlags   = 6 // varint: flagSnapshot, flagFirst, flagLast
	envOp      = 7 // bytes, repeated: one operation
)

// Envelope flags.
const (
	flagSnapshot = 1 << iota // the message is a part of a snapshot
	flagFirst                // the first part of a snapshot
	flagLast                 // the last part of a snapshot
	flagForce                // a snapshot every replica applies (a RestoreCluster), not a copy of the state before it
)

// Operation fields.
const (
	opFieldType    = 1 // varint: opType
	opFieldAt      = 2 // zigzag varint: Unix nanoseconds the owner applied it at
	opFieldKind    = 3 // kind
	opFieldRow     = 4 // row, repeated
	opFieldMore    = 5 // varint bool: the rows continue in the next operation part
	opFieldKey     = 6 // key (Delete)
	opFieldError   = 7 // string (ReportKindError)
	opFieldCluster = 8 // cluster row (UpsertCluster, snapshot)
	opFieldKindSt  = 9 // kind state, repeated (snapshot)
	// Format 2, snapshots only: the part's label table.
	opFieldLabelStr  = 10 // string, repeated: label keys and values, each once
	opFieldLabelPair = 11 // packed varints, repeated: key and value of each pair, indexes into the strings
)

// opType is an index.Sink call, or a snapshot.
type opType uint8

const (
	opReplace opType = iota + 1
	opUpsert         // UpsertBatch (and Upsert)
	opDelete
	opKindError
	opCluster // UpsertCluster
	opRemoveCluster
	opSnapshot // RestoreCluster: a snapshot's cluster row, kinds and rows
)

func (t opType) String() string {
	switch t {
	case opReplace:
		return "replace"
	case opUpsert:
		return "upsert"
	case opDelete:
		return "delete"
	case opKindError:
		return "kind-error"
	case opCluster:
		return "cluster"
	case opRemoveCluster:
		return "remove-cluster"
	case opSnapshot:
		return "snapshot"
	}
	return fmt.Sprintf("op(%d)", t)
}

// op is one operation, or one part of it: Replace, UpsertBatch and
// snapshots with many rows are split over several parts (more set on all
// but the last), each small enough for a message, and applied once the
// last part has arrived.
type op struct {
	typ     opType
	at      time.Time
	kind    index.Kind        // Replace, ReportKindError
	rows    []index.Object    // Replace, UpsertBatch, snapshot
	more    bool              // rows continue in the next part
	key     index.Key         // Delete
	err     string            // ReportKindError
	cluster *index.Cluster    // UpsertCluster, snapshot (first part)
	kinds   []index.KindState // snapshot (first part)
	// labels, when not nil, holds the labels of rows, which then have none
	// of their own (a snapshot read from format 2, or restored from one).
	labels *index.LabelTable
}

// envelope is one decoded message.
type envelope struct {
	cluster string
	epoch   uint64
	owner   string
	lease   uint64
	prev    uint64
	flags   uint64
	ops     []op
}

func (e *envelope) snapshot() bool { return e.flags&flagSnapshot != 0 }

// Row fields.
const (
	rowNamespace = 1
	rowGroup     = 2
	rowVersion   = 3
	rowKind      = 4
	rowResource  = 5
	rowName      = 6
	rowUID       = 7
	rowLabel     = 8 // pair, repeated, in key order
	rowOwner     = 9 // owner ref, repeated
	rowCreated   = 10
	rowUpdated   = 11
	rowRV        = 12
	rowStatus    = 13
	rowMessage   = 14
	rowSummary   = 15
	rowPolicy    = 16 // JSON of index.Policy: RBAC rows are few and small
	rowLabelRef  = 17 // packed varints: the labels as indexes into the part's pairs (format 2, snapshots)
)

// Cluster-row fields.
const (
	clName      = 1
	clLabel     = 2
	clMode      = 3
	clState     = 4
	clSince     = 5
	clLastSeen  = 6
	clLastError = 7
	clSynced    = 8
	clMetadata  = 9
)

// errDecode wraps every decoding error.
var errDecode = errors.New("replication: malformed message")

// encoder builds messages. It is not safe for concurrent use.
type encoder struct {
	zw      *zstd.Encoder
	scratch []byte
}

func newEncoder() *encoder {
	zw, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		panic(fmt.Sprintf("replication: zstd writer: %v", err)) // only for invalid options
	}
	return &encoder{zw: zw}
}

// minCompress is the envelope size from which messages are compressed.
const minCompress = 512

// seal compresses an encoded envelope of format version and adds the
// header bytes.
func (e *encoder) seal(version byte, env []byte) []byte {
	if len(env) < minCompress {
		return append([]byte{version, compressNone}, env...)
	}
	out := make([]byte, 2, 2+len(env)/3)
	out[0], out[1] = version, compressZstd
	return e.zw.EncodeAll(env, out)
}

// appendEnvelopeHead encodes every envelope field but the operations.
func appendEnvelopeHead(b []byte, e *envelope) []byte {
	b = appendString(b, envCluster, e.cluster)
	b = appendVarint(b, envEpoch, e.epoch)
	b = appendString(b, envOwner, e.owner)
	b = appendVarint(b, envLease, e.lease)
	b = appendVarint(b, envPrev, e.prev)
	return appendVarint(b, envFlags, e.flags)
}

// appendOpHead encodes an operation's fields but its rows.
func appendOpHead(b []byte, o *op) []byte {
	b = appendVarint(b, opFieldType, uint64(o.typ))
	b = appendTime(b, opFieldAt, o.at)
	if o.kind != (index.Kind{}) {
		b = appendSub(b, opFieldKind, func(b []byte) []byte { return appendKind(b, o.kind) })
	}
	if o.more {
		b = appendVarint(b, opFieldMore, 1)
	}
	if o.key != (index.Key{}) {
		b = appendSub(b, opFieldKey, func(b []byte) []byte {
			b = appendString(b, rowGroup, o.key.Group)
			b = appendString(b, rowKind, o.key.Kind)
			b = appendString(b, rowNamespace, o.key.Namespace)
			return appendString(b, rowName, o.key.Name)
		})
	}
	b = appendString(b, opFieldError, o.err)
	if o.cluster != nil {
		b = appendSub(b, opFieldCluster, func(b []byte) []byte { return appendCluster(b, o.cluster) })
	}
	for i := range o.kinds {
		k := &o.kinds[i]
		b = appendSub(b, opFieldKindSt, func(b []byte) []byte {
			b = appendSub(b, 1, func(b []byte) []byte { return appendKind(b, k.Kind) })
			if k.Present {
				b = appendVarint(b, 2, 1)
			}
			b = appendString(b, 3, k.Error)
			return appendTime(b, 4, k.ErrorSince)
		})
	}
	return b
}

// label is one key=value label.
type label struct{ key, value string }

// appendRow encodes one row (field rowX numbers) without its cluster,
// which the envelope names. Its labels are labels (sorted by key): as
// strings, or with tab, as indexes into tab, which gains the ones it
// lacks.
func appendRow(b []byte, o *index.Object, labels []label, tab *labelTable) []byte {
	b = appendString(b, rowNamespace, o.Namespace)
	b = appendString(b, rowGroup, o.Group)
	b = appendString(b, rowVersion, o.Version)
	b = appendString(b, rowKind, o.Kind)
	b = appendString(b, rowResource, o.Resource)
	b = appendString(b, rowName, o.Name)
	b = appendString(b, rowUID, o.UID)
	switch {
	case tab == nil:
		for _, l := range labels {
			b = appendSub(b, rowLabel, func(b []byte) []byte {
				b = appendString(b, 1, l.key)
				return appendString(b, 2, l.value)
			})
		}
	case len(labels) > 0:
		b = appendSub(b, rowLabelRef, func(b []byte) []byte {
			for _, l := range labels {
				b = protowire.AppendVarint(b, uint64(tab.pair(l)))
			}
			return b
		})
	}
	for _, r := range o.OwnerRefs {
		b = appendSub(b, rowOwner, func(b []byte) []byte {
			b = appendString(b, 1, r.Kind)
			return appendString(b, 2, r.Name)
		})
	}
	b = appendTime(b, rowCreated, o.CreatedAt)
	b = appendTime(b, rowUpdated, o.UpdatedAt)
	b = appendString(b, rowRV, o.ResourceVersion)
	b = appendString(b, rowStatus, string(o.Status))
	b = appendString(b, rowMessage, o.Message)
	if len(o.Summary) > 0 {
		b = protowire.AppendTag(b, rowSummary, protowire.BytesType)
		b = protowire.AppendBytes(b, o.Summary)
	}
	if o.Policy != nil {
		p, err := json.Marshal(o.Policy)
		if err != nil {
			panic(fmt.Sprintf("replication: encoding a policy: %v", err)) // plain structs of strings
		}
		b = protowire.AppendTag(b, rowPolicy, protowire.BytesType)
		b = protowire.AppendBytes(b, p)
	}
	return b
}

func appendKind(b []byte, k index.Kind) []byte {
	b = appendString(b, 1, k.Group)
	b = appendString(b, 2, k.Version)
	b = appendString(b, 3, k.Kind)
	b = appendString(b, 4, k.Resource)
	if k.Namespaced {
		b = appendVarint(b, 5, 1)
	}
	return b
}

func appendCluster(b []byte, c *index.Cluster) []byte {
	b = appendString(b, clName, c.Name)
	b = appendPairs(b, clLabel, c.Labels)
	b = appendString(b, clMode, string(c.Mode))
	b = appendString(b, clState, string(c.State))
	b = appendTime(b, clSince, c.Since)
	b = appendTime(b, clLastSeen, c.LastSeen)
	b = appendString(b, clLastError, c.LastError)
	if c.Synced {
		b = appendVarint(b, clSynced, 1)
	}
	return appendPairs(b, clMetadata, c.Metadata)
}

func appendPairs(b []byte, num protowire.Number, m map[string]string) []byte {
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b = appendSub(b, num, func(b []byte) []byte {
			b = appendString(b, 1, k)
			return appendString(b, 2, m[k])
		})
	}
	return b
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendTime writes Unix nanoseconds, or nothing for the zero time.
func appendTime(b []byte, num protowire.Number, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeZigZag(t.UnixNano()))
}

// appendSub writes a nested message: fn's bytes, length-prefixed. The
// length is written after fn has run, by moving its bytes once.
func appendSub(b []byte, num protowire.Number, fn func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	start := len(b)
	b = fn(b)
	n := len(b) - start
	var lenBuf [binaryMaxVarint]byte
	l := protowire.AppendVarint(lenBuf[:0], uint64(n))
	b = append(b, l...) // grow by len(l)
	copy(b[start+len(l):], b[start:start+n])
	copy(b[start:], l)
	return b
}

const binaryMaxVarint = 10

// decoder reads messages. It keeps the strings that repeat from row to row
// (namespaces, kinds, label keys and values) once per decoder, so a
// snapshot of a large cluster does not allocate each of them per row. It is
// not safe for concurrent use.
type decoder struct {
	zr     *zstd.Decoder
	buf    []byte
	intern map[string]string
	// recent holds, by row field, the last string read: rows come in key
	// order, so most rows repeat the previous row's namespace, group,
	// version, kind, resource and status, and take them with a
	// comparison instead of a hashed lookup.
	recent [rowStatus + 1]string
	refs   []uint64 // scratch for a row's label references
	// labels is scratch for a row's labels, which become its Labels.
	labels map[string]string
}

// maxDecoded bounds the size of a decompressed message, so that a small
// message cannot expand without limit.
const maxDecoded = 64 << 20

func newDecoder() *decoder {
	zr, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxDecoded))
	if err != nil {
		panic(fmt.Sprintf("replication: zstd reader: %v", err)) // only for invalid options
	}
	return &decoder{zr: zr, intern: map[string]string{}}
}

// maxInterned bounds the interned strings; the table starts again when it
// is full, which only costs allocations.
const maxInterned = 1 << 16

func (d *decoder) str(b []byte) string {
	if s, ok := d.intern[string(b)]; ok {
		return s
	}
	if len(d.intern) >= maxInterned {
		clear(d.intern)
	}
	s := string(b)
	d.intern[s] = s
	return s
}

// decode reads one message.
func (d *decoder) decode(msg []byte) (*envelope, error) {
	if len(msg) < 2 {
		return nil, fmt.Errorf("%w: %d bytes", errDecode, len(msg))
	}
	if msg[0] != formatV1 && msg[0] != formatV2 {
		return nil, fmt.Errorf("%w: format version %d; this fleetgraph reads versions 1 to %d (upgrade it to read this stream)", errDecode, msg[0], formatVersion)
	}
	body := msg[2:]
	switch msg[1] {
	case compressNone:
	case compressZstd:
		var err error
		d.buf, err = d.zr.DecodeAll(body, d.buf[:0])
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errDecode, err)
		}
		body = d.buf
	default:
		return nil, fmt.Errorf("%w: unknown compression %d", errDecode, msg[1])
	}
	env := &envelope{}
	r := reader{b: body}
	for r.next() {
		switch r.num {
		case envCluster:
			env.cluster = r.str(d)
		case envEpoch:
			env.epoch = r.varint()
		case envOwner:
			env.owner = r.str(d)
		case envLease:
			env.lease = r.varint()
		case envPrev:
			env.prev = r.varint()
		case envFlags:
			env.flags = r.varint()
		case envOp:
			o, err := d.op(r.bytes(), env.cluster)
			if err != nil {
				return nil, err
			}
			env.ops = append(env.ops, o)
		default:
			r.skip()
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	if env.cluster == "" {
		return nil, fmt.Errorf("%w: no cluster", errDecode)
	}
	return env, nil
}

// op reads one operation of cluster (the envelope's cluster field comes
// first).
func (d *decoder) op(b []byte, cluster string) (op, error) {
	if cluster == "" {
		return op{}, fmt.Errorf("%w: an operation before the cluster", errDecode)
	}
	var o op
	n, tab, err := d.table(b)
	if err != nil {
		return op{}, err
	}
	if n > 0 {
		o.rows = make([]index.Object, 0, n)
	}
	if tab != nil {
		o.labels = tab
		tab.Ends = make([]uint32, 0, n)
	}
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case opFieldType:
			o.typ = opType(r.varint())
		case opFieldAt:
			o.at = r.time()
		case opFieldKind:
			o.kind = d.kind(&r, r.bytes())
		case opFieldRow:
			row := d.row(&r, r.bytes(), tab)
			row.Cluster = cluster
			o.rows = append(o.rows, row)
			if tab != nil {
				tab.Ends = append(tab.Ends, uint32(len(tab.Refs)))
			}
		case opFieldMore:
			o.more = r.varint() != 0
		case opFieldKey:
			sub := reader{b: r.bytes()}
			o.key.Cluster = cluster
			for sub.next() {
				switch sub.num {
				case rowGroup:
					o.key.Group = sub.str(d)
				case rowKind:
					o.key.Kind = sub.str(d)
				case rowNamespace:
					o.key.Namespace = sub.str(d)
				case rowName:
					o.key.Name = string(sub.bytes())
				default:
					sub.skip()
				}
			}
			r.fail(sub.err)
		case opFieldError:
			o.err = string(r.bytes())
		case opFieldCluster:
			o.cluster = d.cluster(&r, r.bytes())
		case opFieldKindSt:
			sub := reader{b: r.bytes()}
			var k index.KindState
			for sub.next() {
				switch sub.num {
				case 1:
					k.Kind = d.kind(&sub, sub.bytes())
				case 2:
					k.Present = sub.varint() != 0
				case 3:
					k.Error = string(sub.bytes())
				case 4:
					k.ErrorSince = sub.time()
				default:
					sub.skip()
				}
			}
			r.fail(sub.err)
			o.kinds = append(o.kinds, k)
		default:
			r.skip()
		}
	}
	if r.err != nil {
		return op{}, r.err
	}
	if o.typ < opReplace || o.typ > opSnapshot {
		return op{}, fmt.Errorf("%w: unknown operation %d", errDecode, o.typ)
	}
	if tab != nil && o.typ != opSnapshot {
		return op{}, fmt.Errorf("%w: a label table in a %s operation", errDecode, o.typ)
	}
	return o, nil
}

// table reads an operation's label table (nil when it has none), which
// its rows refer to wherever it is in the encoding, and counts its rows,
// so that decoding allocates them once (a snapshot part holds thousands
// of rows of about 300 bytes each): a walk over the fields that skips the
// rest, a few nanoseconds a row.
func (d *decoder) table(b []byte) (rows int, tab *index.LabelTable, err error) {
	var strs []string
	var pairs [][]byte // packed varints
	nums := 0
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case opFieldRow:
			rows++
			r.skip()
		case opFieldLabelStr:
			strs = append(strs, r.str(d))
		case opFieldLabelPair:
			p := r.bytes()
			pairs = append(pairs, p)
			nums += countVarints(p)
		default:
			r.skip()
		}
	}
	if r.err != nil {
		return 0, nil, r.err
	}
	if strs == nil && pairs == nil {
		return rows, nil, nil
	}
	if nums%2 != 0 {
		return 0, nil, fmt.Errorf("%w: a label pair without its value", errDecode)
	}
	tab = &index.LabelTable{Strings: strs, Pairs: make([]index.LabelPair, 0, nums/2)}
	var kv [2]uint32
	n := 0
	for _, p := range pairs {
		for len(p) > 0 {
			v, l := protowire.ConsumeVarint(p)
			if l < 0 {
				return 0, nil, fmt.Errorf("%w: %w", errDecode, protowire.ParseError(l))
			}
			if v >= uint64(len(strs)) {
				return 0, nil, fmt.Errorf("%w: label pair %d names string %d of %d", errDecode, len(tab.Pairs), v, len(strs))
			}
			p = p[l:]
			kv[n] = uint32(v)
			if n++; n == 2 {
				tab.Pairs = append(tab.Pairs, index.LabelPair{Key: kv[0], Value: kv[1]})
				n = 0
			}
		}
	}
	// About as many labels as pairs: they barely repeat within a cluster.
	tab.Refs = make([]uint32, 0, len(tab.Pairs)+len(tab.Pairs)/4)
	return rows, tab, nil
}

// countVarints returns how many varints b holds: its bytes without the
// continuation bit.
func countVarints(b []byte) int {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	return n
}

func (d *decoder) kind(parent *reader, b []byte) index.Kind {
	var k index.Kind
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			k.Group = r.str(d)
		case 2:
			k.Version = r.str(d)
		case 3:
			k.Kind = r.str(d)
		case 4:
			k.Resource = r.str(d)
		case 5:
			k.Namespaced = r.varint() != 0
		default:
			r.skip()
		}
	}
	parent.fail(r.err)
	return k
}

// row reads one row; its label references go to tab (the operation's
// label table, nil for none).
func (d *decoder) row(parent *reader, b []byte, tab *index.LabelTable) index.Object {
	var o index.Object
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case rowNamespace:
			o.Namespace = r.field(d)
		case rowGroup:
			o.Group = r.field(d)
		case rowVersion:
			o.Version = r.field(d)
		case rowKind:
			o.Kind = r.field(d)
		case rowResource:
			o.Resource = r.field(d)
		case rowName:
			o.Name = string(r.bytes())
		case rowUID:
			o.UID = string(r.bytes())
		case rowLabel:
			k, v := d.pair(&r, r.bytes())
			if d.labels == nil {
				d.labels = map[string]string{}
			}
			d.labels[k] = v // a key given twice keeps its last value, as it did
		case rowLabelRef:
			if tab == nil {
				r.fail(fmt.Errorf("%w: label references without a label table", errDecode))
				break
			}
			d.refs = r.varints(d.refs[:0])
			for _, ref := range d.refs {
				if ref >= uint64(len(tab.Pairs)) {
					r.fail(fmt.Errorf("%w: label %d of a table of %d", errDecode, ref, len(tab.Pairs)))
					break
				}
				tab.Refs = append(tab.Refs, uint32(ref))
			}
		case rowOwner:
			k, v := d.pair(&r, r.bytes())
			o.OwnerRefs = append(o.OwnerRefs, index.OwnerRef{Kind: k, Name: v})
		case rowCreated:
			o.CreatedAt = r.time()
		case rowUpdated:
			o.UpdatedAt = r.time()
		case rowRV:
			o.ResourceVersion = string(r.bytes())
		case rowStatus:
			o.Status = index.Status(r.field(d))
		case rowMessage:
			o.Message = r.str(d)
		case rowSummary:
			// A copy: the bytes are the message's, or the decoder's
			// buffer, which the next message's decompression overwrites
			// while this one waits to be applied (followBuffer) or its
			// snapshot parts gather. TestCodecRoundTrip fails without it.
			o.Summary = slices.Clone(r.bytes())
		case rowPolicy:
			var p index.Policy
			if err := json.Unmarshal(r.bytes(), &p); err != nil {
				r.fail(fmt.Errorf("%w: policy: %w", errDecode, err))
			}
			o.Policy = &p
		default:
			r.skip()
		}
	}
	if len(d.labels) > 0 {
		o.Labels = index.LabelsOf(d.labels)
		clear(d.labels)
	}
	parent.fail(r.err)
	return o
}

func (d *decoder) cluster(parent *reader, b []byte) *index.Cluster {
	c := &index.Cluster{}
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case clName:
			c.Name = string(r.bytes())
		case clLabel, clMetadata:
			k, v := d.pair(&r, r.bytes())
			m := &c.Labels
			if r.num == clMetadata {
				m = &c.Metadata
			}
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[k] = v
		case clMode:
			c.Mode = index.SyncMode(r.str(d))
		case clState:
			c.State = index.ConnectionState(r.str(d))
		case clSince:
			c.Since = r.time()
		case clLastSeen:
			c.LastSeen = r.time()
		case clLastError:
			c.LastError = string(r.bytes())
		case clSynced:
			c.Synced = r.varint() != 0
		default:
			r.skip()
		}
	}
	parent.fail(r.err)
	return c
}

func (d *decoder) pair(parent *reader, b []byte) (string, string) {
	var k, v string
	r := reader{b: b}
	for r.next() {
		switch r.num {
		case 1:
			k = r.str(d)
		case 2:
			v = r.str(d)
		default:
			r.skip()
		}
	}
	parent.fail(r.err)
	return k, v
}

// reader walks the fields of one message; the first error sticks and
// ends the walk.
type reader struct {
	b   []byte
	num protowire.Number
	typ protowire.Type
	err error
}

func (r *reader) fail(err error) {
	if err != nil && r.err == nil {
		r.err = err
		r.b = nil
	}
}

func (r *reader) next() bool {
	if r.err != nil || len(r.b) == 0 {
		return false
	}
	num, typ, n := protowire.ConsumeTag(r.b)
	if n < 0 {
		r.fail(fmt.Errorf("%w: %w", errDecode, protowire.ParseError(n)))
		return false
	}
	r.b, r.num, r.typ = r.b[n:], num, typ
	return true
}

func (r *reader) varint() uint64 {
	if r.typ != protowire.VarintType {
		r.fail(fmt.Errorf("%w: field %d is not a varint", errDecode, r.num))
		return 0
	}
	v, n := protowire.ConsumeVarint(r.b)
	if n < 0 {
		r.fail(fmt.Errorf("%w: %w", errDecode, protowire.ParseError(n)))
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) time() time.Time {
	v := r.varint()
	if v == 0 {
		return time.Time{}
	}
	return time.Unix(0, protowire.DecodeZigZag(v)).UTC()
}

func (r *reader) bytes() []byte {
	if r.typ != protowire.BytesType {
		r.fail(fmt.Errorf("%w: field %d is not bytes", errDecode, r.num))
		return nil
	}
	v, n := protowire.ConsumeBytes(r.b)
	if n < 0 {
		r.fail(fmt.Errorf("%w: %w", errDecode, protowire.ParseError(n)))
		return nil
	}
	r.b = r.b[n:]
	return v
}

// varints appends the packed varints of a bytes field to dst.
func (r *reader) varints(dst []uint64) []uint64 {
	b := r.bytes()
	for len(b) > 0 {
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			r.fail(fmt.Errorf("%w: %w", errDecode, protowire.ParseError(n)))
			return dst
		}
		dst = append(dst, v)
		b = b[n:]
	}
	return dst
}

// field is str for a row field whose value repeats from row to row (see
// decoder.recent).
func (r *reader) field(d *decoder) string {
	b := r.bytes()
	if r.err != nil {
		return ""
	}
	if s := d.recent[r.num]; s == string(b) {
		return s
	}
	s := d.str(b)
	d.recent[r.num] = s
	return s
}

func (r *reader) str(d *decoder) string {
	b := r.bytes()
	if r.err != nil {
		return ""
	}
	return d.str(b)
}

func (r *reader) skip() {
	n := protowire.ConsumeFieldValue(r.num, r.typ, r.b)
	if n < 0 {
		r.fail(fmt.Errorf("%w: %w", errDecode, protowire.ParseError(n)))
		return
	}
	r.b = r.b[n:]
}

// message encodes one pending message with its envelope head (whose
// flags are taken from p).
func (e *encoder) message(head envelope, p *pending) []byte {
	head.flags = p.flags
	e.scratch = appendEnvelopeHead(e.scratch[:0], &head)
	e.scratch = append(e.scratch, p.ops...)
	return e.seal(p.version(), e.scratch)
}

// labelTable builds the label table of one snapshot part (format 2):
// each distinct label string and key=value pair once, numbered in the
// order rows first use them. The part's rows are added one at a time and
// the last may not fit the message: mark and rollback undo one row.
type labelTable struct {
	strs  map[string]uint32
	pairs map[[2]uint32]uint32
	// strsEnc and pairsEnc are the encoded fields: opFieldLabelStr
	// fields, and the packed varints of opFieldLabelPair.
	strsEnc, pairsEnc []byte
	// newStrs and newPairs are what the table gained since mark.
	newStrs  []string
	newPairs [][2]uint32
}

func newLabelTable() *labelTable {
	return &labelTable{strs: map[string]uint32{}, pairs: map[[2]uint32]uint32{}}
}

// tableMark is a labelTable's size at a mark.
type tableMark struct{ strs, pairs int }

// mark starts a row; rollback removes what the table gained since.
func (t *labelTable) mark() tableMark {
	t.newStrs, t.newPairs = t.newStrs[:0], t.newPairs[:0]
	return tableMark{len(t.strsEnc), len(t.pairsEnc)}
}

func (t *labelTable) rollback(m tableMark) {
	for _, s := range t.newStrs {
		delete(t.strs, s)
	}
	for _, p := range t.newPairs {
		delete(t.pairs, p)
	}
	t.strsEnc, t.pairsEnc = t.strsEnc[:m.strs], t.pairsEnc[:m.pairs]
}

// size returns what the table adds to its part, at most.
func (t *labelTable) size() int {
	if t == nil {
		return 0
	}
	return len(t.strsEnc) + len(t.pairsEnc) + 2*binaryMaxVarint
}

// pair returns the index of l, adding it if new.
func (t *labelTable) pair(l label) uint32 {
	p := [2]uint32{t.str(l.key), t.str(l.value)}
	id, ok := t.pairs[p]
	if !ok {
		id = uint32(len(t.pairs))
		t.pairs[p] = id
		t.newPairs = append(t.newPairs, p)
		t.pairsEnc = protowire.AppendVarint(protowire.AppendVarint(t.pairsEnc, uint64(p[0])), uint64(p[1]))
	}
	return id
}

func (t *labelTable) str(s string) uint32 {
	id, ok := t.strs[s]
	if !ok {
		id = uint32(len(t.strs))
		t.strs[s] = id
		t.newStrs = append(t.newStrs, s)
		t.strsEnc = protowire.AppendTag(t.strsEnc, opFieldLabelStr, protowire.BytesType)
		t.strsEnc = protowire.AppendString(t.strsEnc, s)
	}
	return id
}

// appendTo writes the table's fields.
func (t *labelTable) appendTo(b []byte) []byte {
	if t == nil || len(t.pairs) == 0 {
		return b
	}
	b = append(b, t.strsEnc...)
	b = protowire.AppendTag(b, opFieldLabelPair, protowire.BytesType)
	return protowire.AppendBytes(b, t.pairsEnc)
}
