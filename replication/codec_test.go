package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
)

var (
	t0      = time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC)
	podKind = index.Kind{Version: "v1", Kind: "Pod", Resource: "pods", Namespaced: true}
)

func testPod(cluster, ns, name string, i int) index.Object {
	return index.Object{
		Cluster: cluster, Namespace: ns, Version: "v1", Kind: "Pod", Resource: "pods", Name: name,
		UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i*7919), Labels: index.LabelsOf(map[string]string{"app": "web", "pod-template-hash": fmt.Sprint(i % 7)}),
		OwnerRefs: []index.OwnerRef{{Kind: "ReplicaSet", Name: "web-" + fmt.Sprint(i%7)}},
		CreatedAt: t0.Add(-time.Duration(i) * time.Second), UpdatedAt: t0, ResourceVersion: fmt.Sprint(1000 + i),
		Status: index.StatusHealthy, Message: "", Summary: []byte(`{"phase":"Running","restarts":0}`),
	}
}

// sampleOps is one of each operation, with every field set somewhere.
func sampleOps(cluster string, rows int) []op {
	var pods []index.Object
	for i := range rows {
		pods = append(pods, testPod(cluster, fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("web-%d", i), i))
	}
	role := index.Object{
		Cluster: cluster, Group: index.RBACGroup, Version: "v1", Kind: index.KindRoleBinding, Resource: "rolebindings",
		Namespace: "ns-1", Name: "rb", Policy: &index.Policy{
			RoleRef:  index.RoleRef{APIGroup: index.RBACGroup, Kind: "ClusterRole", Name: "view"},
			Subjects: []index.Subject{{Kind: "User", Name: "alice"}, {Kind: "ServiceAccount", Name: "sa", Namespace: "ns-1"}},
		},
	}
	row := &index.Cluster{
		Name: cluster, Labels: map[string]string{"env": "prod"}, Mode: index.ModePush, State: index.StateDegraded,
		Since: t0, LastSeen: t0.Add(time.Second), LastError: "HelmRelease: forbidden", Synced: true,
		Metadata: map[string]string{"region": "eu", "kubernetes.version": "v1.35.4"},
	}
	hr := index.Kind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease", Resource: "helmreleases", Namespaced: true}
	return []op{
		{typ: opReplace, at: t0, kind: podKind, rows: pods},
		{typ: opUpsert, at: t0.Add(time.Millisecond), rows: []index.Object{role, pods[0]}},
		{typ: opDelete, at: t0, key: index.Key{Cluster: cluster, Kind: "Pod", Namespace: "ns-0", Name: "web-0"}},
		{typ: opKindError, at: t0, kind: hr, err: "forbidden"},
		{typ: opCluster, at: t0, cluster: row},
		{typ: opRemoveCluster, at: t0},
		{typ: opReplace, at: t0, kind: hr}, // no rows
	}
}

// roundTrip chunks ops into messages under budget, encodes and decodes
// them, and joins the parts again.
func roundTrip(t *testing.T, ops []op, snapshot *op, budget int) ([]op, []*envelope, int) {
	t.Helper()
	c := newChunker(budget)
	for i := range ops {
		c.add(&ops[i], 0)
	}
	if snapshot != nil {
		c.addSnapshot(snapshot, false)
	}
	enc, dec := newEncoder(), newDecoder()
	head := envelope{cluster: "east", epoch: 3, owner: "collector-a/1", lease: 7, prev: 41}
	var got []op
	var envs []*envelope
	var part *op
	total := 0
	for _, p := range c.messages() {
		msg := enc.message(head, &p)
		total += len(msg)
		if len(p.ops) > budget+512 {
			t.Errorf("a message of %d bytes of operations, over the budget %d", len(p.ops), budget)
		}
		env, err := dec.decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		if env.cluster != head.cluster || env.epoch != head.epoch || env.owner != head.owner || env.lease != head.lease || env.prev != head.prev || env.flags != p.flags {
			t.Fatalf("envelope %+v, want %+v flags %d", env, head, p.flags)
		}
		envs = append(envs, env)
		for _, o := range env.ops {
			if o.typ == opSnapshot && o.labels != nil {
				// Each row's labels as the table gives them: the
				// comparison with the rows encoded checks every one.
				for i := range o.rows {
					o.rows[i].Labels = o.labels.Labels(i)
				}
				o.labels = nil
			}
			if part != nil {
				if o.typ != part.typ {
					t.Fatalf("a %s part follows an unfinished %s", o.typ, part.typ)
				}
				part.rows = append(part.rows, o.rows...)
				part.more = o.more
			} else {
				o := o
				part = &o
			}
			if !part.more {
				got = append(got, *part)
				part = nil
			}
		}
	}
	if part != nil {
		t.Fatal("the last part says more")
	}
	return got, envs, total
}

func TestCodecRoundTrip(t *testing.T) {
	for _, budget := range []int{1 << 20, 4 << 10} {
		t.Run(fmt.Sprintf("budget %d", budget), func(t *testing.T) {
			ops := sampleOps("east", 300)
			snap := &op{
				typ: opSnapshot, cluster: ops[4].cluster, rows: ops[0].rows,
				kinds: []index.KindState{{Kind: podKind, Present: true}, {Kind: ops[3].kind, Error: "forbidden", ErrorSince: t0}},
			}
			got, envs, _ := roundTrip(t, ops, snap, budget)
			want := append(append([]op{}, ops...), *snap)
			for i := range want {
				for j := range want[i].rows {
					want[i].rows[j].Cluster = "east"
				}
				if want[i].key != (index.Key{}) {
					want[i].key.Cluster = "east"
				}
			}
			if len(got) != len(want) {
				t.Fatalf("%d operations back, want %d", len(got), len(want))
			}
			for i := range want {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("operation %d (%s):\n got %+v\nwant %+v", i, want[i].typ, got[i], want[i])
				}
			}
			// The snapshot has messages of its own, flagged first to last.
			var flags []uint64
			for _, e := range envs {
				if e.snapshot() {
					flags = append(flags, e.flags)
				}
			}
			if len(flags) == 0 || flags[0]&flagFirst == 0 || flags[len(flags)-1]&flagLast == 0 {
				t.Fatalf("snapshot flags %v", flags)
			}
			if budget < 10<<10 && len(envs) < 10 {
				t.Fatalf("a %d-byte budget made only %d messages", budget, len(envs))
			}
		})
	}
}

// TestSnapshotFormatsRestore encodes a cluster's snapshot in format 1
// (each row's labels) and format 2 (label tables), in one message and in
// many, as an owner publishes it; decodes and assembles it as a replica
// does (appendSnapshotRows); and restores it into an empty index, which
// must then hold exactly the source's rows: none dropped, none with
// another row's labels.
func TestSnapshotFormatsRestore(t *testing.T) {
	ctx := context.Background()
	f := indextest.Fleet{Clusters: 1, Namespaces: 60, PerNamespace: 10, Seed: 7}
	src := index.New(memtables.Open)
	if err := f.ReplaceCluster(ctx, src, 0); err != nil {
		t.Fatal(err)
	}
	name := indextest.ClusterName(0)
	want := src.SnapshotCluster(name)
	for _, format := range []byte{formatV1, formatV2} {
		for _, budget := range []int{1 << 20, 16 << 10} {
			t.Run(fmt.Sprintf("format %d budget %d", format, budget), func(t *testing.T) {
				c := newChunker(budget)
				c.noTables = format == formatV1
				c.addSnapshot(&op{typ: opSnapshot, cluster: want.Cluster, kinds: want.Kinds, rows: want.Rows}, false)
				enc, dec := newEncoder(), newDecoder()
				asm := &index.ClusterSnapshot{Name: name}
				msgs := c.messages()
				for _, p := range msgs {
					msg := enc.message(envelope{cluster: name, epoch: 1, owner: "o"}, &p)
					if msg[0] != format {
						t.Fatalf("a snapshot message of format %d, want %d", msg[0], format)
					}
					env, err := dec.decode(msg)
					if err != nil {
						t.Fatal(err)
					}
					for _, o := range env.ops {
						if (o.labels != nil) != (format == formatV2) {
							t.Fatalf("format %d decoded with label table %v", format, o.labels != nil)
						}
						if o.cluster != nil {
							asm.Cluster = o.cluster
						}
						asm.Kinds = append(asm.Kinds, o.kinds...)
						appendSnapshotRows(asm, &o)
					}
				}
				if budget < 1<<20 && len(msgs) < 5 {
					t.Fatalf("a %d-byte budget made only %d messages", budget, len(msgs))
				}
				dst := index.New(memtables.Open)
				if err := dst.RestoreCluster(ctx, *asm); err != nil {
					t.Fatal(err)
				}
				got := dst.SnapshotCluster(name)
				if len(got.Rows) != len(want.Rows) {
					t.Fatalf("%d rows restored, want %d", len(got.Rows), len(want.Rows))
				}
				for i := range want.Rows {
					if !reflect.DeepEqual(got.Rows[i], want.Rows[i]) {
						t.Fatalf("row %d restored as\n%+v\nwant\n%+v", i, got.Rows[i], want.Rows[i])
					}
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("restored cluster differs:\n got %+v\nwant %+v", got, want)
				}
			})
		}
	}
}

// TestCodecSize keeps the encoding compact: a snapshot of the benchmark
// fleet's objects (random uids, 3-8 labels, messages up to 200 bytes)
// must stay well under the 150 bytes per object the stream may hold.
func TestCodecSize(t *testing.T) {
	f := indextest.DefaultFleet()
	store := index.New(memtables.Open)
	var rows []index.Object
	for i := range f.Namespaces * f.PerNamespace { // the first cluster
		rows = append(rows, f.Object(i))
	}
	for _, o := range rows {
		if err := store.Upsert(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	snap := store.SnapshotCluster(rows[0].Cluster)
	_, _, total := roundTrip(t, nil, &op{typ: opSnapshot, rows: snap.Rows}, 1<<20)
	perRow := float64(total) / float64(len(rows))
	t.Logf("%.1f bytes per object in a snapshot of %d", perRow, len(rows))
	if perRow > 120 {
		t.Fatalf("%.1f bytes per object in a snapshot", perRow)
	}
}

func TestDecodeRejectsBadInput(t *testing.T) {
	enc, dec := newEncoder(), newDecoder()
	c := newChunker(1 << 20)
	ops := sampleOps("east", 3)
	c.add(&ops[0], 0)
	good := enc.message(envelope{cluster: "east", epoch: 1}, &c.messages()[0])
	if _, err := dec.decode(good); err != nil {
		t.Fatal(err)
	}
	bomb := append([]byte{formatVersion, compressZstd}, enc.zw.EncodeAll(bytes.Repeat([]byte{0}, maxDecoded+1), nil)...)
	cases := map[string][]byte{
		"empty":          nil,
		"one byte":       {formatVersion},
		"future version": append([]byte{formatVersion + 1}, good[1:]...),
		"compression":    {formatVersion, 9, 1, 2},
		"bad zstd":       {formatVersion, compressZstd, 1, 2, 3, 4},
		"truncated":      good[:len(good)/2],
		"no cluster":     {formatVersion, compressNone},
		"bomb":           bomb,
		"garbage":        append([]byte{formatVersion, compressNone}, bytes.Repeat([]byte{0xff}, 64)...),
		"unknown op":     append([]byte{formatVersion, compressNone}, appendSub(appendString(nil, envCluster, "x"), envOp, func(b []byte) []byte { return appendVarint(b, opFieldType, 99) })...),
		"label not in table": snapshotMessage(func(b []byte) []byte {
			b = appendString(appendString(b, opFieldLabelStr, "app"), opFieldLabelStr, "web")
			b = appendSub(b, opFieldLabelPair, func(b []byte) []byte { return append(b, 0, 1) })
			return appendSub(b, opFieldRow, func(b []byte) []byte { return appendSub(b, rowLabelRef, func(b []byte) []byte { return append(b, 1) }) })
		}),
		"pair not in strings": snapshotMessage(func(b []byte) []byte {
			b = appendString(b, opFieldLabelStr, "app")
			return appendSub(b, opFieldLabelPair, func(b []byte) []byte { return append(b, 0, 1) })
		}),
		"pair without value": snapshotMessage(func(b []byte) []byte {
			b = appendString(b, opFieldLabelStr, "app")
			return appendSub(b, opFieldLabelPair, func(b []byte) []byte { return append(b, 0) })
		}),
		"references without table": snapshotMessage(func(b []byte) []byte {
			return appendSub(b, opFieldRow, func(b []byte) []byte { return appendSub(b, rowLabelRef, func(b []byte) []byte { return append(b, 0) }) })
		}),
		"table outside a snapshot": append([]byte{formatV2, compressNone}, appendSub(appendString(nil, envCluster, "x"), envOp, func(b []byte) []byte {
			b = appendVarint(b, opFieldType, uint64(opUpsert))
			b = appendString(appendString(b, opFieldLabelStr, "app"), opFieldLabelStr, "web")
			return appendSub(b, opFieldLabelPair, func(b []byte) []byte { return append(b, 0, 1) })
		})...),
	}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			env, err := dec.decode(msg)
			if !errors.Is(err, errDecode) {
				t.Fatalf("decode = %+v, %v; want an errDecode", env, err)
			}
		})
	}
	// A field this version does not know is skipped.
	withNew := append([]byte{formatVersion, compressNone}, appendString(appendString(nil, 99, "from the future"), envCluster, "east")...)
	if env, err := dec.decode(withNew); err != nil || env.cluster != "east" {
		t.Fatalf("unknown field: %+v, %v", env, err)
	}
}

// snapshotMessage is a format 2 message of one snapshot operation whose
// fields after the type fn writes.
func snapshotMessage(fn func([]byte) []byte) []byte {
	return append([]byte{formatV2, compressNone}, appendSub(appendString(nil, envCluster, "x"), envOp, func(b []byte) []byte {
		return fn(appendVarint(b, opFieldType, uint64(opSnapshot)))
	})...)
}

func TestSubjectToken(t *testing.T) {
	cases := map[string]string{
		"east":             "east",
		"prod.eu-west_1":   "prod~2eeu-west_1",
		"a b*>~":           "a~20b~2a~3e~7e",
		"arn:aws:eks:x/y":  "arn~3aaws~3aeks~3ax~2fy",
		"prod~2eeu-west_1": "prod~7e2eeu-west_1",
		"ünï":              "~c3~bcn~c3~af",
	}
	seen := map[string]string{}
	for in, want := range cases {
		if got := subjectToken(in); got != want {
			t.Errorf("subjectToken(%q) = %q, want %q", in, got, want)
		}
		if other, dup := seen[want]; dup {
			t.Errorf("%q and %q share token %q", in, other, want)
		}
		seen[want] = in
	}
}
