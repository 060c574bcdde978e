package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// redisPeer is the store the query-scaling RFC had in mind
// (docs/design.md), on a redis-server the harness starts on a loopback
// port without persistence: a hash per
// object (o:<id>), a hash from object key to id, sets of ids per cluster,
// (cluster, namespace), namespace, kind, kind x status and label pair, and
// a sorted set of every id scored by its rank in name order. A page is a
// Lua script (one round trip): ZINTERSTORE of the name order with the
// filter's sets, the first ids, and their hashes. A restricted viewer's
// scope is a set (the union of its namespaces' sets) built once per viewer,
// as a per-identity cache would; building it is not timed.
type redisPeer struct {
	d      *daemon
	rdb    *redis.Client
	scopes []*scope
	redis  string
	rss0   int64
	kinds  []string
	fleet  indextest.Fleet
}

var (
	redisGet = redis.NewScript(`
local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return false end
return redis.call('HGETALL', 'o:' .. id)`)

	// KEYS: a scratch key, the name order, then the sets to intersect.
	redisPage = redis.NewScript(`
local args = {KEYS[1], #KEYS - 1}
for i = 2, #KEYS do args[#args + 1] = KEYS[i] end
args[#args + 1] = 'WEIGHTS'
args[#args + 1] = 1
for i = 3, #KEYS do args[#args + 1] = 0 end
redis.call('ZINTERSTORE', unpack(args))
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
redis.call('DEL', KEYS[1])
local out = {}
for i, id in ipairs(ids) do out[i] = redis.call('HGETALL', 'o:' .. id) end
return out`)

	redisCount = redis.NewScript(`
local out = {}
for i, k in ipairs(KEYS) do out[i] = redis.call('SCARD', k) end
return out`)

	// ARGV: key, status, message, labels ("k=v,..." sorted), resource version.
	redisUpdate = redis.NewScript(`
local id = redis.call('HGET', 'keys', ARGV[1])
if not id then return redis.error_reply('no object ' .. ARGV[1]) end
local h = 'o:' .. id
local old = redis.call('HMGET', h, 'st', 'l', 'k')
if old[1] ~= ARGV[2] then
  redis.call('SMOVE', 's:ks:' .. old[3] .. '/' .. old[1], 's:ks:' .. old[3] .. '/' .. ARGV[2], id)
end
if old[2] ~= ARGV[4] then
  for pair in string.gmatch(old[2], '[^,]+') do redis.call('SREM', 's:l:' .. pair, id) end
  for pair in string.gmatch(ARGV[4], '[^,]+') do redis.call('SADD', 's:l:' .. pair, id) end
end
redis.call('HSET', h, 'st', ARGV[2], 'm', ARGV[3], 'l', ARGV[4], 'rv', ARGV[5])
return 1`)
)

func newRedis(ctx context.Context, dir string, scopes ...*scope) (*redisPeer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server is not installed (make bench-compare installs Debian's redis-server package)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d, err := startDaemon("redis", filepath.Join(dir, "redis.log"), nil, bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := d.waitPort(ctx, addr); err != nil {
		d.stop()
		return nil, err
	}
	p := &redisPeer{d: d, rdb: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4}), scopes: scopes}
	info, err := p.rdb.InfoMap(ctx, "server").Result()
	if err != nil {
		p.close()
		return nil, err
	}
	p.redis = "Redis " + info["Server"]["redis_version"]
	for _, s := range []*redis.Script{redisGet, redisPage, redisCount, redisUpdate} {
		if err := s.Load(ctx, p.rdb).Err(); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

func (p *redisPeer) name() string { return "redis" }

func (p *redisPeer) version() string { return p.redis + ", go-redis v9.23.0" }

func (p *redisPeer) schema() string {
	return `o:<id>              hash: c g k ns n v r u st m l ct rv (l = "k=v,k=v" sorted)
keys                hash: object key -> id
s:c:<cluster>       set of ids        s:cn:<cluster>/<namespace>  set of ids
s:n:<namespace>     set of ids        s:k:<kind>                  set of ids
s:ks:<kind>/<status> set of ids       s:l:<key>=<value>           set of ids
z:name              sorted set: id scored by its rank in (name, key) order
scope:<viewer>      set: SUNIONSTORE of the viewer's s:cn sets (built once per viewer)
-- Q1: EVALSHA get (HGET keys <key>; HGETALL o:<id>)
-- Q2..Q4, Q6: EVALSHA page: ZINTERSTORE tmp z:name <sets> WEIGHTS 1 0..; ZRANGE tmp 0 99; DEL tmp; HGETALL each
--   Q2 sets: s:cn:<c>/<ns> s:k:<kind>   Q3: s:ks:Kustomization/UNHEALTHY   Q4: s:l:app=v0
--   Q6: s:ks:Kustomization/UNHEALTHY scope:<viewer>
-- Q5: EVALSHA count: SCARD of every s:ks, s:c and s:n set; summed by the client
-- churn: EVALSHA update per object, pipelined per batch (SMOVE between s:ks sets, SREM/SADD label sets, HSET)
-- Lua scripts:
` + redisGet.Hash() + " get\n" + redisPage.Hash() + " page\n" + redisCount.Hash() + " count\n" + redisUpdate.Hash() + " update"
}

func (p *redisPeer) close() {
	_ = p.rdb.Close()
	p.d.stop()
}

func labelString(l index.Labels) string {
	return strings.Join(labelList(l), ",")
}

// load computes each object's rank in name order (the sorted set's score),
// then writes the fleet in pipelines of batch objects, and builds the
// viewers' scope sets.
func (p *redisPeer) load(ctx context.Context, f indextest.Fleet, batch int) error {
	p.fleet = f
	p.rss0, _, _ = procRSS(p.d.pid())
	type nk struct {
		k index.Key
		i int32
	}
	order := make([]nk, f.Size())
	for i := range order {
		o := f.Object(i)
		order[i] = nk{o.Key(), int32(i)}
	}
	// (name, cluster, group, kind, namespace): the order of every store.
	slices.SortFunc(order, func(a, b nk) int {
		return cmp.Or(strings.Compare(a.k.Name, b.k.Name), strings.Compare(a.k.Cluster, b.k.Cluster),
			strings.Compare(a.k.Group, b.k.Group), strings.Compare(a.k.Kind, b.k.Kind), strings.Compare(a.k.Namespace, b.k.Namespace))
	})
	rank := make([]int32, f.Size())
	for r, e := range order {
		rank[e.i] = int32(r)
	}
	next := 0
	err := f.Each(batch, func(rows []index.Object) error {
		pipe := p.rdb.Pipeline()
		for j := range rows {
			o := &rows[j]
			id := strconv.Itoa(next)
			key := keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name)
			pipe.HSet(ctx, "o:"+id, "c", o.Cluster, "g", o.Group, "k", o.Kind, "ns", o.Namespace, "n", o.Name, "v", o.Version,
				"r", o.Resource, "u", o.UID, "st", string(o.Status), "m", o.Message, "l", labelString(o.Labels),
				"ct", o.CreatedAt.Unix(), "rv", o.ResourceVersion)
			pipe.HSet(ctx, "keys", key, id)
			pipe.SAdd(ctx, "s:c:"+o.Cluster, id)
			pipe.SAdd(ctx, "s:cn:"+o.Cluster+"/"+o.Namespace, id)
			pipe.SAdd(ctx, "s:n:"+o.Namespace, id)
			pipe.SAdd(ctx, "s:k:"+o.Kind, id)
			pipe.SAdd(ctx, "s:ks:"+o.Kind+"/"+string(o.Status), id)
			for k, v := range o.Labels.All() {
				pipe.SAdd(ctx, "s:l:"+k+"="+v, id)
			}
			pipe.ZAdd(ctx, "z:name", redis.Z{Score: float64(rank[next]), Member: id})
			next++
		}
		_, err := pipe.Exec(ctx)
		return err
	})
	if err != nil {
		return err
	}
	for _, k := range indextest.Kinds {
		p.kinds = append(p.kinds, k.Kind)
	}
	return nil
}

// buildScopes makes each viewer's scope set; it runs after the size is
// taken, off the clock.
func (p *redisPeer) buildScopes(ctx context.Context) error {
	for _, s := range p.scopes {
		keys := make([]string, len(s.clusters))
		for i := range keys {
			keys[i] = "s:cn:" + s.clusters[i] + "/" + s.namespaces[i]
		}
		if err := p.rdb.SUnionStore(ctx, "scope:"+s.id, keys...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// size is the growth of redis-server's resident set over the load.
func (p *redisPeer) size(ctx context.Context) (int64, string, error) {
	rss, _, err := procRSS(p.d.pid())
	if err != nil {
		return 0, "", err
	}
	mem, err := p.rdb.InfoMap(ctx, "memory").Result()
	if err != nil {
		return 0, "", err
	}
	if err := p.buildScopes(ctx); err != nil {
		return 0, "", err
	}
	return rss - p.rss0, "growth of redis-server's RSS over the load (used_memory " + mem["Memory"]["used_memory_human"] + ")", nil
}

// fields decodes an HGETALL reply into the object's key.
func hashKey(v any) (string, error) {
	l, ok := v.([]any)
	if !ok || len(l)%2 != 0 {
		return "", fmt.Errorf("unexpected reply %T", v)
	}
	m := make(map[string]string, len(l)/2)
	for i := 0; i < len(l); i += 2 {
		k, _ := l[i].(string)
		s, _ := l[i+1].(string)
		m[k] = s
	}
	return keyString(m["c"], m["g"], m["k"], m["ns"], m["n"]), nil
}

func (p *redisPeer) get(ctx context.Context, k index.Key) (string, error) {
	v, err := redisGet.EvalSha(ctx, p.rdb, []string{"keys"}, keyString(k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return hashKey(v)
}

func (p *redisPeer) page(ctx context.Context, q pageQuery) (pageAnswer, error) {
	keys := []string{"tmp:page", "z:name"}
	switch {
	case q.cluster != "":
		keys = append(keys, "s:cn:"+q.cluster+"/"+q.namespace, "s:k:"+q.kind)
	case q.labelKey != "":
		keys = append(keys, "s:l:"+q.labelKey+"="+q.labelValue)
	default:
		keys = append(keys, "s:ks:"+q.kind+"/"+string(q.status))
		if q.scope != nil {
			keys = append(keys, "scope:"+q.scope.id)
		}
	}
	v, err := redisPage.EvalSha(ctx, p.rdb, keys, q.first).Slice()
	if err != nil {
		return nil, err
	}
	out := rows[[]any]{list: make([][]any, len(v)), key: func(h *[]any) string {
		k, _ := hashKey(*h) // checked below
		return k
	}}
	for i, h := range v {
		l, ok := h.([]any)
		if !ok || len(l)%2 != 0 {
			return nil, fmt.Errorf("unexpected reply %T", h)
		}
		out.list[i] = l
	}
	return out, nil
}

func (p *redisPeer) facets(ctx context.Context) (facetAnswer, error) {
	var keys []string
	for _, k := range p.kinds {
		for _, st := range index.Statuses {
			keys = append(keys, "s:ks:"+k+"/"+string(st))
		}
	}
	for c := range p.fleet.Clusters {
		keys = append(keys, "s:c:"+indextest.ClusterName(c))
	}
	for n := range p.fleet.Namespaces {
		keys = append(keys, "s:n:"+indextest.NamespaceName(n))
	}
	v, err := redisCount.EvalSha(ctx, p.rdb, keys).Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(v) != len(keys) {
		return nil, fmt.Errorf("%d counts for %d sets", len(v), len(keys))
	}
	return redisFacets{v: v, kinds: p.kinds, clusters: p.fleet.Clusters}, nil
}

// redisFacets is the script's counts, one per set asked for: kind x
// status, then each cluster, then each namespace.
type redisFacets struct {
	v        []int64
	kinds    []string
	clusters int
}

// sums adds the kind x status counts up by kind and by status.
func (f redisFacets) sums() (byKind, byStatus []int64, rest []int64) {
	byKind, byStatus = make([]int64, len(f.kinds)), make([]int64, len(index.Statuses))
	for i, n := range f.v[:len(f.kinds)*len(index.Statuses)] {
		byKind[i/len(index.Statuses)] += n
		byStatus[i%len(index.Statuses)] += n
	}
	return byKind, byStatus, f.v[len(f.kinds)*len(index.Statuses):]
}

func (f redisFacets) len() int {
	byKind, byStatus, rest := f.sums()
	n := 0
	for _, l := range [][]int64{byKind, byStatus, rest} {
		for _, c := range l {
			if c > 0 {
				n++
			}
		}
	}
	return n
}

func (f redisFacets) counts() facetCounts {
	byKind, byStatus, rest := f.sums()
	out := facetCounts{}
	add := func(key string, n int64) {
		if n > 0 {
			out[key] = int(n)
		}
	}
	for i, k := range f.kinds {
		add("kind/"+k, byKind[i])
	}
	for i, st := range index.Statuses {
		add("status/"+string(st), byStatus[i])
	}
	for i, n := range rest {
		if i < f.clusters {
			add("cluster/"+indextest.ClusterName(i), n)
		} else {
			add("namespace/"+indextest.NamespaceName(i-f.clusters), n)
		}
	}
	return out
}

func (p *redisPeer) update(ctx context.Context, objs []index.Object) error {
	pipe := p.rdb.Pipeline()
	for i := range objs {
		o := &objs[i]
		redisUpdate.EvalSha(ctx, pipe, nil, keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name),
			string(o.Status), o.Message, labelString(o.Labels), o.ResourceVersion)
	}
	_, err := pipe.Exec(ctx)
	return err
}
