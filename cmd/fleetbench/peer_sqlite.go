package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver ("sqlite")

	"github.com/fleetgraph/fleetgraph/index"
	"github.com/fleetgraph/fleetgraph/index/indextest"
)

// sqlitePeer is an SQLite cache the way Rancher's Steve keeps one: WAL
// mode, a table of typed columns keyed by the object key with an index per
// filtered field, and a labels table (key, label, value) indexed by
// (label, value) that label selectors join. Statements are prepared once.
type sqlitePeer struct {
	path   string
	db     *sql.DB
	stmts  map[string]*sql.Stmt
	sqlite string
}

var sqliteSchema = []string{
	`CREATE TABLE objects (key TEXT PRIMARY KEY, cluster TEXT NOT NULL, grp TEXT NOT NULL, kind TEXT NOT NULL,
  namespace TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL, resource TEXT NOT NULL, uid TEXT NOT NULL,
  status TEXT NOT NULL, message TEXT NOT NULL, labels TEXT NOT NULL, created_at INTEGER NOT NULL, rv TEXT NOT NULL)`,
	`CREATE TABLE labels (key TEXT NOT NULL, label TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (key, label))`,
}

var sqliteIndexes = []string{
	`CREATE UNIQUE INDEX objects_id ON objects (cluster, grp, kind, namespace, name)`,
	`CREATE INDEX objects_kind_status_name ON objects (kind, status, name, cluster, grp, namespace)`,
	`CREATE INDEX objects_scope_kind_name ON objects (cluster, namespace, kind, name)`,
	`CREATE INDEX objects_name ON objects (name, cluster, grp, kind, namespace)`,
	`CREATE INDEX labels_label_value ON labels (label, value)`,
	`ANALYZE`,
}

const sqliteCols = `o.cluster, o.grp, o.kind, o.namespace, o.name, o.uid, o.status, o.message, o.labels, o.created_at, o.rv`

var sqliteQueries = map[string]string{
	"get": `SELECT ` + sqliteCols + ` FROM objects o WHERE cluster = ? AND grp = ? AND kind = ? AND namespace = ? AND name = ?`,
	"q2": `SELECT ` + sqliteCols + ` FROM objects o WHERE cluster = ? AND namespace = ? AND kind = ?
  ORDER BY name, cluster, grp, kind, namespace LIMIT ?`,
	"q3": `SELECT ` + sqliteCols + ` FROM objects o WHERE kind = ? AND status = ? ORDER BY name, cluster, grp, kind, namespace LIMIT ?`,
	"q4": `SELECT ` + sqliteCols + ` FROM objects o JOIN labels l ON l.key = o.key WHERE l.label = ? AND l.value = ?
  ORDER BY o.name, o.cluster, o.grp, o.kind, o.namespace LIMIT ?`,
	"q5": `SELECT 'status/' || status, count(*) FROM objects GROUP BY status
  UNION ALL SELECT 'kind/' || kind, count(*) FROM objects GROUP BY kind
  UNION ALL SELECT 'cluster/' || cluster, count(*) FROM objects GROUP BY cluster
  UNION ALL SELECT 'namespace/' || namespace, count(*) FROM objects GROUP BY namespace`,
	"q6": `SELECT ` + sqliteCols + ` FROM objects o WHERE kind = ? AND status = ?
    AND (cluster, namespace) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))
    AND kind IN (SELECT value FROM json_each(?))
  ORDER BY name, cluster, grp, kind, namespace LIMIT ?`,
	"insert":  `INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
	"label":   `INSERT INTO labels VALUES (?, ?, ?)`,
	"update":  `UPDATE objects SET status = ?, message = ?, labels = ?, rv = ? WHERE key = ?`,
	"unlabel": `DELETE FROM labels WHERE key = ?`,
}

func newSQLite(ctx context.Context, dir string) (*sqlitePeer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "fleet.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)&_pragma=cache_size(-262144)")
	if err != nil {
		return nil, err
	}
	p := &sqlitePeer{path: path, db: db, stmts: map[string]*sql.Stmt{}}
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&p.sqlite); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	for _, s := range sqliteSchema {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return nil, errors.Join(err, db.Close())
		}
	}
	return p, nil
}

func (p *sqlitePeer) name() string { return "sqlite" }

func (p *sqlitePeer) version() string {
	return "SQLite " + p.sqlite + ", modernc.org/sqlite v1.61.1 (pure Go)"
}

func (p *sqlitePeer) schema() string {
	var b strings.Builder
	b.WriteString("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-262144;\n")
	for _, s := range append(append([]string{}, sqliteSchema...), sqliteIndexes...) {
		b.WriteString(s + ";\n")
	}
	for _, n := range []string{"get", "q2", "q3", "q4", "q5", "q6", "update", "unlabel", "label"} {
		b.WriteString("-- " + n + "\n" + sqliteQueries[n] + ";\n")
	}
	return b.String()
}

func (p *sqlitePeer) close() {
	for _, s := range p.stmts {
		_ = s.Close()
	}
	_ = p.db.Close()
}

// prepareAll (re)prepares every statement. The map is written only here,
// before queries and churn run concurrently.
func (p *sqlitePeer) prepareAll(ctx context.Context) error {
	for _, s := range p.stmts {
		_ = s.Close()
	}
	p.stmts = map[string]*sql.Stmt{}
	for name, q := range sqliteQueries {
		s, err := p.db.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		p.stmts[name] = s
	}
	return nil
}

func (p *sqlitePeer) stmt(_ context.Context, name string) (*sql.Stmt, error) {
	if s := p.stmts[name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("statement %s is not prepared", name)
}

func labelsJSON(l index.Labels) string {
	if l.IsZero() {
		return "null" // as a nil map marshaled
	}
	b, _ := json.Marshal(l)
	return string(b)
}

// load inserts the fleet in transactions of batch rows, then builds the
// indexes.
func (p *sqlitePeer) load(ctx context.Context, f indextest.Fleet, batch int) error {
	if err := p.prepareAll(ctx); err != nil {
		return err
	}
	err := f.Each(batch, func(rows []index.Object) error {
		tx, err := p.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := p.insert(ctx, tx, rows); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		return tx.Commit()
	})
	if err != nil {
		return err
	}
	for _, s := range sqliteIndexes {
		if _, err := p.db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	// Prepare again now that the indexes exist, so that the plans use them.
	return p.prepareAll(ctx)
}

func (p *sqlitePeer) insert(ctx context.Context, tx *sql.Tx, rows []index.Object) error {
	ins, err := p.stmt(ctx, "insert")
	if err != nil {
		return err
	}
	lab, err := p.stmt(ctx, "label")
	if err != nil {
		return err
	}
	ins, lab = tx.StmtContext(ctx, ins), tx.StmtContext(ctx, lab)
	for i := range rows {
		o := &rows[i]
		key := keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name)
		if _, err := ins.ExecContext(ctx, key, o.Cluster, o.Group, o.Kind, o.Namespace, o.Name, o.Version, o.Resource, o.UID,
			string(o.Status), o.Message, labelsJSON(o.Labels), o.CreatedAt.Unix(), o.ResourceVersion); err != nil {
			return err
		}
		for k, v := range o.Labels.All() {
			if _, err := lab.ExecContext(ctx, key, k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// size is the database file and its WAL after a checkpoint.
func (p *sqlitePeer) size(ctx context.Context) (int64, string, error) {
	if _, err := p.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return 0, "", err
	}
	var n int64
	for _, f := range []string{p.path, p.path + "-wal"} {
		if st, err := os.Stat(f); err == nil {
			n += st.Size()
		}
	}
	return n, "database file plus WAL after a checkpoint", nil
}

// sqliteRow is a row as the client holds it, every column a page shows.
type sqliteRow struct {
	cluster, grp, kind, ns, name, uid, status, msg, labels, rv string
	created                                                    int64
}

func sqliteRowKey(r *sqliteRow) string {
	return keyString(r.cluster, r.grp, r.kind, r.ns, r.name)
}

func (p *sqlitePeer) query(ctx context.Context, name string, args ...any) (rows[sqliteRow], error) {
	out := rows[sqliteRow]{key: sqliteRowKey}
	s, err := p.stmt(ctx, name)
	if err != nil {
		return out, err
	}
	rs, err := s.QueryContext(ctx, args...)
	if err != nil {
		return out, err
	}
	defer func() { _ = rs.Close() }()
	for rs.Next() {
		var r sqliteRow
		if err := rs.Scan(&r.cluster, &r.grp, &r.kind, &r.ns, &r.name, &r.uid, &r.status, &r.msg, &r.labels, &r.created, &r.rv); err != nil {
			return out, err
		}
		out.list = append(out.list, r)
	}
	return out, rs.Err()
}

func (p *sqlitePeer) get(ctx context.Context, k index.Key) (string, error) {
	got, err := p.query(ctx, "get", k.Cluster, k.Group, k.Kind, k.Namespace, k.Name)
	if err != nil || got.len() == 0 {
		return "", err
	}
	return sqliteRowKey(&got.list[0]), nil
}

func (p *sqlitePeer) page(ctx context.Context, q pageQuery) (pageAnswer, error) {
	switch {
	case q.cluster != "":
		return p.query(ctx, "q2", q.cluster, q.namespace, q.kind, q.first)
	case q.labelKey != "":
		return p.query(ctx, "q4", q.labelKey, q.labelValue, q.first)
	case q.scope != nil:
		pairs := make([][2]string, len(q.scope.clusters))
		for i := range pairs {
			pairs[i] = [2]string{q.scope.clusters[i], q.scope.namespaces[i]}
		}
		pj, err := json.Marshal(pairs)
		if err != nil {
			return nil, err
		}
		kj, err := json.Marshal(q.scope.kinds)
		if err != nil {
			return nil, err
		}
		return p.query(ctx, "q6", q.kind, string(q.status), string(pj), string(kj), q.first)
	default:
		return p.query(ctx, "q3", q.kind, string(q.status), q.first)
	}
}

func (p *sqlitePeer) facets(ctx context.Context) (facetAnswer, error) {
	s, err := p.stmt(ctx, "q5")
	if err != nil {
		return nil, err
	}
	rs, err := s.QueryContext(ctx)
	if err != nil {
		return nil, err
	}
	return scanFacets(sqlRows{rs})
}

// sqlRows gives *sql.Rows pgx's Close, for scanFacets.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// update applies a batch in one transaction; labels are rewritten, as a
// cache that stores each object's labels in rows does.
func (p *sqlitePeer) update(ctx context.Context, objs []index.Object) error {
	upd, err := p.stmt(ctx, "update")
	if err != nil {
		return err
	}
	unl, err := p.stmt(ctx, "unlabel")
	if err != nil {
		return err
	}
	lab, err := p.stmt(ctx, "label")
	if err != nil {
		return err
	}
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	upd, unl, lab = tx.StmtContext(ctx, upd), tx.StmtContext(ctx, unl), tx.StmtContext(ctx, lab)
	for i := range objs {
		o := &objs[i]
		key := keyString(o.Cluster, o.Group, o.Kind, o.Namespace, o.Name)
		if _, err := upd.ExecContext(ctx, string(o.Status), o.Message, labelsJSON(o.Labels), o.ResourceVersion, key); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		if _, err := unl.ExecContext(ctx, key); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		for k, v := range o.Labels.All() {
			if _, err := lab.ExecContext(ctx, key, k, v); err != nil {
				return errors.Join(err, tx.Rollback())
			}
		}
	}
	return tx.Commit()
}
