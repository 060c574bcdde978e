package index

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// TestRowSize holds objRow to its allocation size class: a field that
// takes it past 80 bytes costs 16 bytes per object (the next class is
// 96), about 16 MB at 1M objects.
func TestRowSize(t *testing.T) {
	if got := unsafe.Sizeof(objRow{}); got > 80 {
		t.Fatalf("objRow is %d bytes, want at most 80", got)
	}
}

// TestRowParts checks that every part of an Object survives its row: the
// offsets into data and the owner references' pointer and count.
func TestRowParts(t *testing.T) {
	x := newObjIndex()
	cases := []Object{
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: "n", Namespace: "ns"},
		{
			Cluster: "c1", Group: "apps", Version: "v1", Kind: "ReplicaSet", Resource: "replicasets", Namespace: "ns-1", Name: "web-5d8f",
			UID: "0b5c6c0e-7d4a-4c43-9d43-0c1e2b3a4f5d", ResourceVersion: "123456",
			Labels:    LabelsOf(map[string]string{"app": "web", "pod-template-hash": "5d8f"}),
			OwnerRefs: []OwnerRef{{Kind: "Deployment", Name: "web"}, {Kind: "Other", Name: "x"}},
			Summary:   []byte(`{"replicas":3}`),
			CreatedAt: time.Unix(1_700_000_000, 5).UTC(), UpdatedAt: time.Unix(1_700_000_100, 0).UTC(),
			Status: StatusProgressing, Message: "scaling",
		},
		// More owner references than a 16-bit count holds: an object
		// Kubernetes accepts (about 17 bytes a reference in protobuf).
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: "owned", Namespace: "ns", OwnerRefs: manyOwners(70_000)},
		// Lengths of 128 and more take two bytes or more of the header
		// (span's long path), each part in turn.
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: strings.Repeat("n", 253), UID: "u", ResourceVersion: "1", Summary: []byte("s")},
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: "long-uid", UID: strings.Repeat("u", 200), ResourceVersion: "1"},
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: "long-rv", UID: "u", ResourceVersion: strings.Repeat("9", 20_000), Summary: []byte("s")},
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: "many-labels", UID: "u", Labels: LabelsOf(manyLabels(300)), Summary: []byte("s")},
		{Cluster: "c", Kind: "ConfigMap", Version: "v1", Resource: "configmaps", Name: strings.Repeat("m", maxKeyLen-20), UID: strings.Repeat("u", 127), ResourceVersion: strings.Repeat("1", 128), Labels: LabelsOf(manyLabels(127))},
	}
	for _, o := range cases {
		t.Run(o.Name, func(t *testing.T) {
			if err := ValidateRow(&o); err != nil {
				t.Fatal(err)
			}
			r := x.buildRow(&o, x.internLabels(nil, o.Labels))
			if x.keyOf(r) != o.Key() || r.name() != o.Name || r.uid() != o.UID || r.rv() != o.ResourceVersion {
				t.Fatalf("key %s name %q uid %q rv %q", x.keyOf(r), r.name(), r.uid(), r.rv())
			}
			if ls := r.labels(); ls.len() != o.Labels.Len() || !slices.IsSorted(r.labelIDs(nil)) {
				t.Fatalf("%d labels, want %d", ls.len(), o.Labels.Len())
			}
			start, nameEnd, uidEnd, rvEnd, labelsEnd := r.span()
			if s2, n2, u2, v2, l2 := r.spanLong(); s2 != start || n2 != nameEnd || u2 != uidEnd || v2 != rvEnd || l2 != labelsEnd {
				t.Fatalf("span %d %d %d %d %d, spanLong %d %d %d %d %d", start, nameEnd, uidEnd, rvEnd, labelsEnd, s2, n2, u2, v2, l2)
			}
			got := x.object(r)
			if !slices.Equal(got.OwnerRefs, o.OwnerRefs) || string(got.Summary) != string(o.Summary) || (got.Summary == nil) != (len(o.Summary) == 0) {
				t.Fatalf("owners %v summary %q, want %v %q", got.OwnerRefs, got.Summary, o.OwnerRefs, o.Summary)
			}
			if !x.sameLabels(o.Labels, r) || !sameFields(&o, r) {
				t.Fatalf("row differs from its object: %+v", got)
			}
		})
	}
}

// TestValidateRowOwners rejects a row whose owner references do not fit
// an objRow's 24-bit count, and only such a row.
func TestValidateRowOwners(t *testing.T) {
	if !ownersFit(maxOwners) || ownersFit(maxOwners+1) || maxOwners < 200_000 {
		t.Fatalf("maxOwners %d: want a count every object etcd stores fits", maxOwners)
	}
	o := Object{Cluster: "c", Kind: "Pod", Name: "p", OwnerRefs: manyOwners(1 << 16)}
	if err := ValidateRow(&o); err != nil {
		t.Fatal(err)
	}
}

// TestValidateRowPolicy: an RBAC row must be namespaced as its kind is,
// as UpsertBatch and ApplySnapshot require; ValidateRow, which an edge
// holds its rows to, says so before the index is asked.
func TestValidateRowPolicy(t *testing.T) {
	for _, tc := range []struct {
		kind, namespace string
		ok              bool
	}{
		{KindRole, "ns", true},
		{KindRoleBinding, "ns", true},
		{KindClusterRole, "", true},
		{KindClusterRoleBinding, "", true},
		{KindRole, "", false},
		{KindRoleBinding, "", false},
		{KindClusterRole, "ns", false},
		{KindClusterRoleBinding, "ns", false},
	} {
		o := Object{Cluster: "c", Group: RBACGroup, Kind: tc.kind, Namespace: tc.namespace, Name: "n"}
		err := ValidateRow(&o)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidRow)) {
			t.Errorf("%s in namespace %q: %v, want ok %v", tc.kind, tc.namespace, err, tc.ok)
		}
		st, _ := newTestStore(t)
		if err := st.UpsertBatch(t.Context(), []Object{o}); (err == nil) != tc.ok {
			t.Errorf("%s in namespace %q: UpsertBatch: %v, want ok %v", tc.kind, tc.namespace, err, tc.ok)
		}
	}
}

// manyLabels returns n distinct labels.
func manyLabels(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["k"+strconv.Itoa(i)] = "v" + strconv.Itoa(i%7)
	}
	return m
}

// manyOwners returns n distinct owner references.
func manyOwners(n int) []OwnerRef {
	refs := make([]OwnerRef, n)
	for i := range refs {
		refs[i] = OwnerRef{Kind: "ReplicaSet", Name: strconv.Itoa(i)}
	}
	return refs
}

// TestLabelPairSize holds a label pair to 32 bytes, 8 of ids and 24 of
// posting list (see pairTable): there are about 1.7 pairs per object in
// the benchmark fleet, so 8 bytes more a pair cost about 14 MB at 1M
// objects, and reads of the ids load a table of 8 bytes a pair.
func TestLabelPairSize(t *testing.T) {
	if ids, list := unsafe.Sizeof(pairKV{}), unsafe.Sizeof(postings{}); ids > 8 || ids+list > 32 {
		t.Fatalf("a label pair is %d bytes of ids and %d of list, want 8 and at most 32 in all", ids, list)
	}
}

// TestEmptySummaryAndOwners stores an object whose Summary and OwnerRefs
// are empty but not nil: they come back nil (a row keeps no empty parts),
// and sending the object again, either way, is no change.
func TestEmptySummaryAndOwners(t *testing.T) {
	s, _ := newTestStore(t)
	o := pod("c0", "ns0", "p", StatusHealthy, nil)
	o.Summary, o.OwnerRefs = []byte{}, []OwnerRef{}
	mustNoErr(t, s.Upsert(ctxb, o))
	got, ok := s.Get(o.Key())
	if !ok || got.Summary != nil || got.OwnerRefs != nil {
		t.Fatalf("got %v: summary %#v owners %#v, want both nil", ok, got.Summary, got.OwnerRefs)
	}
	seq := s.LastSeq()
	nils := o
	nils.Summary, nils.OwnerRefs = nil, nil
	for _, again := range []Object{o, nils} {
		mustNoErr(t, s.Upsert(ctxb, again))
		if s.LastSeq() != seq {
			t.Fatalf("sending the object again (summary %#v, owners %#v) published a change", again.Summary, again.OwnerRefs)
		}
	}
}
