//! The SQLite schema: the base DDL (version 1), the numbered upgrade steps
//! ([`UPGRADES`]) and the migration that runs them.

use sqlx::sqlite::SqliteConnection;

use super::sql::KEY_TAKEN;
use super::{SqliteBackend, Tables, NOW, NOW_US};
use crate::error::StoreError;
use crate::store::migrate::{parse_version, Dialect};
use crate::store::sql_row::{self, corrupt};
use crate::store::SchemaStatus;
use crate::store::CANCEL_REQUESTED;

/// The version [`schema_sql`] creates; [`UPGRADES`] take it from there.
const BASE_VERSION: i64 = 1;

/// The schema version this code writes and reads: the base plus one per
/// upgrade step.
const SCHEMA_VERSION: i64 = BASE_VERSION + UPGRADES.len() as i64;

/// The unique index's condition before schema 9 (the base DDL creates it
/// so; step 8 → 9 replaces it with [`KEY_TAKEN`]).
const KEY_TAKEN_BEFORE_9: &str = "(unique_forever OR state IN ('pending', 'running'))";

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
    WHERE unique_key IS NOT NULL AND {KEY_TAKEN_BEFORE_9};
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
    // 2 → 3: the `queues` table (a queue's paused flag).
    upgrade_queues,
    // 3 → 4: the enqueuer's trace context on each task.
    upgrade_traceparent,
    // 4 → 5: slot tombstones (a pruned slot's key stays taken, DESIGN.md
    // S1) and each job's queue.
    upgrade_slot_tombstones,
    // 5 → 6: each task's concurrency key, and the index a per-key capped
    // claim counts a queue's running tasks per key with.
    upgrade_concurrency_key,
    // 6 → 7: unique keys scoped by kind and queue (issue 29): the keys of
    // existing tasks rewritten into the default scope's composite.
    upgrade_unique_scope,
    // 7 → 8: rate limits' start logs.
    upgrade_rates,
    // 8 → 9: a third unique hold, `UntilFailed` (issue 29).
    upgrade_unique_until_failed,
    // 9 → 10: fair claiming: each queue's rotation cursor and the index
    // the fair claim finds each key's first pending task with.
    upgrade_fair,
    // 10 → 11: each job's overlap policy, and the note, author and time
    // of a job's or queue's last pause or resume (issue 26).
    upgrade_pause_notes,
    // 11 → 12: the audit log (issue 27).
    upgrade_audit,
    // 12 → 13: debounce and throttle: the index a throttled enqueue finds
    // its key's last start with.
    upgrade_key_starts,
    // 13 → 14: the limits each queue's workers declare (issue 25).
    upgrade_queue_limits,
    // 14 → 15: job definitions kept in the store (issue 26).
    upgrade_jobdefs,
    // 15 → 16: rates per concurrency key: each key's start log.
    upgrade_key_rates,
    // 16 → 17: the throughput rollup (issue 27).
    upgrade_rollup,
    // 17 → 18: lock history (issue 27).
    upgrade_lock_history,
    // 18 → 19: the rollup per schedule job (issue 27).
    upgrade_rollup_job,
    // 19 → 20: a release recorded in one statement (issue 27).
    upgrade_lock_history_release,
    // 20 → 21: start logs written as runs (issue 25).
    start_log_runs,
];

/// Nothing to convert: rate limits' start logs (`<p>rates`,
/// `<p>key_rates`) are written as runs from this version on (`instant*count`,
/// `store::rate::StartLog`), which older builds cannot read; plain instants
/// still read as runs of one. The version keeps older builds from opening
/// a database this one has written.
fn start_log_runs(_: &Tables) -> Vec<Ddl> {
    Vec::new()
}

/// A release with lock history in one statement: the record is inserted
/// from the lock's row with the lease's new end (`release_to`), and a
/// trigger on the insert sets it on the lock, in the same statement (no
/// `BEGIN IMMEDIATE` of two statements). `release_to` is `NULL` on rows
/// no release wrote (none yet).
fn upgrade_lock_history_release(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::AddColumn {
            table: format!("{}lock_history", t.prefix),
            column: "release_to",
            decl: "INTEGER",
        },
        Ddl::Sql(format!(
            "CREATE TRIGGER IF NOT EXISTS {} AFTER INSERT ON {} \
             WHEN NEW.release_to IS NOT NULL BEGIN \
               UPDATE {} SET lock_until = NEW.release_to \
               WHERE name = NEW.name AND token = NEW.token; \
             END",
            t.index("lock_history_release"),
            t.lock_history,
            t.locks
        )),
    ]
}

/// The rollup keyed by job too (`''` for tasks of no job), so a job
/// defined in the store (kind `command`) has a series of its own. SQLite
/// cannot change a primary key: the table is copied into one with the new
/// key (rows counted before belong to no job), in the migration's
/// transaction.
fn upgrade_rollup_job(t: &Tables) -> Vec<Ddl> {
    let cols = format!(
        "res, bucket, queue, kind, {}",
        crate::store::stats_sql::COUNT_COLS.join(", ")
    );
    let next = format!("\"{}rollup_next\"", t.prefix);
    vec![
        Ddl::Sql(format!("DROP TABLE IF EXISTS {next}")),
        Ddl::Sql(format!(
            "CREATE TABLE {next} ( \
             res INTEGER NOT NULL, bucket INTEGER NOT NULL, \
             queue TEXT NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL DEFAULT '', \
             succeeded INTEGER NOT NULL, failed INTEGER NOT NULL, \
             dead INTEGER NOT NULL, cancelled INTEGER NOT NULL, \
             wait_n INTEGER NOT NULL, wait_ms INTEGER NOT NULL, wait_max_ms INTEGER NOT NULL, \
             run_n INTEGER NOT NULL, run_ms INTEGER NOT NULL, run_max_ms INTEGER NOT NULL, \
             PRIMARY KEY (res, bucket, queue, kind, job) \
         )"
        )),
        Ddl::Sql(format!(
            "INSERT INTO {next} ({cols}) SELECT {cols} FROM {}",
            t.rollup
        )),
        Ddl::Sql(format!("DROP TABLE {}", t.rollup)),
        Ddl::Sql(format!(
            "ALTER TABLE {next} RENAME TO \"{}rollup\"",
            t.prefix
        )),
    ]
}

/// Job definitions kept in the store: one row a name, a tombstone when
/// deleted (so a name's version never repeats).
fn upgrade_jobdefs(t: &Tables) -> Vec<Ddl> {
    let fingerprint = Ddl::AddColumn {
        table: format!("{}jobs", t.prefix),
        column: "fingerprint",
        decl: "TEXT",
    };
    vec![
        fingerprint,
        Ddl::Sql(format!(
            "CREATE TABLE IF NOT EXISTS \"{}jobdefs\" ( \
             name       TEXT PRIMARY KEY, \
             version    INTEGER NOT NULL, \
             spec       TEXT NOT NULL, \
             deleted    INTEGER NOT NULL DEFAULT 0, \
             created_at INTEGER NOT NULL, \
             updated_at INTEGER NOT NULL, \
             updated_by TEXT NOT NULL \
         )",
            t.prefix
        )),
    ]
}

/// Lock history: one row a release, pruned by `released_at` and per lock.
fn upgrade_lock_history(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::Sql(format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, \
             holder TEXT NOT NULL, token INTEGER NOT NULL, \
             acquired_at INTEGER NOT NULL, released_at INTEGER NOT NULL \
         )",
        t.lock_history
    ))]
}

/// The throughput rollup: one row a (resolution, bucket, queue, kind),
/// counts added by each worker's flush, pruned by bucket.
fn upgrade_rollup(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::Sql(format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             res INTEGER NOT NULL, bucket INTEGER NOT NULL, \
             queue TEXT NOT NULL, kind TEXT NOT NULL, \
             succeeded INTEGER NOT NULL, failed INTEGER NOT NULL, \
             dead INTEGER NOT NULL, cancelled INTEGER NOT NULL, \
             wait_n INTEGER NOT NULL, wait_ms INTEGER NOT NULL, wait_max_ms INTEGER NOT NULL, \
             run_n INTEGER NOT NULL, run_ms INTEGER NOT NULL, run_max_ms INTEGER NOT NULL, \
             PRIMARY KEY (res, bucket, queue, kind) \
         )",
        t.rollup
    ))]
}

/// The jobs' `overlap` (what a worker ending a run reads to skip
/// `job_release` under `skip`/`allow`) and the pause records of jobs and
/// queues (`pause_note`, `pause_by`, `pause_at`), all nullable: nothing to
/// convert.
fn upgrade_pause_notes(t: &Tables) -> Vec<Ddl> {
    let col = |table: &str, column: &'static str, decl: &'static str| Ddl::AddColumn {
        table: format!("{}{table}", t.prefix),
        column,
        decl,
    };
    vec![
        col("jobs", "overlap", "TEXT"),
        col("jobs", "pause_note", "TEXT"),
        col("jobs", "pause_by", "TEXT"),
        col("jobs", "pause_at", "INTEGER"),
        col("queues", "pause_note", "TEXT"),
        col("queues", "pause_by", "TEXT"),
        col("queues", "pause_at", "INTEGER"),
    ]
}

/// The audit log: one row an operator action, pruned by `at`.
fn upgrade_audit(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::Sql(format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 id      INTEGER PRIMARY KEY AUTOINCREMENT, \
                 at      INTEGER NOT NULL, \
                 actor   TEXT NOT NULL, \
                 action  TEXT NOT NULL, \
                 target  TEXT NOT NULL, \
                 source  TEXT NOT NULL, \
                 outcome TEXT NOT NULL \
             )",
            t.audit
        )),
        Ddl::Sql(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (at)",
            t.index("audit_at"),
            t.audit
        )),
    ]
}

/// The limits a queue's workers declare (`store::QueueLimits` as JSON),
/// who declared them and when: nullable, nothing to convert.
fn upgrade_queue_limits(t: &Tables) -> Vec<Ddl> {
    let col = |column: &'static str, decl: &'static str| Ddl::AddColumn {
        table: format!("{}queues", t.prefix),
        column,
        decl,
    };
    vec![
        col("limits", "TEXT"),
        col("limits_by", "TEXT"),
        col("limits_at", "INTEGER"),
    ]
}

/// The index `store::KeySeen::last_start` is read from: the tasks with a
/// unique key that have started, by key and start.
fn upgrade_key_starts(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::Sql(format!(
        "CREATE INDEX IF NOT EXISTS {} ON {} (unique_key, started_at) \
         WHERE unique_key IS NOT NULL AND started_at IS NOT NULL",
        t.index("tasks_key_starts"),
        t.tasks
    ))]
}

/// The hold `UniqueHold::UntilFailed` (a succeeded task keeps its key):
/// the column `unique_until_failed` (0 on every existing task, so each
/// keeps its hold: `unique_forever` forever, the rest unfinished) and the
/// unique index rebuilt on [`KEY_TAKEN`], which reads it.
fn upgrade_unique_until_failed(t: &Tables) -> Vec<Ddl> {
    let unique_idx = t.index("tasks_unique");
    vec![
        Ddl::AddColumn {
            table: format!("{}tasks", t.prefix),
            column: "unique_until_failed",
            decl: "INTEGER NOT NULL DEFAULT 0",
        },
        Ddl::Sql(format!("DROP INDEX IF EXISTS {unique_idx}")),
        Ddl::Sql(format!(
            "CREATE UNIQUE INDEX IF NOT EXISTS {unique_idx} ON {} (unique_key) \
             WHERE unique_key IS NOT NULL AND {KEY_TAKEN}",
            t.tasks
        )),
    ]
}

/// The fair claim (`store::fair`) walks the distinct keys of a queue's
/// pending tasks and each key's first due one on this index, and keeps the
/// group it served last in `queues.fair_cursor`.
fn upgrade_fair(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::AddColumn {
            table: format!("{}queues", t.prefix),
            column: "fair_cursor",
            decl: "TEXT",
        },
        Ddl::Sql(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (queue, concurrency_key, priority, run_at, id) \
             WHERE state = 'pending'",
            t.index("tasks_key_pending"),
            t.tasks
        )),
    ]
}

/// Rewrite the key of every task that is no job's run and has a key from
/// before scopes into the default scope's composite
/// (`store::UniqueKey::upgraded`, spelled the same; a composite over 1024
/// bytes leaves the key as it was). Idempotent: a composite starts with
/// the separator and is left alone.
fn upgrade_unique_scope(t: &Tables) -> Vec<Ddl> {
    let s = "char(31)";
    let bytes = |c: &str| format!("length(CAST({c} AS BLOB))");
    vec![Ddl::Sql(format!(
        "UPDATE {tasks} SET unique_key = {s} || 'k' || {s} || queue || {s} || kind || {s} \
             || {s} || {s} || unique_key \
         WHERE unique_key IS NOT NULL AND job IS NULL AND substr(unique_key, 1, 1) <> {s} \
             AND {} + {} + {} + 7 <= {max}",
        bytes("queue"),
        bytes("kind"),
        bytes("unique_key"),
        tasks = t.tasks,
        max = crate::store::MAX_STORED_KEY_LEN,
    ))]
}

/// Rates per concurrency key (`store::key_rate`): one start log per
/// (queue, key), found by `free_at` for the earliest held-back key and by
/// `idle_at` for pruning.
fn upgrade_key_rates(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::Sql(format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 queue   TEXT NOT NULL, \
                 ckey    TEXT NOT NULL, \
                 starts  TEXT NOT NULL DEFAULT '', \
                 free_at INTEGER NOT NULL DEFAULT 0, \
                 idle_at INTEGER NOT NULL DEFAULT 0, \
                 PRIMARY KEY (queue, ckey) \
             )",
            t.key_rates
        )),
        Ddl::Sql(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (queue, free_at)",
            t.index("key_rates_free"),
            t.key_rates
        )),
        Ddl::Sql(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (queue, idle_at)",
            t.index("key_rates_idle"),
            t.key_rates
        )),
    ]
}

fn upgrade_rates(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::Sql(format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             name   TEXT PRIMARY KEY, \
             starts TEXT NOT NULL DEFAULT '' \
         )",
        t.rates
    ))]
}

fn upgrade_concurrency_key(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::AddColumn {
            table: format!("{}tasks", t.prefix),
            column: "concurrency_key",
            decl: "TEXT",
        },
        Ddl::Sql(format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} (queue, concurrency_key) \
             WHERE state = 'running' AND concurrency_key IS NOT NULL",
            t.index("tasks_key_running"),
            t.tasks
        )),
    ]
}

fn upgrade_slot_tombstones(t: &Tables) -> Vec<Ddl> {
    vec![
        Ddl::Sql(format!(
            "CREATE TABLE IF NOT EXISTS {} ( \
                 unique_key  TEXT PRIMARY KEY, \
                 job         TEXT NOT NULL, \
                 slot        INTEGER, \
                 task_id     INTEGER NOT NULL, \
                 state       TEXT NOT NULL, \
                 last_error  TEXT, \
                 finished_at INTEGER \
             )",
            t.slots
        )),
        Ddl::AddColumn {
            table: format!("{}jobs", t.prefix),
            column: "queue",
            decl: "TEXT",
        },
    ]
}

fn upgrade_traceparent(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::AddColumn {
        table: format!("{}tasks", t.prefix),
        column: "traceparent",
        decl: "TEXT",
    }]
}

fn upgrade_queues(t: &Tables) -> Vec<Ddl> {
    vec![Ddl::Sql(format!(
        "CREATE TABLE IF NOT EXISTS {} ( \
             name   TEXT PRIMARY KEY, \
             paused INTEGER NOT NULL DEFAULT 0 \
         )",
        t.queues
    ))]
}

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

/// The recorded version against [`SCHEMA_VERSION`] (a read, no DDL).
pub(super) async fn status(b: &SqliteBackend) -> Result<SchemaStatus, StoreError> {
    let read = sqlx::query_scalar(&format!(
        "SELECT value FROM {} WHERE key = 'schema_version'",
        b.t.meta
    ))
    .fetch_optional(&*b.reader)
    .await;
    sql_row::schema_status(read, SCHEMA_VERSION)
}

/// Drop every table of the prefix, in one `BEGIN IMMEDIATE` transaction
/// (a migration takes the same lock, so it runs before or after, whole).
pub(super) async fn remove(b: &SqliteBackend) -> Result<(), StoreError> {
    let mut tx = b.immediate().await?;
    // One table a statement (SQLite's DROP TABLE takes one); indexes and
    // triggers go with their table.
    for t in crate::store::migrate::SQL_TABLES {
        sqlx::query(&format!("DROP TABLE IF EXISTS \"{}{t}\"", b.t.prefix))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Create the schema if absent and run the upgrade steps from the recorded
/// version, in one `BEGIN IMMEDIATE` transaction (so processes that connect
/// at once take turns), through the shared runner (`store::migrate`).
pub(super) async fn migrate(b: &SqliteBackend) -> Result<(), StoreError> {
    crate::store::migrate::run(&mut Migration { b, tx: None }).await
}

/// The SQLite side of the shared migration runner: the lock is a `BEGIN
/// IMMEDIATE` transaction.
struct Migration<'a> {
    b: &'a SqliteBackend,
    tx: Option<sqlx::Transaction<'static, sqlx::Sqlite>>,
}

impl Migration<'_> {
    /// The transaction [`Dialect::lock`] began.
    fn tx(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        self.tx
            .as_deref_mut()
            .ok_or_else(|| StoreError::Backend("sqlite migration: not locked".into()))
    }

    fn read_version_sql(&self) -> String {
        format!(
            "SELECT value FROM {} WHERE key = 'schema_version'",
            self.b.t.meta
        )
    }
}

#[async_trait::async_trait]
impl Dialect for Migration<'_> {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn prefix(&self) -> &str {
        &self.b.t.prefix
    }

    fn base_version(&self) -> i64 {
        BASE_VERSION
    }

    fn step_count(&self) -> usize {
        UPGRADES.len()
    }

    async fn peek_version(&mut self) -> Result<Option<i64>, StoreError> {
        let v: Option<String> = sqlx::query_scalar(&self.read_version_sql())
            .fetch_optional(&*self.b.pool)
            .await?;
        v.as_deref().map(parse_version).transpose()
    }

    async fn lock(&mut self) -> Result<(), StoreError> {
        self.tx = Some(self.b.immediate().await?);
        Ok(())
    }

    async fn recorded_version(&mut self) -> Result<Option<i64>, StoreError> {
        let sql = self.read_version_sql();
        let read: Result<Option<String>, sqlx::Error> =
            sqlx::query_scalar(&sql).fetch_optional(self.tx()?).await;
        match read {
            Ok(v) => v.as_deref().map(parse_version).transpose(),
            Err(e) if sql_row::is_missing_table(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn create(&mut self) -> Result<i64, StoreError> {
        for stmt in schema_sql(&self.b.t) {
            sqlx::query(&stmt).execute(self.tx()?).await?;
        }
        Ok(BASE_VERSION)
    }

    async fn run_step(&mut self, index: usize) -> Result<(), StoreError> {
        let step = UPGRADES
            .get(index)
            .ok_or_else(|| corrupt("schema upgrade step", index))?;
        for ddl in step(&self.b.t) {
            run_ddl(self.tx()?, &ddl).await?;
        }
        Ok(())
    }

    async fn record_version(&mut self, version: i64) -> Result<(), StoreError> {
        let sql = format!(
            "UPDATE {} SET value = ?1 WHERE key = 'schema_version'",
            self.b.t.meta
        );
        sqlx::query(&sql)
            .bind(version.to_string())
            .execute(self.tx()?)
            .await?;
        Ok(())
    }

    async fn unlock(&mut self, commit: bool) -> Result<(), StoreError> {
        match self.tx.take() {
            Some(tx) if commit => Ok(tx.commit().await?),
            // Dropped: rolled back.
            _ => Ok(()),
        }
    }

    async fn write_identity(&mut self) -> Result<(), StoreError> {
        // The store's identity, written once (see `StoreIdentity`).
        sqlx::query(&format!(
            "INSERT INTO {} (key, value) VALUES ('store_id', ?1) ON CONFLICT (key) DO NOTHING",
            self.b.t.meta
        ))
        .bind(crate::store::new_store_id())
        .execute(&*self.b.pool)
        .await?;
        Ok(())
    }
}

/// The store's identity and task id counter (a read; nothing at all when
/// the tables are missing).
pub(super) async fn identity(b: &SqliteBackend) -> Result<crate::store::StoreIdentity, StoreError> {
    let read: Result<(Option<String>, i64), sqlx::Error> = sqlx::query_as(&format!(
        "SELECT (SELECT value FROM {} WHERE key = 'store_id'), \
             COALESCE((SELECT seq FROM sqlite_sequence WHERE name = ?1), 0)",
        b.t.meta
    ))
    .bind(format!("{}tasks", b.t.prefix))
    .fetch_one(&*b.reader)
    .await;
    match read {
        Ok((id, last_task_id)) => Ok(crate::store::StoreIdentity { id, last_task_id }),
        Err(e) if sql_row::is_missing_table(&e) => Ok(crate::store::StoreIdentity::default()),
        Err(e) => Err(e.into()),
    }
}

/// Raise the task id counter (`sqlite_sequence`) to the store's clock in
/// µs when it is more than
/// [`ID_FLOOR_SLACK_US`](crate::store::ID_FLOOR_SLACK_US) behind it
/// (DESIGN.md I1), in one `BEGIN IMMEDIATE` transaction, which inserts
/// cannot interleave with.
pub(super) async fn floor_ids(b: &SqliteBackend) -> Result<(), StoreError> {
    let name = format!("{}tasks", b.t.prefix);
    let mut tx = b.immediate().await?;
    // The counter's row exists from the first insert on; before that it
    // is written here.
    let floored = async {
        sqlx::query(
            "INSERT INTO sqlite_sequence (name, seq) SELECT ?1, 0 \
             WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = ?1)",
        )
        .bind(&name)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "UPDATE sqlite_sequence SET seq = {NOW_US} WHERE name = ?1 AND seq < {NOW_US} - ?2"
        ))
        .bind(&name)
        .bind(crate::store::ID_FLOOR_SLACK_US)
        .execute(&mut *tx)
        .await
    }
    .await;
    match floored {
        Ok(_) => Ok(tx.commit().await?),
        // Not migrated (no AUTOINCREMENT table yet): nothing to floor.
        Err(e) if sql_row::is_missing_table(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// An `UPDATE` of no row: a database file this process may not write
/// answers SQLITE_READONLY (`StoreError::ReadOnly`); otherwise a no-op.
pub(super) async fn write_probe(b: &SqliteBackend) -> Result<(), StoreError> {
    let probe = format!("UPDATE {} SET value = value WHERE 0", b.t.meta);
    match sqlx::query(&probe).execute(&*b.pool).await {
        Ok(_) => Ok(()),
        Err(e) if sql_row::is_missing_table(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
