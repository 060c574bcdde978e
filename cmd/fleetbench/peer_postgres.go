package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// pgServer is a PostgreSQL server from the distribution's packages, with
// its data in a temporary directory and listening on a loopback port only,
// started and stopped by the harness. Durability is off (fsync,
// synchronous_commit, full_page_writes), which only helps it load and
// update faster; reads are unaffected.
type pgServer struct {
	d       *daemon
	dsn     string
	version string
}

// postgresBin finds the server binaries of the newest installed major
// version (Debian keeps them out of PATH).
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(dir string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return n
	}
	slices.SortFunc(dirs, func(a, b string) int { return major(a) - major(b) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL is not installed (make bench-compare installs Debian's postgresql package)")
}

func startPostgres(ctx context.Context, workDir string) (*pgServer, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := unprivileged("postgres")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(workDir, "postgres")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		// The server runs as postgres: it must reach and own its directory.
		if err := errors.Join(os.Chmod(workDir, 0o755), os.Chown(dir, int(cred.Uid), int(cred.Gid))); err != nil {
			return nil, err
		}
	}
	if err := runAs(cred, filepath.Join(bin, "initdb"), "-D", dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d, err := startDaemon("postgres", filepath.Join(workDir, "postgres.log"), cred,
		filepath.Join(bin, "postgres"), "-D", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", fmt.Sprintf("port=%d", port), "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "shared_buffers=1GB", "-c", "work_mem=64MB", "-c", "maintenance_work_mem=1GB", "-c", "max_wal_size=8GB")
	if err != nil {
		return nil, err
	}
	s := &pgServer{d: d, dsn: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := d.waitPort(ctx, addr); err != nil {
		d.stop()
		return nil, err
	}
	// Accepting TCP is not yet accepting queries.
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		c, err := pgx.Connect(ctx, s.dsn)
		if err == nil {
			err = c.QueryRow(ctx, "SHOW server_version").Scan(&s.version)
			_ = c.Close(ctx)
			if err == nil {
				break
			}
		}
		if time.Since(start) > 30*time.Second {
			d.stop()
			return nil, fmt.Errorf("postgres: %w: %s", err, d.logTail())
		}
	}
	s.version = "PostgreSQL " + s.version
	return s, nil
}

func (s *pgServer) stop() { s.d.stop() }

// postgresPeer is one of the two PostgreSQL designs: typed columns with
// btree indexes (keyset-ready), or stolostron-style JSONB rows with a GIN
// index. Queries go through pgx, which prepares each statement once per
// connection and then executes it by name.
type postgresPeer struct {
	srv   *pgServer
	jsonb bool
	conn  *pgx.Conn // queries
	wconn *pgx.Conn // churn updates
	sql   pgQueries
}

// pgQueries are the statements of one design.
type pgQueries struct {
	create, index []string
	table         string
	get, q2, q3   string
	q4, q5, q6    string
	update        string
}

// The typed design: one column per field, the RBAC-relevant ones first,
// labels as a text[] of "key=value" with a GIN index. Pages are keyset
// paginated on (name, cluster, grp, kind, namespace), the order of the
// btree indexes that serve them.
var pgTyped = pgQueries{
	table: "objects",
	create: []string{`CREATE TABLE objects (
  cluster text NOT NULL, grp text NOT NULL, kind text NOT NULL, namespace text NOT NULL, name text NOT NULL,
  version text NOT NULL, resource text NOT NULL, uid text NOT NULL, status text NOT NULL, message text NOT NULL,
  labels text[] NOT NULL, created_at timestamptz NOT NULL, updated_at timestamptz, rv text NOT NULL)`},
	index: []string{
		`ALTER TABLE objects ADD PRIMARY KEY (cluster, grp, kind, namespace, name)`,
		`CREATE INDEX objects_kind_status_name ON objects (kind, status, name, cluster, grp, namespace)`,
		`CREATE INDEX objects_scope_kind_name ON objects (cluster, namespace, kind, name)`,
		`CREATE INDEX objects_name ON objects (name, cluster, grp, kind, namespace)`,
		`CREATE INDEX objects_labels ON objects USING gin (labels)`,
		`VACUUM ANALYZE objects`, // as after any bulk load: statistics and the visibility map, so autovacuum does not run during the timed queries
	},
	get: `SELECT cluster, grp, kind, namespace, name, uid, status, message, labels, created_at, rv FROM objects
  WHERE cluster = $1 AND grp = $2 AND kind = $3 AND namespace = $4 AND name = $5`,
	q2: `SELECT cluster, grp, kind, namespace, name, uid, status, message, labels, created_at, rv FROM objects
  WHERE cluster = $1 AND namespace = $2 AND kind = $3 ORDER BY name, cluster, grp, kind, namespace LIMIT $4`,
	q3: `SELECT cluster, grp, kind, namespace, name, uid, status, message, labels, created_at, rv FROM objects
  WHERE kind = $1 AND status = $2 ORDER BY name, cluster, grp, kind, namespace LIMIT $3`,
	q4: `SELECT cluster, grp, kind, namespace, name, uid, status, message, labels, created_at, rv FROM objects
  WHERE labels @> $1 ORDER BY name, cluster, grp, kind, namespace LIMIT $2`,
	q5: `SELECT CASE WHEN GROUPING(status) = 0 THEN 'status/' || status WHEN GROUPING(kind) = 0 THEN 'kind/' || kind
  WHEN GROUPING(cluster) = 0 THEN 'cluster/' || cluster ELSE 'namespace/' || namespace END, count(*)
  FROM objects GROUP BY GROUPING SETS ((status), (kind), (cluster), (namespace))`,
	q6: `SELECT cluster, grp, kind, namespace, name, uid, status, message, labels, created_at, rv FROM objects
  WHERE kind = $1 AND status = $2
    AND (cluster, namespace) IN (SELECT * FROM unnest($3::text[], $4::text[])) AND kind = ANY($5)
  ORDER BY name, cluster, grp, kind, namespace LIMIT $6`,
	update: `UPDATE objects o SET status = u.status, message = u.message, labels = string_to_array(u.labels, ','), rv = u.rv, updated_at = now()
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
    AS u(cluster, grp, kind, namespace, name, status, message, labels, rv)
  WHERE (o.cluster, o.grp, o.kind, o.namespace, o.name) = (u.cluster, u.grp, u.kind, u.namespace, u.name)`,
}

// The JSONB design, as stolostron's search-indexer stores rows: uid,
// cluster and one JSONB document per object, a GIN index over the
// document (jsonb_path_ops: containment queries), and a btree on cluster.
// Filters are containment (@>); pages sort the matches by name.
var pgJSONB = pgQueries{
	table:  "resources",
	create: []string{`CREATE TABLE resources (uid text NOT NULL, cluster text NOT NULL, data jsonb NOT NULL)`},
	index: []string{
		`ALTER TABLE resources ADD PRIMARY KEY (uid)`,
		`CREATE INDEX resources_data ON resources USING gin (data jsonb_path_ops)`,
		`CREATE INDEX resources_cluster ON resources (cluster)`,
		`VACUUM ANALYZE resources`,
	},
	get: `SELECT uid, cluster, data FROM resources WHERE cluster = $1 AND data @> $2`,
	q2: `SELECT uid, cluster, data FROM resources WHERE cluster = $1 AND data @> $2
  ORDER BY data->>'name', cluster, data->>'apigroup', data->>'kind', data->>'namespace' LIMIT $3`,
	q3: `SELECT uid, cluster, data FROM resources WHERE data @> $1
  ORDER BY data->>'name', cluster, data->>'apigroup', data->>'kind', data->>'namespace' LIMIT $2`,
	q4: `SELECT uid, cluster, data FROM resources WHERE data @> $1
  ORDER BY data->>'name', cluster, data->>'apigroup', data->>'kind', data->>'namespace' LIMIT $2`,
	q5: `SELECT CASE WHEN GROUPING(data->>'status') = 0 THEN 'status/' || (data->>'status')
  WHEN GROUPING(data->>'kind') = 0 THEN 'kind/' || (data->>'kind')
  WHEN GROUPING(cluster) = 0 THEN 'cluster/' || cluster ELSE 'namespace/' || (data->>'namespace') END, count(*)
  FROM resources GROUP BY GROUPING SETS ((data->>'status'), (data->>'kind'), (cluster), (data->>'namespace'))`,
	q6: `SELECT uid, cluster, data FROM resources WHERE data @> $1
    AND (cluster, data->>'namespace') IN (SELECT * FROM unnest($2::text[], $3::text[])) AND data->>'kind' = ANY($4)
  ORDER BY data->>'name', cluster, data->>'apigroup', data->>'kind', data->>'namespace' LIMIT $5`,
	update: `UPDATE resources r SET data = u.data FROM unnest($1::text[], $2::jsonb[]) AS u(uid, data) WHERE r.uid = u.uid`,
}

func newPostgres(ctx context.Context, name string, srv *pgServer) (*postgresPeer, error) {
	p := &postgresPeer{srv: srv, jsonb: name == "postgres_jsonb", sql: pgTyped}
	if p.jsonb {
		p.sql = pgJSONB
	}
	var err error
	if p.conn, err = pgx.Connect(ctx, srv.dsn); err != nil {
		return nil, err
	}
	if p.wconn, err = pgx.Connect(ctx, srv.dsn); err != nil {
		_ = p.conn.Close(ctx)
		return nil, err
	}
	return p, nil
}

func (p *postgresPeer) name() string {
	if p.jsonb {
		return "postgres_jsonb"
	}
	return "postgres_typed"
}

func (p *postgresPeer) version() string { return p.srv.version + ", pgx v5.12.0" }

func (p *postgresPeer) schema() string {
	var b strings.Builder
	for _, s := range append(slices.Clone(p.sql.create), p.sql.index...) {
		b.WriteString(s + ";\n")
	}
	for _, q := range []struct{ n, s string }{{"Q1", p.sql.get}, {"Q2", p.sql.q2}, {"Q3", p.sql.q3}, {"Q4", p.sql.q4}, {"Q5", p.sql.q5}, {"Q6", p.sql.q6}, {"churn", p.sql.update}} {
		b.WriteString("-- " + q.n + "\n" + q.s + ";\n")
	}
	return b.String()
}

func (p *postgresPeer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.conn.Close(ctx)
	_ = p.wconn.Close(ctx)
}

// labelList is the typed design's labels column.
func labelList(l index.Labels) []string {
	out := make([]string, 0, l.Len())
	for k, v := range l.All() {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// jsonDoc is the JSONB design's document, with stolostron's field names.
type jsonDoc struct {
	Kind            string       `json:"kind"`
	APIGroup        string       `json:"apigroup"`
	APIVersion      string       `json:"apiversion"`
	KindPlural      string       `json:"kind_plural"`
	Namespace       string       `json:"namespace"`
	Name            string       `json:"name"`
	Status          string       `json:"status"`
	Message         string       `json:"message,omitempty"`
	Label           index.Labels `json:"label,omitzero"`
	Created         string       `json:"created"`
	ResourceVersion string       `json:"resourceVersion"`
}

func docOf(o *index.Object) jsonDoc {
	return jsonDoc{
		Kind: o.Kind, APIGroup: o.Group, APIVersion: o.Version, KindPlural: o.Resource, Namespace: o.Namespace, Name: o.Name,
		Status: string(o.Status), Message: o.Message, Label: o.Labels, Created: o.CreatedAt.Format(time.RFC3339), ResourceVersion: o.ResourceVersion,
	}
}

func (p *postgresPeer) load(ctx context.Context, f indextest.Fleet, batch int) error {
	for _, s := range p.sql.create {
		if _, err := p.conn.Exec(ctx, s); err != nil {
			return err
		}
	}
	// Bulk load as one would: COPY, then build the indexes.
	var cols []string
	if p.jsonb {
		cols = []string{"uid", "cluster", "data"}
	} else {
		cols = []string{"cluster", "grp", "kind", "namespace", "name", "version", "resource", "uid", "status", "message", "labels", "created_at", "rv"}
	}
	err := f.Each(batch, func(rows []index.Object) error {
		src := make([][]any, len(rows))
		for i := range rows {
			o := &rows[i]
			if p.jsonb {
				doc, err := json.Marshal(docOf(o))
				if err != nil {
					return err
				}
				src[i] = []any{o.UID, o.Cluster, doc}
			} else {
				src[i] = []any{o.Cluster, o.Group, o.Kind, o.Namespace, o.Name, o.Version, o.Resource, o.UID, string(o.Status), o.Message, labelList(o.Labels), o.CreatedAt, o.ResourceVersion}
			}
		}
		_, err := p.conn.CopyFrom(ctx, pgx.Identifier{p.sql.table}, cols, pgx.CopyFromRows(src))
		return err
	})
	if err != nil {
		return err
	}
	for _, s := range p.sql.index {
		if _, err := p.conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// size is the table with its indexes and TOAST.
func (p *postgresPeer) size(ctx context.Context) (int64, string, error) {
	var n int64
	err := p.conn.QueryRow(ctx, "SELECT pg_total_relation_size($1)", p.sql.table).Scan(&n)
	return n, "pg_total_relation_size: heap, indexes and TOAST", err
}

// rowKeys reads the rows of a page (every column, as a client would) and
// returns their keys.
// pgRow is a typed row as the client holds it, every column a page
// shows; a JSONB row keeps its decoded document.
type pgRow struct {
	cluster, grp, kind, ns, name, uid, status, msg, rv string
	labels                                             []string
	created                                            time.Time
	doc                                                jsonDoc
}

func pgRowKey(r *pgRow) string {
	if r.doc.Kind != "" {
		return keyString(r.cluster, r.doc.APIGroup, r.doc.Kind, r.doc.Namespace, r.doc.Name)
	}
	return keyString(r.cluster, r.grp, r.kind, r.ns, r.name)
}

// scanRows reads a page's rows.
func (p *postgresPeer) scanRows(rs pgx.Rows) (rows[pgRow], error) {
	defer rs.Close()
	out := rows[pgRow]{key: pgRowKey}
	for rs.Next() {
		var r pgRow
		var err error
		if p.jsonb {
			err = rs.Scan(&r.uid, &r.cluster, &r.doc)
		} else {
			err = rs.Scan(&r.cluster, &r.grp, &r.kind, &r.ns, &r.name, &r.uid, &r.status, &r.msg, &r.labels, &r.created, &r.rv)
		}
		if err != nil {
			return out, err
		}
		out.list = append(out.list, r)
	}
	return out, rs.Err()
}

func (p *postgresPeer) get(ctx context.Context, k index.Key) (string, error) {
	var rows pgx.Rows
	var err error
	if p.jsonb {
		rows, err = p.conn.Query(ctx, p.sql.get, k.Cluster, map[string]string{"apigroup": k.Group, "kind": k.Kind, "namespace": k.Namespace, "name": k.Name})
	} else {
		rows, err = p.conn.Query(ctx, p.sql.get, k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
	}
	if err != nil {
		return "", err
	}
	got, err := p.scanRows(rows)
	if err != nil || got.len() == 0 {
		return "", err
	}
	return pgRowKey(&got.list[0]), nil
}

func (p *postgresPeer) page(ctx context.Context, q pageQuery) (pageAnswer, error) {
	var rows pgx.Rows
	var err error
	switch {
	case p.jsonb && q.cluster != "":
		rows, err = p.conn.Query(ctx, p.sql.q2, q.cluster, map[string]string{"namespace": q.namespace, "kind": q.kind}, q.first)
	case p.jsonb && q.labelKey != "":
		rows, err = p.conn.Query(ctx, p.sql.q4, map[string]any{"label": map[string]string{q.labelKey: q.labelValue}}, q.first)
	case p.jsonb && q.scope != nil:
		rows, err = p.conn.Query(ctx, p.sql.q6, map[string]string{"kind": q.kind, "status": string(q.status)}, q.scope.clusters, q.scope.namespaces, q.scope.kinds, q.first)
	case p.jsonb:
		rows, err = p.conn.Query(ctx, p.sql.q3, map[string]string{"kind": q.kind, "status": string(q.status)}, q.first)
	case q.cluster != "":
		rows, err = p.conn.Query(ctx, p.sql.q2, q.cluster, q.namespace, q.kind, q.first)
	case q.labelKey != "":
		rows, err = p.conn.Query(ctx, p.sql.q4, []string{q.labelKey + "=" + q.labelValue}, q.first)
	case q.scope != nil:
		rows, err = p.conn.Query(ctx, p.sql.q6, q.kind, string(q.status), q.scope.clusters, q.scope.namespaces, q.scope.kinds, q.first)
	default:
		rows, err = p.conn.Query(ctx, p.sql.q3, q.kind, string(q.status), q.first)
	}
	if err != nil {
		return nil, err
	}
	return p.scanRows(rows)
}

func (p *postgresPeer) facets(ctx context.Context) (facetAnswer, error) {
	rs, err := p.conn.Query(ctx, p.sql.q5)
	if err != nil {
		return nil, err
	}
	return scanFacets(rs)
}

// update applies a batch as one UPDATE joined to the batch's rows
// (unnest of array parameters): one statement, one round trip.
func (p *postgresPeer) update(ctx context.Context, objs []index.Object) error {
	if p.jsonb {
		uids, docs := make([]string, len(objs)), make([][]byte, len(objs))
		for i := range objs {
			doc, err := json.Marshal(docOf(&objs[i]))
			if err != nil {
				return err
			}
			uids[i], docs[i] = objs[i].UID, doc
		}
		_, err := p.wconn.Exec(ctx, p.sql.update, uids, docs)
		return err
	}
	cols := make([][]string, 9)
	for i := range cols {
		cols[i] = make([]string, len(objs))
	}
	for i := range objs {
		o := &objs[i]
		for c, v := range []string{o.Cluster, o.Group, o.Kind, o.Namespace, o.Name, string(o.Status), o.Message, strings.Join(labelList(o.Labels), ","), o.ResourceVersion} {
			cols[c][i] = v
		}
	}
	args := make([]any, len(cols))
	for i := range cols {
		args[i] = cols[i]
	}
	_, err := p.wconn.Exec(ctx, p.sql.update, args...)
	return err
}
