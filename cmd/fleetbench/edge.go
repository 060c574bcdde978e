package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetgraph/fleetgraph/internal/testcluster"
)

// runEdge is fleetbench edge (make bench-edge): a real `fleetgraph edge`
// pushing a real control plane seeded with about 50,000 objects to a real
// `fleetgraph serve`, both child processes of the binary -fleetgraph names,
// with a TCP proxy between them that counts the bytes on the wire (after
// the websocket's compression). Each run starts a fresh manager and edge
// and measures:
//
//   - snapshot_apply_s: from the first byte of the edge's first snapshot
//     on the wire (the proxy reads the websocket frame headers: the
//     snapshot is the edge's second data message, after Hello) until the
//     manager's API shows the cluster CONNECTED with every object the
//     control plane lists (polled every 10 ms over GraphQL);
//   - wire_bytes_per_object: the bytes the edge sent from the snapshot's
//     first byte until then, divided by the objects;
//   - delta_latency_p99_ms: pods are patched (a label carrying a sequence
//     number) at -delta-rate per second through the control plane's API;
//     each change is timed from just before its PATCH request until its
//     event arrives on an objectChanges subscription of the manager
//     (server-sent events); every change must arrive. The default
//     window (800 at 20/s) is longer than the 30 s resync interval, so it
//     holds a periodic full resync and the wait of deltas behind it.
//
// It prints the median of -runs runs of each figure (never the best run):
//
//	edge: objects=N snapshot_apply_s=.. wire_bytes_per_object=.. delta_latency_p99_ms=.. runs=3
func runEdge(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	bin := fs.String("fleetgraph", "", "the fleetgraph binary to run as manager and edge (make bench-edge builds bin/fleetgraph)")
	namespaces := fs.Int("namespaces", 470, "namespaces to seed")
	pods := fs.Int("pods", 60, "pods per namespace")
	services := fs.Int("services", 20, "services (each with an EndpointSlice) per namespace")
	runs := fs.Int("runs", 3, "runs; the line gives the median of each figure")
	// 800 at 20/s is 40 s, longer than the edge's 30 s resync interval:
	// the window holds a periodic full resync, as a user's would.
	deltas := fs.Int("deltas", 800, "pod changes timed per run (at -delta-rate; the default spans a resync)")
	deltaRate := fs.Int("delta-rate", 20, "pod changes per second")
	verbose := fs.Bool("v", false, "log progress to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" {
		return errors.New("edge: -fleetgraph is required (make bench-edge builds bin/fleetgraph)")
	}
	logf := func(format string, a ...any) {
		if *verbose {
			fmt.Fprintf(os.Stderr, "edge: "+format+"\n", a...)
		}
	}
	c, err := testcluster.New(ctx, testcluster.Options{Name: "edge-bench"})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if err := errors.Join(c.InstallFluxCRDs(ctx), c.InstallIstioCRDs(ctx)); err != nil {
		return err
	}
	seedStart := time.Now()
	if _, err := c.Seed(ctx, testcluster.SeedOptions{Namespaces: *namespaces, Pods: *pods, Services: *services, Flux: true, Istio: true, Workers: 32}); err != nil {
		return err
	}
	// What the edge must deliver: every object of the collected kinds the
	// control plane lists (the seed, plus its own namespaces and the
	// kubernetes Service).
	_, objects, _, err := floorList(ctx, c.DirectConfig)
	if err != nil {
		return err
	}
	logf("seeded %d objects in %v", objects, time.Since(seedStart).Round(time.Second))

	var results []edgeResult
	for r := range *runs {
		res, err := edgeRun(ctx, c, *bin, objects, *namespaces, *pods, *deltas, *deltaRate, logf)
		if err != nil {
			return fmt.Errorf("run %d: %w", r+1, err)
		}
		logf("run %d: snapshot applied in %.3fs (%.2fs after the edge started), %.1f wire bytes/object, delta p50 %.1f ms p99 %.1f ms",
			r+1, res.apply.Seconds(), res.fromStart.Seconds(), res.wirePerObject, ms(res.deltaP50), ms(res.deltaP99))
		results = append(results, res)
	}
	med := func(f func(edgeResult) float64) float64 {
		v := make([]float64, len(results))
		for i, r := range results {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	fmt.Printf("edge: objects=%d snapshot_apply_s=%.3f wire_bytes_per_object=%.1f delta_latency_p99_ms=%.1f runs=%d\n",
		objects, med(func(r edgeResult) float64 { return r.apply.Seconds() }), med(func(r edgeResult) float64 { return r.wirePerObject }),
		med(func(r edgeResult) float64 { return ms(r.deltaP99) }), len(results))
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// edgeResult is one run's figures.
type edgeResult struct {
	apply, fromStart   time.Duration
	wirePerObject      float64
	deltaP50, deltaP99 time.Duration
}

// edgeRun starts a manager, a proxy and an edge, and measures one snapshot
// and the deltas after it.
func edgeRun(ctx context.Context, c *testcluster.Cluster, bin string, objects, namespaces, pods, deltas, rate int, logf func(string, ...any)) (edgeResult, error) {
	var res edgeResult
	dir, err := os.MkdirTemp("", "fleetbench-edge-")
	if err != nil {
		return res, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	const adminToken, edgeToken = "fleetbench-admin-token", "fleetbench-edge-token"
	files := map[string]string{
		"tokens.csv":       adminToken + ",fleetbench,fleetbench,\"fleetbench:admins\"\n",
		"edge-tokens.csv":  edgeToken + "," + c.Name + "\n",
		"edge-token":       edgeToken + "\n",
		"empty.kubeconfig": "apiVersion: v1\nkind: Config\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return res, err
		}
	}
	port, err := freePort()
	if err != nil {
		return res, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	mgr, err := startDaemon("fleetgraph serve", filepath.Join(dir, "serve.log"), nil, bin, "serve", "--listen", addr,
		"--kubeconfig", filepath.Join(dir, "empty.kubeconfig"), "--tokens-file", filepath.Join(dir, "tokens.csv"),
		"--admin-group", "fleetbench:admins", "--edge-tokens-file", filepath.Join(dir, "edge-tokens.csv"), "--log-level", "warn")
	if err != nil {
		return res, err
	}
	defer mgr.stop()
	if err := mgr.waitPort(ctx, addr); err != nil {
		return res, err
	}
	proxy, err := newWireProxy(addr)
	if err != nil {
		return res, err
	}
	defer proxy.close()
	api := &gqlClient{url: "http://" + addr + "/graphql", token: adminToken}

	start := time.Now()
	edge, err := startDaemon("fleetgraph edge", filepath.Join(dir, "edge.log"), nil, bin, "edge",
		"--manager", "ws://"+proxy.addr()+"/edge", "--cluster", c.Name, "--token-file", filepath.Join(dir, "edge-token"),
		"--kubeconfig", c.Kubeconfig, "--log-level", "warn")
	if err != nil {
		return res, err
	}
	defer edge.stop()
	// Applied: CONNECTED with every object.
	q := fmt.Sprintf(`{ cluster(name: %q) { connection { state } } objects(filter: {clusters: [%q]}, first: 1) { totalCount } }`, c.Name, c.Name)
	var applied time.Time
	for deadline := time.Now().Add(10 * time.Minute); ; {
		var out struct {
			Cluster *struct{ Connection struct{ State string } }
			Objects struct{ TotalCount int }
		}
		if err := api.query(ctx, q, &out); err != nil {
			return res, err
		}
		if out.Cluster != nil && out.Cluster.Connection.State == "CONNECTED" && out.Objects.TotalCount == objects {
			applied = time.Now()
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the manager shows %+v after 10 minutes, want CONNECTED with %d objects: %s", out, objects, edge.logTail())
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return res, err
		}
	}
	snapStart, wire, err := proxy.snapshot(applied)
	if err != nil {
		return res, err
	}
	res.apply, res.fromStart = applied.Sub(snapStart), applied.Sub(start)
	res.wirePerObject = float64(wire) / float64(objects)

	timed, err := deltaLatencies(ctx, c, api, namespaces, pods, deltas, rate)
	if err != nil {
		return res, err
	}
	lat := make([]time.Duration, len(timed))
	for i, d := range timed {
		lat[i] = d.lat
	}
	res.deltaP50, res.deltaP99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	// When the slowest were sent tells a periodic resync (due 30 s after
	// the first snapshot) from load.
	var slow []string
	for _, d := range timed[max(0, len(timed)-10):] {
		slow = append(slow, fmt.Sprintf("%.1fms@+%.1fs", ms(d.lat), d.sent.Sub(snapStart).Seconds()))
	}
	logf("slowest deltas (latency@sent, after the first snapshot's first byte): %s", strings.Join(slow, " "))
	logf("manager log: %s", strings.ReplaceAll(mgr.logTail(), "\n", " | "))
	return res, nil
}

// deltaTiming is one timed change: when its PATCH was sent and how long it
// took to reach the manager's stream.
type deltaTiming struct {
	sent time.Time
	lat  time.Duration
}

// deltaLatencies patches pods through the control plane's API and times
// each change until its event arrives on the manager's objectChanges
// stream. It returns one timing per change, fastest first.
func deltaLatencies(ctx context.Context, c *testcluster.Cluster, api *gqlClient, namespaces, pods, n, rate int) ([]deltaTiming, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const label = "fleetbench-seq"
	events, err := api.subscribe(ctx, fmt.Sprintf(`subscription { objectChanges(filter: {clusters: [%q], kinds: ["Pod"]}) { type object { labels { key value } } } }`, c.Name))
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	arrived := map[int]time.Time{}
	readErr := make(chan error, 1)
	go func() {
		for data := range events {
			var ev struct {
				ObjectChanges struct {
					Object struct{ Labels []struct{ Key, Value string } }
				}
			}
			if err := json.Unmarshal(data, &ev); err != nil {
				readErr <- err
				return
			}
			now := time.Now()
			for _, l := range ev.ObjectChanges.Object.Labels {
				if seq, err := strconv.Atoi(l.Value); l.Key == label && err == nil {
					mu.Lock()
					if _, dup := arrived[seq]; !dup {
						arrived[seq] = now
					}
					mu.Unlock()
				}
			}
		}
		readErr <- errors.New("the objectChanges stream ended")
	}()
	kube := kubernetes.NewForConfigOrDie(c.DirectConfig)
	patch := func(seq int) error {
		ns, name := "ns-"+strconv.Itoa(seq%namespaces), "pod-"+strconv.Itoa(seq/namespaces%pods)
		body := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, label, strconv.Itoa(seq))
		_, err := kube.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
	wait := func(seq int, d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); {
			mu.Lock()
			_, ok := arrived[seq]
			mu.Unlock()
			if ok {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}
	// The stream is open once a first change arrives; untimed.
	base := int(time.Now().UnixMilli() % 1_000_000 * 1000)
	for tries := 0; ; tries++ {
		if err := patch(base); err != nil {
			return nil, err
		}
		if wait(base, time.Second) {
			break
		}
		if tries == 30 {
			return nil, errors.New("no change reached the objectChanges stream in 30 s")
		}
		base++
	}
	sent := make(map[int]time.Time, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 1; i <= n; i++ {
		<-tick.C
		seq := base + i
		sent[seq] = time.Now()
		if err := patch(seq); err != nil {
			return nil, err
		}
	}
	if !wait(base+n, 30*time.Second) {
		select {
		case err := <-readErr:
			return nil, err
		default:
		}
	}
	// Every change must arrive (the last one has, or 30 s passed).
	var timed []deltaTiming
	mu.Lock()
	defer mu.Unlock()
	for seq, t0 := range sent {
		t1, ok := arrived[seq]
		if !ok {
			return nil, fmt.Errorf("change %d of %d never reached the manager", seq-base, n)
		}
		timed = append(timed, deltaTiming{sent: t0, lat: t1.Sub(t0)})
	}
	slices.SortFunc(timed, func(a, b deltaTiming) int { return cmp.Compare(a.lat, b.lat) })
	return timed, nil
}

// gqlClient talks to the manager's GraphQL API.
type gqlClient struct {
	url, token string
}

// query runs a query and decodes its data into out.
func (g *gqlClient) query(ctx context.Context, q string, out any) error {
	body, err := json.Marshal(map[string]string{"query": q})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	var r struct {
		Data   json.RawMessage
		Errors []struct{ Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("graphql: HTTP %d: %w", resp.StatusCode, err)
	}
	if len(r.Errors) > 0 {
		return fmt.Errorf("graphql: %s", r.Errors[0].Message)
	}
	return json.Unmarshal(r.Data, out)
}

// subscribe opens a subscription as server-sent events and returns the
// data of each event; the channel closes when the stream ends.
func (g *gqlClient) subscribe(ctx context.Context, q string) (<-chan json.RawMessage, error) {
	body, err := json.Marshal(map[string]string{"query": q})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+g.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		return nil, fmt.Errorf("subscribe: HTTP %d: %s", resp.StatusCode, b)
	}
	out := make(chan json.RawMessage, 1024)
	go func() {
		defer close(out)
		defer func() { _ = resp.Body.Close() }()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event:"):
				event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
			case strings.HasPrefix(line, "data:") && event == "next":
				var r struct {
					Data   json.RawMessage
					Errors []struct{ Message string }
				}
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data:")), &r) != nil || len(r.Errors) > 0 {
					return
				}
				select {
				case out <- r.Data:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// wireProxy forwards TCP connections to a target and records, for the
// client-to-server direction, when each websocket data message started and
// how many bytes had been sent by then. It parses only frame headers: the
// payloads, compressed by the websocket, are counted, not read.
type wireProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []*wireConn
	wg     sync.WaitGroup
}

// wireConn is what the proxy saw of one connection from the client.
type wireConn struct {
	mu       sync.Mutex
	sent     int64       // bytes so far
	messages []wireEvent // each data message's start
	times    []wireEvent // the time and count after each read
}

type wireEvent struct {
	at    time.Time
	bytes int64
}

func newWireProxy(target string) (*wireProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &wireProxy{l: l, target: target}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *wireProxy) addr() string { return p.l.Addr().String() }

func (p *wireProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		wc := &wireConn{}
		p.mu.Lock()
		p.conns = append(p.conns, wc)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			wc.copy(out, in)
			_ = out.Close()
		}()
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(in, out)
			_ = in.Close()
		}()
	}
}

// copy forwards the client's bytes, parsing the websocket frames after the
// HTTP upgrade request.
func (wc *wireConn) copy(dst io.Writer, src io.Reader) {
	var f frameParser
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			wc.mu.Lock()
			for _, off := range f.feed(buf[:n]) {
				wc.messages = append(wc.messages, wireEvent{at: now, bytes: wc.sent + int64(off)})
			}
			wc.sent += int64(n)
			wc.times = append(wc.times, wireEvent{at: now, bytes: wc.sent})
			wc.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// snapshot returns when the edge's first snapshot started on the wire (its
// second data message, after Hello) and how many bytes the edge sent from
// then until the given time.
func (p *wireProxy) snapshot(until time.Time) (time.Time, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, wc := range p.conns {
		wc.mu.Lock()
		if len(wc.messages) < 2 {
			wc.mu.Unlock()
			continue
		}
		start := wc.messages[1]
		end := start.bytes
		for _, t := range wc.times {
			if t.at.After(until) {
				break
			}
			end = t.bytes
		}
		wc.mu.Unlock()
		return start.at, end - start.bytes, nil
	}
	return time.Time{}, 0, fmt.Errorf("the proxy saw no edge connection with a snapshot (%d connections)", len(p.conns))
}

func (p *wireProxy) close() {
	_ = p.l.Close()
	p.wg.Wait()
}

// frameParser follows a client-to-server websocket stream (RFC 6455)
// through its frame headers: the HTTP request, then frames of a 2-byte
// header, an extended length, a 4-byte mask key and the payload.
type frameParser struct {
	upgraded bool
	http     []byte // the upgrade request so far
	hdr      []byte // the current frame header so far
	skip     uint64 // payload bytes left in the current frame
}

// feed consumes the next bytes and returns the offsets in b where a data
// message (a text or binary frame, not a continuation or control frame)
// starts.
func (f *frameParser) feed(b []byte) []int {
	var starts []int
	i := 0
	if !f.upgraded {
		f.http = append(f.http, b...)
		end := bytes.Index(f.http, []byte("\r\n\r\n"))
		if end < 0 {
			return nil
		}
		f.upgraded = true
		i = len(b) - (len(f.http) - (end + 4))
		f.http = nil
	}
	for i < len(b) {
		if f.skip > 0 {
			n := min(f.skip, uint64(len(b)-i))
			f.skip -= n
			i += int(n)
			continue
		}
		if len(f.hdr) == 0 {
			if op := b[i] & 0x0f; op == 1 || op == 2 {
				starts = append(starts, i)
			}
		}
		f.hdr = append(f.hdr, b[i])
		i++
		if need := frameHeaderLen(f.hdr); need > 0 && len(f.hdr) == need {
			f.skip = framePayloadLen(f.hdr)
			f.hdr = f.hdr[:0]
		}
	}
	return starts
}

// frameHeaderLen returns the length of a frame header given its first
// bytes, or 0 while fewer than two are known.
func frameHeaderLen(h []byte) int {
	if len(h) < 2 {
		return 0
	}
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4
	}
	return n
}

// framePayloadLen returns the payload length of a complete frame header.
func framePayloadLen(h []byte) uint64 {
	switch l := h[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		return binary.BigEndian.Uint64(h[2:10])
	default:
		return uint64(l)
	}
}
