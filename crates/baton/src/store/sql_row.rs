//! Reading rows back, shared by the SQL backends (SQLite, PostgreSQL and
//! MySQL/MariaDB).
//!
//! The stores keep the same columns in different types (SQLite:
//! INTEGER milliseconds, TEXT JSON, INTEGER flags; PostgreSQL:
//! `timestamptz`, `jsonb`, `boolean`, `int4`/`int8`; MySQL: `DATETIME(6)`,
//! JSON text, `TINYINT(1)`). Each backend says how
//! to read one column of each kind ([`SqlRow`]); how a row becomes a
//! [`TaskInfo`], [`Task`], [`LockInfo`] or [`JobState`], and which stored
//! values count as corrupt, is written once here.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{AttemptError, FencingToken, JobState, LockInfo, TaskInfo, TaskState};
use crate::error::StoreError;

/// The columns of the tasks table read into a [`TaskInfo`], in the order
/// [`task_info`] reads them (the same names on every SQL backend).
pub(crate) const TASK_COLS: &str = "id, queue, kind, payload, state, priority, attempt, \
     max_attempts, timeout_ms, run_at, created_at, started_at, finished_at, lease_until, \
     worker, unique_key, unique_forever, unique_until_failed, cancel_requested, last_error, \
     errors, progress, job, slot, traceparent, concurrency_key";

/// The columns a claim returns, read into a [`Task`] by [`claimed_task`]
/// (PostgreSQL's and MySQL's; SQLite's claims return them packed).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const CLAIM_COLS: &str = "id, queue, kind, payload, priority, attempt, claim_token, \
     max_attempts, timeout_ms, run_at, lease_until, job, slot, traceparent";

/// The columns of the jobs table read into a [`JobState`] by [`job_state`].
pub(crate) const JOB_COLS: &str =
    "name, last_slot, paused, queue, overlap, pause_note, pause_by, pause_at, fingerprint";

/// The columns of the queues table read by [`queue_row`] (MySQL's table
/// names its key `queue`: it reads `queue AS name`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const QUEUE_COLS: &str = "name, paused, pause_note, pause_by, pause_at";

/// One column of each kind, as a backend stores it.
pub(crate) trait SqlRow {
    /// A text column.
    fn text(&self, col: &str) -> Result<String, StoreError>;
    /// A nullable text column.
    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError>;
    /// A 32-bit integer column (priority, attempt counts).
    fn int(&self, col: &str) -> Result<i64, StoreError>;
    /// A 64-bit integer column (ids, tokens).
    fn big(&self, col: &str) -> Result<i64, StoreError>;
    /// A nullable 64-bit integer column (milliseconds).
    fn opt_big(&self, col: &str) -> Result<Option<i64>, StoreError>;
    /// A boolean column.
    fn flag(&self, col: &str) -> Result<bool, StoreError>;
    /// A timestamp column.
    fn time(&self, col: &str) -> Result<DateTime<Utc>, StoreError>;
    /// A nullable timestamp column.
    fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// A JSON column.
    fn json(&self, col: &str) -> Result<serde_json::Value, StoreError>;
    /// A nullable JSON column.
    fn opt_json(&self, col: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// The `errors` column: every failed attempt, oldest first.
    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError>;
}

/// The [`SqlRow`] methods a backend reads with sqlx's own decoder, written
/// once for every backend: `name: Type` reads the column as `Type`;
/// `name: Type as Stored` reads it as `Stored` and widens it to `Type`
/// (`From`). Used inside an `impl SqlRow for <sqlx row>` block.
macro_rules! decoded_columns {
    ($($name:ident: $ty:ty $(as $stored:ty)?),* $(,)?) => {
        $(decoded_columns!(@one $name: $ty $(as $stored)?);)*
    };
    (@one $name:ident: $ty:ty) => {
        fn $name(&self, col: &str) -> Result<$ty, $crate::error::StoreError> {
            Ok(sqlx::Row::try_get(self, col)?)
        }
    };
    (@one $name:ident: $ty:ty as $stored:ty) => {
        fn $name(&self, col: &str) -> Result<$ty, $crate::error::StoreError> {
            Ok(<$ty>::from(sqlx::Row::try_get::<$stored, _>(self, col)?))
        }
    };
}
pub(crate) use decoded_columns;

/// JSON stored as text (SQLite, MySQL), read back.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn json_of(text: &str, col: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("task {col}: {e}")))
}

/// A stored value that does not fit its field.
pub(crate) fn corrupt(what: &str, v: impl std::fmt::Debug) -> StoreError {
    StoreError::Corrupt(format!("{what}: unexpected value {v:?}"))
}

/// A stored count (attempts) that must not be negative.
pub(crate) fn to_u32(v: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| corrupt(what, v))
}

/// A stored priority.
pub(crate) fn to_i32(v: i64, what: &str) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| corrupt(what, v))
}

/// Stored milliseconds (a timeout) as a duration.
pub(crate) fn to_duration(v: Option<i64>, what: &str) -> Result<Option<Duration>, StoreError> {
    v.map(|v| {
        u64::try_from(v)
            .map(Duration::from_millis)
            .map_err(|_| corrupt(what, v))
    })
    .transpose()
}

/// A stored token (lock or claim).
pub(crate) fn token_of(v: i64, what: &str) -> Result<FencingToken, StoreError> {
    u64::try_from(v)
        .map(FencingToken)
        .map_err(|_| corrupt(what, v))
}

/// A token as the SQL stores bind it. A token beyond `i64` was never
/// granted by an SQL store, so `-1` (which matches no row) stands for it.
pub(crate) fn token_arg(token: FencingToken) -> i64 {
    i64::try_from(token.0).unwrap_or(-1)
}

#[cfg(feature = "sqlite")]
/// A stored count (`count(*)`), never negative in practice.
pub(crate) fn count_of(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(what, v))
}

/// A row of [`TASK_COLS`].
pub(crate) fn task_info(row: &impl SqlRow) -> Result<TaskInfo, StoreError> {
    Ok(TaskInfo {
        id: row.big("id")?,
        queue: row.text("queue")?,
        kind: row.text("kind")?,
        payload: row.json("payload")?,
        state: row.text("state")?.parse::<TaskState>()?,
        priority: to_i32(row.int("priority")?, "priority")?,
        attempt: to_u32(row.int("attempt")?, "attempt")?,
        max_attempts: to_u32(row.int("max_attempts")?, "max_attempts")?,
        timeout: to_duration(row.opt_big("timeout_ms")?, "timeout")?,
        run_at: row.time("run_at")?,
        created_at: row.time("created_at")?,
        started_at: row.opt_time("started_at")?,
        finished_at: row.opt_time("finished_at")?,
        lease_until: row.opt_time("lease_until")?,
        worker: row.opt_text("worker")?,
        unique_key: row.opt_text("unique_key")?,
        unique_hold: crate::store::UniqueHold::from_flags(
            row.flag("unique_forever")?,
            row.flag("unique_until_failed")?,
        ),
        cancel_requested: row.flag("cancel_requested")?,
        last_error: row.opt_text("last_error")?,
        errors: row.errors("errors")?,
        progress: row.opt_json("progress")?,
        job: row.opt_text("job")?,
        slot: row.opt_time("slot")?,
        traceparent: row.opt_text("traceparent")?,
        concurrency_key: row.opt_text("concurrency_key")?,
    })
}

/// A row of [`CLAIM_COLS`]: a task just claimed.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn claimed_task(row: &impl SqlRow) -> Result<super::Task, StoreError> {
    claimed_task_leased(row, row.time("lease_until")?)
}

/// [`claimed_task`] with its lease ending at `lease_until` (not read from
/// the row: a pending row read before the update that claims it).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn claimed_task_leased(
    row: &impl SqlRow,
    lease_until: chrono::DateTime<chrono::Utc>,
) -> Result<super::Task, StoreError> {
    Ok(super::Task {
        id: row.big("id")?,
        queue: row.text("queue")?,
        kind: row.text("kind")?,
        payload: row.json("payload")?,
        priority: to_i32(row.int("priority")?, "priority")?,
        attempt: to_u32(row.int("attempt")?, "attempt")?,
        token: token_of(row.big("claim_token")?, "claim token")?,
        max_attempts: to_u32(row.int("max_attempts")?, "max_attempts")?,
        timeout: to_duration(row.opt_big("timeout_ms")?, "timeout")?,
        run_at: row.time("run_at")?,
        lease_until,
        job: row.opt_text("job")?,
        slot: row.opt_time("slot")?,
        traceparent: row.opt_text("traceparent")?,
    })
}

/// A lock row with the store's `now`: `name, holder, token, locked_at,
/// lock_until, now`. Held while `lock_until > now`.
/// One audit record from `id, at, actor, action, target, source, outcome`.
pub(crate) fn audit_record(row: &impl SqlRow) -> Result<crate::store::AuditRecord, StoreError> {
    Ok(crate::store::AuditRecord {
        id: row.big("id")?,
        at: row.time("at")?,
        actor: row.text("actor")?,
        action: row.text("action")?,
        target: row.text("target")?,
        source: row.text("source")?,
        outcome: row.text("outcome")?,
    })
}

pub(crate) fn lock_info(row: &impl SqlRow) -> Result<LockInfo, StoreError> {
    let lock_until = row.time("lock_until")?;
    let now = row.time("now")?;
    Ok(LockInfo {
        name: row.text("name")?,
        holder: row.text("holder")?,
        token: token_of(row.big("token")?, "lock token")?,
        locked_at: row.time("locked_at")?,
        lock_until,
        held: lock_until > now,
        now,
    })
}

/// A job row: [`JOB_COLS`].
pub(crate) fn job_state(row: &impl SqlRow) -> Result<JobState, StoreError> {
    let overlap = row
        .opt_text("overlap")?
        .map(|o| {
            o.parse::<super::Overlap>()
                .map_err(|_| corrupt("job overlap", &o))
        })
        .transpose()?;
    Ok(JobState {
        name: row.text("name")?,
        last_slot: row.opt_time("last_slot")?,
        paused: row.flag("paused")?,
        queue: row.opt_text("queue")?,
        overlap,
        pause_change: pause_change(row)?,
        fingerprint: row.opt_text("fingerprint")?,
    })
}

/// The `pause_note, pause_by, pause_at` columns of a job or queue row.
fn pause_change(row: &impl SqlRow) -> Result<Option<super::PauseChange>, StoreError> {
    Ok(super::PauseChange::from_parts(
        row.opt_text("pause_note")?,
        row.opt_text("pause_by")?,
        row.opt_time("pause_at")?,
    ))
}

/// A queues row: [`QUEUE_COLS`].
pub(crate) fn queue_row(row: &impl SqlRow) -> Result<super::QueueRow, StoreError> {
    Ok((row.text("name")?, row.flag("paused")?, pause_change(row)?))
}

/// A slot tombstone row: `unique_key, job, slot, task_id, state,
/// last_error, finished_at`.
pub(crate) fn pruned_slot(row: &impl SqlRow) -> Result<crate::store::PrunedSlot, StoreError> {
    use std::str::FromStr;
    Ok(crate::store::PrunedSlot {
        key: row.text("unique_key")?,
        job: row.text("job")?,
        slot: row.opt_time("slot")?,
        task_id: row.big("task_id")?,
        state: crate::store::TaskState::from_str(&row.text("state")?)?,
        last_error: row.opt_text("last_error")?,
        finished_at: row.opt_time("finished_at")?,
    })
}

/// A per-queue counts row: `queue, pending, running, succeeded, failed,
/// cancelled, oldest_ms` (PostgreSQL and MySQL; SQLite counts per state).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn queue_stats(row: &impl SqlRow) -> Result<crate::store::QueueStats, StoreError> {
    // A count is never negative; a negative age (clock step) reads as 0.
    let count = |col: &str| row.big(col).map(|v| u64::try_from(v).unwrap_or(0));
    Ok(crate::store::QueueStats {
        queue: row.text("queue")?,
        pending: count("pending")?,
        running: count("running")?,
        succeeded: count("succeeded")?,
        failed: count("failed")?,
        cancelled: count("cancelled")?,
        oldest_pending_ms: row
            .opt_big("oldest_ms")?
            .map(|v| u64::try_from(v).unwrap_or(0)),
        // Set afterwards from the queues table (`mark_paused`).
        paused: false,
        pause_change: None,
        // Set by `Queue::stats` from the declared limits.
        limits: None,
    })
}

/// The answer to `schema_status` from the meta table's `schema_version`
/// row, read as text (`Ok(None)`: no row), or the error reading it. A
/// missing meta table is no schema at all (`found: None`), not an error.
pub(crate) fn schema_status(
    read: Result<Option<String>, sqlx::Error>,
    expected: i64,
) -> Result<crate::store::SchemaStatus, StoreError> {
    let found = match read {
        Ok(v) => v,
        Err(e) if is_missing_table(&e) => None,
        Err(e) => return Err(e.into()),
    };
    let found = found
        .map(|v| {
            v.trim()
                .parse::<i64>()
                .map_err(|_| corrupt("schema version", &v))
        })
        .transpose()?;
    Ok(crate::store::SchemaStatus { found, expected })
}

/// Whether a driver error says the table does not exist (PostgreSQL
/// `42P01`, MySQL/MariaDB error 1146, SQLite "no such table").
pub(crate) fn is_missing_table(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1146;
    }
    db.code().as_deref() == Some("42P01") || db.message().starts_with("no such table")
}
