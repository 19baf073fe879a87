//! The PostgreSQL backend.
//!
//! Every operation is one SQL statement, or one short transaction holding row
//! locks, and every time comparison uses the server's `now()` (DESIGN.md C1).
//! Durations travel as milliseconds (`$n * interval '1 millisecond'`).
//!
//! Tables (all prefixed by [`StoreOptions::prefix`], default `baton_`):
//!
//! - `<p>meta`: the schema version.
//! - `<p>locks`: one row per lock name; never deleted, so tokens keep rising.
//! - `<p>tasks`: the queue. A partial index on the pending set
//!   `(queue, priority, run_at, id) WHERE state = 'pending'` serves the claim,
//!   which is an `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)`
//!   with its `LIMIT` written as a literal so a generic plan cannot flip it to
//!   a sequential scan.
//! - `<p>jobs`: one cursor row per schedule job.
//!
//! New pending work is announced with `pg_notify('<p>tasks', queue)` inside
//! the enqueueing transaction (`queue\n<µs>` for work due later: see
//! [`Wake`]); [`Backend::subscribe`] listens on that channel
//! with a [`PgListener`] that reconnects with backoff. Notifications are a
//! hint only; workers poll as well.
//!
//! [`enqueue_in`] lets users enqueue inside their own transaction (the
//! transactional outbox): the tasks and the notification appear at their
//! commit, or not at all.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, Row};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::SlotRecord;
use super::{
    ms, Acquire, Advanced, AttemptError, Backend, CancelOutcome, Claim, ClaimRequest, Enqueued,
    FencingToken, Finish, Heartbeat, JobState, LockInfo, LockRequest, NewTask, Overlap, QueueStats,
    Rescued, RunAt, SlotAdvance, StoreOptions, Task, TaskFilter, TaskInfo, TaskState, Wake,
    CANCEL_REQUESTED, LEASE_EXPIRED, OVERLAP_SKIPPED,
};
use crate::error::StoreError;

/// The version [`Names::schema_sql`] creates; [`UPGRADES`] take it from there.
const BASE_VERSION: i32 = 1;

/// The schema version this build creates and understands: the base plus
/// one per upgrade step.
const SCHEMA_VERSION: i32 = BASE_VERSION + UPGRADES.len() as i32;

/// One schema upgrade step: SQL (one or more idempotent statements) taking
/// the schema from version `n` to `n + 1`, where `n - BASE_VERSION` is the
/// step's index in [`UPGRADES`].
type Upgrade = fn(&Names) -> String;

/// The upgrade steps, in order. Each runs once per prefix, in the
/// migration's transaction under its advisory lock, together with the
/// version bump. Add a step at the end (and nothing else:
/// [`SCHEMA_VERSION`] follows).
const UPGRADES: &[Upgrade] = &[
    // 1 → 2: per-task claim tokens; a pending task whose cancel was
    // requested (possible before 2) is cancelled.
    upgrade_claim_token,
];

fn upgrade_claim_token(n: &Names) -> String {
    let t = &n.tasks;
    format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_token bigint NOT NULL DEFAULT 0; \
         UPDATE {t} SET state = 'cancelled', finished_at = now(), \
             last_error = '{CANCEL_REQUESTED}' \
         WHERE state = 'pending' AND cancel_requested;"
    )
}

/// The store's clock in microseconds since the epoch: the floor of every
/// fencing token.
const NOW_US: &str = "floor(extract(epoch FROM now()) * 1000000)::bigint";

/// The default table prefix.
const DEFAULT_PREFIX: &str = "baton_";

/// Rows per `INSERT … SELECT FROM UNNEST(…)` statement when enqueueing.
const INSERT_CHUNK: usize = 10_000;

/// Durations are clamped to this (about 100 years) so `now() + d` never
/// leaves the timestamp range.
const MAX_MS: i64 = 100 * 366 * 24 * 3_600 * 1_000;

/// How long connecting (or waiting for a pooled connection) may take before
/// the store counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled connection idle at least this long is pinged before it is
/// handed out. Busier connections are not: sqlx's default pings on every
/// checkout, one extra round trip in front of every statement. A connection
/// that broke while busy fails its next statement once (the caller sees
/// [`StoreError::Unavailable`]) and is then dropped from the pool.
const IDLE_PING: Duration = Duration::from_secs(1);

/// Columns read into a [`TaskInfo`].
const TASK_COLS: &str = "id, queue, kind, payload, state, priority, attempt, max_attempts, \
     timeout_ms, run_at, created_at, started_at, finished_at, lease_until, worker, unique_key, \
     cancel_requested, last_error, errors, progress, job, slot";

/// The partial-index predicate under which a unique key is taken.
const UNIQUE_PRED: &str =
    "unique_key IS NOT NULL AND (unique_forever OR state IN ('pending', 'running'))";

/// A duration as clamped milliseconds for binding.
fn dur(d: Duration) -> i64 {
    ms(d).min(MAX_MS)
}

/// Quoted, prefixed object names.
#[derive(Debug, Clone)]
struct Names {
    prefix: String,
    meta: String,
    locks: String,
    tasks: String,
    jobs: String,
    /// The task id sequence, as a quoted identifier inside a string literal
    /// (for `nextval('…')`).
    seq_lit: String,
    /// The notification channel (a plain string, used with `pg_notify`).
    chan: String,
}

impl Names {
    fn new(prefix: Option<&str>) -> Names {
        let p = prefix.unwrap_or(DEFAULT_PREFIX).to_string();
        Names {
            meta: format!("\"{p}meta\""),
            locks: format!("\"{p}locks\""),
            tasks: format!("\"{p}tasks\""),
            jobs: format!("\"{p}jobs\""),
            seq_lit: format!("'\"{p}tasks_id_seq\"'"),
            chan: format!("{p}tasks"),
            prefix: p,
        }
    }

    fn schema_sql(&self) -> String {
        let p = &self.prefix;
        let (meta, locks, tasks, jobs) = (&self.meta, &self.locks, &self.tasks, &self.jobs);
        format!(
            r#"
CREATE TABLE IF NOT EXISTS {meta} (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS {locks} (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    token      bigint NOT NULL,
    locked_at  timestamptz NOT NULL,
    lock_until timestamptz NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS "{p}tasks_id_seq";
CREATE TABLE IF NOT EXISTS {tasks} (
    id               bigint PRIMARY KEY DEFAULT nextval('"{p}tasks_id_seq"'),
    queue            text NOT NULL,
    kind             text NOT NULL,
    payload          jsonb NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    attempt          integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 1,
    timeout_ms       bigint,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_until      timestamptz,
    worker           text,
    unique_key       text,
    unique_forever   boolean NOT NULL DEFAULT false,
    cancel_requested boolean NOT NULL DEFAULT false,
    last_error       text,
    errors           jsonb NOT NULL DEFAULT '[]'::jsonb,
    progress         jsonb,
    job              text,
    slot             timestamptz
);
ALTER SEQUENCE "{p}tasks_id_seq" OWNED BY {tasks}.id;
CREATE INDEX IF NOT EXISTS "{p}tasks_claim" ON {tasks} (queue, priority, run_at, id)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS "{p}tasks_lease" ON {tasks} (lease_until)
    WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS "{p}tasks_unique" ON {tasks} (unique_key)
    WHERE {UNIQUE_PRED};
CREATE INDEX IF NOT EXISTS "{p}tasks_prune" ON {tasks} (finished_at)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX IF NOT EXISTS "{p}tasks_job" ON {tasks} (job, slot)
    WHERE job IS NOT NULL;
CREATE TABLE IF NOT EXISTS {jobs} (
    name      text PRIMARY KEY,
    last_slot timestamptz,
    paused    boolean NOT NULL DEFAULT false
);
"#
        )
    }
}

/// The PostgreSQL backend: a connection pool plus the lazily started
/// notification listener.
struct PgBackend {
    pool: PgPool,
    connect: PgConnectOptions,
    names: Arc<Names>,
    wake: broadcast::Sender<Wake>,
    listener: OnceLock<()>,
    shutdown: CancellationToken,
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connect to PostgreSQL and return the backend. The pool holds at most
/// `opts.max_connections` connections; an unreachable server fails within
/// `opts.connect_timeout` with [`StoreError::Unavailable`], and every session
/// runs with `statement_timeout` and `idle_in_transaction_session_timeout`
/// set to `opts.statement_timeout`. Migrations are not run here
/// (the caller runs [`Backend::migrate`] when `opts.migrate` is set).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    let statement_ms = opts.statement_timeout.as_millis().max(1);
    // Server-side bounds on every session: a statement, and a transaction
    // left idle by a client that went away, end after `statement_timeout`.
    let connect = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::Config(format!("store URL {:?}: {e}", super::redact(url))))?
        .options([
            ("statement_timeout", statement_ms),
            ("idle_in_transaction_session_timeout", statement_ms),
        ]);
    let pool = PgPoolOptions::new()
        .max_connections(opts.max_connections.max(1))
        .acquire_timeout(opts.connect_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_PING {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(connect.clone())
        .await?;
    let (wake, _) = broadcast::channel(1024);
    Ok(Arc::new(PgBackend {
        pool,
        connect,
        names: Arc::new(Names::new(opts.prefix.as_deref())),
        wake,
        listener: OnceLock::new(),
        shutdown: CancellationToken::new(),
    }))
}

/// Enqueue tasks on the caller's connection, typically inside the caller's
/// own transaction (the transactional outbox): the tasks, and the
/// notification that wakes workers, become visible at the caller's commit
/// and vanish with a rollback.
///
/// `prefix` must be the table prefix the store was opened with (`None` for
/// the default `baton_`). Unique keys behave as in [`Backend::enqueue`].
/// Under `REPEATABLE READ` or `SERIALIZABLE` a key taken by a concurrent
/// transaction may surface as [`StoreError::Conflict`].
pub async fn enqueue_in(
    conn: &mut PgConnection,
    prefix: Option<&str>,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    if let Some(p) = prefix {
        super::validate_prefix(p)?;
    }
    let names = Names::new(prefix);
    insert_tasks(conn, &names, tasks, None).await
}

/// Insert tasks in order on `conn` (the shared code of [`enqueue_in`],
/// [`Backend::enqueue`] and [`Backend::job_advance`]). With `skipped`, the
/// tasks are inserted directly as `cancelled` with that reason.
///
/// Returns one [`Enqueued`] per task. Due work is announced by the insert
/// statement itself.
async fn insert_tasks(
    conn: &mut PgConnection,
    n: &Names,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<Vec<Enqueued>, StoreError> {
    let mut out: Vec<Option<Enqueued>> = vec![None; tasks.len()];
    // Indices still to insert; a second round only happens when a key's
    // holder finished between our conflict and our look-up.
    let mut todo: Vec<usize> = (0..tasks.len()).collect();
    let sql_keyed = insert_sql(n, true);
    let sql_plain = insert_sql(n, false);
    let lookup = format!(
        "SELECT unique_key, id FROM {} WHERE unique_key = ANY($1) AND {UNIQUE_PRED}",
        n.tasks
    );
    for _round in 0..8 {
        if todo.is_empty() {
            break;
        }
        let mut conflicted: Vec<usize> = Vec::new();
        for chunk in todo.chunks(INSERT_CHUNK) {
            let mut queue = Vec::with_capacity(chunk.len());
            let mut kind = Vec::with_capacity(chunk.len());
            let mut payload = Vec::with_capacity(chunk.len());
            let mut priority = Vec::with_capacity(chunk.len());
            let mut run_at_abs: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(chunk.len());
            let mut delay_ms: Vec<Option<i64>> = Vec::with_capacity(chunk.len());
            let mut max_attempts = Vec::with_capacity(chunk.len());
            let mut timeout_ms: Vec<Option<i64>> = Vec::with_capacity(chunk.len());
            let mut unique_key: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            let mut unique_forever = Vec::with_capacity(chunk.len());
            let mut job: Vec<Option<&str>> = Vec::with_capacity(chunk.len());
            let mut slot: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(chunk.len());
            for &i in chunk {
                let t = &tasks[i];
                queue.push(t.queue.as_str());
                kind.push(t.kind.as_str());
                payload.push(&t.payload);
                priority.push(t.priority);
                match t.run_at {
                    RunAt::Now => {
                        run_at_abs.push(None);
                        delay_ms.push(None);
                    }
                    RunAt::Delay(d) => {
                        run_at_abs.push(None);
                        delay_ms.push(Some(dur(d)));
                    }
                    RunAt::At(at) => {
                        run_at_abs.push(Some(at));
                        delay_ms.push(None);
                    }
                }
                max_attempts.push(i32::try_from(t.max_attempts).unwrap_or(i32::MAX).max(1));
                timeout_ms.push(t.timeout.map(dur));
                unique_key.push(t.unique_key.as_deref());
                unique_forever.push(t.unique_forever);
                job.push(t.job.as_deref());
                slot.push(t.slot);
            }
            // Speculative insertion (ON CONFLICT) costs, so chunks without
            // keys use a plain INSERT.
            let sql = if unique_key.iter().any(Option::is_some) {
                &sql_keyed
            } else {
                &sql_plain
            };
            let rows = sqlx::query(sql)
                .bind(&queue)
                .bind(&kind)
                .bind(&payload)
                .bind(&priority)
                .bind(&run_at_abs)
                .bind(&delay_ms)
                .bind(&max_attempts)
                .bind(&timeout_ms)
                .bind(&unique_key)
                .bind(&unique_forever)
                .bind(&job)
                .bind(&slot)
                .bind(skipped.is_some())
                .bind(skipped)
                .bind(&n.chan)
                .fetch_all(&mut *conn)
                .await?;
            if rows.len() != chunk.len() {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} rows back for {} tasks",
                    rows.len(),
                    chunk.len()
                )));
            }
            for (row, &i) in rows.iter().zip(chunk) {
                let id: i64 = row.try_get(0)?;
                let inserted: bool = row.try_get(1)?;
                if inserted {
                    out[i] = Some(Enqueued { id, inserted: true });
                } else {
                    conflicted.push(i);
                }
            }
        }
        todo.clear();
        if conflicted.is_empty() {
            break;
        }
        // Conflicts: find the tasks that hold the keys (a new statement, so a
        // new snapshot that sees the committed holder under READ COMMITTED).
        let keys: Vec<&str> = conflicted
            .iter()
            .filter_map(|&i| tasks[i].unique_key.as_deref())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let rows = sqlx::query(&lookup)
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await?;
        let mut holders: HashMap<String, i64> = HashMap::with_capacity(rows.len());
        for row in rows {
            holders.insert(row.try_get(0)?, row.try_get(1)?);
        }
        for i in conflicted {
            match tasks[i].unique_key.as_deref().and_then(|k| holders.get(k)) {
                Some(&id) => {
                    out[i] = Some(Enqueued {
                        id,
                        inserted: false,
                    })
                }
                None => todo.push(i),
            }
        }
    }
    if !todo.is_empty() {
        return Err(StoreError::Conflict(
            "enqueue: unique keys kept changing hands; try again".into(),
        ));
    }
    let out = out
        .into_iter()
        .map(|e| e.ok_or_else(|| StoreError::Corrupt("enqueue: task without result".into())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(out)
}

/// A wake-up's due time for a row's `run_at` (see [`super::Wake::parse`]):
/// microseconds since the epoch, rounded up so a timer armed for it never
/// fires before the row is due.
const WAKE_AT: &str = "ceil(extract(epoch FROM run_at) * 1000000)::int8";

/// The chunked insert: ids are drawn from the sequence in input order inside
/// a materialized CTE, so each result row maps back to its input by
/// ordinality whether it was inserted or met a unique key. The same
/// statement announces new pending work with `pg_notify` (sent at commit, so
/// inside a caller's transaction it waits for that commit): per queue once
/// for rows due now, and once with the earliest `run_at` of rows due later.
fn insert_sql(n: &Names, keyed: bool) -> String {
    let (tasks, seq) = (&n.tasks, &n.seq_lit);
    let on_conflict = if keyed {
        format!("ON CONFLICT (unique_key) WHERE {UNIQUE_PRED} DO NOTHING")
    } else {
        String::new()
    };
    format!(
        r#"WITH input AS MATERIALIZED (
    SELECT nextval({seq}) AS id, t.*
    FROM UNNEST($1::text[], $2::text[], $3::jsonb[], $4::int4[], $5::timestamptz[],
                $6::int8[], $7::int4[], $8::int8[], $9::text[], $10::bool[], $11::text[],
                $12::timestamptz[])
         WITH ORDINALITY AS t(queue, kind, payload, priority, run_at_abs, delay_ms,
                              max_attempts, timeout_ms, unique_key, unique_forever, job,
                              slot, ord)
),
ins AS (
    INSERT INTO {tasks} (id, queue, kind, payload, state, priority, run_at, max_attempts,
                         timeout_ms, unique_key, unique_forever, job, slot, last_error,
                         finished_at)
    SELECT id, queue, kind, payload,
           CASE WHEN $13::bool THEN 'cancelled' ELSE 'pending' END,
           priority,
           coalesce(run_at_abs, now() + coalesce(delay_ms, 0) * interval '1 millisecond'),
           max_attempts, timeout_ms, unique_key, unique_forever, job, slot,
           CASE WHEN $13::bool THEN $14::text END,
           CASE WHEN $13::bool THEN now() END
    FROM input
    ORDER BY ord
    {on_conflict}
    RETURNING id, queue, state = 'pending' AS pending, run_at,
              (state = 'pending' AND run_at <= now()) AS due
),
woke AS (
    SELECT count(pg_notify($15::text, q.msg)) AS n
    FROM (SELECT queue AS msg FROM ins WHERE due GROUP BY queue
          UNION ALL
          SELECT queue || chr(10) || {WAKE_AT}
          FROM (SELECT queue, min(run_at) AS run_at FROM ins
                WHERE pending AND NOT due GROUP BY queue) AS f) AS q
)
SELECT input.id, ins.id IS NOT NULL AS inserted
FROM input LEFT JOIN ins ON ins.id = input.id CROSS JOIN woke
ORDER BY input.ord"#
    )
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn to_u32(v: i32, what: &str) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} is negative")))
}

fn to_dur(v: Option<i64>) -> Result<Option<Duration>, StoreError> {
    v.map(|v| {
        u64::try_from(v)
            .map(Duration::from_millis)
            .map_err(|_| StoreError::Corrupt(format!("timeout {v} ms is negative")))
    })
    .transpose()
}

fn token_of(v: i64) -> Result<FencingToken, StoreError> {
    u64::try_from(v)
        .map(FencingToken)
        .map_err(|_| StoreError::Corrupt(format!("token {v} is negative")))
}

fn token_arg(t: FencingToken) -> i64 {
    // A token above i64::MAX was never granted here, so it matches nothing.
    i64::try_from(t.0).unwrap_or(-1)
}

fn lock_info(row: &PgRow) -> Result<LockInfo, StoreError> {
    Ok(LockInfo {
        name: row.try_get("name")?,
        holder: row.try_get("holder")?,
        token: token_of(row.try_get("token")?)?,
        locked_at: row.try_get("locked_at")?,
        lock_until: row.try_get("lock_until")?,
        held: row.try_get("held")?,
        now: row.try_get("now")?,
    })
}

fn task_info(row: &PgRow) -> Result<TaskInfo, StoreError> {
    let state: String = row.try_get("state")?;
    let errors: serde_json::Value = row.try_get("errors")?;
    let errors: Vec<AttemptError> =
        serde_json::from_value(errors).map_err(|e| corrupt("task errors", e))?;
    Ok(TaskInfo {
        id: row.try_get("id")?,
        queue: row.try_get("queue")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        state: TaskState::from_str(&state)?,
        priority: row.try_get("priority")?,
        attempt: to_u32(row.try_get("attempt")?, "attempt")?,
        max_attempts: to_u32(row.try_get("max_attempts")?, "max_attempts")?,
        timeout: to_dur(row.try_get("timeout_ms")?)?,
        run_at: row.try_get("run_at")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
        lease_until: row.try_get("lease_until")?,
        worker: row.try_get("worker")?,
        unique_key: row.try_get("unique_key")?,
        cancel_requested: row.try_get("cancel_requested")?,
        last_error: row.try_get("last_error")?,
        errors,
        progress: row.try_get("progress")?,
        job: row.try_get("job")?,
        slot: row.try_get("slot")?,
    })
}

fn claimed_task(row: &PgRow) -> Result<Task, StoreError> {
    Ok(Task {
        id: row.try_get("id")?,
        queue: row.try_get("queue")?,
        kind: row.try_get("kind")?,
        payload: row.try_get("payload")?,
        priority: row.try_get("priority")?,
        attempt: to_u32(row.try_get("attempt")?, "attempt")?,
        token: token_of(row.try_get("claim_token")?)?,
        max_attempts: to_u32(row.try_get("max_attempts")?, "max_attempts")?,
        timeout: to_dur(row.try_get("timeout_ms")?)?,
        run_at: row.try_get("run_at")?,
        lease_until: row.try_get("lease_until")?,
        job: row.try_get("job")?,
        slot: row.try_get("slot")?,
    })
}

fn job_state(row: &PgRow) -> Result<JobState, StoreError> {
    Ok(JobState {
        name: row.try_get("name")?,
        last_slot: row.try_get("last_slot")?,
        paused: row.try_get("paused")?,
    })
}

/// The SQL fragment that appends `{attempt, at, error}` (error text in `$e`)
/// to `errors`, with `at` as RFC 3339 UTC.
fn append_error(e: &str) -> String {
    format!(
        "errors || jsonb_build_array(jsonb_build_object('attempt', attempt, 'at', \
         to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), 'error', {e}))"
    )
}

/// The claim statement. `LIMIT` is a literal: with a `$n` there, a generic
/// plan assumes it fetches 10% of the table and can prefer a sequential scan
/// plus sort over the index walk.
/// The claim. With `capped`, `$4` is the queue's cluster-wide cap on
/// running tasks (the caller holds the queue's advisory lock).
fn claim_sql(n: &Names, limit: u32, capped: bool) -> String {
    let t = &n.tasks;
    let limit = if capped {
        format!(
            "greatest(0, least({limit}, $4 - ( \
                 SELECT count(*) FROM {t} WHERE state = 'running' AND queue = $1)))"
        )
    } else {
        limit.to_string()
    };
    format!(
        "UPDATE {t} SET state = 'running', attempt = attempt + 1, started_at = now(), \
             lease_until = now() + $3 * interval '1 millisecond', worker = $2, \
             claim_token = greatest(claim_token + 1, {NOW_US}) \
         WHERE id IN ( \
             SELECT id FROM {t} \
             WHERE state = 'pending' AND queue = $1 AND run_at <= now() \
                 AND NOT cancel_requested \
             ORDER BY priority, run_at, id \
             LIMIT {limit} \
             FOR UPDATE SKIP LOCKED) \
         RETURNING id, queue, kind, payload, priority, attempt, claim_token, max_attempts, \
             timeout_ms, run_at, lease_until, job, slot"
    )
}

async fn listen_loop(
    pool: PgPool,
    chan: String,
    wake: broadcast::Sender<Wake>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    let max_backoff = Duration::from_secs(10);
    loop {
        let attempt = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen(&chan).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let mut listener = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = attempt => match r {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(channel = %chan, error = %e, retry_in = ?backoff,
                        "postgres LISTEN failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(max_backoff);
                    continue;
                }
            }
        };
        tracing::debug!(channel = %chan, "postgres LISTEN established");
        backoff = Duration::from_millis(100);
        loop {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listener.try_recv() => r,
            };
            match r {
                Ok(Some(note)) => {
                    // No receivers is fine: nobody is waiting right now.
                    let _ = wake.send(Wake::parse(note.payload()));
                }
                Ok(None) => {
                    tracing::warn!(channel = %chan,
                        "postgres LISTEN connection lost; reconnected (notifications may have been missed)");
                }
                Err(e) => {
                    tracing::warn!(channel = %chan, error = %e, retry_in = ?backoff,
                        "postgres LISTEN connection failed; reconnecting");
                    break;
                }
            }
        }
        drop(listener);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

#[async_trait]
impl Backend for PgBackend {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let n = &*self.names;
        // Fast path: a schema already at this version needs no DDL. (Running
        // `CREATE INDEX IF NOT EXISTS` anyway takes table locks that can
        // deadlock with live workers' transactions.) A missing meta table is
        // an error here and falls through to the full migration.
        let current: Result<Option<String>, sqlx::Error> = sqlx::query_scalar(&format!(
            "SELECT value FROM {} WHERE key = 'schema_version'",
            n.meta
        ))
        .fetch_optional(&self.pool)
        .await;
        if let Ok(Some(v)) = &current {
            if v.parse::<i32>() == Ok(SCHEMA_VERSION) {
                return Ok(());
            }
        }
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("baton-migrate:{}", n.prefix))
            .execute(&mut *tx)
            .await?;
        let schema = n.schema_sql();
        sqlx::Executor::execute(&mut *tx, schema.as_str()).await?;
        sqlx::query(&format!(
            "INSERT INTO {} (key, value) VALUES ('schema_version', $1) ON CONFLICT (key) DO NOTHING",
            n.meta
        ))
        .bind(BASE_VERSION.to_string())
        .execute(&mut *tx)
        .await?;
        let v: String = sqlx::query_scalar(&format!(
            "SELECT value FROM {} WHERE key = 'schema_version'",
            n.meta
        ))
        .fetch_one(&mut *tx)
        .await?;
        let v: i32 = v
            .parse()
            .map_err(|e| corrupt(&format!("schema version {v:?}"), e))?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::Config(format!(
                "tables with prefix {:?} have schema version {v}, newer than this build's {SCHEMA_VERSION}; upgrade baton",
                n.prefix
            )));
        }
        for from in v.max(BASE_VERSION)..SCHEMA_VERSION {
            let step = usize::try_from(from - BASE_VERSION)
                .ok()
                .and_then(|i| UPGRADES.get(i))
                .ok_or_else(|| corrupt("schema version", from))?;
            sqlx::Executor::execute(&mut *tx, step(n).as_str()).await?;
            sqlx::query(&format!(
                "UPDATE {} SET value = $1 WHERE key = 'schema_version'",
                n.meta
            ))
            .bind((from + 1).to_string())
            .execute(&mut *tx)
            .await?;
            tracing::info!(
                prefix = %n.prefix,
                "postgres: upgraded the baton schema from version {from} to {}",
                from + 1
            );
        }
        tx.commit().await?;
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await?)
    }

    // ---- locks -------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        let l = &self.names.locks;
        // A live lease in the statement's snapshot answers Busy with a pure
        // read. Otherwise the grant is an UPDATE of a row we could lock
        // without waiting (`FOR UPDATE SKIP LOCKED`, rechecked on the latest
        // version under that lock: that is what makes it exclusive), or the
        // `INSERT … ON CONFLICT DO NOTHING` of a new name. Contenders never
        // queue behind each other's row locks (and commits).
        let sql = format!(
            "WITH cur AS ( \
                 SELECT name, holder, token, locked_at, lock_until FROM {l} WHERE name = $1), \
             up AS ( \
                 UPDATE {l} AS l SET holder = $2, token = greatest(l.token + 1, {NOW_US}), \
                     locked_at = now(), \
                     lock_until = now() + $3 * interval '1 millisecond' \
                 WHERE l.name = $1 AND l.name IN ( \
                     SELECT name FROM {l} WHERE name = $1 AND lock_until <= now() \
                     FOR UPDATE SKIP LOCKED) \
                 RETURNING name, holder, token, locked_at, lock_until), \
             ins AS ( \
                 INSERT INTO {l} (name, holder, token, locked_at, lock_until) \
                 SELECT $1, $2, {NOW_US}, now(), now() + $3 * interval '1 millisecond' \
                 WHERE NOT EXISTS (SELECT 1 FROM cur) \
                 ON CONFLICT (name) DO NOTHING \
                 RETURNING name, holder, token, locked_at, lock_until), \
             g AS (SELECT * FROM up UNION ALL SELECT * FROM ins) \
             SELECT true AS granted, name, holder, token, locked_at, lock_until, \
                 true AS held, now() AS now FROM g \
             UNION ALL \
             SELECT false, name, holder, token, locked_at, lock_until, lock_until > now(), now() \
                 FROM cur WHERE NOT EXISTS (SELECT 1 FROM g)"
        );
        // When our snapshot and the latest version disagree (a concurrent
        // grant or release), try again (bounded) rather than report a lapsed
        // holder as busy.
        let mut last = None;
        for _ in 0..3 {
            let row = sqlx::query(&sql)
                .bind(req.name)
                .bind(req.holder)
                .bind(dur(req.at_most))
                .fetch_optional(&self.pool)
                .await?;
            if let Some(row) = row {
                if row.try_get::<bool, _>("granted")? {
                    return Ok(Acquire::Granted {
                        token: token_of(row.try_get("token")?)?,
                        locked_at: row.try_get("locked_at")?,
                        lock_until: row.try_get("lock_until")?,
                    });
                }
                let info = lock_info(&row)?;
                if info.held {
                    return Ok(Acquire::Busy(info));
                }
            }
            match self.lock_get(req.name).await? {
                Some(info) if info.held => return Ok(Acquire::Busy(info)),
                other => last = other,
            }
        }
        match last {
            Some(info) => Ok(Acquire::Busy(info)),
            None => Err(StoreError::Backend(format!(
                "lock {:?}: neither granted nor found",
                req.name
            ))),
        }
    }

    async fn lock_extend(
        &self,
        name: &str,
        token: FencingToken,
        at_most: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(sqlx::query_scalar(&format!(
            "UPDATE {} SET lock_until = now() + $3 * interval '1 millisecond' \
             WHERE name = $1 AND token = $2 AND lock_until > now() RETURNING lock_until",
            self.names.locks
        ))
        .bind(name)
        .bind(token_arg(token))
        .bind(dur(at_most))
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn lock_release(
        &self,
        name: &str,
        token: FencingToken,
        at_least: Duration,
    ) -> Result<bool, StoreError> {
        // The release commits without waiting for its WAL flush
        // (`synchronous_commit = off` for this one transaction). That is
        // safe: a release lost in a server crash leaves the row as granted
        // or last extended, whose `lock_until` is never earlier than the
        // release's, so the lease just lasts until then, as if the holder
        // had died. It never shortens a lease and never touches the token,
        // and the next durable commit (any grant) flushes it anyway. Grants
        // and extensions stay synchronous: losing one would let a second
        // holder in (or reissue a token) after a crash.
        let r = sqlx::query(&format!(
            "UPDATE {} AS l \
             SET lock_until = greatest(now(), l.locked_at + $3 * interval '1 millisecond') \
             FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
             WHERE l.name = $1 AND l.token = $2 AND l.lock_until > now()",
            self.names.locks
        ))
        .bind(name)
        .bind(token_arg(token))
        .bind(dur(at_least))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT name, holder, token, locked_at, lock_until, lock_until > now() AS held, \
             now() AS now FROM {} WHERE name = $1",
            self.names.locks
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(lock_info).transpose()
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT name, holder, token, locked_at, lock_until, lock_until > now() AS held, \
             now() AS now FROM {} ORDER BY name",
            self.names.locks
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(lock_info).collect()
    }

    // ---- tasks -------------------------------------------------------------

    async fn enqueue(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        // One statement is atomic on its own: a single task, or one chunk
        // of tasks without unique keys (no conflict, so no second round),
        // needs no transaction around it, which saves two round trips.
        if tasks.len() == 1
            || (tasks.len() <= INSERT_CHUNK && tasks.iter().all(|t| t.unique_key.is_none()))
        {
            let mut conn = self.pool.acquire().await?;
            return insert_tasks(&mut conn, &self.names, tasks, None).await;
        }
        let mut tx = self.pool.begin().await?;
        let out = insert_tasks(&mut tx, &self.names, tasks, None).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let rows = match req.max_running {
            None => {
                sqlx::query(&claim_sql(&self.names, req.limit, false))
                    .bind(req.queue)
                    .bind(req.worker)
                    .bind(dur(req.lease))
                    .fetch_all(&self.pool)
                    .await?
            }
            Some(max) => {
                // Claimers of a capped queue take turns (a transaction-scoped
                // advisory lock per queue), so each one counts the running
                // tasks after the previous one committed.
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(format!("{}:{}", self.names.chan, req.queue))
                    .execute(&mut *tx)
                    .await?;
                let rows = sqlx::query(&claim_sql(&self.names, req.limit, true))
                    .bind(req.queue)
                    .bind(req.worker)
                    .bind(dur(req.lease))
                    .bind(i64::from(max))
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                rows
            }
        };
        let mut tasks = rows
            .iter()
            .map(claimed_task)
            .collect::<Result<Vec<_>, _>>()?;
        tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
        Ok(tasks)
    }

    async fn heartbeat(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = claims.iter().map(|c| c.id).collect();
        let tokens: Vec<i64> = claims.iter().map(|c| token_arg(c.token)).collect();
        let rows = sqlx::query(&format!(
            "UPDATE {} AS t SET lease_until = now() + $3 * interval '1 millisecond' \
             FROM (SELECT DISTINCT id, token FROM UNNEST($1::int8[], $2::int8[]) AS u(id, token)) AS c \
             WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running' \
             RETURNING t.id, t.claim_token, t.cancel_requested",
            self.names.tasks
        ))
        .bind(&ids)
        .bind(&tokens)
        .bind(dur(lease))
        .fetch_all(&self.pool)
        .await?;
        let mut found: HashMap<(i64, i64), bool> = HashMap::with_capacity(rows.len());
        for row in rows {
            found.insert((row.try_get(0)?, row.try_get(1)?), row.try_get(2)?);
        }
        Ok(ids
            .iter()
            .zip(&tokens)
            .map(|(&id, &a)| match found.get(&(id, a)) {
                Some(true) => Heartbeat::CancelRequested,
                Some(false) => Heartbeat::Extended,
                None => Heartbeat::Lost,
            })
            .collect())
    }

    async fn finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        // Successes (the common case) in one statement and one commit; the
        // rest one by one.
        let t = &self.names.tasks;
        let mut out = vec![false; items.len()];
        let mut ids = Vec::new();
        let mut tokens = Vec::new();
        for (claim, finish) in items {
            if matches!(finish, Finish::Succeeded) {
                ids.push(claim.id);
                tokens.push(token_arg(claim.token));
            }
        }
        if !ids.is_empty() {
            let done: Vec<i64> = sqlx::query_scalar(&format!(
                "UPDATE {t} AS t SET state = 'succeeded', finished_at = now(), lease_until = NULL \
                 FROM UNNEST($1::int8[], $2::int8[]) AS c(id, token) \
                 WHERE t.id = c.id AND t.claim_token = c.token AND t.state = 'running' \
                 RETURNING t.id"
            ))
            .bind(&ids)
            .bind(&tokens)
            .fetch_all(&self.pool)
            .await?;
            let done: std::collections::HashSet<i64> = done.into_iter().collect();
            for (i, (claim, finish)) in items.iter().enumerate() {
                if matches!(finish, Finish::Succeeded) {
                    out[i] = done.contains(&claim.id);
                }
            }
        }
        for (i, (claim, finish)) in items.iter().enumerate() {
            if !matches!(finish, Finish::Succeeded) {
                out[i] = self.finish(*claim, finish).await?;
            }
        }
        Ok(out)
    }

    async fn finish(&self, claim: Claim, finish: &Finish) -> Result<bool, StoreError> {
        let t = &self.names.tasks;
        let token = token_arg(claim.token);
        let cas = "WHERE id = $1 AND claim_token = $2 AND state = 'running'";
        let q = match finish {
            Finish::Succeeded => {
                sqlx::query_scalar::<_, i64>(&format!(
                    "UPDATE {t} SET state = 'succeeded', finished_at = now(), lease_until = NULL \
                 {cas} RETURNING id"
                ))
                .bind(claim.id)
                .bind(token)
                .fetch_optional(&self.pool)
                .await?
            }
            Finish::Failed { error, retry_in } => {
                // A retry whose cancellation was requested is not retried.
                let again = "($4::int8 IS NOT NULL AND attempt < max_attempts \
                     AND NOT cancel_requested)";
                let stop = "($4::int8 IS NOT NULL AND attempt < max_attempts AND cancel_requested)";
                // A retry is announced with its due time, so a worker starts
                // it when the backoff ends rather than at a later poll.
                sqlx::query_scalar::<_, i64>(&format!(
                    "WITH u AS (UPDATE {t} SET errors = {errs}, lease_until = NULL, \
                         last_error = CASE WHEN {stop} THEN '{CANCEL_REQUESTED}: ' || $3::text \
                             ELSE $3::text END, \
                         state = CASE WHEN {again} THEN 'pending' \
                             WHEN {stop} THEN 'cancelled' ELSE 'failed' END, \
                         run_at = CASE WHEN {again} \
                             THEN now() + $4 * interval '1 millisecond' ELSE run_at END, \
                         finished_at = CASE WHEN {again} THEN NULL ELSE now() END \
                     {cas} RETURNING id, queue, state, run_at) \
                     SELECT id FROM u LEFT JOIN LATERAL (SELECT pg_notify($5, \
                         u.queue || chr(10) || {WAKE_AT}) WHERE u.state = 'pending') AS n ON true",
                    errs = append_error("$3::text")
                ))
                .bind(claim.id)
                .bind(token)
                .bind(error)
                .bind(retry_in.map(dur))
                .bind(&self.names.chan)
                .fetch_optional(&self.pool)
                .await?
            }
            Finish::Cancelled { reason } => {
                sqlx::query_scalar::<_, i64>(&format!(
                    "UPDATE {t} SET state = 'cancelled', last_error = $3, finished_at = now(), \
                     lease_until = NULL {cas} RETURNING id"
                ))
                .bind(claim.id)
                .bind(token)
                .bind(reason)
                .fetch_optional(&self.pool)
                .await?
            }
            Finish::HandBack => {
                // The attempt is not counted; a requested cancel ends it.
                sqlx::query_scalar::<_, i64>(&format!(
                    "WITH u AS (UPDATE {t} SET \
                         state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END, \
                         attempt = attempt - 1, lease_until = NULL, \
                         last_error = CASE WHEN cancel_requested THEN $4 ELSE last_error END, \
                         finished_at = CASE WHEN cancel_requested THEN now() END \
                     {cas} RETURNING id, queue, state) \
                 SELECT id FROM u LEFT JOIN LATERAL (SELECT pg_notify($3, u.queue) \
                     WHERE u.state = 'pending') AS n ON true"
                ))
                .bind(claim.id)
                .bind(token)
                .bind(&self.names.chan)
                .bind(CANCEL_REQUESTED)
                .fetch_optional(&self.pool)
                .await?
            }
        };
        Ok(q.is_some())
    }

    async fn progress(
        &self,
        claim: Claim,
        progress: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let r = sqlx::query(&format!(
            "UPDATE {} SET progress = $3 WHERE id = $1 AND claim_token = $2 AND state = 'running'",
            self.names.tasks
        ))
        .bind(claim.id)
        .bind(token_arg(claim.token))
        .bind(progress)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn rescue(&self) -> Result<Rescued, StoreError> {
        let t = &self.names.tasks;
        let gone = "(cancel_requested OR attempt >= max_attempts)";
        let row = sqlx::query(&format!(
            "WITH r AS ( \
                 UPDATE {t} SET \
                     state = CASE WHEN cancel_requested THEN 'cancelled' \
                                  WHEN attempt >= max_attempts THEN 'failed' \
                                  ELSE 'pending' END, \
                     finished_at = CASE WHEN {gone} THEN now() END, \
                     lease_until = NULL, \
                     last_error = $1, \
                     errors = {errs} \
                 WHERE state = 'running' AND lease_until < now() \
                 RETURNING state, queue), \
             n AS (SELECT pg_notify($2, q.queue) FROM (SELECT DISTINCT queue FROM r \
                   WHERE state = 'pending') AS q) \
             SELECT count(*) FILTER (WHERE state = 'pending') AS requeued, \
                    count(*) FILTER (WHERE state = 'failed') AS failed, \
                    count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                    (SELECT count(*) FROM n) AS notified \
             FROM r",
            errs = append_error("$1::text")
        ))
        .bind(LEASE_EXPIRED)
        .bind(&self.names.chan)
        .fetch_one(&self.pool)
        .await?;
        let get = |c: &str| -> Result<u64, StoreError> {
            let v: i64 = row.try_get(c)?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        Ok(Rescued {
            requeued: get("requeued")?,
            failed: get("failed")?,
            cancelled: get("cancelled")?,
        })
    }

    async fn cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        let t = &self.names.tasks;
        let mut tx = self.pool.begin().await?;
        let state: Option<String> =
            sqlx::query_scalar(&format!("SELECT state FROM {t} WHERE id = $1 FOR UPDATE"))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(state) = state else {
            return Ok(CancelOutcome::NotFound);
        };
        let outcome = match TaskState::from_str(&state)? {
            TaskState::Pending => {
                sqlx::query(&format!(
                    "UPDATE {t} SET state = 'cancelled', finished_at = now(), lease_until = NULL \
                     WHERE id = $1"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?;
                CancelOutcome::Cancelled
            }
            TaskState::Running => {
                sqlx::query(&format!(
                    "UPDATE {t} SET cancel_requested = true WHERE id = $1"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?;
                CancelOutcome::Requested
            }
            s => CancelOutcome::AlreadyFinished(s),
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn retry(&self, id: i64) -> Result<bool, StoreError> {
        let row = sqlx::query(&format!(
            "WITH u AS (UPDATE {} SET state = 'pending', run_at = now(), finished_at = NULL, \
                 lease_until = NULL, cancel_requested = false, \
                 max_attempts = greatest(max_attempts, attempt + 1) \
             WHERE id = $1 AND state IN ('failed', 'cancelled') RETURNING id, queue) \
             SELECT id FROM u, LATERAL (SELECT pg_notify($2, u.queue)) AS n",
            self.names.tasks
        ))
        .bind(id)
        .bind(&self.names.chan)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| match StoreError::from(e) {
            StoreError::Conflict(_) => StoreError::Conflict(format!(
                "task {id}: its unique key is taken by another unfinished task"
            )),
            other => other,
        })?;
        Ok(row.is_some())
    }

    async fn task(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {TASK_COLS} FROM {} WHERE id = $1",
            self.names.tasks
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(task_info).transpose()
    }

    async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLS} FROM {} \
             WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2) \
               AND ($3::text IS NULL OR job = $3) AND ($4::int8 IS NULL OR id < $4) \
             ORDER BY id DESC LIMIT $5",
            self.names.tasks
        ))
        .bind(filter.queue.as_deref())
        .bind(filter.state.map(TaskState::as_str))
        .bind(filter.job.as_deref())
        .bind(filter.before_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(task_info).collect()
    }

    async fn stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT queue, \
                 count(*) FILTER (WHERE state = 'pending') AS pending, \
                 count(*) FILTER (WHERE state = 'running') AS running, \
                 count(*) FILTER (WHERE state = 'succeeded') AS succeeded, \
                 count(*) FILTER (WHERE state = 'failed') AS failed, \
                 count(*) FILTER (WHERE state = 'cancelled') AS cancelled, \
                 floor(extract(epoch FROM now() - min(run_at) \
                     FILTER (WHERE state = 'pending' AND run_at <= now())) * 1000)::int8 \
                     AS oldest_ms \
             FROM {} GROUP BY queue ORDER BY queue",
            self.names.tasks
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let c = |name: &str| -> Result<u64, StoreError> {
                    let v: i64 = row.try_get(name)?;
                    Ok(u64::try_from(v).unwrap_or(0))
                };
                let oldest: Option<i64> = row.try_get("oldest_ms")?;
                Ok(QueueStats {
                    queue: row.try_get("queue")?,
                    pending: c("pending")?,
                    running: c("running")?,
                    succeeded: c("succeeded")?,
                    failed: c("failed")?,
                    cancelled: c("cancelled")?,
                    oldest_pending_ms: oldest.map(|v| u64::try_from(v).unwrap_or(0)),
                })
            })
            .collect()
    }

    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let r = sqlx::query(&format!(
            "DELETE FROM {} WHERE state IN ('succeeded', 'failed', 'cancelled') \
             AND finished_at < now() - $1 * interval '1 millisecond'",
            self.names.tasks
        ))
        .bind(dur(older_than))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        let rx = self.wake.subscribe();
        self.listener.get_or_init(|| {
            // Its own one-connection pool, so the long-lived LISTEN session
            // never takes a slot from the operations' pool.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(CONNECT_TIMEOUT)
                .connect_lazy_with(self.connect.clone());
            tokio::spawn(listen_loop(
                pool,
                self.names.chan.clone(),
                self.wake.clone(),
                self.shutdown.clone(),
            ));
        });
        Ok(rx)
    }

    // ---- schedules ---------------------------------------------------------

    async fn job_register(&self, job: &str) -> Result<JobState, StoreError> {
        let j = &self.names.jobs;
        let row = sqlx::query(&format!(
            "INSERT INTO {j} (name, last_slot, paused) VALUES ($1, now(), false) \
             ON CONFLICT (name) DO NOTHING RETURNING name, last_slot, paused"
        ))
        .bind(job)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = row {
            return job_state(&row);
        }
        let row = sqlx::query(&format!(
            "SELECT name, last_slot, paused FROM {j} WHERE name = $1"
        ))
        .bind(job)
        .fetch_one(&self.pool)
        .await?;
        job_state(&row)
    }

    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        let n = &*self.names;
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "SELECT last_slot, paused, last_slot IS NOT DISTINCT FROM $2 AS matches, \
             now() AS now FROM {} WHERE name = $1 FOR UPDATE",
            n.jobs
        ))
        .bind(adv.job)
        .bind(adv.expected)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(Advanced::UnknownJob);
        };
        let paused: bool = row.try_get("paused")?;
        if paused {
            return Ok(Advanced::Paused);
        }
        if !row.try_get::<bool, _>("matches")? {
            return Ok(Advanced::Moved(row.try_get("last_slot")?));
        }
        let now: DateTime<Utc> = row.try_get("now")?;
        if (adv.due_only && adv.slot > now) || adv.until.is_some_and(|u| now >= u) {
            return Ok(Advanced::NotDue { now });
        }
        sqlx::query(&format!(
            "UPDATE {} SET last_slot = $2 WHERE name = $1",
            n.jobs
        ))
        .bind(adv.job)
        .bind(adv.slot)
        .execute(&mut *tx)
        .await?;
        let Some(task) = adv.task else {
            tx.commit().await?;
            return Ok(Advanced::Enqueued(Enqueued {
                id: 0,
                inserted: false,
            }));
        };
        let busy = match (adv.record, adv.overlap) {
            (SlotRecord::Enqueue, Overlap::Forbid) => {
                sqlx::query_scalar(&format!(
                    "SELECT EXISTS (SELECT 1 FROM {} WHERE job = $1 \
                     AND state IN ('pending', 'running') \
                     AND ($2::timestamptz IS NULL OR slot IS NULL OR slot <= $2))",
                    n.tasks
                ))
                .bind(adv.job)
                .bind(adv.batch_after)
                .fetch_one(&mut *tx)
                .await?
            }
            _ => false,
        };
        let skip = match adv.record {
            SlotRecord::Skip { reason } => Some(reason),
            _ if busy => Some(OVERLAP_SKIPPED),
            _ => None,
        };
        let out = insert_tasks(&mut tx, n, std::slice::from_ref(task), skip).await?;
        let e = out
            .first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt("job_advance: no insert result".into()))?;
        let result = if !e.inserted {
            // The slot's task exists already (a trigger made it): the slot
            // is not skipped, it runs as that task.
            Advanced::Enqueued(e)
        } else if skip.is_some() {
            Advanced::Skipped(e)
        } else {
            if let SlotRecord::Run { worker, lease } = adv.record {
                sqlx::query(&format!(
                    "UPDATE {} SET state = 'running', attempt = 1, started_at = now(), \
                     lease_until = now() + $2 * interval '1 millisecond', worker = $3, claim_token = 1 \
                     WHERE id = $1",
                    n.tasks
                ))
                .bind(e.id)
                .bind(dur(lease))
                .bind(worker)
                .execute(&mut *tx)
                .await?;
            }
            Advanced::Enqueued(e)
        };
        tx.commit().await?;
        Ok(result)
    }

    async fn job_set_paused(&self, job: &str, paused: bool) -> Result<bool, StoreError> {
        let r = sqlx::query(&format!(
            "UPDATE {} SET paused = $2 WHERE name = $1",
            self.names.jobs
        ))
        .bind(job)
        .bind(paused)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT name, last_slot, paused FROM {} ORDER BY name",
            self.names.jobs
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_state).collect()
    }
}

/// The plan of the claim statement for `queue` and `limit`, as `EXPLAIN`
/// prints it, prepared and then explained under `plan_cache_mode =
/// force_generic_plan` (`generic`) or `force_custom_plan`. For tests and
/// diagnostics (a claim must stay an index walk); not a stable API. Runs in
/// a transaction that is rolled back.
#[doc(hidden)]
pub async fn explain_claim(
    conn: &mut PgConnection,
    prefix: Option<&str>,
    queue: &str,
    limit: u32,
    generic: bool,
) -> Result<String, StoreError> {
    let n = Names::new(prefix);
    let mut tx = conn.begin().await?;
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    sqlx::Executor::execute(
        &mut *tx,
        format!("SET LOCAL plan_cache_mode = {mode}").as_str(),
    )
    .await?;
    sqlx::Executor::execute(
        &mut *tx,
        format!(
            "PREPARE baton_explain_claim(text, text, int8) AS {}",
            claim_sql(&n, limit, false)
        )
        .as_str(),
    )
    .await?;
    let q = queue.replace('\'', "''");
    let rows: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN EXECUTE baton_explain_claim('{q}', 'explain', 1000)"
    ))
    .fetch_all(&mut *tx)
    .await?;
    sqlx::Executor::execute(&mut *tx, "DEALLOCATE baton_explain_claim").await?;
    tx.rollback().await?;
    Ok(rows.join("\n"))
}
