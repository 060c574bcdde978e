package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/fleetgraph/fleetgraph/index"
)

// The load generator of fleetbench fleet: simulated leaf clusters behind one
// HTTPS listener (HTTP/2, as kube-apiserver serves), cluster <name> under
// /clusters/<name>. It speaks as much of the Kubernetes API as client-go's
// discovery, typed and dynamic clients and reflectors use:
//
//   - /version, /readyz, and legacy discovery (/api, /api/v1, /apis,
//     /apis/<group>/<version>); aggregated discovery is not offered, so
//     client-go falls back to the legacy documents, as it does with older
//     servers;
//   - LIST with resourceVersion, limit and continue (resourceVersion=0 is
//     served whole, as the watch cache does), protobuf for built-in kinds to
//     clients that accept it and JSON otherwise;
//   - WATCH from a resource version, with the events after it from a ring
//     of the last watchRing events of each resource, or 410 Expired
//     ("too old resource version") when the ring no longer holds them;
//     periodic bookmarks when allowWatchBookmarks is set; sendInitialEvents
//     (the WatchList streaming client-go 0.35 reflectors use by default):
//     an ADDED event per object, then a bookmark annotated
//     k8s.io/initial-events-end; timeoutSeconds.
//
// Objects are only modified, never created or deleted: the churn bumps a
// pod's restart count (every change is a real change of its row). A
// resource version is the Unix time in nanoseconds at which the change
// was made (strictly increasing per cluster), so that the driver can time
// each change from the leaf to its index from the row alone. Both
// processes read the same clock.
//
// It is a load generator, not a product feature: no authentication (any
// bearer token is accepted), no writes, no field or label selectors.

// watchRing is how many events of each resource a server keeps for watches
// that resume from a resource version.
const watchRing = 2048

// simBookmarkEvery is how often a watch that allows bookmarks gets one
// (kube-apiserver sends them about once a minute).
const simBookmarkEvery = time.Minute

// fleetServer serves every simulated cluster.
type fleetServer struct {
	shape    fleetShape
	clusters []*simCluster
	byName   map[string]*simCluster
	rate     atomic.Int64 // changes per second across the fleet
	log      *slog.Logger
	// bookmarkEvery is simBookmarkEvery; tests shorten it.
	bookmarkEvery time.Duration
	// Requests served, by type, for tests and the log.
	lists, watches, initialWatches, expired atomic.Int64
	// discovery documents, the same for every cluster
	apiVersions, apiGroups []byte
	resourceLists          map[string][]byte // by group/version
}

// simCluster is one simulated cluster. mu guards everything below it: the
// objects, each resource's event ring and watchers, and rv.
type simCluster struct {
	idx  int
	name string

	mu        sync.Mutex
	rv        uint64
	changes   int
	resources []*simResource // by index in simKinds
}

// simResource is one kind of one cluster.
type simResource struct {
	kind simKind
	kid  int
	objs []simObj
	// ring holds the last events (ring[(start+i)%len]); droppedRV is the
	// resource version of the newest event dropped from it, 0 if none.
	ring      []simEvent
	start, n  int
	droppedRV uint64
	watchers  map[*simWatcher]struct{}
}

// simObj is an object's state: its version, its generation (restarts) and
// its encoding (the protobuf message of a built-in kind, JSON otherwise),
// replaced, never changed in place, so readers may keep it.
type simObj struct {
	rv   uint64
	gen  uint32
	data []byte
}

// simEvent is one change.
type simEvent struct {
	i   int
	obj simObj
}

// simWatcher is one watch request's queue. The server never waits for it:
// when the queue is full the watch is ended, as kube-apiserver ends the
// watches of clients that do not keep up; the client resumes or relists.
type simWatcher struct {
	ch       chan simEvent
	overflow chan struct{}
}

func (c *simCluster) nextRV() uint64 {
	c.rv = max(c.rv+1, uint64(time.Now().UnixNano()))
	return c.rv
}

// newFleetServer builds every object of every cluster.
func newFleetServer(shape fleetShape, clusters int, log *slog.Logger) (*fleetServer, error) {
	s := &fleetServer{shape: shape, byName: map[string]*simCluster{}, log: log, bookmarkEvery: simBookmarkEvery}
	if err := s.buildDiscovery(); err != nil {
		return nil, err
	}
	for ci := range clusters {
		c := &simCluster{idx: ci, name: simClusterName(ci)}
		for kid, k := range simKinds {
			r := &simResource{kind: k, kid: kid, ring: make([]simEvent, watchRing), watchers: map[*simWatcher]struct{}{}}
			r.objs = make([]simObj, shape.count(k))
			for i := range r.objs {
				o := simObj{rv: c.nextRV()}
				var err error
				if o.data, err = s.encode(simRef{ci, kid, i}, k, 0, o.rv); err != nil {
					return nil, err
				}
				r.objs[i] = o
			}
			c.resources = append(c.resources, r)
		}
		s.clusters = append(s.clusters, c)
		s.byName[c.name] = c
	}
	return s, nil
}

// simClusterName names cluster c.
func simClusterName(c int) string { return fmt.Sprintf("leaf-%03d", c) }

// encode returns the stored form of an object: a built-in object's
// protobuf message, a custom resource's JSON.
func (s *fleetServer) encode(ref simRef, k simKind, gen uint32, rv uint64) ([]byte, error) {
	if !k.proto {
		return s.shape.custom(ref, k, rv), nil
	}
	return s.shape.builtin(ref, k, gen, rv).Marshal()
}

// protoObject is a built-in object with its generated protobuf methods.
type protoObject interface {
	runtime.Object
	metav1.Object
	Marshal() ([]byte, error)
	Unmarshal([]byte) error
}

// typedObject decodes a stored protobuf message into a new object of kind k.
func typedObject(k simKind, data []byte) (protoObject, error) {
	gvk := k.gvk()
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	p, ok := obj.(protoObject)
	if !ok {
		return nil, fmt.Errorf("%s has no protobuf encoding", gvk)
	}
	if data != nil {
		if err := p.Unmarshal(data); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// protoPrefix starts every protobuf-encoded object (a runtime.Unknown).
var protoPrefix = []byte("k8s\x00")

// The protobuf wire form of an object is the magic prefix and a
// runtime.Unknown (typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2)
// holding the object's message. The server writes it, and the watch events
// and lists around it, straight into one buffer with protowire rather than
// through the generated types, which would copy every object's bytes three
// times per event: at 200 clusters the generator relists a million objects
// a minute.

// unknownSize returns the size of the wire form of an n-byte message.
func unknownSize(apiVersion, kind string, n int) int {
	return len(protoPrefix) + protowire.SizeTag(1) + protowire.SizeBytes(typeMetaSize(apiVersion, kind)) +
		protowire.SizeTag(2) + protowire.SizeBytes(n)
}

func typeMetaSize(apiVersion, kind string) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(apiVersion)) + protowire.SizeTag(2) + protowire.SizeBytes(len(kind))
}

// appendUnknownHeader appends the wire form of an n-byte message up to the
// message itself, which the caller appends next.
func appendUnknownHeader(b []byte, apiVersion, kind string, n int) []byte {
	b = append(b, protoPrefix...)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(typeMetaSize(apiVersion, kind)))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, apiVersion)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, kind)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// wrapProto returns the wire form of a message.
func wrapProto(apiVersion, kind string, msg []byte) []byte {
	b := make([]byte, 0, unknownSize(apiVersion, kind, len(msg)))
	return append(appendUnknownHeader(b, apiVersion, kind, len(msg)), msg...)
}

// jsonOf returns an object's JSON with its apiVersion and kind.
func jsonOf(k simKind, data []byte) ([]byte, error) {
	if !k.proto {
		return data, nil
	}
	obj, err := typedObject(k, data)
	if err != nil {
		return nil, err
	}
	obj.GetObjectKind().SetGroupVersionKind(k.gvk())
	return json.Marshal(obj)
}

// buildDiscovery renders the legacy discovery documents.
func (s *fleetServer) buildDiscovery() error {
	core := metav1.APIResourceList{GroupVersion: "v1"}
	groups := map[string]*metav1.APIGroup{}
	lists := map[string]*metav1.APIResourceList{"v1": &core}
	var order []string
	for _, k := range simKinds {
		res := metav1.APIResource{
			Name: k.Resource, SingularName: strings.ToLower(k.Kind.Kind), Namespaced: k.Namespaced,
			Kind: k.Kind.Kind, Verbs: metav1.Verbs{"get", "list", "watch"},
		}
		gv := k.gv()
		l := lists[gv]
		if l == nil {
			l = &metav1.APIResourceList{GroupVersion: gv}
			lists[gv] = l
		}
		l.APIResources = append(l.APIResources, res)
		if k.Group == "" {
			continue
		}
		g := groups[k.Group]
		if g == nil {
			g = &metav1.APIGroup{Name: k.Group}
			groups[k.Group] = g
			order = append(order, k.Group)
		}
		v := metav1.GroupVersionForDiscovery{GroupVersion: gv, Version: k.Version}
		if !containsVersion(g.Versions, v) {
			g.Versions = append(g.Versions, v)
			// The first version listed is the preferred one, as for
			// Flux's source group (v1 before v1beta2).
			if len(g.Versions) == 1 {
				g.PreferredVersion = v
			}
		}
	}
	var err error
	s.apiVersions, err = json.Marshal(&metav1.APIVersions{
		TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: "127.0.0.1"}},
	})
	if err != nil {
		return err
	}
	gl := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}}
	for _, name := range order {
		gl.Groups = append(gl.Groups, *groups[name])
	}
	if s.apiGroups, err = json.Marshal(&gl); err != nil {
		return err
	}
	s.resourceLists = map[string][]byte{}
	for gv, l := range lists {
		l.TypeMeta = metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}
		if s.resourceLists[gv], err = json.Marshal(l); err != nil {
			return err
		}
	}
	return nil
}

func containsVersion(vs []metav1.GroupVersionForDiscovery, v metav1.GroupVersionForDiscovery) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// ServeHTTP routes /clusters/<name>/... to a cluster and /fleetbench/... to
// the controls.
func (s *fleetServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/fleetbench/"); ok {
		s.serveControl(w, r, rest)
		return
	}
	rest, ok := strings.CutPrefix(path, "/clusters/")
	if !ok {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path: "+path)
		return
	}
	name, sub, _ := strings.Cut(rest, "/")
	c := s.byName[name]
	if c == nil {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such cluster: "+name)
		return
	}
	if r.Method != http.MethodGet {
		writeStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "this simulated cluster is read-only")
		return
	}
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	switch {
	case sub == "readyz" || sub == "livez" || sub == "healthz":
		_, _ = w.Write([]byte("ok"))
	case sub == "version":
		writeJSON(w, []byte(`{"major":"1","minor":"35","gitVersion":"v1.35.4-fleetbench","platform":"linux/amd64"}`))
	case sub == "api":
		writeJSON(w, s.apiVersions)
	case sub == "apis":
		writeJSON(w, s.apiGroups)
	case parts[0] == "api" && len(parts) >= 2:
		s.serveResource(w, r, c, "", parts[1], parts[2:])
	case parts[0] == "apis" && len(parts) >= 3:
		s.serveResource(w, r, c, parts[1], parts[2], parts[3:])
	default:
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path: "+path)
	}
}

// serveResource serves discovery of a group version, or a list, watch or
// get of a resource: rest is [res], [res, name], [namespaces, ns, res] or
// [namespaces, ns, res, name] (and [namespaces] / [namespaces, name] for
// the namespaces themselves).
func (s *fleetServer) serveResource(w http.ResponseWriter, r *http.Request, c *simCluster, group, version string, rest []string) {
	gv := version
	if group != "" {
		gv = group + "/" + version
	}
	if len(rest) == 0 {
		if doc, ok := s.resourceLists[gv]; ok {
			writeJSON(w, doc)
			return
		}
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	var ns, res, name string
	switch {
	case rest[0] == "namespaces" && len(rest) >= 3:
		ns, res = rest[1], rest[2]
		if len(rest) > 3 {
			name = rest[3]
		}
	default:
		res = rest[0]
		if len(rest) > 1 {
			name = rest[1]
		}
	}
	var sr *simResource
	for _, x := range c.resources {
		if x.kind.Resource == res && x.kind.gv() == gv {
			sr = x
		}
	}
	if sr == nil || len(rest) > 4 {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	proto := sr.kind.proto && strings.Contains(r.Header.Get("Accept"), "application/vnd.kubernetes.protobuf")
	q := r.URL.Query()
	switch {
	case name != "":
		s.serveGet(w, c, sr, ns, name, proto)
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		s.serveWatch(w, r, c, sr, ns, proto)
	default:
		s.serveList(w, r, c, sr, ns, proto)
	}
}

// serveGet serves one object.
func (s *fleetServer) serveGet(w http.ResponseWriter, c *simCluster, sr *simResource, ns, name string, proto bool) {
	c.mu.Lock()
	var found *simObj
	for i := range sr.objs {
		if n, nm := s.shape.namespaceAndName(sr.kind, i); n == ns && nm == name {
			o := sr.objs[i]
			found = &o
			break
		}
	}
	c.mu.Unlock()
	if found == nil {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("%s %q not found", sr.kind.Resource, name))
		return
	}
	b, ctype, err := s.wireObject(sr.kind, found.data, proto)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		return
	}
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write(b)
}

// wireObject returns one object as the client wants it.
func (s *fleetServer) wireObject(k simKind, data []byte, proto bool) ([]byte, string, error) {
	if proto {
		return wrapProto(k.gv(), k.Kind.Kind, data), protoType, nil
	}
	b, err := jsonOf(k, data)
	return b, jsonType, err
}

const (
	protoType = "application/vnd.kubernetes.protobuf"
	jsonType  = "application/json"
)

// serveList serves a list, a page at a time when limit is set (unless
// resourceVersion is 0, which the watch cache serves whole). The continue
// token is the list's resource version and the next index: objects are
// never created or deleted, so a position stays meaningful.
func (s *fleetServer) serveList(w http.ResponseWriter, r *http.Request, c *simCluster, sr *simResource, ns string, proto bool) {
	s.lists.Add(1)
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	if q.Get("resourceVersion") == "0" || limit < 0 {
		limit = 0
	}
	from := 0
	var listRV uint64
	if tok := q.Get("continue"); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(raw) != 16 {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "invalid continue token")
			return
		}
		listRV, from = binary.BigEndian.Uint64(raw[:8]), int(binary.BigEndian.Uint64(raw[8:]))
	}
	c.mu.Lock()
	if listRV == 0 {
		listRV = c.rv
	}
	var items []simObj
	to := len(sr.objs)
	if limit > 0 {
		to = min(to, from+limit)
	}
	for i := from; i < to; i++ {
		if ns != "" {
			if n, _ := s.shape.namespaceAndName(sr.kind, i); n != ns {
				continue
			}
		}
		items = append(items, sr.objs[i])
	}
	c.mu.Unlock()
	meta := metav1.ListMeta{ResourceVersion: strconv.FormatUint(listRV, 10)}
	if to < len(sr.objs) {
		var raw [16]byte
		binary.BigEndian.PutUint64(raw[:8], listRV)
		binary.BigEndian.PutUint64(raw[8:], uint64(to))
		meta.Continue = base64.RawURLEncoding.EncodeToString(raw[:])
		meta.RemainingItemCount = ptrTo(int64(len(sr.objs) - to))
	}
	var body []byte
	var err error
	if proto {
		body, err = protoList(sr.kind, meta, items)
		w.Header().Set("Content-Type", protoType)
	} else {
		body, err = jsonList(sr.kind, meta, items)
		w.Header().Set("Content-Type", jsonType)
	}
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
		return
	}
	_, _ = w.Write(body)
}

// protoList encodes a list: field 1 is the ListMeta and field 2 the
// repeated items in every built-in list type.
func protoList(k simKind, meta metav1.ListMeta, items []simObj) ([]byte, error) {
	mb, err := meta.Marshal()
	if err != nil {
		return nil, err
	}
	n := protowire.SizeTag(1) + protowire.SizeBytes(len(mb))
	for _, it := range items {
		n += protowire.SizeTag(2) + protowire.SizeBytes(len(it.data))
	}
	kind := k.Kind.Kind + "List"
	b := make([]byte, 0, unknownSize(k.gv(), kind, n))
	b = appendUnknownHeader(b, k.gv(), kind, n)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, mb)
	for _, it := range items {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, it.data)
	}
	return b, nil
}

// jsonList encodes a list as JSON.
func jsonList(k simKind, meta metav1.ListMeta, items []simObj) ([]byte, error) {
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"apiVersion":%q,"kind":%q,"metadata":%s,"items":[`, k.gv(), k.Kind.Kind+"List", mb)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		j, err := jsonOf(k, it.data)
		if err != nil {
			return nil, err
		}
		b.Write(j)
	}
	b.WriteString("]}")
	return b.Bytes(), nil
}

// serveWatch serves a watch: with sendInitialEvents, every object then the
// initial-events-end bookmark; from a resource version, the ring's events
// after it (or 410 when they are gone); from "" or "0", new events only.
func (s *fleetServer) serveWatch(w http.ResponseWriter, r *http.Request, c *simCluster, sr *simResource, ns string, proto bool) {
	q := r.URL.Query()
	initial := q.Get("sendInitialEvents") == "true"
	if initial && q.Get("resourceVersionMatch") != string(metav1.ResourceVersionMatchNotOlderThan) {
		writeStatus(w, http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "sendInitialEvents requires resourceVersionMatch=NotOlderThan")
		return
	}
	var fromRV uint64
	if v := q.Get("resourceVersion"); v != "" && v != "0" {
		var err error
		if fromRV, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "invalid resourceVersion "+v)
			return
		}
	}
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	timeout := 30 * time.Minute
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}

	wt := &simWatcher{ch: make(chan simEvent, 4096), overflow: make(chan struct{})}
	var snapshot []simObj
	var backlog []simEvent
	s.watches.Add(1)
	c.mu.Lock()
	switch {
	case initial:
		s.initialWatches.Add(1)
		snapshot = append([]simObj(nil), sr.objs...)
		fromRV = c.rv
	case fromRV == 0:
		fromRV = c.rv
	case fromRV < sr.droppedRV:
		c.mu.Unlock()
		s.expired.Add(1)
		writeStatus(w, http.StatusGone, metav1.StatusReasonExpired,
			fmt.Sprintf("too old resource version: %d (%d)", fromRV, sr.droppedRV))
		return
	default:
		for j := range sr.n {
			if e := sr.ring[(sr.start+j)%len(sr.ring)]; e.obj.rv > fromRV {
				backlog = append(backlog, e)
			}
		}
	}
	sr.watchers[wt] = struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(sr.watchers, wt)
		c.mu.Unlock()
	}()

	ww := &watchWriter{w: w, k: sr.kind, proto: proto}
	if proto {
		w.Header().Set("Content-Type", protoType+";stream=watch")
	} else {
		w.Header().Set("Content-Type", jsonType)
	}
	w.WriteHeader(http.StatusOK)
	flush := func() error { return http.NewResponseController(w).Flush() }
	inNS := func(i int) bool {
		if ns == "" {
			return true
		}
		n, _ := s.shape.namespaceAndName(sr.kind, i)
		return n == ns
	}
	for i, o := range snapshot {
		if inNS(i) {
			if err := ww.event("ADDED", o.data); err != nil {
				return
			}
		}
	}
	if initial {
		if err := ww.bookmark(fromRV, true); err != nil || flush() != nil {
			return
		}
	}
	for _, e := range backlog {
		if inNS(e.i) {
			if err := ww.event("MODIFIED", e.obj.data); err != nil {
				return
			}
		}
	}
	if flush() != nil {
		return
	}
	lastRV := fromRV
	tick := time.NewTicker(s.bookmarkEvery)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-deadline.C:
			return
		case <-wt.overflow:
			return
		case <-tick.C:
			if !bookmarks {
				continue
			}
			if ww.bookmark(lastRV, false) != nil || flush() != nil {
				return
			}
		case e := <-wt.ch:
			// Write what is queued, then flush once.
			for {
				if e.obj.rv > lastRV {
					lastRV = e.obj.rv
					if inNS(e.i) && ww.event("MODIFIED", e.obj.data) != nil {
						return
					}
				}
				select {
				case e = <-wt.ch:
					continue
				default:
				}
				break
			}
			if flush() != nil {
				return
			}
		}
	}
}

// watchWriter writes watch events in the negotiated framing: protobuf
// frames (a 4-byte big-endian length, then a metav1.WatchEvent whose object
// is a runtime.Unknown), or JSON events one after another.
type watchWriter struct {
	w     http.ResponseWriter
	k     simKind
	proto bool
	buf   []byte
}

func (ww *watchWriter) event(typ string, data []byte) error {
	if ww.proto {
		// A 4-byte length, then a metav1.WatchEvent: type = 1, object =
		// 2 (a RawExtension: raw = 1, the object's wire form).
		gv, kind := ww.k.gv(), ww.k.Kind.Kind
		obj := unknownSize(gv, kind, len(data))
		ext := protowire.SizeTag(1) + protowire.SizeBytes(obj)
		ev := protowire.SizeTag(1) + protowire.SizeBytes(len(typ)) + protowire.SizeTag(2) + protowire.SizeBytes(ext)
		b := binary.BigEndian.AppendUint32(ww.buf[:0], uint32(ev))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, typ)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(ext))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(obj))
		ww.buf = append(appendUnknownHeader(b, gv, kind, len(data)), data...)
	} else {
		obj, err := jsonOf(ww.k, data)
		if err != nil {
			return err
		}
		ww.buf = append(append(append(append(ww.buf[:0], `{"type":"`...), typ...), `","object":`...), obj...)
		ww.buf = append(ww.buf, "}\n"...)
	}
	_, err := ww.w.Write(ww.buf)
	return err
}

// bookmark writes a BOOKMARK event at rv; initialEnd marks the end of the
// initial events.
func (ww *watchWriter) bookmark(rv uint64, initialEnd bool) error {
	meta := metav1.ObjectMeta{ResourceVersion: strconv.FormatUint(rv, 10)}
	if initialEnd {
		meta.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	if ww.k.proto {
		obj, err := typedObject(ww.k, nil)
		if err != nil {
			return err
		}
		obj.SetResourceVersion(meta.ResourceVersion)
		obj.SetAnnotations(meta.Annotations)
		data, err := obj.Marshal()
		if err != nil {
			return err
		}
		return ww.event("BOOKMARK", data)
	}
	b, err := json.Marshal(map[string]any{"apiVersion": ww.k.gv(), "kind": ww.k.Kind.Kind, "metadata": meta})
	if err != nil {
		return err
	}
	return ww.event("BOOKMARK", b)
}

// change applies one change to a cluster: a pod's next restart.
func (s *fleetServer) change(c *simCluster, i int) error {
	pods := c.resources[simKindIndex("Pod")]
	c.mu.Lock()
	defer c.mu.Unlock()
	o := pods.objs[i]
	o.gen++
	o.rv = c.nextRV()
	var err error
	if o.data, err = s.encode(simRef{c.idx, pods.kid, i}, pods.kind, o.gen, o.rv); err != nil {
		return err
	}
	pods.objs[i] = o
	c.changes++
	// Into the ring, then to every watcher.
	if pods.n == len(pods.ring) {
		pods.droppedRV = pods.ring[pods.start].obj.rv
		pods.start = (pods.start + 1) % len(pods.ring)
		pods.n--
	}
	pods.ring[(pods.start+pods.n)%len(pods.ring)] = simEvent{i: i, obj: o}
	pods.n++
	for wt := range pods.watchers {
		select {
		case wt.ch <- simEvent{i: i, obj: o}:
		default:
			select {
			case <-wt.overflow:
			default:
				close(wt.overflow)
			}
		}
	}
	return nil
}

// simKindIndex returns the index of a kind in simKinds.
func simKindIndex(kind string) int {
	for i, k := range simKinds {
		if k.Kind.Kind == kind {
			return i
		}
	}
	panic("no simulated kind " + kind)
}

// churn applies changes at the current rate, spread round-robin over the
// clusters, each to a random pod, until ctx ends.
func (s *fleetServer) churn(ctx context.Context) error {
	pods := s.shape.count(simKinds[simKindIndex("Pod")])
	if pods == 0 || len(s.clusters) == 0 {
		<-ctx.Done()
		return nil
	}
	rnd := uint64(1)
	var done int64
	start, startRate := time.Now(), int64(0)
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rate := s.rate.Load()
		if rate != startRate { // a new rate starts its own schedule
			start, startRate, done = time.Now(), rate, 0
		}
		due := int64(time.Since(start).Seconds() * float64(rate))
		for ; done < due; done++ {
			rnd = rnd*6364136223846793005 + 1442695040888963407
			c := s.clusters[int(done)%len(s.clusters)]
			if err := s.change(c, int((rnd>>33)%uint64(pods))); err != nil {
				return err
			}
		}
	}
}

// fleetState is what /fleetbench/state reports per cluster: the counts and
// a digest of every listed object's key and resource version, which the
// driver recomputes from its index.
type fleetState struct {
	Cluster string `json:"cluster"`
	Listed  int    `json:"listed"`
	RBAC    int    `json:"rbac"`
	Changes int    `json:"changes"`
	Digest  uint64 `json:"digest"`
}

// rowDigest is one object's share of a digest (digests xor them).
func rowDigest(k index.Key, rv string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(k.String()))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(rv))
	return h.Sum64()
}

// serveControl serves the driver's controls: GET state, POST churn?rate=N.
func (s *fleetServer) serveControl(w http.ResponseWriter, r *http.Request, what string) {
	switch what {
	case "churn":
		rate, err := strconv.ParseInt(r.URL.Query().Get("rate"), 10, 64)
		if err != nil || rate < 0 || r.Method != http.MethodPost {
			http.Error(w, "POST churn?rate=N", http.StatusBadRequest)
			return
		}
		s.rate.Store(rate)
	case "state":
		var out []fleetState
		for _, c := range s.clusters {
			st := fleetState{Cluster: c.name}
			c.mu.Lock()
			st.Changes = c.changes
			for _, sr := range c.resources {
				if sr.kind.Group == index.RBACGroup {
					st.RBAC += len(sr.objs)
					continue
				}
				st.Listed += len(sr.objs)
				for i, o := range sr.objs {
					ns, name := s.shape.namespaceAndName(sr.kind, i)
					st.Digest ^= rowDigest(index.Key{Cluster: c.name, Group: sr.kind.Group, Kind: sr.kind.Kind.Kind, Namespace: ns, Name: name}, strconv.FormatUint(o.rv, 10))
				}
			}
			c.mu.Unlock()
			out = append(out, st)
		}
		b, err := json.Marshal(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, b)
	default:
		http.NotFound(w, r)
	}
}

func writeJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", jsonType)
	_, _ = w.Write(b)
}

// writeStatus writes a metav1.Status error, as the API server does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	b, _ := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
	w.Header().Set("Content-Type", jsonType)
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// selfSigned returns a TLS certificate for 127.0.0.1 and its PEM.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleetbench simulated clusters"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(7 * 24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return cert, certPEM, err
}

// runFleetServer is the hidden subcommand fleet-server: the load generator
// process fleetbench fleet starts. It writes its CA certificate, builds the
// clusters, listens, then writes the ready file: the URL of each cluster's
// listener, one a line (the first also serves the controls).
func runFleetServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fleet-server", flag.ContinueOnError)
	clusters := fs.Int("clusters", 10, "simulated clusters")
	var shape fleetShape
	fs.IntVar(&shape.Namespaces, "namespaces", 50, "namespaces per cluster")
	fs.IntVar(&shape.Pods, "pods", 60, "pods per namespace")
	fs.IntVar(&shape.Services, "services", 20, "services per namespace")
	rate := fs.Int64("rate", 0, "changes per second across the fleet")
	caFile := fs.String("ca-file", "", "where to write the CA certificate")
	readyFile := fs.String("ready-file", "", "where to write the clusters' URLs once serving")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *caFile == "" || *readyFile == "" {
		return errors.New("fleet-server: -ca-file and -ready-file are required")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	s, err := newFleetServer(shape, *clusters, log)
	if err != nil {
		return err
	}
	s.rate.Store(*rate)
	cert, certPEM, err := selfSigned()
	if err != nil {
		return err
	}
	if err := os.WriteFile(*caFile, certPEM, 0o600); err != nil {
		return err
	}
	// One listener per cluster, as a real fleet has one API server per
	// cluster. The collector already opens a connection of its own per
	// cluster either way; still, with one listener the first sync of 200
	// clusters on a loaded 2-core machine did not finish in 4.5 minutes
	// (248 clusters lost to probe timeouts), and with one per cluster it
	// took 192 s (76 lost). Why is not established. The first listener
	// also serves the controls.
	listeners := make([]net.Listener, *clusters)
	for i := range listeners {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		listeners[i] = l
	}
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		// Every cluster's watches share its one HTTP/2 connection.
		HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: 1000},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() { serveErr <- srv.ServeTLS(l, "", "") }()
	}
	churnErr := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { churnErr <- s.churn(cctx) }()
	var ready strings.Builder // a URL per line: each cluster's, in order
	for _, l := range listeners {
		ready.WriteString("https://" + l.Addr().String() + "\n")
	}
	// Written whole, then renamed: the driver polls for it.
	if err := os.WriteFile(*readyFile+".tmp", []byte(ready.String()), 0o600); err != nil {
		return err
	}
	if err := os.Rename(*readyFile+".tmp", *readyFile); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return err
	case err := <-churnErr:
		return err
	}
	log.Info("requests served", "lists", s.lists.Load(), "watches", s.watches.Load(),
		"watchlists", s.initialWatches.Load(), "expired", s.expired.Load())
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	return srv.Shutdown(sctx)
}
