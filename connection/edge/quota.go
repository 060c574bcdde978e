package edge

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/fleetgraph/fleetgraph/index"
)

// Quotas bound what one edge may make the manager hold for its cluster. An
// edge is trusted for its own cluster's state, not for its size: past a
// quota the session ends with ReasonQuota, saying which, and the rows
// already in the index stay as they were (the edge reconnects, and keeps
// failing until its cluster fits or the operator raises the quota). The
// per-row quotas (LabelsPerRow, StringBytes) are announced in the Welcome,
// and an edge does not send a row over them (checkRow), so one object over
// them costs only itself. Zero fields take the defaults below.
type Quotas struct {
	// RowsPerCluster bounds the rows (objects and RBAC rows) the cluster
	// would have in the index once a snapshot or a delta is applied.
	RowsPerCluster int
	// KindsPerCluster bounds the kinds the cluster has in the index.
	KindsPerCluster int
	// LabelsPerRow bounds the labels of one row.
	LabelsPerRow int
	// StringBytes bounds each string of a row: name, namespace, uid,
	// message, label key and value, owner references, the summary (as
	// JSON) and every string of an RBAC rule or subject.
	StringBytes int
}

// The default quotas. Half a million rows is several times the largest
// clusters seen (about 50,000 objects of the collected kinds), and with
// the snapshot bound (DefaultMaxSnapshotBytes, counted decoded) about what
// one snapshot can carry anyway. A cluster with every Istio and Flux kind
// has a few dozen kinds; 512 leaves room for ExtraKinds. Kubernetes limits
// names to 253 bytes and label values to 63, and objects rarely carry more
// than a few dozen labels; a condition message can be a few KiB.
const (
	DefaultRowsPerCluster  = 500_000
	DefaultKindsPerCluster = 512
	DefaultLabelsPerRow    = 128
	DefaultStringBytes     = 16 << 10
)

func (q *Quotas) setDefaults() {
	if q.RowsPerCluster <= 0 {
		q.RowsPerCluster = DefaultRowsPerCluster
	}
	if q.KindsPerCluster <= 0 {
		q.KindsPerCluster = DefaultKindsPerCluster
	}
	if q.LabelsPerRow <= 0 {
		q.LabelsPerRow = DefaultLabelsPerRow
	}
	if q.StringBytes <= 0 {
		q.StringBytes = DefaultStringBytes
	}
}

// Store is what a Hub needs of the index: every write (index.Sink), and
// the reads that hold an edge to its quotas. *index.Store implements it.
type Store interface {
	index.Sink
	// Kinds lists the kinds a cluster has.
	Kinds(cluster string) []index.Kind
	// Get reads one row, to tell a delta's new rows from changed ones.
	Get(k index.Key) (*index.Object, bool)
	// Facets counts a cluster's object rows by kind (from pre-aggregated
	// counts), and PolicyRows its RBAC rows.
	Facets(ctx context.Context, f index.Filter, a *index.Access) (*index.Facets, error)
	PolicyRows(cluster string) map[string]int
}

// quotaf is the error that ends a session over a quota.
func quotaf(format string, args ...any) *RejectError {
	return rejectf(ReasonQuota, format, args...)
}

// checkRow holds one row to the per-row quotas and returns what it costs
// to hold decoded (rowCost), which is what the snapshot bound counts, or,
// when the row is over a quota, which and how (over). It is the one check
// of a row's quotas: the manager ends a session that sends a row over one
// (over.reject, ReasonQuota: an edge is untrusted), and the edge runs it
// on each row before sending, with the quotas the Welcome announced, and
// skips the rows the manager would refuse (review-s10 H1).
func (q *Quotas) checkRow(o *index.Object) (cost int, over *rowOverQuota) {
	if err := index.ValidateRow(o); err != nil {
		// The index would refuse it (its key, or an RBAC row namespaced
		// against its kind), ending the session with invalid.
		return 0, &rowOverQuota{quota: quotaIndex, reject: rejectf(ReasonInvalid, "%v", err)}
	}
	if o.Labels.Len() > q.LabelsPerRow {
		return 0, &rowOverQuota{quota: "labels", reject: quotaf("row %s has %d labels; at most %d are allowed", o.Key(), o.Labels.Len(), q.LabelsPerRow)}
	}
	cost, how, what := rowCost(o, q.StringBytes)
	if how != "" {
		return 0, &rowOverQuota{quota: what, reject: quotaf("row %s: %s; at most %d are allowed per string", o.Key(), how, q.StringBytes)}
	}
	return cost, nil
}

// rowOverQuota is a row over a per-row quota: which quota (labels, or the
// string: "name", "an owner reference", "a subject", ...; or quotaIndex,
// quotaEncoding, quotaMessageSize for the other reasons an edge holds a
// row back, encodeWithin), so that an edge
// counts and logs each kind of problem once rather than once per row per
// resync, and the reject a manager ends the session with. It is not an
// error, so that a nil one never becomes a non-nil error.
type rowOverQuota struct {
	quota  string
	reject *RejectError
}

// rowQuotas returns the per-row quotas a Welcome announces; a manager
// from before the fields announces none, and its quotas are the defaults
// (Quotas.setDefaults), which every manager had before they could be set.
func rowQuotas(w *Welcome) Quotas {
	q := Quotas{LabelsPerRow: w.MaxLabelsPerRow, StringBytes: w.MaxStringBytes}
	q.setDefaults()
	return q
}

// rowCost returns what a row costs the manager to hold decoded: the
// Object and every byte it points to (the JSON it came in can be much
// smaller, for example many empty labels); and, when a string of it is
// over maxString bytes, which one (over says how, what names the field). The manager counts it against its
// snapshot limits, and the edge counts the same for its deltas' budget
// (deltaBudget). Strings count as the manager decodes them (jsonLen), so
// the edge's own rows, which may hold invalid UTF-8, cost the same on
// both sides.
func rowCost(o *index.Object, maxString int) (cost int, over, what string) {
	cost = int(unsafe.Sizeof(*o))
	// str counts a string of n bytes, and names it (what, then label)
	// only when it is over: the message is built at most once a row, as
	// this runs for every label of every row either side holds.
	str := func(field, label string, n int) {
		if n > maxString && over == "" {
			over, what = fmt.Sprintf("%s%s is %d bytes", field, label, n), strings.TrimSpace(field)
		}
		cost += n
	}
	for _, f := range []struct {
		what string
		n    int
	}{
		{"name", jsonLen(o.Name)},
		{"namespace", jsonLen(o.Namespace)},
		{"group", jsonLen(o.Group)},
		{"version", jsonLen(o.Version)},
		{"kind", jsonLen(o.Kind)},
		{"resource", jsonLen(o.Resource)},
		{"uid", jsonLen(o.UID)},
		{"resourceVersion", jsonLen(o.ResourceVersion)},
		{"message", jsonLen(o.Message)},
		{"summary", len(o.Summary)}, // JSON already: encoding copies its strings' bytes as they are
	} {
		str(f.what, "", f.n)
	}
	// A label holds two string headers in Labels, and 16 bytes more are
	// counted for the map a row's labels are decoded through
	// (Labels.UnmarshalJSON).
	const labelEntry = 2 * int(unsafe.Sizeof(""))
	for k, v := range o.Labels.All() {
		str("a label key", "", jsonLen(k))
		str("the value of label ", k, jsonLen(v))
		cost += labelEntry + 16
	}
	for _, r := range o.OwnerRefs {
		str("an owner reference", "", jsonLen(r.Kind))
		str("an owner reference", "", jsonLen(r.Name))
		cost += int(unsafe.Sizeof(r))
	}
	if p := o.Policy; p != nil {
		cost += int(unsafe.Sizeof(*p))
		for _, r := range p.Rules {
			cost += int(unsafe.Sizeof(r))
			for _, list := range [][]string{r.Verbs, r.APIGroups, r.Resources, r.ResourceNames, r.NonResourceURLs} {
				for _, s := range list {
					str("a policy rule entry", "", jsonLen(s))
					cost += int(unsafe.Sizeof(s))
				}
			}
		}
		for _, s := range p.Subjects {
			str("a subject", "", jsonLen(s.Name))
			str("a subject", "", jsonLen(s.Namespace))
			cost += int(unsafe.Sizeof(s))
		}
		str("the role reference", "", jsonLen(p.RoleRef.Name))
	}
	return cost, over, what
}

// jsonLen returns the length of s as the manager decodes it from the
// edge's JSON: encoding/json writes each byte of invalid UTF-8 as U+FFFD,
// which decodes to three bytes, so a string of such bytes grows threefold
// on the way (review-s9-a L2). The collector reads core kinds over
// protobuf, which does not check UTF-8, so a free-text field can hold
// them. A valid string (every string the manager decoded) is its length.
func jsonLen(s string) int {
	if utf8.ValidString(s) {
		return len(s)
	}
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			n += utf8.RuneLen(utf8.RuneError)
		} else {
			n += size
		}
		i += size
	}
	return n
}

// clusterCounts reads how many rows the index holds for a cluster, by
// kind (as index.Kind.GroupKind names them) and in total: objects from the
// index's counts, RBAC rows by walking them.
func clusterCounts(ctx context.Context, st Store, cluster string) (map[string]int, int, error) {
	f, err := st.Facets(ctx, index.Filter{Clusters: []string{cluster}}, &index.Access{All: true})
	if err != nil {
		return nil, 0, fmt.Errorf("counting the rows of cluster %q: %w", cluster, err)
	}
	byKind := make(map[string]int, len(f.Kinds)+4)
	total := f.Total
	for _, k := range f.Kinds {
		byKind[k.Value] = k.Count
	}
	for kind, n := range st.PolicyRows(cluster) {
		byKind[index.Kind{Group: index.RBACGroup, Kind: kind}.GroupKind()] = n
		total += n
	}
	return byKind, total, nil
}
