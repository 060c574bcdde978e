package graph

import (
	"bytes"
	"context"
	"testing"

	"github.com/fleetgraph/fleetgraph/index"
)

// TestEventsFastPathMatchesGeneratedCode subscribes each document three
// times over graphql-transport-ws: through gqlgen's generated code and
// websocket transport, through the events fast path and gqlgen's
// transport, and through the fast path with the next messages written
// directly (wsevents.go); it wants the same message bytes for every event,
// for a viewer who sees everything and one who sees a namespace, through a
// filter that objects enter and leave (so the same change is ADDED,
// MODIFIED or DELETED depending on the viewer), with a stale cluster,
// strings that encoding/json escapes (<, >, &, U+2028) and an operation id
// that needs escaping too.
func TestEventsFastPathMatchesGeneratedCode(t *testing.T) {
	docs := []struct {
		name, query string
		vars        map[string]any
	}{
		{"every field", `subscription { objectChanges { type cursor object { id cluster namespace group version kind resource name uid status message
			labels { key value } ownerReferences { kind name } createdAt updatedAt resourceVersion summary stale } } }`, nil},
		{"aliases and typename", `subscription { c: objectChanges { __typename t: type o: object { __typename i: id l: labels { __typename k: key } } } }`, nil},
		{"fragments", `subscription { objectChanges { ...E } } fragment E on ObjectChangeEvent { type object { ... on Object { name ownerReferences { name } } } }`, nil},
		{"skip and include", `subscription($s: Boolean!) { objectChanges { cursor @skip(if: $s) object { name @include(if: $s) kind } } }`, map[string]any{"s": true}},
		{"filter", `subscription($f: ObjectFilter) { objectChanges(filter: $f) { type object { name status stale } } }`, map[string]any{"f": map[string]any{"statuses": []string{"UNHEALTHY"}}}},
	}
	const id = "op<1>&\"\u2028\""
	modes := []struct {
		name       string
		fast, wsOK bool
	}{{"generated", false, false}, {"fast path", true, false}, {"written directly", true, true}}
	f := newFixture(t)
	ctx := context.Background()
	type sub struct {
		name string
		c    *wsClient
	}
	var subs []sub
	e := f.h.svc.events
	for _, d := range docs {
		for _, user := range []string{"admin", "alice"} {
			for _, m := range modes {
				e.off.Store(!m.fast)
				e.wsOff.Store(!m.wsOK)
				served, written := e.served.Load(), e.written.Load()
				c := f.connect(user)
				c.subscribe(id, d.query, d.vars)
				f.waitSubscribers(len(subs) + 1)
				if fast, direct := e.served.Load() > served, e.written.Load() > written; fast != m.fast || direct != m.wsOK {
					t.Fatalf("%s as %s, %s: fast path used %v, written directly %v", d.name, user, m.name, fast, direct)
				}
				subs = append(subs, sub{d.name + " as " + user + ", " + m.name, c})
			}
		}
	}
	e.off.Store(false)
	e.wsOff.Store(false)

	p := testObject(podKind, "east", "team-a", "pod-fast", index.StatusUnhealthy)
	p.OwnerRefs = []index.OwnerRef{{Kind: "ReplicaSet", Name: "rs\"1<&>"}}
	p.Message = "quotes \" and \\ and \u2028 \u2029 and <b>&amp;</b> \t \x01 é ’"
	p.Labels = index.LabelsOf(map[string]string{"b": "2", "a\"": "1\\"})
	p.ResourceVersion = "7"
	upsert(t, f.store, p) // ADDED, and in the filter
	p.Status = index.StatusHealthy
	upsert(t, f.store, p) // MODIFIED, and DELETED for the filter
	bare := index.Object{Cluster: "east", Namespace: "team-a", Version: "v1", Kind: "Pod", Resource: "pods", Name: "bare", UID: "u", Status: index.StatusUnhealthy}
	upsert(t, f.store, bare)
	must(t, f.store.Delete(ctx, p.Key()))
	stale := testObject(podKind, "north", "team-a", "pod-stale", index.StatusUnhealthy) // north is disconnected
	upsert(t, f.store, stale)
	last := testObject(podKind, "east", "team-a", "pod-last", index.StatusUnhealthy) // every subscription sees it
	upsert(t, f.store, last)

	var sawStale, sawDeleted, sawEscaped bool
	for i := 0; i < len(subs); i += len(modes) {
		generated := subs[i]
		for n := 0; ; n++ {
			mg := generated.c.readFor(id)
			if mg.Type != "next" {
				t.Fatalf("%s: event %d: %s %s", generated.name, n, mg.Type, mg.raw)
			}
			for _, other := range subs[i+1 : i+len(modes)] {
				mo := other.c.readFor(id)
				if !bytes.Equal(mg.raw, mo.raw) {
					t.Errorf("event %d:\n%s: %s\n%s: %s", n, generated.name, mg.raw, other.name, mo.raw)
				}
			}
			sawStale = sawStale || bytes.Contains(mg.raw, []byte(`"stale":true`))
			sawDeleted = sawDeleted || bytes.Contains(mg.raw, []byte(`"DELETED"`))
			sawEscaped = sawEscaped || bytes.Contains(mg.raw, []byte(`\u003cb\u003e\u0026amp;`))
			if bytes.Contains(mg.raw, []byte("pod-last")) {
				break
			}
		}
	}
	if !sawStale || !sawDeleted || !sawEscaped {
		t.Errorf("no subscription saw a stale object (%v), a DELETED change (%v) or an escaped string (%v)", sawStale, sawDeleted, sawEscaped)
	}
}

// TestEventsAreEncodedOncePerShape: subscriptions with the same selection
// share an event's bytes, unless their change differs (here its type).
func TestEventsAreEncodedOncePerShape(t *testing.T) {
	f := newFixture(t)
	e := f.h.svc.events
	o := testObject(podKind, "east", "team-a", "p", index.StatusHealthy)
	sh := &eventShape{prefix: []byte(`{"objectChanges":`), plan: &selPlan{typeName: "ObjectChangeEvent", fields: []fieldPlan{
		{key: []byte(`"type":`), name: "type", write: objectChangeEventWriters["type"]},
	}}}
	e.shapes["s"], sh.sig, sh.users = sh, "s", 1
	first := sh.encode(f.h.svc, index.ObjectChange{Type: index.EventModified, Object: &o, Seq: 5})
	if again := sh.encode(f.h.svc, index.ObjectChange{Type: index.EventModified, Object: &o, Seq: 5}); &again[0] == &first[0] {
		t.Error("one subscription's events were cached")
	}
	sh.users = 2
	sh.recent = make([]encodedEvent, eventCacheSize)
	first = sh.encode(f.h.svc, index.ObjectChange{Type: index.EventModified, Object: &o, Seq: 5})
	if again := sh.encode(f.h.svc, index.ObjectChange{Type: index.EventModified, Object: &o, Seq: 5}); &again[0] != &first[0] {
		t.Error("the same change was encoded twice for one shape")
	}
	deleted := sh.encode(f.h.svc, index.ObjectChange{Type: index.EventDeleted, Object: &o, Seq: 5})
	if want := `{"objectChanges":{"type":"DELETED"}}`; string(deleted) != want || string(first) != `{"objectChanges":{"type":"MODIFIED"}}` {
		t.Errorf("got %s and %s, want MODIFIED and %s", first, deleted, want)
	}
	e.release(sh)
	e.release(sh)
	if len(e.shapes) != 0 {
		t.Errorf("%d shapes left after their subscriptions ended", len(e.shapes))
	}
}
