package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/index"
)

const objectChangesSub = `subscription($filter: ObjectFilter, $after: String) {
  objectChanges(filter: $filter, after: $after) { type cursor object { id cluster namespace name status stale } } }`

type changeEvent struct {
	ObjectChanges struct {
		Type   string
		Cursor string
		Object struct {
			ID, Cluster, Name, Status string
			Namespace                 *string
			Stale                     bool
		}
	}
}

// nextData reads the next event of operation id and decodes its data,
// failing on errors.
func nextData[T any](c *wsClient, id string) T {
	c.t.Helper()
	m := c.readFor(id)
	if m.Type != "next" {
		c.t.Fatalf("operation %s: %s %s", id, m.Type, m.Payload)
	}
	var p struct {
		Data   T
		Errors []gqlErr
	}
	must(c.t, json.Unmarshal(m.Payload, &p))
	if len(p.Errors) > 0 {
		c.t.Fatalf("operation %s: errors %+v", id, p.Errors)
	}
	return p.Data
}

func (c *wsClient) nextChange(id string) changeEvent {
	c.t.Helper()
	return nextData[changeEvent](c, id)
}

// expectQuiet checks that nothing arrives for a while.
func (c *wsClient) expectQuiet(d time.Duration) {
	c.t.Helper()
	if m, err := c.readTimeout(d); err == nil {
		c.t.Fatalf("unexpected message %+v %s", m, m.Payload)
	}
}

func upsert(t *testing.T, s *index.Store, rows ...index.Object) {
	t.Helper()
	for _, r := range rows {
		must(t, s.Upsert(context.Background(), r))
	}
}

func TestObjectChangesShowOnlyVisibleObjects(t *testing.T) {
	f := newFixture(t)
	alice := f.connect("alice")
	alice.subscribe("a", objectChangesSub, nil)
	carol := f.connect("carol")
	carol.subscribe("c", objectChangesSub, nil)
	f.waitSubscribers(2)

	hidden := []index.Object{
		testObject(podKind, "east", "team-b", "hidden-1", index.StatusHealthy),
		testObject(podKind, "west", "team-a", "hidden-2", index.StatusHealthy),
		testObject(nsKind, "east", "", "team-z", index.StatusHealthy),
	}
	visible := testObject(podKind, "east", "team-a", "new-pod", index.StatusProgressing)
	upsert(t, f.store, hidden...)
	upsert(t, f.store, visible)
	visible.Status = index.StatusHealthy
	upsert(t, f.store, visible)
	must(t, f.store.Delete(context.Background(), visible.Key()))
	upsert(t, f.store, hidden[0])

	var got []string
	for range 3 {
		e := alice.nextChange("a").ObjectChanges
		got = append(got, e.Type+" "+e.Object.ID+" "+e.Object.Status)
		if e.Cursor == "" {
			t.Error("event without cursor")
		}
	}
	want := []string{
		"ADDED east//Pod/team-a/new-pod PROGRESSING",
		"MODIFIED east//Pod/team-a/new-pod HEALTHY",
		"DELETED east//Pod/team-a/new-pod HEALTHY",
	}
	if !slices.Equal(got, want) {
		t.Errorf("alice got %v, want %v", got, want)
	}
	alice.expectQuiet(200 * time.Millisecond)
	carol.expectQuiet(200 * time.Millisecond)
}

func TestObjectChangesFilterEntersAndLeaves(t *testing.T) {
	f := newFixture(t)
	c := f.connect("admin")
	c.subscribe("1", objectChangesSub, map[string]any{"filter": map[string]any{"statuses": []string{"UNHEALTHY"}, "kinds": []string{"Pod"}}})
	f.waitSubscribers(1)
	p := testObject(podKind, "west", "team-a", "pod-team-a-0", index.StatusUnhealthy) // was HEALTHY
	upsert(t, f.store, p)
	p.Status = index.StatusProgressing
	upsert(t, f.store, p)
	svc := testObject(svcKind, "west", "team-a", "svc-team-a-0", index.StatusUnhealthy)
	upsert(t, f.store, svc)
	for _, want := range []string{"ADDED UNHEALTHY", "DELETED PROGRESSING"} {
		e := c.nextChange("1").ObjectChanges
		if got := e.Type + " " + e.Object.Status; got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	c.expectQuiet(200 * time.Millisecond)
}

// TestObjectChangesClusterLabelSelector: a subscription selecting clusters
// by label sees only their objects' changes, and follows a relabelled
// cluster from its next event on.
func TestObjectChangesClusterLabelSelector(t *testing.T) {
	f := newFixture(t)
	c := f.connect("admin")
	c.subscribe("1", objectChangesSub, map[string]any{"filter": map[string]any{"clusterLabelSelector": "region=west"}})
	f.waitSubscribers(1)
	upsert(t, f.store, testObject(podKind, "east", "team-a", "east-pod", index.StatusHealthy))
	upsert(t, f.store, testObject(podKind, "west", "team-a", "west-pod", index.StatusHealthy))
	if e := c.nextChange("1").ObjectChanges; e.Type != "ADDED" || e.Object.Cluster != "west" {
		t.Fatalf("got %+v, want west's pod ADDED", e)
	}
	east, _ := f.store.GetCluster(nil, "east")
	relabelled := *east
	relabelled.Labels = map[string]string{"region": "west"}
	must(t, f.store.UpsertCluster(context.Background(), relabelled))
	upsert(t, f.store, testObject(podKind, "east", "team-a", "east-pod-2", index.StatusHealthy))
	if e := c.nextChange("1").ObjectChanges; e.Type != "ADDED" || e.Object.Name != "east-pod-2" {
		t.Fatalf("got %+v, want the relabelled east's new pod ADDED", e)
	}
	c.expectQuiet(200 * time.Millisecond)
}

func TestObjectChangesResume(t *testing.T) {
	f := newFixture(t)
	c := f.connect("alice")
	c.subscribe("1", objectChangesSub, nil)
	f.waitSubscribers(1)
	upsert(t, f.store, testObject(podKind, "east", "team-a", "p1", index.StatusHealthy))
	first := c.nextChange("1").ObjectChanges
	c.send(wsMessage{ID: "1", Type: "complete"})
	f.waitSubscribers(0)

	// Changes while the client is away, visible or not.
	upsert(t, f.store,
		testObject(podKind, "east", "team-a", "p2", index.StatusHealthy),
		testObject(podKind, "east", "team-b", "hidden", index.StatusHealthy),
		testObject(podKind, "east", "team-a", "p3", index.StatusHealthy))

	// A live subscription keeps the fan-out running past the gap, so the
	// resumed one must replay from the index.
	keep := f.connect("admin")
	keep.subscribe("k", objectChangesSub, nil)
	f.waitSubscribers(1)
	upsert(t, f.store, testObject(podKind, "east", "team-a", "p4", index.StatusHealthy))

	c2 := f.connect("alice")
	c2.subscribe("2", objectChangesSub, map[string]any{"after": first.Cursor})
	var got []string
	for range 3 {
		got = append(got, c2.nextChange("2").ObjectChanges.Object.Name)
	}
	if !slices.Equal(got, []string{"p2", "p3", "p4"}) {
		t.Errorf("resumed with %v, want p2 p3 p4", got)
	}
	upsert(t, f.store, testObject(podKind, "east", "team-a", "p5", index.StatusHealthy))
	if n := c2.nextChange("2").ObjectChanges.Object.Name; n != "p5" {
		t.Errorf("live after replay: %s", n)
	}
	c2.expectQuiet(200 * time.Millisecond)
}

func TestObjectChangesFromQueryCursor(t *testing.T) {
	f := newFixture(t)
	var r objectsResult
	f.query("alice", objectsQuery, map[string]any{"first": 1}, &r)
	upsert(t, f.store, testObject(podKind, "east", "team-a", "after-page", index.StatusHealthy))
	c := f.connect("alice")
	c.subscribe("1", objectChangesSub, map[string]any{"after": r.Objects.ChangesCursor})
	if e := c.nextChange("1").ObjectChanges; e.Type != "ADDED" || e.Object.Name != "after-page" {
		t.Errorf("got %+v", e)
	}
}

func TestObjectChangesBadCursors(t *testing.T) {
	f := newFixture(t)
	other := newFixture(t)
	var r objectsResult
	other.query("alice", objectsQuery, map[string]any{"first": 1}, &r)
	c := f.connect("alice")
	for id, tc := range map[string]struct{ cursor, code string }{
		"malformed":      {"xyz", CodeBadUserInput},
		"other instance": {r.Objects.ChangesCursor, CodeResyncRequired},
		"future":         {f.h.svc.encodeChangeCursor(1 << 40), CodeBadUserInput},
	} {
		c.subscribe(id, objectChangesSub, map[string]any{"after": tc.cursor})
		for {
			m := c.read()
			if m.ID != id || m.Type == "complete" {
				continue
			}
			if !strings.Contains(string(m.Payload), tc.code) || !strings.Contains(string(m.Payload), `"data":null`) {
				t.Errorf("%s: %+v %s", id, m, m.Payload)
			}
			break
		}
	}
}

func TestObjectChangesFollowRBAC(t *testing.T) {
	f := newFixture(t)
	c := f.connect("alice")
	c.subscribe("1", objectChangesSub, nil)
	f.waitSubscribers(1)
	ctx := context.Background()

	// Grant team-b: its changes start streaming.
	grant := append(bindingsOf("east"), binding("east", "team-b", "alice-view-b", index.KindClusterRole, "view", userSubject("alice")))
	must(t, f.store.Replace(ctx, "east", rbKind, grant))
	start := time.Now()
	upsert(t, f.store, testObject(podKind, "east", "team-b", "granted", index.StatusHealthy))
	if e := c.nextChange("1").ObjectChanges; e.Object.Name != "granted" {
		t.Fatalf("after grant got %+v", e)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("grant took %v to apply", d)
	}

	// Revoke everything: nothing streams any more.
	must(t, f.store.Replace(ctx, "east", rbKind, nil))
	upsert(t, f.store,
		testObject(podKind, "east", "team-a", "revoked-a", index.StatusHealthy),
		testObject(podKind, "east", "team-b", "revoked-b", index.StatusHealthy))
	c.expectQuiet(300 * time.Millisecond)

	// And a query agrees.
	var r objectsResult
	f.query("alice", objectsQuery, nil, &r)
	if r.Objects.TotalCount != 0 {
		t.Errorf("after revoke alice still sees %d objects", r.Objects.TotalCount)
	}
}

const clusterConnectionSub = `subscription($clusters: [String!]) {
  clusterConnection(clusters: $clusters) { cluster state previous at message } }`

type connEvent struct {
	ClusterConnection struct {
		Cluster, State string
		Previous       *string
		Message        *string
		At             time.Time
	}
}

func (c *wsClient) nextConn(id string) connEvent { c.t.Helper(); return nextData[connEvent](c, id) }

func TestClusterConnectionOneEventPerTransition(t *testing.T) {
	f := newFixture(t)
	admin := f.connect("admin")
	admin.subscribe("all", clusterConnectionSub, nil)
	admin.subscribe("west", clusterConnectionSub, map[string]any{"clusters": []string{"west"}})
	alice := f.connect("alice")
	alice.subscribe("a", clusterConnectionSub, nil)
	carol := f.connect("carol")
	carol.subscribe("c", clusterConnectionSub, nil)
	f.waitSubscribers(4)

	ctx := context.Background()
	at := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	set := func(name string, st index.ConnectionState, seen time.Time, lastErr string) {
		c, _ := f.store.GetCluster(nil, name)
		n := *c
		if n.State != st {
			n.Since = at
			at = at.Add(time.Second)
		}
		n.State, n.LastSeen, n.LastError = st, seen, lastErr
		must(t, f.store.UpsertCluster(ctx, n))
	}
	set("east", index.StateConnected, time.Now(), "")                   // lastSeen only: no event
	set("east", index.StateDisconnected, time.Now(), "probe timed out") // transition
	set("east", index.StateDisconnected, time.Now(), "probe timed out") // repeated: no event
	set("east", index.StateConnected, time.Now(), "")                   // transition
	set("west", index.StateDegraded, time.Now(), "kustomizations: forbidden")

	var got []string
	for range 3 {
		e := admin.nextConn("all").ClusterConnection
		prev := "<nil>"
		if e.Previous != nil {
			prev = *e.Previous
		}
		got = append(got, fmt.Sprintf("%s %s->%s", e.Cluster, prev, e.State))
		if e.State == "DISCONNECTED" && (e.Message == nil || *e.Message != "probe timed out") {
			t.Errorf("disconnect message %v", e.Message)
		}
	}
	want := []string{"east CONNECTED->DISCONNECTED", "east DISCONNECTED->CONNECTED", "west CONNECTED->DEGRADED"}
	if !slices.Equal(got, want) {
		t.Errorf("admin got %v, want %v", got, want)
	}
	if e := admin.nextConn("west").ClusterConnection; e.Cluster != "west" || e.State != "DEGRADED" {
		t.Errorf("filtered subscription got %+v", e)
	}
	for _, want := range []string{"DISCONNECTED", "CONNECTED"} {
		if e := alice.nextConn("a").ClusterConnection; e.Cluster != "east" || e.State != want {
			t.Errorf("alice got %+v, want east %s", e, want)
		}
	}
	alice.expectQuiet(200 * time.Millisecond) // west is not hers
	carol.expectQuiet(100 * time.Millisecond)
}

func TestFleetSubscription(t *testing.T) {
	f := newFixture(t)
	c := f.connect("admin")
	c.subscribe("1", `subscription { fleet { clustersTotal clustersSynced rebuilding message } }`, nil)
	next := func() string {
		for {
			m := c.read()
			if m.ID == "1" && m.Type == "next" {
				var p struct {
					Data struct{ Fleet struct{ Message string } }
				}
				must(t, json.Unmarshal(m.Payload, &p))
				return p.Data.Fleet.Message
			}
		}
	}
	if m := next(); m != "2/3 clusters synced (1 disconnected, showing last known state)" {
		t.Errorf("first status %q", m)
	}
	north, _ := f.store.GetCluster(nil, "north")
	n := *north
	n.LastSeen = time.Now() // no change in the status: no event
	must(t, f.store.UpsertCluster(context.Background(), n))
	n.State = index.StateConnecting // reachable again, first sync under way
	must(t, f.store.UpsertCluster(context.Background(), n))
	if m := next(); m != "Rebuilding indices... 2/3 clusters" {
		t.Errorf("while north syncs %q", m)
	}
	n.Synced, n.State = true, index.StateConnected
	must(t, f.store.UpsertCluster(context.Background(), n))
	if m := next(); m != "All 3 clusters synced" {
		t.Errorf("after sync %q", m)
	}
	c.expectQuiet(200 * time.Millisecond)
}

// flood writes n new pods with large messages, in commits of batch rows,
// pausing between commits so that the fan-out (which is not the subject)
// keeps up even on a loaded machine.
func flood(t *testing.T, s *index.Store, n, batch int) {
	t.Helper()
	big := strings.Repeat("m", 4000)
	rows := make([]index.Object, 0, batch)
	for i := range n {
		r := testObject(podKind, "west", "team-a", fmt.Sprintf("flood-%04d", i), index.StatusHealthy)
		r.Message = big
		rows = append(rows, r)
		if len(rows) == batch || i == n-1 {
			must(t, s.UpsertBatch(context.Background(), rows))
			rows = rows[:0]
			time.Sleep(2 * time.Millisecond)
		}
	}
}

func TestBurstLargerThanQueueCatchesUp(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.SubscriptionBuffer = 8 })
	c := f.connect("admin")
	c.subscribe("1", `subscription { objectChanges { type object { name } } }`, nil)
	f.waitSubscribers(1)
	const n = 3000
	flood(t, f.store, n, n)
	for i := range n {
		e := c.nextChange("1").ObjectChanges
		if want := fmt.Sprintf("flood-%04d", i); e.Type != "ADDED" || e.Object.Name != want {
			t.Fatalf("event %d: %s %s, want ADDED %s", i, e.Type, e.Object.Name, want)
		}
	}
	c.expectQuiet(100 * time.Millisecond)
	if body := f.get("/metrics"); strings.Contains(body, `fleetgraph_graphql_subscription_catchups_total{subscription="objectChanges"} 0`) {
		t.Error("the burst did not go through catch-up")
	}
}

func TestSlowConsumerFallsOutOfTheRing(t *testing.T) {
	f := newFixtureWith(t, seededStore(t, index.WithReplayBuffer(1024)), func(o *Options) {
		o.SubscriptionBuffer = 8
		o.Websocket.KeepAlive = time.Hour
	})
	c := f.connect("admin")
	c.subscribe("1", `subscription { objectChanges { cursor object { name message } } }`, nil)
	f.waitSubscribers(1)
	// The client does not read while thousands of large events arrive:
	// the socket buffers fill, the pump blocks, and the ring moves on.
	const n = 3000
	flood(t, f.store, n, 50)
	time.Sleep(200 * time.Millisecond)
	received := 0
	for {
		m := c.read()
		if m.Type == "next" {
			received++
			continue
		}
		if m.Type != "error" || !strings.Contains(string(m.Payload), CodeSlowConsumer) || !strings.Contains(string(m.Payload), "changesCursor") {
			t.Fatalf("got %+v %s", m, m.Payload)
		}
		break
	}
	if received >= n {
		t.Fatalf("received all %d events; the subscription should have fallen behind", received)
	}
	body := f.get("/metrics")
	if !strings.Contains(body, `fleetgraph_graphql_subscriptions_ended_total{reason="slow_consumer",subscription="objectChanges"} 1`) {
		t.Error("/metrics does not count the slow consumer")
	}
	if strings.Contains(body, `fleetgraph_graphql_subscription_events_dropped_total{subscription="objectChanges"} 0`) {
		t.Error("no dropped events counted")
	}
	// The documented recovery: query, then subscribe from changesCursor.
	var r objectsResult
	f.query("admin", objectsQuery, map[string]any{"first": 1}, &r)
	c.subscribe("2", objectChangesSub, map[string]any{"after": r.Objects.ChangesCursor})
	upsert(t, f.store, testObject(podKind, "west", "team-a", "after-resync", index.StatusHealthy))
	if e := c.nextChange("2").ObjectChanges; e.Object.Name != "after-resync" {
		t.Errorf("after resubscribing got %+v", e)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	f := newFixture(t)
	c := f.connect("alice")
	c.subscribe("1", objectChangesSub, nil)
	f.waitSubscribers(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		msgs []wsMessage
		err  error
	}
	done := make(chan result)
	go func() {
		var r result
		for {
			m, err := c.readTimeout(5 * time.Second)
			if err != nil {
				r.err = err
				done <- r
				return
			}
			r.msgs = append(r.msgs, m)
		}
	}()
	start := time.Now()
	must(t, f.h.Close(ctx))
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	r := <-done
	if len(r.msgs) != 1 || r.msgs[0].Type != "error" || !strings.Contains(string(r.msgs[0].Payload), CodeShuttingDown) {
		t.Errorf("before the close frame the client got %+v", r.msgs)
	}
	if code := websocket.CloseStatus(r.err); code != closeGoingAway {
		t.Errorf("closed with %v, want 1001", r.err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	c2, resp, err := websocket.Dial(dctx, f.wsURL(), &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err == nil {
		_ = c2.CloseNow()
		t.Fatal("websocket accepted after Close")
	}
	if resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("upgrade after Close: %v %+v", err, resp)
	} else {
		_ = resp.Body.Close()
	}
}

// TestClientSeesEventsAfterAQuietRead guards the test client itself: a
// read that found nothing within its deadline must not blind the client
// to what arrives later (the websocket library closes the connection when
// a read's context ends, which once made "nothing more arrived" checks
// after a first quiet read pass whatever the server sent).
func TestClientSeesEventsAfterAQuietRead(t *testing.T) {
	f := newFixture(t)
	alice := f.connect("alice")
	alice.subscribe("a", objectChangesSub, nil)
	f.waitSubscribers(1)
	alice.expectQuiet(100 * time.Millisecond)
	upsert(t, f.store, testObject(podKind, "east", "team-a", "after-quiet", index.StatusHealthy))
	m, err := alice.readTimeout(10 * time.Second)
	if err != nil {
		t.Fatalf("after a quiet read: %v", err)
	}
	if !strings.Contains(string(m.Payload), "after-quiet") {
		t.Fatalf("got %+v %s", m, m.Payload)
	}
}
