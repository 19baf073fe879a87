#!/usr/bin/env python3
"""PostgreSQL transitions, schema 3 ("old": lease index on lease_until, default
fillfactor, successes-only finish statement, literal claim LIMIT) against
schema 4 ("new": running index on queue, fillfactor 70, the one finish_many
statement, bucketed claim LIMIT), at a backlog of ROWS bulk-inserted pending
tasks without ANALYZE: per-row WAL (records, full-page images, bytes) from
EXPLAIN (ANALYZE, BUFFERS, WAL) of BATCHES rounds of claim(BATCH) ->
heartbeat -> finish (success), HOT updates from pg_stat_user_tables, and
the claim's plan. The statements are copied from store/postgres/sql.rs of
each version (table names unprefixed). Each variant gets its own schema.

    PG=postgres://... scripts/pg-wal-profile.py 200000 20 96
"""
import json, subprocess, sys, time
import os
PG = os.environ.get("PG", "postgres://postgres@127.0.0.1:5432/test")
ROWS, BATCHES, B = (int(a) for a in sys.argv[1:4])

def psql(sql, schema):
    r = subprocess.run(["psql", PG, "-qAtX", "-v", "ON_ERROR_STOP=1", "-c",
                        f"SET search_path = {schema}; " + sql],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr)
    return r.stdout

TABLE = """
CREATE TABLE tasks (
id bigint PRIMARY KEY, queue text NOT NULL, kind text NOT NULL, payload jsonb NOT NULL,
state text NOT NULL DEFAULT 'pending'
  CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
priority integer NOT NULL DEFAULT 0, attempt integer NOT NULL DEFAULT 0,
max_attempts integer NOT NULL DEFAULT 1, timeout_ms bigint,
run_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
started_at timestamptz, finished_at timestamptz, lease_until timestamptz, worker text,
unique_key text, unique_forever boolean NOT NULL DEFAULT false,
cancel_requested boolean NOT NULL DEFAULT false, last_error text,
errors jsonb NOT NULL DEFAULT '[]'::jsonb, progress jsonb, job text, slot timestamptz,
claim_token bigint NOT NULL DEFAULT 0) {with_};
CREATE TABLE queues (name text PRIMARY KEY, paused boolean NOT NULL DEFAULT false);
CREATE INDEX ON tasks (queue, priority, run_at, id) WHERE state = 'pending';
CREATE UNIQUE INDEX ON tasks (unique_key)
  WHERE unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'));
CREATE INDEX ON tasks (job, slot) WHERE job IS NOT NULL;
"""
VARIANTS = {
    "old": ("", """CREATE INDEX tasks_lease ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX ON tasks (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled');"""),
    "new": ("WITH (fillfactor = 70)", """CREATE INDEX ON tasks (queue) WHERE state = 'running';
CREATE INDEX ON tasks (finished_at) WHERE state IN ('succeeded', 'failed', 'cancelled');"""),
}
NOW_US = "floor(extract(epoch FROM now()) * 1000000)::bigint"
SET = f"""SET state = 'running', attempt = attempt + 1, started_at = now(),
 lease_until = now() + 60000 * interval '1 millisecond', worker = 'w',
 claim_token = greatest(claim_token + 1, {NOW_US})"""
WHERE = """state = 'pending' AND queue = 'q' AND run_at <= now() AND NOT cancel_requested
 AND NOT EXISTS (SELECT 1 FROM queues WHERE name = 'q' AND paused)
 ORDER BY priority, run_at, id"""
def claim(v):
    if v == "old":
        return f"UPDATE tasks {SET} WHERE id IN (SELECT id FROM tasks WHERE {WHERE} LIMIT {B} FOR UPDATE SKIP LOCKED) RETURNING id, claim_token"
    bucket = 1 << (B - 1).bit_length()
    return f"UPDATE tasks {SET} WHERE id IN (SELECT id FROM (SELECT id FROM tasks WHERE {WHERE} LIMIT {bucket} FOR UPDATE SKIP LOCKED) AS c LIMIT {B}) RETURNING id, claim_token"
def arr(xs):
    return "ARRAY[" + ",".join(map(str, xs)) + "]::int8[]"
def heartbeat(ids, toks):
    return f"""UPDATE tasks AS t SET lease_until = now() + 60000 * interval '1 millisecond'
 FROM (SELECT DISTINCT id, token FROM UNNEST({arr(ids)}, {arr(toks)}) AS u(id, token)) AS c
 WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running'"""
def finish(v, ids, toks):
    if v == "old":
        return f"""UPDATE tasks AS t SET state = 'succeeded', finished_at = now(), lease_until = NULL
 FROM UNNEST({arr(ids)}, {arr(toks)}) AS c(id, token)
 WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running' RETURNING t.id"""
    return FINISH_NEW.replace("$1", arr(ids)).replace("$2", arr(toks)).replace(
        "$3", "array_fill('s'::text, ARRAY[%d])" % len(ids)).replace(
        "$4", "array_fill(NULL::text, ARRAY[%d])" % len(ids)).replace(
        "$5", "array_fill(NULL::int8, ARRAY[%d])" % len(ids)).replace(
        "$6", "'chan'").replace("$7", "'cancel requested'")
FINISH_NEW = """WITH c AS (SELECT DISTINCT ON (id) * FROM UNNEST($1, $2, $3::text[], $4::text[], $5::int8[]) AS c(id, token, kind, msg, retry_ms)),
d AS (SELECT NULL::int8 AS id, NULL::int8 AS token WHERE false),
u AS (UPDATE tasks AS t SET
  state = CASE c.kind WHEN 's' THEN 'succeeded' WHEN 'c' THEN 'cancelled'
    WHEN 'h' THEN CASE WHEN t.cancel_requested THEN 'cancelled' ELSE 'pending' END
    ELSE CASE WHEN (c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts AND NOT t.cancel_requested) THEN 'pending'
      WHEN (c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts AND t.cancel_requested) THEN 'cancelled' ELSE 'failed' END END,
  finished_at = CASE c.kind WHEN 'h' THEN CASE WHEN t.cancel_requested THEN now() END
    WHEN 'f' THEN CASE WHEN (c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts AND NOT t.cancel_requested) THEN NULL ELSE now() END
    ELSE now() END,
  lease_until = NULL,
  last_error = CASE c.kind WHEN 's' THEN t.last_error WHEN 'c' THEN c.msg
    WHEN 'h' THEN CASE WHEN t.cancel_requested THEN $7 ELSE t.last_error END
    ELSE CASE WHEN (c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts AND t.cancel_requested) THEN 'cancel requested: ' || c.msg ELSE c.msg END END,
  errors = CASE WHEN c.kind = 'f' THEN errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'error', c.msg)) ELSE t.errors END,
  run_at = CASE WHEN (c.kind = 'f' AND c.retry_ms IS NOT NULL AND t.attempt < t.max_attempts AND NOT t.cancel_requested) THEN now() + c.retry_ms * interval '1 millisecond' ELSE t.run_at END,
  attempt = CASE WHEN c.kind = 'h' THEN t.attempt - 1 ELSE t.attempt END
FROM c
WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running'
RETURNING t.id, t.claim_token AS token, t.queue, t.state, t.run_at, c.kind),
n AS (SELECT count(pg_notify($6, CASE WHEN u.kind = 'h' THEN u.queue ELSE u.queue || chr(10) || ceil(extract(epoch FROM run_at) * 1000000)::int8 END)) AS n FROM u WHERE u.state = 'pending')
SELECT r.id, r.token FROM (SELECT id, token FROM d UNION ALL SELECT id, token FROM u) AS r CROSS JOIN n
"""

def wal(plan):
    p = json.loads(plan)[0]["Plan"]
    return p.get("WAL Records", 0), p.get("WAL FPI", 0), p.get("WAL Bytes", 0), json.loads(plan)[0]["Execution Time"]

res = {}
for v, (with_, idx) in VARIANTS.items():
    s = f"h3prof_{v}"
    psql(f"DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s};", "public")
    psql(TABLE.format(with_=with_) + idx, s)
    out = psql(f"""EXPLAIN (ANALYZE, WAL, FORMAT JSON) INSERT INTO tasks (id, queue, kind, payload)
        SELECT i, 'q', 'k', '{{}}'::jsonb FROM generate_series(1, {ROWS}) AS i""", s)
    r = {"insert": wal(out)}
    tot = {"claim": [0, 0, 0, 0], "heartbeat": [0, 0, 0, 0], "finish": [0, 0, 0, 0]}
    hot0 = int(psql("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks' AND schemaname = current_schema()", s) or 0)
    for _ in range(BATCHES):
        out = psql("SET plan_cache_mode = auto; EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + claim(v), s)
        for i, x in enumerate(wal(out)): tot["claim"][i] += x
        rows = psql(f"SELECT id, claim_token FROM tasks WHERE state = 'running' ORDER BY id", s).split()
        ids = [int(x.split("|")[0]) for x in rows]; toks = [int(x.split("|")[1]) for x in rows]
        out = psql("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + heartbeat(ids, toks), s)
        for i, x in enumerate(wal(out)): tot["heartbeat"][i] += x
        out = psql("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + finish(v, ids, toks), s)
        for i, x in enumerate(wal(out)): tot["finish"][i] += x
    time.sleep(1.5)
    hot = int(psql("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks' AND schemaname = current_schema()", s) or 0) - hot0
    n = BATCHES * B
    print(f"{v}: insert per row: records {r['insert'][0]/ROWS:.2f} fpi {r['insert'][1]/ROWS:.3f} bytes {r['insert'][2]/ROWS:.0f}; ms total {r['insert'][3]:.0f}")
    for k, t in tot.items():
        print(f"{v}: {k} per row: records {t[0]/n:.2f} fpi {t[1]/n:.3f} bytes {t[2]/n:.0f}; ms per batch {t[3]/BATCHES:.2f}")
    print(f"{v}: HOT updates {hot} of {3*n} updates")
    print(psql("SELECT pg_size_pretty(pg_relation_size('tasks')), (SELECT string_agg(indexrelid::regclass || '=' || pg_size_pretty(pg_relation_size(indexrelid)), ' ') FROM pg_index WHERE indrelid = 'tasks'::regclass)", s).strip())
    plan = psql("EXPLAIN (ANALYZE, BUFFERS, WAL) " + claim(v), s)
    print(plan)
    psql(f"DROP SCHEMA {s} CASCADE", "public")
