//! The SQLite backend: baton's embedded store for a single host.
//!
//! One database file holds three tables (names prefixed, default `baton_`):
//! `locks`, `tasks` and `jobs`, plus a `meta` table recording the schema
//! version. The file runs in WAL mode with `synchronous=NORMAL` and a busy
//! timeout, so many processes on the same host can share it.
//!
//! Every operation is one `INSERT/UPDATE … RETURNING` statement or one short
//! `BEGIN IMMEDIATE` transaction (never a deferred transaction that reads
//! then writes: that can fail with `SQLITE_BUSY_SNAPSHOT` whatever the busy
//! timeout). Every "now" is computed inside the statement with
//! `unixepoch('subsec')` (the host clock, which is the store clock for an
//! embedded file), and every timestamp is stored as INTEGER milliseconds
//! since the Unix epoch.
//!
//! SQLite has no cross-process notification: [`Backend::subscribe`] is an
//! in-process broadcast shared by every handle on the same file and prefix in
//! this process (work due later is announced with its `run_at`). Workers in
//! other processes find new work by polling.
//!
//! [`enqueue_in`] lets applications enqueue tasks inside their own
//! transaction (the transactional outbox pattern).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::Row;
use tokio::sync::broadcast;

use super::SlotRecord;
use super::{
    from_ms, ms, Acquire, Advanced, AttemptError, CancelOutcome, Claim, ClaimRequest, Enqueued,
    FencingToken, Finish, Heartbeat, JobState, LockInfo, LockRequest, NewTask, Overlap, QueueStats,
    Rescued, RunAt, SlotAdvance, Task, TaskFilter, TaskInfo, TaskState, Wake, CANCEL_REQUESTED,
    LEASE_EXPIRED, OVERLAP_SKIPPED,
};
use super::{Backend, StoreOptions};
use crate::error::StoreError;

/// The store's clock in milliseconds since the epoch, evaluated by SQLite.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The store's clock in microseconds since the epoch (millisecond
/// resolution): the floor of every fencing token.
const NOW_US: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000";

/// The version [`schema_sql`] creates; [`UPGRADES`] take it from there.
const BASE_VERSION: i64 = 1;

/// The schema version this code writes and reads: the base plus one per
/// upgrade step.
const SCHEMA_VERSION: i64 = BASE_VERSION + UPGRADES.len() as i64;

/// Rows per multi-row `INSERT` (12 bound values each, well inside SQLite's
/// limit of 32766 variables per statement).
const INSERT_CHUNK: usize = 1000;

/// Capacity of the in-process wake-up channel.
const WAKE_CAPACITY: usize = 1024;

/// The condition under which a task's unique key is taken; the same text as
/// the partial unique index's `WHERE`, so lookups use that index.
const KEY_TAKEN: &str = "(unique_forever OR state IN ('pending', 'running'))";

/// Every column of the tasks table, in the order [`task_info`] reads them.
const TASK_COLS: &str = "id, queue, kind, payload, state, priority, attempt, max_attempts, \
     timeout_ms, run_at, created_at, started_at, finished_at, lease_until, worker, unique_key, \
     cancel_requested, last_error, errors, progress, job, slot";

/// Quoted table names for one prefix.
#[derive(Debug, Clone)]
struct Tables {
    prefix: String,
    locks: String,
    tasks: String,
    jobs: String,
    meta: String,
}

impl Tables {
    fn new(prefix: Option<&str>) -> Result<Tables, StoreError> {
        let prefix = prefix.unwrap_or("baton_");
        super::validate_prefix(prefix)?;
        let q = |name: &str| format!("\"{prefix}{name}\"");
        Ok(Tables {
            prefix: prefix.to_string(),
            locks: q("locks"),
            tasks: q("tasks"),
            jobs: q("jobs"),
            meta: q("meta"),
        })
    }

    /// A quoted index name (index names share one namespace per database).
    fn index(&self, name: &str) -> String {
        format!("\"{}{name}\"", self.prefix)
    }
}

/// State shared by every handle on the same database file and prefix in this
/// process.
struct Shared {
    wake: broadcast::Sender<Wake>,
}

type Registry = Mutex<HashMap<(PathBuf, String), Arc<Shared>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn shared_for(path: &Path, prefix: &str) -> Arc<Shared> {
    // A poisoned registry only means another thread panicked while holding
    // the lock; the map itself is still usable.
    let mut map = registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    map.entry((path.to_path_buf(), prefix.to_string()))
        .or_insert_with(|| {
            let (wake, _) = broadcast::channel(WAKE_CAPACITY);
            Arc::new(Shared { wake })
        })
        .clone()
}

/// Connections that write, per database file in this process. SQLite runs
/// one writer at a time: more writer connections only meet in its busy
/// handler (which sleeps in steps of up to 100 ms); writers of one process
/// wait for each other in the pool instead. Two, not one, so that one
/// connection's statement runs while the other's result is being handled.
const WRITERS: u32 = 2;

/// One writer pool and one reader pool per database file in this process,
/// shared by every handle on it. Weak, so a file's pools close with its
/// last handle.
type Pools = Mutex<HashMap<PathBuf, (std::sync::Weak<SqlitePool>, std::sync::Weak<SqlitePool>)>>;

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn live_pools(key: &Path) -> Option<(Arc<SqlitePool>, Arc<SqlitePool>)> {
    let map = pools().lock().unwrap_or_else(|p| p.into_inner());
    let (w, r) = map.get(key)?;
    let (w, r) = (w.upgrade()?, r.upgrade()?);
    (!w.is_closed() && !r.is_closed()).then_some((w, r))
}

/// The SQLite backend. Build it with [`connect`].
pub struct SqliteBackend {
    /// Every statement that writes (and every transaction).
    pool: Arc<SqlitePool>,
    /// Pure reads (listings, stats, the clock): they never wait behind
    /// writers for a connection.
    reader: Arc<SqlitePool>,
    t: Tables,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("prefix", &self.t.prefix)
            .finish()
    }
}

/// The canonical path of an existing file (or its absolute path).
fn canonical_of(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// The file path of a `sqlite://PATH` or `sqlite:PATH` URL.
fn parse_url(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::Config(format!("store URL {url:?}: expected sqlite://PATH")))?;
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() {
        return Err(StoreError::Config(format!(
            "store URL {url:?}: no file path; use sqlite://PATH (e.g. sqlite://baton.db)"
        )));
    }
    if path == ":memory:" || path.starts_with("file:") {
        return Err(StoreError::Config(format!(
            "store URL {url:?}: in-memory SQLite is not supported (each pooled connection would \
             see its own database); use a file path"
        )));
    }
    Ok(PathBuf::from(path))
}

/// Connect to the SQLite file named by `url` (`sqlite://PATH` or
/// `sqlite:PATH`), creating it if absent, and return the backend.
///
/// The file is opened in WAL mode with `synchronous=NORMAL` and a busy
/// timeout of `opts.statement_timeout` (how long a connection waits for
/// another writer before failing with `SQLITE_BUSY`, mapped to the retryable
/// [`StoreError::Unavailable`]), through a pool of `opts.max_connections` connections. Migrations
/// are not run here; [`Backend::migrate`] does that (and
/// [`crate::Store::connect_with`] calls it unless `opts.migrate` is false).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Ok(Arc::new(SqliteBackend::connect(url, opts).await?))
}

impl SqliteBackend {
    /// The compare-and-set UPDATE that ends an attempt, and its `?3`/`?4`
    /// arguments (error text, retry delay in ms); `?1`/`?2` are id and claim
    /// token. The transitions are DESIGN.md's task state table.
    fn finish_sql<'f>(&self, finish: &'f Finish) -> (String, Option<&'f str>, Option<i64>) {
        let tasks = &self.t.tasks;
        let (set, text, retry_in): (String, Option<&str>, Option<i64>) = match finish {
            Finish::Succeeded => (
                format!("state = 'succeeded', finished_at = {NOW}"),
                None,
                None,
            ),
            Finish::Failed { error, retry_in } => {
                // A retry whose cancellation was requested is not retried.
                let again = "?4 IS NOT NULL AND attempt < max_attempts AND NOT cancel_requested";
                let stop = "?4 IS NOT NULL AND attempt < max_attempts AND cancel_requested";
                (
                    format!(
                        "errors = json_insert(errors, '$[#]', \
                             json_object('attempt', attempt, 'at', {NOW}, 'error', ?3)), \
                         last_error = CASE WHEN {stop} THEN '{CANCEL_REQUESTED}: ' || ?3 \
                             ELSE ?3 END, \
                         state = CASE WHEN {again} THEN 'pending' \
                             WHEN {stop} THEN 'cancelled' ELSE 'failed' END, \
                         run_at = CASE WHEN {again} THEN {NOW} + ?4 ELSE run_at END, \
                         finished_at = CASE WHEN {again} THEN NULL ELSE {NOW} END"
                    ),
                    Some(error.as_str()),
                    retry_in.map(ms),
                )
            }
            Finish::Cancelled { reason } => (
                format!("state = 'cancelled', last_error = ?3, finished_at = {NOW}"),
                Some(reason.as_str()),
                None,
            ),
            Finish::HandBack => (
                // Keep run_at: a handed-back task keeps its place in line.
                // The attempt is not counted; a requested cancel ends it.
                format!(
                    "state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'pending' END, \
                     attempt = attempt - 1, \
                     last_error = CASE WHEN cancel_requested THEN ?3 ELSE last_error END, \
                     finished_at = CASE WHEN cancel_requested THEN {NOW} ELSE NULL END"
                ),
                Some(CANCEL_REQUESTED),
                None,
            ),
        };
        // Every transition out of `running` clears the lease.
        let sql = format!(
            "UPDATE {tasks} SET {set}, lease_until = NULL \
             WHERE id = ?1 AND claim_token = ?2 AND state = 'running' RETURNING queue, state, run_at"
        );
        (sql, text, retry_in)
    }

    /// Connect without boxing (see [`connect`]).
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<SqliteBackend, StoreError> {
        let t = Tables::new(opts.prefix.as_deref())?;
        let path = parse_url(url)?;
        let key = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
        if let Some((pool, reader)) = live_pools(&key) {
            let shared = shared_for(&canonical_of(&path), &t.prefix);
            return Ok(SqliteBackend {
                pool,
                reader,
                t,
                shared,
            });
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.statement_timeout)
            .foreign_keys(false);
        let pool = Arc::new(
            SqlitePoolOptions::new()
                .max_connections(WRITERS.min(opts.max_connections.max(1)))
                .test_before_acquire(false)
                .connect_with(options.clone())
                .await?,
        );
        let reader = Arc::new(
            SqlitePoolOptions::new()
                .max_connections(opts.max_connections.max(1))
                .test_before_acquire(false)
                .connect_with(options)
                .await?,
        );
        pools()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (Arc::downgrade(&pool), Arc::downgrade(&reader)));
        // The file exists now; key the shared state by its canonical path so
        // that `./a.db` and `/abs/a.db` share one wake-up channel.
        let shared = shared_for(&canonical_of(&path), &t.prefix);
        Ok(SqliteBackend {
            pool,
            reader,
            t,
            shared,
        })
    }

    /// The writer pool (two connections per file and process), for
    /// applications that want to run their own transactions with
    /// [`enqueue_in`]. Keep such transactions short: baton's own writes in
    /// this process share these connections.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn wake<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let mut seen = HashSet::new();
        for q in queues {
            if seen.insert(q) {
                // No receivers is fine: the wake-up is only a hint.
                let _ = self.shared.wake.send(Wake::now(q));
            }
        }
    }

    /// Announce work due later: per queue, the earliest `run_at` (ms).
    fn wake_later<'a>(&self, items: impl IntoIterator<Item = (&'a str, i64)>) {
        let mut first: HashMap<&str, i64> = HashMap::new();
        for (q, at) in items {
            let e = first.entry(q).or_insert(at);
            *e = (*e).min(at);
        }
        for (q, at) in first {
            if let Ok(due) = from_ms(at) {
                let _ = self.shared.wake.send(Wake {
                    queue: q.to_string(),
                    due: Some(due),
                });
            }
        }
    }

    async fn immediate(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

// ---- conversions -------------------------------------------------------------

fn corrupt(what: &str, v: impl std::fmt::Debug) -> StoreError {
    StoreError::Corrupt(format!("{what}: unexpected value {v:?}"))
}

fn to_u32(v: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| corrupt(what, v))
}

fn to_i32(v: i64, what: &str) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| corrupt(what, v))
}

fn to_duration(v: Option<i64>, what: &str) -> Result<Option<Duration>, StoreError> {
    v.map(|v| {
        u64::try_from(v)
            .map(Duration::from_millis)
            .map_err(|_| corrupt(what, v))
    })
    .transpose()
}

fn opt_time(v: Option<i64>) -> Result<Option<DateTime<Utc>>, StoreError> {
    v.map(from_ms).transpose()
}

fn json_of(text: &str, what: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn json_text(v: &serde_json::Value) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(format!("cannot encode JSON: {e}")))
}

/// One entry of the `errors` column as stored: `at` in ms since the epoch.
#[derive(serde::Deserialize)]
struct StoredError {
    attempt: u32,
    at: i64,
    error: String,
}

fn errors_of(text: &str) -> Result<Vec<AttemptError>, StoreError> {
    let raw: Vec<StoredError> =
        serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("task errors: {e}")))?;
    raw.into_iter()
        .map(|e| {
            Ok(AttemptError {
                attempt: e.attempt,
                at: from_ms(e.at)?,
                error: e.error,
            })
        })
        .collect()
}

fn task_info(row: &SqliteRow) -> Result<TaskInfo, StoreError> {
    let state: String = row.try_get("state")?;
    let payload: String = row.try_get("payload")?;
    let errors: String = row.try_get("errors")?;
    let progress: Option<String> = row.try_get("progress")?;
    Ok(TaskInfo {
        id: row.try_get("id")?,
        queue: row.try_get("queue")?,
        kind: row.try_get("kind")?,
        payload: json_of(&payload, "task payload")?,
        state: TaskState::from_str(&state)?,
        priority: to_i32(row.try_get("priority")?, "priority")?,
        attempt: to_u32(row.try_get("attempt")?, "attempt")?,
        max_attempts: to_u32(row.try_get("max_attempts")?, "max_attempts")?,
        timeout: to_duration(row.try_get("timeout_ms")?, "timeout")?,
        run_at: from_ms(row.try_get("run_at")?)?,
        created_at: from_ms(row.try_get("created_at")?)?,
        started_at: opt_time(row.try_get("started_at")?)?,
        finished_at: opt_time(row.try_get("finished_at")?)?,
        lease_until: opt_time(row.try_get("lease_until")?)?,
        worker: row.try_get("worker")?,
        unique_key: row.try_get("unique_key")?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested")? != 0,
        last_error: row.try_get("last_error")?,
        errors: errors_of(&errors)?,
        progress: progress.map(|p| json_of(&p, "task progress")).transpose()?,
        job: row.try_get("job")?,
        slot: opt_time(row.try_get("slot")?)?,
    })
}

fn claimed_task(row: &SqliteRow) -> Result<Task, StoreError> {
    let payload: String = row.try_get("payload")?;
    Ok(Task {
        id: row.try_get("id")?,
        queue: row.try_get("queue")?,
        kind: row.try_get("kind")?,
        payload: json_of(&payload, "task payload")?,
        priority: to_i32(row.try_get("priority")?, "priority")?,
        attempt: to_u32(row.try_get("attempt")?, "attempt")?,
        token: token_of(row.try_get("claim_token")?, "claim token")?,
        max_attempts: to_u32(row.try_get("max_attempts")?, "max_attempts")?,
        timeout: to_duration(row.try_get("timeout_ms")?, "timeout")?,
        run_at: from_ms(row.try_get("run_at")?)?,
        lease_until: from_ms(row.try_get("lease_until")?)?,
        job: row.try_get("job")?,
        slot: opt_time(row.try_get("slot")?)?,
    })
}

fn lock_info(row: &SqliteRow) -> Result<LockInfo, StoreError> {
    let token: i64 = row.try_get("token")?;
    let lock_until: i64 = row.try_get("lock_until")?;
    let now: i64 = row.try_get("now")?;
    Ok(LockInfo {
        name: row.try_get("name")?,
        holder: row.try_get("holder")?,
        token: token_of(token, "lock token")?,
        locked_at: from_ms(row.try_get("locked_at")?)?,
        lock_until: from_ms(lock_until)?,
        held: lock_until > now,
        now: from_ms(now)?,
    })
}

fn job_state(row: &SqliteRow) -> Result<JobState, StoreError> {
    Ok(JobState {
        name: row.try_get("name")?,
        last_slot: opt_time(row.try_get("last_slot")?)?,
        paused: row.try_get::<i64, _>("paused")? != 0,
    })
}

// ---- schema ------------------------------------------------------------------

/// The schema's statements, each idempotent.
fn schema_sql(t: &Tables) -> Vec<String> {
    let Tables {
        locks,
        tasks,
        jobs,
        meta,
        ..
    } = t;
    let claim_idx = t.index("tasks_claim");
    let lease_idx = t.index("tasks_lease");
    let unique_idx = t.index("tasks_unique");
    let finished_idx = t.index("tasks_finished");
    let job_idx = t.index("tasks_job");
    format!(
        r#"
CREATE TABLE IF NOT EXISTS {meta} (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS {locks} (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    token      INTEGER NOT NULL,
    locked_at  INTEGER NOT NULL,
    lock_until INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS {tasks} (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT NOT NULL,
    kind             TEXT NOT NULL,
    payload          TEXT NOT NULL,
    state            TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    timeout_ms       INTEGER,
    run_at           INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    lease_until      INTEGER,
    worker           TEXT,
    unique_key       TEXT,
    unique_forever   INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    errors           TEXT NOT NULL DEFAULT '[]',
    progress         TEXT,
    job              TEXT,
    slot             INTEGER
);
CREATE INDEX IF NOT EXISTS {claim_idx} ON {tasks} (queue, priority, run_at, id)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS {lease_idx} ON {tasks} (lease_until)
    WHERE state = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS {unique_idx} ON {tasks} (unique_key)
    WHERE unique_key IS NOT NULL AND {KEY_TAKEN};
CREATE INDEX IF NOT EXISTS {finished_idx} ON {tasks} (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {job_idx} ON {tasks} (job, slot)
    WHERE job IS NOT NULL;
CREATE TABLE IF NOT EXISTS {jobs} (
    name      TEXT PRIMARY KEY,
    last_slot INTEGER,
    paused    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO {meta} (key, value) VALUES ('schema_version', '{BASE_VERSION}')
    ON CONFLICT (key) DO NOTHING;
"#
    )
    .split(';')
    .map(str::trim)
    .filter(|s| !s.is_empty())
    .map(str::to_string)
    .collect()
}

/// One statement of an upgrade step.
enum Ddl {
    /// Run as is; must be idempotent.
    Sql(String),
    /// `ALTER TABLE … ADD COLUMN`, skipped when the column exists (SQLite
    /// has no `ADD COLUMN IF NOT EXISTS`).
    AddColumn {
        /// The unquoted table name.
        table: String,
        column: &'static str,
        /// The column's type and constraints.
        decl: &'static str,
    },
}

/// One schema upgrade step: its statements take the schema from version
/// `n` to `n + 1`, where `n - BASE_VERSION` is the step's index in
/// [`UPGRADES`].
type Upgrade = fn(&Tables) -> Vec<Ddl>;

/// The upgrade steps, in order. Each runs once per database, inside the
/// migration's `BEGIN IMMEDIATE` transaction together with the version
/// bump, and each statement is idempotent. Add a step at the end (and
/// nothing else: [`SCHEMA_VERSION`] follows).
const UPGRADES: &[Upgrade] = &[
    // 1 → 2: per-task claim tokens; a pending task whose cancel was
    // requested (possible before 2) is cancelled.
    upgrade_claim_token,
];

fn upgrade_claim_token(t: &Tables) -> Vec<Ddl> {
    let tasks = &t.tasks;
    vec![
        Ddl::AddColumn {
            table: format!("{}tasks", t.prefix),
            column: "claim_token",
            decl: "INTEGER NOT NULL DEFAULT 0",
        },
        Ddl::Sql(format!(
            "UPDATE {tasks} SET state = 'cancelled', finished_at = {NOW}, \
                 last_error = '{CANCEL_REQUESTED}' \
             WHERE state = 'pending' AND cancel_requested"
        )),
    ]
}

/// Run one upgrade statement on `conn`.
async fn run_ddl(conn: &mut SqliteConnection, ddl: &Ddl) -> Result<(), StoreError> {
    match ddl {
        Ddl::Sql(sql) => {
            sqlx::query(sql).execute(&mut *conn).await?;
        }
        Ddl::AddColumn {
            table,
            column,
            decl,
        } => {
            let exists: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")
                    .bind(table)
                    .bind(column)
                    .fetch_optional(&mut *conn)
                    .await?;
            if exists.is_none() {
                sqlx::query(&format!(
                    "ALTER TABLE \"{table}\" ADD COLUMN {column} {decl}"
                ))
                .execute(&mut *conn)
                .await?;
            }
        }
    }
    Ok(())
}

// ---- the shared insert (enqueue, enqueue_in, job_advance) ---------------------

/// What inserting tasks produced: one result per task, plus the inserted
/// tasks already due and those due later with their `run_at` (for wake-ups).
struct Inserted {
    results: Vec<Enqueued>,
    due_queues: Vec<usize>,
    later: Vec<(usize, i64)>,
}

/// Insert `tasks` in order on `conn`, which the caller has put inside a
/// transaction. Tasks without a unique key are always inserted; a task whose
/// key is taken yields the holder's id with `inserted = false`.
async fn insert_tasks(
    conn: &mut SqliteConnection,
    t: &Tables,
    tasks: &[NewTask],
) -> Result<Inserted, StoreError> {
    let mut results = Vec::with_capacity(tasks.len());
    let mut due_queues = Vec::new();
    let mut later = Vec::new();
    let mut taken: Vec<(usize, &str)> = Vec::new();
    // Who holds each of a list of taken keys (a JSON array), in one query.
    let lookup_sql = format!(
        "SELECT unique_key, id FROM {tasks} \
         WHERE unique_key IN (SELECT value FROM json_each(?1)) \
           AND unique_key IS NOT NULL AND {KEY_TAKEN}",
        tasks = t.tasks
    );
    for (chunk_no, chunk) in tasks.chunks(INSERT_CHUNK).enumerate() {
        let base = chunk_no * INSERT_CHUNK;
        let mut sql = format!(
            "INSERT INTO {tasks} (queue, kind, payload, state, priority, attempt, max_attempts, \
             timeout_ms, run_at, created_at, unique_key, unique_forever, job, slot) VALUES ",
            tasks = t.tasks
        );
        let row =
            format!("(?, ?, ?, 'pending', ?, 0, ?, ?, COALESCE(?, {NOW} + ?), {NOW}, ?, ?, ?, ?)");
        for i in 0..chunk.len() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&row);
        }
        sql.push_str(&format!(
            " ON CONFLICT DO NOTHING RETURNING id, unique_key, run_at <= {NOW} AS due, run_at"
        ));
        let mut q = sqlx::query(&sql);
        for task in chunk {
            let (abs, rel) = match task.run_at {
                RunAt::Now => (None, 0),
                RunAt::Delay(d) => (None, ms(d)),
                RunAt::At(at) => (Some(at.timestamp_millis()), 0),
            };
            q = q
                .bind(task.queue.as_str())
                .bind(task.kind.as_str())
                .bind(json_text(&task.payload)?)
                .bind(i64::from(task.priority))
                .bind(i64::from(task.max_attempts))
                .bind(task.timeout.map(ms))
                .bind(abs)
                .bind(rel)
                .bind(task.unique_key.as_deref())
                .bind(task.unique_forever)
                .bind(task.job.as_deref())
                .bind(task.slot.map(|s| s.timestamp_millis()));
        }
        let mut rows: Vec<(i64, Option<String>, bool, i64)> = q
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
            .collect::<Result<_, StoreError>>()?;
        // Rows are inserted in VALUES order with rising ids; RETURNING's own
        // order is unspecified, so sort by id and walk both lists together.
        rows.sort_unstable_by_key(|r| r.0);
        let mut next = rows.into_iter().peekable();
        for (i, task) in chunk.iter().enumerate() {
            let inserted = match (&task.unique_key, next.peek()) {
                (None, Some(_)) => true,
                (None, None) => {
                    return Err(StoreError::Backend(
                        "insert returned fewer rows than tasks without a unique key".into(),
                    ))
                }
                (Some(key), Some((_, Some(got), _, _))) => got == key,
                (Some(_), _) => false,
            };
            if inserted {
                let Some((id, _, due, run_at)) = next.next() else {
                    return Err(StoreError::Backend("insert result vanished".into()));
                };
                if due {
                    due_queues.push(base + i);
                } else {
                    later.push((base + i, run_at));
                }
                results.push(Enqueued { id, inserted: true });
            } else {
                // The key is taken: by an existing task, or by an earlier
                // task of this very batch. Look the holders up below.
                taken.push((
                    results.len(),
                    task.unique_key.as_deref().unwrap_or_default(),
                ));
                results.push(Enqueued {
                    id: 0,
                    inserted: false,
                });
            }
        }
        if !taken.is_empty() {
            let keys = serde_json::Value::Array(
                taken
                    .iter()
                    .map(|(_, k)| serde_json::Value::from(*k))
                    .collect(),
            );
            let holders: HashMap<String, i64> = sqlx::query_as(&lookup_sql)
                .bind(json_text(&keys)?)
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .collect();
            for (at, key) in taken.drain(..) {
                let id = holders.get(key).copied().ok_or_else(|| {
                    StoreError::Backend(format!(
                        "unique key {key:?} conflicted but no unfinished task holds it"
                    ))
                })?;
                results[at].id = id;
            }
        }
        if next.next().is_some() {
            return Err(StoreError::Backend(
                "insert returned more rows than expected".into(),
            ));
        }
    }
    Ok(Inserted {
        results,
        due_queues,
        later,
    })
}

/// Enqueue `tasks` on a connection inside the caller's own transaction (the
/// transactional outbox): the tasks exist if and only if the caller commits.
///
/// The caller owns `BEGIN` / `COMMIT` (use `BEGIN IMMEDIATE`, e.g.
/// `pool.begin_with("BEGIN IMMEDIATE")`, if the transaction reads before it
/// writes). `prefix` must match the store's table prefix (`None` for the
/// default `baton_`). Semantics are those of [`Backend::enqueue`], except
/// that no wake-up is sent: workers pick the tasks up at their next poll.
///
/// ```no_run
/// # async fn demo(tasks: Vec<baton::store::NewTask>) -> Result<(), Box<dyn std::error::Error>> {
/// use baton::store::sqlite::{enqueue_in, SqliteBackend};
///
/// let backend = SqliteBackend::connect("sqlite://app.db", &Default::default()).await?;
/// let mut tx = backend.pool().begin_with("BEGIN IMMEDIATE").await?;
/// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7")
///     .execute(&mut *tx)
///     .await?;
/// enqueue_in(&mut tx, None, &tasks).await?; // same transaction
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue_in(
    conn: &mut SqliteConnection,
    prefix: Option<&str>,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    let t = Tables::new(prefix)?;
    Ok(insert_tasks(conn, &t, tasks).await?.results)
}

// ---- the backend ---------------------------------------------------------------

#[async_trait]
impl Backend for SqliteBackend {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.immediate().await?;
        for stmt in schema_sql(&self.t) {
            sqlx::query(&stmt).execute(&mut *tx).await?;
        }
        let version: String = sqlx::query_scalar(&format!(
            "SELECT value FROM {} WHERE key = 'schema_version'",
            self.t.meta
        ))
        .fetch_one(&mut *tx)
        .await?;
        let version: i64 = version
            .parse()
            .map_err(|_| corrupt("schema_version", &version))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Config(format!(
                "the database's baton schema is version {version}, newer than this build's \
                 {SCHEMA_VERSION}; upgrade baton"
            )));
        }
        for from in version.max(BASE_VERSION)..SCHEMA_VERSION {
            let step = usize::try_from(from - BASE_VERSION)
                .ok()
                .and_then(|i| UPGRADES.get(i))
                .ok_or_else(|| corrupt("schema_version", from))?;
            for ddl in step(&self.t) {
                run_ddl(&mut tx, &ddl).await?;
            }
            sqlx::query(&format!(
                "UPDATE {} SET value = ?1 WHERE key = 'schema_version'",
                self.t.meta
            ))
            .bind((from + 1).to_string())
            .execute(&mut *tx)
            .await?;
            tracing::info!(
                prefix = %self.t.prefix,
                "sqlite: upgraded the baton schema from version {from} to {}",
                from + 1
            );
        }
        tx.commit().await?;
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&*self.reader)
            .await?;
        from_ms(now)
    }

    // ---- locks ---------------------------------------------------------------

    async fn lock_acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        let locks = &self.t.locks;
        let mut tx = self.immediate().await?;
        let granted = sqlx::query(&format!(
            "INSERT INTO {locks} (name, holder, token, locked_at, lock_until) \
             VALUES (?1, ?2, {NOW_US}, {NOW}, {NOW} + ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
                 token = MAX({locks}.token + 1, excluded.token), \
                 locked_at = excluded.locked_at, \
                 lock_until = excluded.lock_until \
             WHERE {locks}.lock_until <= excluded.locked_at \
             RETURNING token, locked_at, lock_until"
        ))
        .bind(req.name)
        .bind(req.holder)
        .bind(ms(req.at_most))
        .fetch_optional(&mut *tx)
        .await?;
        let answer = match granted {
            Some(row) => Acquire::Granted {
                token: token_of(row.try_get("token")?, "lock token")?,
                locked_at: from_ms(row.try_get("locked_at")?)?,
                lock_until: from_ms(row.try_get("lock_until")?)?,
            },
            None => {
                let row = sqlx::query(&format!(
                    "SELECT name, holder, token, locked_at, lock_until, {NOW} AS now \
                     FROM {locks} WHERE name = ?1"
                ))
                .bind(req.name)
                .fetch_one(&mut *tx)
                .await?;
                Acquire::Busy(lock_info(&row)?)
            }
        };
        tx.commit().await?;
        Ok(answer)
    }

    async fn lock_extend(
        &self,
        name: &str,
        token: FencingToken,
        at_most: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let until: Option<i64> = sqlx::query_scalar(&format!(
            "UPDATE {locks} SET lock_until = {NOW} + ?3 \
             WHERE name = ?1 AND token = ?2 AND lock_until > {NOW} \
             RETURNING lock_until",
            locks = self.t.locks
        ))
        .bind(name)
        .bind(token_i64(token))
        .bind(ms(at_most))
        .fetch_optional(&*self.pool)
        .await?;
        opt_time(until)
    }

    async fn lock_release(
        &self,
        name: &str,
        token: FencingToken,
        at_least: Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE {locks} SET lock_until = MAX({NOW}, locked_at + ?3) \
             WHERE name = ?1 AND token = ?2 AND lock_until > {NOW}",
            locks = self.t.locks
        ))
        .bind(name)
        .bind(token_i64(token))
        .bind(ms(at_least))
        .execute(&*self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn lock_get(&self, name: &str) -> Result<Option<LockInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT name, holder, token, locked_at, lock_until, {NOW} AS now \
             FROM {locks} WHERE name = ?1",
            locks = self.t.locks
        ))
        .bind(name)
        .fetch_optional(&*self.reader)
        .await?
        .as_ref()
        .map(lock_info)
        .transpose()
    }

    async fn lock_list(&self) -> Result<Vec<LockInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT name, holder, token, locked_at, lock_until, {NOW} AS now \
             FROM {locks} ORDER BY name",
            locks = self.t.locks
        ))
        .fetch_all(&*self.reader)
        .await?
        .iter()
        .map(lock_info)
        .collect()
    }

    // ---- tasks ---------------------------------------------------------------

    async fn enqueue(&self, tasks: &[NewTask]) -> Result<Vec<Enqueued>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.immediate().await?;
        let inserted = insert_tasks(&mut tx, &self.t, tasks).await?;
        tx.commit().await?;
        self.wake(inserted.due_queues.iter().map(|&i| tasks[i].queue.as_str()));
        self.wake_later(
            inserted
                .later
                .iter()
                .map(|&(i, at)| (tasks[i].queue.as_str(), at)),
        );
        Ok(inserted.results)
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Vec<Task>, StoreError> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let tasks = &self.t.tasks;
        let rows = sqlx::query(&format!(
            "UPDATE {tasks} SET state = 'running', attempt = attempt + 1, started_at = {NOW}, \
                 lease_until = {NOW} + ?3, worker = ?2, \
                 claim_token = MAX(claim_token + 1, {NOW_US}) \
             WHERE id IN (SELECT id FROM {tasks} \
                 WHERE state = 'pending' AND queue = ?1 AND run_at <= {NOW} \
                     AND NOT cancel_requested \
                 ORDER BY priority, run_at, id \
                 LIMIT CASE WHEN ?5 IS NULL THEN ?4 ELSE max(0, min(?4, ?5 - ( \
                     SELECT count(*) FROM {tasks} WHERE state = 'running' AND queue = ?1))) END) \
             RETURNING id, queue, kind, payload, priority, attempt, claim_token, max_attempts, \
                 timeout_ms, run_at, lease_until, job, slot"
        ))
        .bind(req.queue)
        .bind(req.worker)
        .bind(ms(req.lease))
        .bind(i64::from(req.limit))
        .bind(req.max_running.map(i64::from))
        .fetch_all(&*self.pool)
        .await?;
        let mut claimed = rows
            .iter()
            .map(claimed_task)
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|t| (t.priority, t.run_at, t.id));
        Ok(claimed)
    }

    async fn heartbeat(
        &self,
        claims: &[Claim],
        lease: Duration,
    ) -> Result<Vec<Heartbeat>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let list = serde_json::Value::Array(
            claims
                .iter()
                .map(|c| serde_json::json!([c.id, token_i64(c.token)]))
                .collect(),
        );
        let tasks = &self.t.tasks;
        let rows = sqlx::query(&format!(
            "UPDATE {tasks} SET lease_until = {NOW} + ?2 \
             FROM (SELECT value ->> 0 AS cid, value ->> 1 AS ctok FROM json_each(?1)) AS c \
             WHERE {tasks}.id = c.cid AND {tasks}.claim_token = c.ctok \
                 AND {tasks}.state = 'running' \
             RETURNING {tasks}.id, {tasks}.claim_token, {tasks}.cancel_requested"
        ))
        .bind(json_text(&list)?)
        .bind(ms(lease))
        .fetch_all(&*self.pool)
        .await?;
        let mut found = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: i64 = row.try_get(0)?;
            let token: i64 = row.try_get(1)?;
            let cancel: i64 = row.try_get(2)?;
            found.insert((id, token), cancel != 0);
        }
        Ok(claims
            .iter()
            .map(|c| match found.get(&(c.id, token_i64(c.token))) {
                Some(true) => Heartbeat::CancelRequested,
                Some(false) => Heartbeat::Extended,
                None => Heartbeat::Lost,
            })
            .collect())
    }

    async fn finish(&self, claim: Claim, finish: &Finish) -> Result<bool, StoreError> {
        let (sql, text, retry_in) = self.finish_sql(finish);
        let q = sqlx::query(&sql)
            .bind(claim.id)
            .bind(token_i64(claim.token))
            .bind(text)
            .bind(retry_in);
        let Some(row) = q.fetch_optional(&*self.pool).await? else {
            return Ok(false);
        };
        match finish {
            Finish::HandBack if row.try_get::<String, _>("state")? == "pending" => {
                let queue: String = row.try_get("queue")?;
                self.wake([queue.as_str()]);
            }
            Finish::Failed { .. } if row.try_get::<String, _>("state")? == "pending" => {
                // A retry: announce when its backoff ends.
                let queue: String = row.try_get("queue")?;
                self.wake_later([(queue.as_str(), row.try_get::<i64, _>("run_at")?)]);
            }
            _ => {}
        }
        Ok(true)
    }

    async fn finish_many(&self, items: &[(Claim, Finish)]) -> Result<Vec<bool>, StoreError> {
        // Successes (the common case) in one statement; the rest one by one.
        // Each statement is a hand-off to the connection's thread, so a
        // batch of successes is one hand-off, one write lock, one commit.
        let mut out = vec![false; items.len()];
        let ok: Vec<serde_json::Value> = items
            .iter()
            .filter(|(_, f)| matches!(f, Finish::Succeeded))
            .map(|(c, _)| serde_json::json!([c.id, token_i64(c.token)]))
            .collect();
        let rest = items.len() - ok.len();
        let tasks = &self.t.tasks;
        let succeed = format!(
            "UPDATE {tasks} SET state = 'succeeded', finished_at = {NOW}, lease_until = NULL \
             FROM (SELECT value ->> 0 AS cid, value ->> 1 AS ctok FROM json_each(?1)) AS c \
             WHERE {tasks}.id = c.cid AND {tasks}.claim_token = c.ctok \
                 AND {tasks}.state = 'running' \
             RETURNING {tasks}.id"
        );
        let list = json_text(&serde_json::Value::Array(ok))?;
        let mut woken: Vec<String> = Vec::new();
        let mut retried: Vec<(String, i64)> = Vec::new();
        let done: HashSet<i64> = if rest == 0 {
            // One statement is atomic on its own.
            sqlx::query_scalar(&succeed)
                .bind(&list)
                .fetch_all(&*self.pool)
                .await?
                .into_iter()
                .collect()
        } else {
            // Mixed outcomes: one IMMEDIATE transaction, one commit.
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let done: HashSet<i64> = if rest < items.len() {
                sqlx::query_scalar(&succeed)
                    .bind(&list)
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .collect()
            } else {
                HashSet::new()
            };
            for (i, (claim, finish)) in items.iter().enumerate() {
                if matches!(finish, Finish::Succeeded) {
                    continue;
                }
                let (sql, text, retry_in) = self.finish_sql(finish);
                let row = sqlx::query(&sql)
                    .bind(claim.id)
                    .bind(token_i64(claim.token))
                    .bind(text)
                    .bind(retry_in)
                    .fetch_optional(&mut *tx)
                    .await?;
                match (&row, finish) {
                    (Some(row), Finish::HandBack)
                        if row.try_get::<String, _>("state")? == "pending" =>
                    {
                        woken.push(row.try_get("queue")?)
                    }
                    (Some(row), Finish::Failed { .. })
                        if row.try_get::<String, _>("state")? == "pending" =>
                    {
                        retried.push((row.try_get("queue")?, row.try_get("run_at")?));
                    }
                    _ => {}
                }
                out[i] = row.is_some();
            }
            tx.commit().await?;
            done
        };
        for (i, (claim, finish)) in items.iter().enumerate() {
            if matches!(finish, Finish::Succeeded) {
                out[i] = done.contains(&claim.id);
            }
        }
        self.wake(woken.iter().map(String::as_str));
        self.wake_later(retried.iter().map(|(q, at)| (q.as_str(), *at)));
        Ok(out)
    }

    async fn progress(
        &self,
        claim: Claim,
        progress: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE {tasks} SET progress = ?3 \
             WHERE id = ?1 AND claim_token = ?2 AND state = 'running'",
            tasks = self.t.tasks
        ))
        .bind(claim.id)
        .bind(token_i64(claim.token))
        .bind(json_text(progress)?)
        .execute(&*self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn rescue(&self) -> Result<Rescued, StoreError> {
        let tasks = &self.t.tasks;
        let ends = "cancel_requested OR attempt >= max_attempts";
        let rows = sqlx::query(&format!(
            "UPDATE {tasks} SET \
                 state = CASE WHEN cancel_requested THEN 'cancelled' \
                              WHEN attempt >= max_attempts THEN 'failed' \
                              ELSE 'pending' END, \
                 finished_at = CASE WHEN {ends} THEN {NOW} ELSE NULL END, \
                 errors = json_insert(errors, '$[#]', \
                     json_object('attempt', attempt, 'at', {NOW}, 'error', ?1)), \
                 last_error = ?1, \
                 lease_until = NULL \
             WHERE state = 'running' AND lease_until < {NOW} \
             RETURNING queue, state"
        ))
        .bind(LEASE_EXPIRED)
        .fetch_all(&*self.pool)
        .await?;
        let mut out = Rescued::default();
        let mut requeued = Vec::new();
        for row in &rows {
            let state: String = row.try_get("state")?;
            match TaskState::from_str(&state)? {
                TaskState::Pending => {
                    out.requeued += 1;
                    requeued.push(row.try_get::<String, _>("queue")?);
                }
                TaskState::Failed => out.failed += 1,
                TaskState::Cancelled => out.cancelled += 1,
                other => return Err(corrupt("rescued task state", other)),
            }
        }
        self.wake(requeued.iter().map(String::as_str));
        Ok(out)
    }

    async fn cancel(&self, id: i64) -> Result<CancelOutcome, StoreError> {
        let tasks = &self.t.tasks;
        let mut tx = self.immediate().await?;
        let state: Option<String> =
            sqlx::query_scalar(&format!("SELECT state FROM {tasks} WHERE id = ?1"))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let outcome = match state.as_deref().map(TaskState::from_str).transpose()? {
            None => CancelOutcome::NotFound,
            Some(TaskState::Pending) => {
                sqlx::query(&format!(
                    "UPDATE {tasks} SET state = 'cancelled', finished_at = {NOW} WHERE id = ?1"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?;
                CancelOutcome::Cancelled
            }
            Some(TaskState::Running) => {
                sqlx::query(&format!(
                    "UPDATE {tasks} SET cancel_requested = 1 WHERE id = ?1"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?;
                CancelOutcome::Requested
            }
            Some(done) => CancelOutcome::AlreadyFinished(done),
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn retry(&self, id: i64) -> Result<bool, StoreError> {
        let res = sqlx::query_scalar::<_, String>(&format!(
            "UPDATE {tasks} SET state = 'pending', run_at = {NOW}, finished_at = NULL, \
                 cancel_requested = 0, max_attempts = MAX(max_attempts, attempt + 1) \
             WHERE id = ?1 AND state IN ('failed', 'cancelled') \
             RETURNING queue",
            tasks = self.t.tasks
        ))
        .bind(id)
        .fetch_optional(&*self.pool)
        .await;
        match res {
            Ok(Some(queue)) => {
                self.wake([queue.as_str()]);
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                Err(StoreError::Conflict(format!(
                    "task {id}: its unique key is taken by another unfinished task"
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn task(&self, id: i64) -> Result<Option<TaskInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT {TASK_COLS} FROM {tasks} WHERE id = ?1",
            tasks = self.t.tasks
        ))
        .bind(id)
        .fetch_optional(&*self.reader)
        .await?
        .as_ref()
        .map(task_info)
        .transpose()
    }

    async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskInfo>, StoreError> {
        // Only the conditions asked for, so the planner sees plain terms.
        let mut conds: Vec<&str> = Vec::new();
        if filter.queue.is_some() {
            conds.push("queue = ?1");
        }
        if filter.state.is_some() {
            conds.push("state = ?2");
        }
        if filter.job.is_some() {
            conds.push("job = ?3");
        }
        if filter.before_id.is_some() {
            conds.push("id < ?4");
        }
        let where_ = if conds.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conds.join(" AND "))
        };
        let limit = if filter.limit == 0 { 100 } else { filter.limit };
        // Every parameter is bound (unused ones are harmless) so the numbers
        // stay fixed; the limit is a literal.
        sqlx::query(&format!(
            "SELECT {TASK_COLS} FROM {tasks} {where_} ORDER BY id DESC LIMIT {limit}",
            tasks = self.t.tasks
        ))
        .bind(filter.queue.as_deref())
        .bind(filter.state.map(TaskState::as_str))
        .bind(filter.job.as_deref())
        .bind(filter.before_id)
        .fetch_all(&*self.reader)
        .await?
        .iter()
        .map(task_info)
        .collect()
    }

    async fn stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        let rows = sqlx::query(&format!(
            "WITH n(now) AS (SELECT {NOW}) \
             SELECT queue, state, COUNT(*) AS count, \
                 n.now - MIN(CASE WHEN state = 'pending' AND run_at <= n.now THEN run_at END) \
                     AS oldest \
             FROM {tasks}, n GROUP BY queue, state ORDER BY queue",
            tasks = self.t.tasks
        ))
        .fetch_all(&*self.reader)
        .await?;
        let mut out: Vec<QueueStats> = Vec::new();
        for row in &rows {
            let queue: String = row.try_get("queue")?;
            let state: String = row.try_get("state")?;
            let count: i64 = row.try_get("count")?;
            let count = u64::try_from(count).map_err(|_| corrupt("count", count))?;
            let oldest: Option<i64> = row.try_get("oldest")?;
            if out.last().map(|s| s.queue != queue).unwrap_or(true) {
                out.push(QueueStats {
                    queue,
                    ..QueueStats::default()
                });
            }
            let Some(s) = out.last_mut() else {
                continue;
            };
            match TaskState::from_str(&state)? {
                TaskState::Pending => {
                    s.pending = count;
                    s.oldest_pending_ms = oldest.map(|o| u64::try_from(o).unwrap_or(0));
                }
                TaskState::Running => s.running = count,
                TaskState::Succeeded => s.succeeded = count,
                TaskState::Failed => s.failed = count,
                TaskState::Cancelled => s.cancelled = count,
            }
        }
        Ok(out)
    }

    async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(&format!(
            "DELETE FROM {tasks} WHERE finished_at < {NOW} - ?1 \
                 AND state IN ('succeeded', 'failed', 'cancelled')",
            tasks = self.t.tasks
        ))
        .bind(ms(older_than))
        .execute(&*self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn subscribe(&self) -> Result<broadcast::Receiver<Wake>, StoreError> {
        Ok(self.shared.wake.subscribe())
    }

    // ---- schedules -----------------------------------------------------------

    async fn job_register(&self, job: &str) -> Result<JobState, StoreError> {
        let jobs = &self.t.jobs;
        // The no-op DO UPDATE makes RETURNING answer for an existing row too.
        let row = sqlx::query(&format!(
            "INSERT INTO {jobs} (name, last_slot, paused) VALUES (?1, {NOW}, 0) \
             ON CONFLICT (name) DO UPDATE SET paused = {jobs}.paused \
             RETURNING name, last_slot, paused"
        ))
        .bind(job)
        .fetch_one(&*self.pool)
        .await?;
        job_state(&row)
    }

    async fn job_advance(&self, adv: &SlotAdvance<'_>) -> Result<Advanced, StoreError> {
        let Tables { tasks, jobs, .. } = &self.t;
        let mut tx = self.immediate().await?;
        let row = sqlx::query(&format!(
            "SELECT last_slot, paused, {NOW} AS now FROM {jobs} WHERE name = ?1"
        ))
        .bind(adv.job)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(Advanced::UnknownJob);
        };
        if row.try_get::<i64, _>("paused")? != 0 {
            return Ok(Advanced::Paused);
        }
        let current: Option<i64> = row.try_get("last_slot")?;
        if current != adv.expected.map(|e| e.timestamp_millis()) {
            return Ok(Advanced::Moved(opt_time(current)?));
        }
        let now: i64 = row.try_get("now")?;
        if (adv.due_only && adv.slot.timestamp_millis() > now)
            || adv.until.is_some_and(|u| now >= u.timestamp_millis())
        {
            return Ok(Advanced::NotDue { now: from_ms(now)? });
        }
        sqlx::query(&format!("UPDATE {jobs} SET last_slot = ?2 WHERE name = ?1"))
            .bind(adv.job)
            .bind(adv.slot.timestamp_millis())
            .execute(&mut *tx)
            .await?;
        let Some(task) = adv.task else {
            tx.commit().await?;
            return Ok(Advanced::Enqueued(Enqueued {
                id: 0,
                inserted: false,
            }));
        };
        let overlapping = match (adv.record, adv.overlap) {
            (SlotRecord::Enqueue, Overlap::Forbid) => sqlx::query_scalar::<_, i64>(&format!(
                "SELECT 1 FROM {tasks} WHERE job = ?1 AND state IN ('pending', 'running') \
                 AND (?2 IS NULL OR slot IS NULL OR slot <= ?2) LIMIT 1"
            ))
            .bind(adv.job)
            .bind(adv.batch_after.map(|t| t.timestamp_millis()))
            .fetch_optional(&mut *tx)
            .await?
            .is_some(),
            _ => false,
        };
        let inserted = insert_tasks(&mut tx, &self.t, std::slice::from_ref(task)).await?;
        let enq = inserted
            .results
            .first()
            .copied()
            .ok_or_else(|| StoreError::Backend("insert returned no result".into()))?;
        let skip_reason = match adv.record {
            SlotRecord::Skip { reason } => Some(reason),
            _ if overlapping => Some(OVERLAP_SKIPPED),
            _ => None,
        };
        let answer = if !enq.inserted {
            // The slot's task already exists (made by a trigger): the slot
            // has its task.
            Advanced::Enqueued(enq)
        } else if let Some(reason) = skip_reason {
            sqlx::query(&format!(
                "UPDATE {tasks} SET state = 'cancelled', last_error = ?2, finished_at = {NOW} \
                 WHERE id = ?1"
            ))
            .bind(enq.id)
            .bind(reason)
            .execute(&mut *tx)
            .await?;
            Advanced::Skipped(enq)
        } else if let SlotRecord::Run { worker, lease } = adv.record {
            sqlx::query(&format!(
                "UPDATE {tasks} SET state = 'running', attempt = 1, started_at = {NOW}, \
                 lease_until = {NOW} + ?2, worker = ?3, claim_token = 1 WHERE id = ?1"
            ))
            .bind(enq.id)
            .bind(ms(lease))
            .bind(worker)
            .execute(&mut *tx)
            .await?;
            Advanced::Enqueued(enq)
        } else {
            Advanced::Enqueued(enq)
        };
        tx.commit().await?;
        if adv.record == SlotRecord::Enqueue
            && matches!(answer, Advanced::Enqueued(_))
            && !inserted.due_queues.is_empty()
        {
            self.wake([task.queue.as_str()]);
        }
        if adv.record == SlotRecord::Enqueue && matches!(answer, Advanced::Enqueued(_)) {
            self.wake_later(
                inserted
                    .later
                    .iter()
                    .map(|&(_, at)| (task.queue.as_str(), at)),
            );
        }
        Ok(answer)
    }

    async fn job_set_paused(&self, job: &str, paused: bool) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "UPDATE {jobs} SET paused = ?2 WHERE name = ?1",
            jobs = self.t.jobs
        ))
        .bind(job)
        .bind(paused)
        .execute(&*self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn job_list(&self) -> Result<Vec<JobState>, StoreError> {
        sqlx::query(&format!(
            "SELECT name, last_slot, paused FROM {jobs} ORDER BY name",
            jobs = self.t.jobs
        ))
        .fetch_all(&*self.reader)
        .await?
        .iter()
        .map(job_state)
        .collect()
    }
}

fn token_i64(token: FencingToken) -> i64 {
    // A token beyond i64 was never granted by this store: no row matches.
    i64::try_from(token.0).unwrap_or(-1)
}

fn token_of(v: i64, what: &str) -> Result<FencingToken, StoreError> {
    u64::try_from(v)
        .map(FencingToken)
        .map_err(|_| corrupt(what, v))
}
