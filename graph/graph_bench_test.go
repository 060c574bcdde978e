package graph

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/fleetgraph/fleetgraph/authz"
	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
	"github.com/fleetgraph/fleetgraph/index/memtables"
	"github.com/fleetgraph/fleetgraph/internal/measure"
)

// BenchmarkGraphFleet is `make bench-graph`. Over real HTTP and websockets
// on loopback, on the index's synthetic 1M-object fleet with real RBAC rows
// and static-token users, it measures:
//
//   - Q3 (Kustomizations that are UNHEALTHY, first 100, by name) over HTTP
//     POST for a restricted viewer bound in 200 namespaces of every
//     cluster: p50 and p99 of 2,000 sequential requests, each timed from
//     sending the request to reading the answer's last byte (the client
//     decodes and checks every answer after that);
//   - 1,000 objectChanges subscribers with distinct identities and
//     overlapping access, as real teams have: 50 fleet-wide viewers (a
//     ClusterRoleBinding) and teams of about 50 (a Group each) whose
//     RoleBindings split every cluster's namespaces between the teams, so
//     each change reaches the fleet-wide viewers and one team (a mean
//     fan-out near 100). The subscribers are held by a separate client
//     process so that the memory figure is the server's alone. Under
//     1,000 changes per second to random objects of the fleet it reports
//     the deliveries per second, the mean fan-out per change, the delay
//     from commit (the row's updatedAt, stamped by the index) to the
//     client reading the event (p50, p99), and the server's live heap
//     plus goroutine stacks per subscriber, sampled as the churn ends with
//     every subscription still open and receiving, over the same before
//     any subscriber connected. It fails
//     unless every subscriber got exactly the changes its access allows,
//     each once and in order (checked per subscriber, by the change
//     positions in the cursors; deliveries = the sum over published
//     changes of their audience).
//
// It prints one line:
//
//	graph: objects=1000000 http_q3_p50_us=.. http_q3_p99_us=.. subscribers=1000 changes_per_s=1000 deliveries_per_s=.. mean_fanout=.. delivery_p50_ms=.. delivery_p99_ms=.. heap_per_subscriber_kib=.. http_q3_server_cpu_us=.. http_q3_gcs=..
//
// http_q3_server_cpu_us is the server process's CPU time per Q3, the
// collector's included; http_q3_gcs counts the collections that completed
// during the queries. The queries allocate about 200 KB each, so on the
// 700 MB live heap a collection comes every 3,500 or so, and whether one
// falls among a run's 2,000 depends on where the ingest left the heap; its
// mark takes a core for most of a second, which can decide the p99. Compare
// p99s of runs with the same count.
//
// changes_per_s is the rate of change events the index actually published.
// FLEETGRAPH_BENCH_SUBSCRIBERS=10000 runs the 10,000-subscriber variant
// (teams of about 50 still, so the fan-out stays near 100);
// FLEETGRAPH_BENCH_SMALL=1 runs a 100k-object, 100-subscriber version for a
// quick check.
func BenchmarkGraphFleet(b *testing.B) {
	p := benchParamsFromEnv()
	if os.Getenv("FLEETGRAPH_BENCH_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 256
	}
	ctx := context.Background()
	store := index.New(memtables.Open)
	start := time.Now()
	must(b, benchIngest(ctx, store, p))
	b.Logf("ingested %d objects and RBAC for %d viewers in %v", p.fleet.Size(), p.subscribers+1, time.Since(start))

	tokens := map[string]string{}
	var csv strings.Builder
	for i, u := range append([]string{"viewer-q3"}, benchSubscriberNames(p.subscribers)...) {
		tokens[u] = "tok-" + u
		group := ""
		if _, team := p.role(i - 1); i > 0 && team >= 0 {
			group = benchTeam(team)
		}
		fmt.Fprintf(&csv, "tok-%s,%s,uid-%s,%q\n", u, u, u, group)
	}
	h, srv := startBenchServer(b, store, csv.String(), nil)

	clients := startBenchClients(b, srv.URL, tokens, p.subscribers)
	stopProfile := benchCPUProfile(b, "FLEETGRAPH_BENCH_Q3_CPUPROFILE")
	cpu0, gcs0 := measure.CPUTime(), gcCycles()
	q3 := clients.q3(b, tokens["viewer-q3"], p.queries)
	serverCPU := (measure.CPUTime() - cpu0) / time.Duration(p.queries+min(p.queries/10, 100))
	q3GCs := gcCycles() - gcs0
	stopProfile()
	p50, p99 := time.Duration(q3.P50*1e6), time.Duration(q3.P99*1e6)
	b.Logf("Q3 over HTTP: p50 %v p99 %v; server CPU per query %v; %d collections during the queries", p50, p99, serverCPU, q3GCs)

	heapBefore := measure.LiveHeapAndStacks()
	if path := os.Getenv("FLEETGRAPH_BENCH_HEAPPROFILE"); path != "" {
		f, err := os.Create(path + ".before")
		must(b, err)
		must(b, pprof.Lookup("heap").WriteTo(f, 0))
		must(b, f.Close())
	}
	clients.subscribe(b)
	waitHub(b, h, p.subscribers)
	time.Sleep(time.Second) // let the pumps compute their routes

	stopProfile = benchCPUProfile(b, "FLEETGRAPH_BENCH_CHURN_CPUPROFILE")
	ch := benchChurn(ctx, b, store, p, func() {
		heap := measure.LiveHeapAndStacks()
		if path := os.Getenv("FLEETGRAPH_BENCH_HEAPPROFILE"); path != "" {
			f, err := os.Create(path)
			must(b, err)
			must(b, pprof.Lookup("heap").WriteTo(f, 0))
			must(b, f.Close())
		}
		b.Logf("server heap and stacks under churn: %d bytes over %d before subscribing", heap, heapBefore)
		heapBefore = heap - heapBefore
	})
	heapPerSub := float64(heapBefore) / float64(p.subscribers)
	clients.await(b, ch.deliveries)
	stopProfile()
	lat := clients.stop(b)
	b.Logf("fan-out: %d deliveries of %d changes (%d expected), p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		lat.Count, ch.published, ch.deliveries, lat.P50, lat.P99, lat.Max)
	if ch.published == 0 || lat.Count != ch.deliveries {
		b.Fatalf("subscribers got %d events; the %d published changes had %d viewers in all", lat.Count, ch.published, ch.deliveries)
	}
	must(b, checkEachSubscriber(p, ch, lat))
	meanFanout := float64(ch.deliveries) / float64(ch.published)
	deliveriesPerS := float64(ch.deliveries) / ch.elapsed.Seconds()

	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Nanoseconds())/1e3, 'f', 1, 64) }
	fmt.Printf("graph: objects=%d http_q3_p50_us=%s http_q3_p99_us=%s subscribers=%d changes_per_s=%.0f deliveries_per_s=%.0f mean_fanout=%.1f delivery_p50_ms=%.1f delivery_p99_ms=%.1f heap_per_subscriber_kib=%.1f http_q3_server_cpu_us=%s http_q3_gcs=%d\n",
		p.fleet.Size(), us(p50), us(p99), p.subscribers, ch.rate, deliveriesPerS, meanFanout, lat.P50, lat.P99, heapPerSub/1024, us(serverCPU), q3GCs)
	b.ReportMetric(float64(serverCPU.Microseconds()), "q3_server_cpu_us")
	b.ReportMetric(float64(p50.Microseconds()), "q3_p50_us")
	b.ReportMetric(float64(p99.Microseconds()), "q3_p99_us")
	b.ReportMetric(lat.P99, "delivery_p99_ms")
	b.ReportMetric(meanFanout, "mean_fanout")
	b.ReportMetric(heapPerSub/1024, "heap_KiB/subscriber")
}

// gcCycles returns how many garbage collections the process has completed.
func gcCycles() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return uint64(m.NumGC)
}

// benchCPUProfile writes the server's CPU profile to the file the
// environment variable env names, if any, until the returned function is
// called: FLEETGRAPH_BENCH_Q3_CPUPROFILE covers the Q3 queries,
// FLEETGRAPH_BENCH_CHURN_CPUPROFILE the churn and its deliveries.
func benchCPUProfile(b *testing.B, env string) (stop func()) {
	path := os.Getenv(env)
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	must(b, err)
	must(b, pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		must(b, f.Close())
	}
}

// BenchmarkQueryQ3 is Q3 over HTTP POST alone, on a 100k-object fleet, for
// profiling the query path (go test -bench QueryQ3 -cpuprofile ...): one
// op is one request and its response, decoded by the client.
func BenchmarkQueryQ3(b *testing.B) {
	p := benchParams{fleet: indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1}}
	store := index.New(memtables.Open)
	must(b, benchIngest(context.Background(), store, p))
	st, err := authz.ParseStaticTokens(strings.NewReader("tok,viewer-q3,uid\n"), "bench tokens", authz.Naming{})
	must(b, err)
	h, err := NewHandler(Options{
		Store: store, Authorizer: authz.NewAuthorizer(store, authz.Options{}),
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{st}}, Logger: testLogger(b),
	})
	must(b, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	q := newQ3Client(b, srv.URL, "tok")
	q.do(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		q.do(b)
	}
}

// startBenchServer serves store over loopback HTTP to the users of a token
// file (kube-apiserver's CSV) until the benchmark ends; members of admins
// are fleet admins.
func startBenchServer(b *testing.B, store *index.Store, tokensCSV string, admins []string) (*Handler, *httptest.Server) {
	st, err := authz.ParseStaticTokens(strings.NewReader(tokensCSV), "bench tokens", authz.Naming{})
	must(b, err)
	h, err := NewHandler(Options{
		Store: store, Authorizer: authz.NewAuthorizer(store, authz.Options{}),
		Authenticator: &authz.Union{Authenticators: []authz.Authenticator{st}},
		AdminGroups:   admins, Logger: testLogger(b),
	})
	must(b, err)
	srv := httptest.NewServer(h)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = h.Close(ctx)
		srv.Close()
	})
	return h, srv
}

type benchParams struct {
	fleet       indextest.Fleet
	subscribers int
	rate        int
	churnFor    time.Duration
	queries     int
}

func benchParamsFromEnv() benchParams {
	p := benchParams{fleet: indextest.DefaultFleet(), subscribers: 1000, rate: 1000, churnFor: 20 * time.Second, queries: 2000}
	if os.Getenv("FLEETGRAPH_BENCH_SMALL") != "" {
		p = benchParams{
			fleet:       indextest.Fleet{Clusters: 10, Namespaces: 1000, PerNamespace: 10, Seed: 1},
			subscribers: 100, rate: 1000, churnFor: 5 * time.Second, queries: 300,
		}
	}
	if v := os.Getenv("FLEETGRAPH_BENCH_SUBSCRIBERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			panic("FLEETGRAPH_BENCH_SUBSCRIBERS=" + v + ": want a positive number")
		}
		p.subscribers = n
	}
	return p
}

// Subscribers' access: the first fleetWide are fleet-wide viewers; the
// others are members of teams of about benchTeamSize, assigned in turn.
const (
	benchFleetWide = 50
	benchTeamSize  = 50
)

func (p benchParams) fleetWide() int { return min(benchFleetWide, max(1, p.subscribers/20)) }

func (p benchParams) teams() int {
	return min(p.fleet.Namespaces, max(1, (p.subscribers-p.fleetWide())/benchTeamSize))
}

// role returns whether subscriber i is a fleet-wide viewer, or its team
// (-1 for a fleet-wide viewer).
func (p benchParams) role(i int) (fleetWide bool, team int) {
	if i < p.fleetWide() {
		return true, -1
	}
	return false, (i - p.fleetWide()) % p.teams()
}

// audience returns how many subscribers may see a change in namespace ns
// (any cluster): the fleet-wide viewers and the members of the team the
// namespace belongs to.
func (p benchParams) audience() func(ns int) int {
	members := make([]int, p.teams())
	for i := range p.subscribers {
		if _, team := p.role(i); team >= 0 {
			members[team]++
		}
	}
	fleetWide := p.fleetWide()
	return func(ns int) int { return fleetWide + members[ns%p.teams()] }
}

func benchTeam(t int) string { return fmt.Sprintf("team-%03d", t) }

func benchSubscriberNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("sub-%04d", i)
	}
	return out
}

// benchIngest fills the store cluster by cluster through the Sink (Replace
// per kind, so the kinds are recorded as discovery would), with a ClusterRole
// that may read every fleet kind and bindings for the viewers: viewer-q3
// in every fifth namespace (200 of 1,000) of every cluster; the fleet-wide
// subscribers in a ClusterRoleBinding; team t's group in the namespaces n
// with n mod teams = t of every cluster (see benchParams.role).
func benchIngest(ctx context.Context, s *index.Store, p benchParams) error {
	f := p.fleet
	rules := indextest.ReadRules()
	for c := range f.Clusters {
		name := indextest.ClusterName(c)
		if err := f.ReplaceCluster(ctx, s, c); err != nil {
			return err
		}
		if err := s.Replace(ctx, name, clusterRoleKind, []index.Object{clusterRole(name, "fleet-view", rules...)}); err != nil {
			return err
		}
		var bindings []index.Object
		for j := range min(200, f.Namespaces) {
			ns := indextest.NamespaceName(j * 5 % f.Namespaces)
			bindings = append(bindings, binding(name, ns, "q3", index.KindClusterRole, "fleet-view", userSubject("viewer-q3")))
		}
		for n := range f.Namespaces {
			team := benchTeam(n % p.teams())
			bindings = append(bindings, binding(name, indextest.NamespaceName(n), team, index.KindClusterRole, "fleet-view", groupSubject(team)))
		}
		if err := s.Replace(ctx, name, rbKind, bindings); err != nil {
			return err
		}
		var fleetWide []index.Subject
		for i := range p.fleetWide() {
			fleetWide = append(fleetWide, userSubject(fmt.Sprintf("sub-%04d", i)))
		}
		if err := s.Replace(ctx, name, crbKind, []index.Object{binding(name, "", "fleet-wide", index.KindClusterRole, "fleet-view", fleetWide...)}); err != nil {
			return err
		}
		if err := s.UpsertCluster(ctx, index.Cluster{Name: name, Mode: index.ModePull, State: index.StateConnected, Since: time.Now(), Synced: true}); err != nil {
			return err
		}
	}
	return nil
}

const benchQ3Query = `query($f: ObjectFilter) { objects(filter: $f, first: 100) { totalCount
  edges { cursor node { id cluster namespace kind name status message labels { key value } updatedAt } } } }`

// q3Client sends Q3 over HTTP POST with a keep-alive connection.
type q3Client struct {
	client     *http.Client
	url, token string
	body       []byte
}

func newQ3Client(tb testing.TB, url, token string) *q3Client {
	body, err := json.Marshal(map[string]any{"query": benchQ3Query, "variables": map[string]any{
		"f": map[string]any{"kinds": []string{"Kustomization"}, "statuses": []string{"UNHEALTHY"}},
	}})
	must(tb, err)
	return &q3Client{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}, url: url + "/graphql", token: token, body: body}
}

// do sends one request and checks that the answer is a full page (or all
// matches, when fewer). It returns the round trip: from sending the
// request to reading the last byte of the answer. Decoding and checking
// the page come after, off the clock: they are the client's work, and on
// two shared cores they would otherwise count the client's JSON decoder
// (about as slow as the server's whole query) as server latency.
func (q *q3Client) do(tb testing.TB) time.Duration {
	req, err := http.NewRequest(http.MethodPost, q.url, bytes.NewReader(q.body))
	must(tb, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+q.token)
	start := time.Now()
	resp, err := q.client.Do(req)
	must(tb, err)
	body, err := io.ReadAll(resp.Body)
	rtt := time.Since(start)
	_ = resp.Body.Close()
	must(tb, err)
	var r struct {
		Data struct {
			Objects struct {
				TotalCount int
				Edges      []json.RawMessage
			}
		}
		Errors []gqlErr
	}
	must(tb, json.Unmarshal(body, &r))
	if resp.StatusCode != http.StatusOK || len(r.Errors) > 0 || r.Data.Objects.TotalCount == 0 || len(r.Data.Objects.Edges) != min(100, r.Data.Objects.TotalCount) {
		tb.Fatalf("Q3: status %d, %d edges of %d, errors %+v", resp.StatusCode, len(r.Data.Objects.Edges), r.Data.Objects.TotalCount, r.Errors)
	}
	return rtt
}

// churnResult is what benchChurn did.
type churnResult struct {
	rate       float64 // published changes per second
	published  int     // changes the index published
	deliveries int     // their audiences, summed: what the subscribers must receive
	perTeam    []int   // published changes in each team's namespaces
	elapsed    time.Duration
}

// benchChurn applies changes to random objects at p.rate per second for
// p.churnFor, calls atEnd as the last changes are being delivered (a
// sample taken halfway would put its forced collections among the timed
// deliveries), and returns the changes the index published and the
// deliveries they owe the subscribers.
func benchChurn(ctx context.Context, b *testing.B, s *index.Store, p benchParams, atEnd func()) churnResult {
	rnd := rand.New(rand.NewPCG(5, 6))
	audience := p.audience()
	const tick = 10 * time.Millisecond
	perTick := max(1, p.rate/int(time.Second/tick))
	res := churnResult{perTeam: make([]int, p.teams())}
	start := time.Now()
	next := start
	version := 1
	for time.Since(start) < p.churnFor {
		// Some new versions equal the stored row (the generator's status
		// and message can repeat), which the index does not publish: keep
		// writing until the tick's changes are published, and count only
		// those.
		for done, tries := 0, 0; done < perTick && tries < 4*perTick; tries++ {
			i := rnd.IntN(p.fleet.Size())
			before := s.FeedStats().Published
			must(b, s.Upsert(ctx, p.fleet.Version(i, version)))
			version++
			if s.FeedStats().Published > before {
				done++
				res.published++
				res.deliveries += audience(p.fleet.NamespaceOf(i))
				res.perTeam[p.fleet.NamespaceOf(i)%p.teams()]++
			}
		}
		next = next.Add(tick)
		if w := time.Until(next); w > 0 {
			time.Sleep(w)
		}
	}
	res.elapsed = time.Since(start)
	res.rate = float64(res.published) / res.elapsed.Seconds()
	atEnd()
	if res.rate < 0.9*float64(p.rate) {
		fmt.Fprintf(os.Stderr, "bench-graph: churn reached only %.0f changes/s of %d\n", res.rate, p.rate)
	}
	return res
}

func waitHub(b *testing.B, h *Handler, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		got := h.streams.len()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d subscribers registered", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// benchClients is the client process: this test binary again, running
// TestGraphBenchClients, so that neither the clients' CPU nor their heap
// counts as the server's. It takes commands on stdin:
//
//	q3 <token> <n>   time n sequential Q3 queries (after a warm-up);
//	                 answers "benchclient: q3 {...}"
//	subscribe        open one objectChanges subscription per token of the
//	                 tokens file; answers "benchclient: ready"
//	count            answers "benchclient: count <events received so far>"
//	(end of input)   close everything; answers "benchclient: stats {...}"
type benchClients struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// latencyStats is what the client process reports: delays in
// milliseconds, and per subscriber (in the order of the tokens file) the
// events it got and those whose change position was not after the one
// before (a change delivered twice, or out of order).
type latencyStats struct {
	Count         int
	P50, P99, Max float64
	Received      []int `json:",omitempty"`
	Repeated      []int `json:",omitempty"`
}

// checkEachSubscriber returns an error unless every subscriber got
// exactly the changes its access allows, each once and in order: the total
// alone could hide a loss in one subscription behind a double in another.
func checkEachSubscriber(p benchParams, ch churnResult, lat latencyStats) error {
	if len(lat.Received) != p.subscribers || len(lat.Repeated) != p.subscribers {
		return fmt.Errorf("the client process reported %d and %d subscribers, want %d", len(lat.Received), len(lat.Repeated), p.subscribers)
	}
	var bad []string
	for i := range p.subscribers {
		want := ch.published
		if fleetWide, team := p.role(i); !fleetWide {
			want = ch.perTeam[team]
		}
		if lat.Received[i] != want || lat.Repeated[i] != 0 {
			bad = append(bad, fmt.Sprintf("subscriber %d got %d events (%d of them repeated or out of order), want %d", i, lat.Received[i], lat.Repeated[i], want))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d subscribers did not get exactly their changes: %s", len(bad), p.subscribers, strings.Join(bad[:min(len(bad), 5)], "; "))
	}
	return nil
}

// TestCheckEachSubscriber: the fan-out benchmark's check fails on a loss
// that a double elsewhere hides from the total, and on a change delivered
// twice in place of another.
func TestCheckEachSubscriber(t *testing.T) {
	p := benchParams{fleet: indextest.Fleet{Namespaces: 10}, subscribers: 4} // 1 fleet-wide viewer, 1 team of 3
	ch := churnResult{published: 6, perTeam: []int{4}}
	exact := latencyStats{Received: []int{6, 4, 4, 4}, Repeated: []int{0, 0, 0, 0}}
	if err := checkEachSubscriber(p, ch, exact); err != nil {
		t.Fatalf("exact deliveries: %v", err)
	}
	for name, lat := range map[string]latencyStats{
		"a loss and a double":  {Received: []int{6, 3, 5, 4}, Repeated: []int{0, 0, 1, 0}},
		"a double for a loss":  {Received: []int{6, 4, 4, 4}, Repeated: []int{1, 0, 0, 0}},
		"a subscriber missing": {Received: []int{6, 4, 4}, Repeated: []int{0, 0, 0}},
	} {
		if err := checkEachSubscriber(p, ch, lat); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

func startBenchClients(b *testing.B, url string, tokens map[string]string, n int) *benchClients {
	var list strings.Builder
	for _, u := range benchSubscriberNames(n) {
		list.WriteString(tokens[u] + "\n")
	}
	path := filepath.Join(b.TempDir(), "tokens")
	must(b, os.WriteFile(path, []byte(list.String()), 0o600))
	args := []string{"-test.run=^TestGraphBenchClients$", "-test.bench=^$", "-test.v"}
	if path := os.Getenv("FLEETGRAPH_BENCH_CLIENT_CPUPROFILE"); path != "" {
		// The client process's CPU: it shares the machine's cores with
		// the server, so its cost per event bounds the delivery delay.
		args = append(args, "-test.cpuprofile="+path)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FLEETGRAPH_BENCH_CLIENT_URL="+url, "FLEETGRAPH_BENCH_CLIENT_TOKENS="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(b, err)
	stdout, err := cmd.StdoutPipe()
	must(b, err)
	must(b, cmd.Start())
	return &benchClients{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
}

// answer waits for the client process's line with a prefix.
func (c *benchClients) answer(b *testing.B, prefix string) string {
	for c.lines.Scan() {
		if rest, ok := strings.CutPrefix(c.lines.Text(), "benchclient: "+prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	_ = c.cmd.Wait()
	b.Fatalf("the client process ended before answering %q", prefix)
	return ""
}

func (c *benchClients) q3(b *testing.B, token string, n int) latencyStats {
	_, err := fmt.Fprintf(c.stdin, "q3 %s %d\n", token, n)
	must(b, err)
	var st latencyStats
	must(b, json.Unmarshal([]byte(c.answer(b, "q3")), &st))
	return st
}

// await waits until the subscribers have received n events in all, or a
// minute has passed.
func (c *benchClients) await(b *testing.B, n int) {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := fmt.Fprintln(c.stdin, "count")
		must(b, err)
		got, err := strconv.Atoi(c.answer(b, "count"))
		must(b, err)
		if got >= n || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *benchClients) subscribe(b *testing.B) {
	_, err := fmt.Fprintln(c.stdin, "subscribe")
	must(b, err)
	c.answer(b, "ready")
}

// stop ends the client process and returns the subscribers' delays.
func (c *benchClients) stop(b *testing.B) latencyStats {
	must(b, c.stdin.Close())
	var st latencyStats
	must(b, json.Unmarshal([]byte(c.answer(b, "stats")), &st))
	must(b, c.cmd.Wait())
	return st
}

// percentiles summarizes delays in milliseconds.
func percentiles(ms []float64) latencyStats {
	slices.Sort(ms)
	st := latencyStats{Count: len(ms)}
	if len(ms) > 0 {
		st.P50, st.P99, st.Max = ms[len(ms)/2], ms[len(ms)*99/100], ms[len(ms)-1]
	}
	return st
}

// TestGraphBenchClients is the client side of BenchmarkGraphFleet; it runs
// only in the process the benchmark starts (see benchClients).
func TestGraphBenchClients(t *testing.T) {
	url, path := os.Getenv("FLEETGRAPH_BENCH_CLIENT_URL"), os.Getenv("FLEETGRAPH_BENCH_CLIENT_TOKENS")
	if url == "" || path == "" {
		t.Skip("runs only as the client process of BenchmarkGraphFleet")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu                 sync.Mutex
		lat                []float64
		wg                 sync.WaitGroup
		conns              []*websocket.Conn
		received, repeated []int // by subscriber; each written by its reader only
	)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		switch {
		case len(cmd) == 3 && cmd[0] == "q3":
			n, err := strconv.Atoi(cmd[2])
			must(t, err)
			b, err := json.Marshal(timeQ3(t, url, cmd[1], n))
			must(t, err)
			fmt.Println("benchclient: q3 " + string(b))
		case len(cmd) == 1 && cmd[0] == "count":
			mu.Lock()
			n := len(lat)
			mu.Unlock()
			fmt.Printf("benchclient: count %d\n", n)
		case len(cmd) == 1 && cmd[0] == "subscribe":
			raw, err := os.ReadFile(path)
			must(t, err)
			conns = subscribeAll(t, ctx, url, strings.Fields(string(raw)))
			received, repeated = make([]int, len(conns)), make([]int, len(conns))
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var last uint64
					benchRead(c, func(ms float64, seq uint64) {
						received[i]++
						if seq <= last {
							repeated[i]++
						}
						last = seq
						mu.Lock()
						lat = append(lat, ms)
						mu.Unlock()
					})
				}()
			}
			fmt.Println("benchclient: ready")
		default:
			t.Fatalf("unknown command %q", in.Text())
		}
	}
	cancel()
	for _, c := range conns {
		_ = c.CloseNow()
	}
	wg.Wait()
	st := percentiles(lat)
	st.Received, st.Repeated = received, repeated
	b, err := json.Marshal(st)
	must(t, err)
	fmt.Println("benchclient: stats " + string(b))
}

// cursorSeq returns the change position in a change cursor
// (base64 of "version:epoch:seq"), or 0 when it is not one.
func cursorSeq(cursor string) uint64 {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(string(raw[bytes.LastIndexByte(raw, ':')+1:]), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// timeQ3 times n sequential Q3 queries after a warm-up.
func timeQ3(t *testing.T, url, token string, n int) latencyStats {
	q := newQ3Client(t, url, token)
	defer q.client.CloseIdleConnections()
	for range min(n/10, 100) {
		q.do(t)
	}
	ms := make([]float64, n)
	for i := range ms {
		ms[i] = float64(q.do(t).Nanoseconds()) / 1e6
	}
	return percentiles(ms)
}

// subscribeAll opens one subscription per token, 32 at a time.
func subscribeAll(t *testing.T, ctx context.Context, url string, tokens []string) []*websocket.Conn {
	wsURL := "ws" + strings.TrimPrefix(url, "http") + "/graphql"
	conns := make([]*websocket.Conn, len(tokens))
	errs := make(chan error, len(tokens))
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, tok := range tokens {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := benchSubscribe(ctx, wsURL, tok)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return conns
}

// benchSubscribe opens a graphql-transport-ws connection and subscribes to
// every visible object change.
func benchSubscribe(ctx context.Context, url, token string) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{Subprotocols: []string{"graphql-transport-ws"}})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return c.Write(dctx, websocket.MessageText, b)
	}
	if err := send(map[string]any{"type": "connection_init", "payload": map[string]any{"Authorization": "Bearer " + token}}); err != nil {
		return nil, err
	}
	if _, msg, err := c.Read(dctx); err != nil || !bytes.Contains(msg, []byte("connection_ack")) {
		return nil, fmt.Errorf("init: %q %w", msg, errors.Join(err, errors.New("no ack")))
	}
	err = send(map[string]any{"id": "1", "type": "subscribe", "payload": map[string]any{
		"query": "subscription { objectChanges { type cursor object { id cluster namespace name status updatedAt } } }",
	}})
	return c, err
}

// benchRead reads events until the connection is closed, answering pings,
// and reports each event's delay since its commit and its change position
// (read from its cursor, see encodeChangeCursor). The client process must
// not be what the delay measures: decoding every event with encoding/json,
// and a read context that coder/websocket watches with an AfterFunc per
// message, cost it 14 us per event on the 2-core machine it shares with the
// server, twice the server's cost of the delivery. So it reads the two
// fields it needs from the next message as the server writes it
// (nextEventFields), and decodes every other message with encoding/json;
// a field it misread would fail the per-subscriber check.
func benchRead(c *websocket.Conn, record func(ms float64, seq uint64)) {
	ctx := context.Background() // the read ends when the connection is closed
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		now := time.Now()
		if updatedAt, cursor, ok := nextEventFields(b); ok {
			t, err := time.Parse(time.RFC3339Nano, updatedAt)
			if err != nil {
				record(0, 0) // counted as out of order: the check fails
				continue
			}
			record(float64(now.Sub(t).Microseconds())/1e3, cursorSeq(cursor))
			continue
		}
		var m struct{ Type string }
		if err := json.Unmarshal(b, &m); err == nil && m.Type == "ping" {
			_ = c.Write(ctx, websocket.MessageText, []byte(`{"type":"pong"}`))
		}
	}
}

// nextEventFields returns the updatedAt and cursor of an objectChanges next
// message of benchSubscribe's subscription, or false for any other message.
// Neither value has characters that JSON escapes, and a key cannot match
// inside a string value, where its quotes would be escaped.
func nextEventFields(b []byte) (updatedAt, cursor string, ok bool) {
	if !bytes.HasPrefix(b, []byte(`{"payload":{"data":{"objectChanges":{`)) || !bytes.HasSuffix(b, []byte(`"type":"next"}`)) {
		return "", "", false
	}
	field := func(key string) (string, bool) {
		_, rest, found := bytes.Cut(b, []byte(`"`+key+`":"`))
		v, _, closed := bytes.Cut(rest, []byte(`"`))
		return string(v), found && closed
	}
	cursor, okC := field("cursor")
	updatedAt, okU := field("updatedAt")
	return updatedAt, cursor, okC && okU
}

// TestBenchNextEventFields: the bench client's reading of a next message
// agrees with encoding/json, and it leaves other messages to it.
func TestBenchNextEventFields(t *testing.T) {
	msg := []byte(`{"payload":{"data":{"objectChanges":{"type":"MODIFIED","cursor":"YzE6MTI6MzQ1","object":{"id":"x","cluster":"c","namespace":"n","name":"\"cursor\":\"no","status":"HEALTHY","updatedAt":"2026-11-26T07:41:48.123456789Z"}}}},"id":"1","type":"next"}`)
	var m struct {
		Payload struct {
			Data struct {
				ObjectChanges struct {
					Cursor string
					Object struct{ UpdatedAt string }
				}
			}
		}
	}
	must(t, json.Unmarshal(msg, &m))
	updatedAt, cursor, ok := nextEventFields(msg)
	if want := m.Payload.Data.ObjectChanges; !ok || cursor != want.Cursor || updatedAt != want.Object.UpdatedAt {
		t.Errorf("got %q %q %v, want %q %q", updatedAt, cursor, ok, want.Object.UpdatedAt, want.Cursor)
	}
	for _, other := range []string{`{"type":"ping"}`, `{"payload":[{"message":"x"}],"id":"1","type":"error"}`, `{"id":"1","type":"complete"}`} {
		if _, _, ok := nextEventFields([]byte(other)); ok {
			t.Errorf("%s read as an event", other)
		}
	}
}
