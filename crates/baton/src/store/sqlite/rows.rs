//! How the SQLite backend stores each kind of column (INTEGER milliseconds
//! since the epoch, TEXT JSON, INTEGER flags): [`SqlRow`] for its rows.
//! Turning rows into values is shared with PostgreSQL in
//! [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use crate::error::StoreError;
use crate::store::sql_row::{
    decoded_columns, json_of, to_duration, to_i32, to_u32, token_of, SqlRow,
};
use crate::store::{from_ms, AttemptError, Task};

/// The one row a claim answers ([`super::sql::ClaimSql`]), read by
/// [`claim_answer`]: `tasks`, a JSON array of each claimed task's
/// [`Packed`] columns, and `payloads`, their payloads in the same order
/// joined by the record separator U+001E (JSON text cannot hold that
/// character unescaped, so it cannot occur inside a payload), NULL when
/// nothing was claimed. Both aggregates see the rows in one pass, in one
/// order.
pub(super) const CLAIM_ANSWER_COLS: &str = "json_group_array(json_array(id, kind, priority, \
     attempt, claim_token, max_attempts, timeout_ms, run_at, lease_until, job, slot, \
     traceparent)) AS tasks, group_concat(payload, char(30)) AS payloads";

/// The separator of [`CLAIM_ANSWER_COLS`]'s payloads.
const PAYLOAD_SEPARATOR: char = '\u{1e}';

/// Each element of [`CLAIM_ANSWER_COLS`]'s `tasks`: every column a
/// claimed [`Task`] needs but its payload, packed into one JSON array.
/// sqlx copies each column of each row out of SQLite (a value copy and an
/// allocation or two per column), so two columns cost far less than
/// fourteen (docs/BENCHMARKS.md, session 25). The queue is the claim's
/// own.
type Packed = (
    i64,
    String,
    i64,
    i64,
    i64,
    i64,
    Option<i64>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// The tasks claimed from `queue`, from the row of [`CLAIM_ANSWER_COLS`].
pub(super) fn claim_answer(row: &SqliteRow, queue: &str) -> Result<Vec<Task>, StoreError> {
    let packed: Vec<Packed> = serde_json::from_str(row.try_get("tasks")?)
        .map_err(|e| StoreError::Corrupt(format!("claimed tasks: {e}")))?;
    let payloads: Option<&str> = row.try_get("payloads")?;
    let mut payloads = payloads.map(|p| p.split(PAYLOAD_SEPARATOR));
    let mut tasks = Vec::with_capacity(packed.len());
    for p in packed {
        let payload = payloads.as_mut().and_then(Iterator::next).ok_or_else(|| {
            StoreError::Corrupt("claimed tasks: fewer payloads than tasks".into())
        })?;
        tasks.push(task_of(p, payload, queue)?);
    }
    if payloads.as_mut().and_then(Iterator::next).is_some() {
        return Err(StoreError::Corrupt(
            "claimed tasks: more payloads than tasks".into(),
        ));
    }
    Ok(tasks)
}

/// A claimed task from its packed columns and its payload's text.
fn task_of(packed: Packed, payload: &str, queue: &str) -> Result<Task, StoreError> {
    let (
        id,
        kind,
        priority,
        attempt,
        token,
        max_attempts,
        timeout_ms,
        run_at,
        lease_until,
        job,
        slot,
        traceparent,
    ) = packed;
    Ok(Task {
        id,
        queue: queue.to_string(),
        kind,
        payload: json_of(payload, "payload")?,
        priority: to_i32(priority, "priority")?,
        attempt: to_u32(attempt, "attempt")?,
        token: token_of(token, "claim token")?,
        max_attempts: to_u32(max_attempts, "max_attempts")?,
        timeout: to_duration(timeout_ms, "timeout")?,
        run_at: from_ms(run_at)?,
        lease_until: from_ms(lease_until)?,
        job,
        slot: opt_time(slot)?,
        traceparent,
    })
}

impl SqlRow for SqliteRow {
    decoded_columns! {
        text: String,
        opt_text: Option<String>,
        int: i64,
        big: i64,
        opt_big: Option<i64>,
    }

    fn flag(&self, col: &str) -> Result<bool, StoreError> {
        Ok(self.try_get::<i64, _>(col)? != 0)
    }

    fn time(&self, col: &str) -> Result<DateTime<Utc>, StoreError> {
        from_ms(self.try_get(col)?)
    }

    fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        opt_time(self.try_get(col)?)
    }

    fn json(&self, col: &str) -> Result<serde_json::Value, StoreError> {
        json_of(&self.try_get::<String, _>(col)?, col)
    }

    fn opt_json(&self, col: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.try_get::<Option<String>, _>(col)?
            .map(|text| json_of(&text, col))
            .transpose()
    }

    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError> {
        let text: String = self.try_get(col)?;
        let raw: Vec<StoredError> = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("task errors: {e}")))?;
        raw.into_iter()
            .map(|e| {
                Ok(AttemptError {
                    attempt: e.attempt,
                    at: from_ms(e.at)?,
                    error: e.error,
                    worker: e.worker,
                    started_at: opt_time(e.started_at)?,
                })
            })
            .collect()
    }
}

/// Optional milliseconds since the epoch.
pub(super) fn opt_time(v: Option<i64>) -> Result<Option<DateTime<Utc>>, StoreError> {
    v.map(from_ms).transpose()
}

/// A JSON value as the TEXT SQLite stores.
pub(super) fn json_text(v: &serde_json::Value) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(format!("cannot encode JSON: {e}")))
}

/// One entry of the `errors` column as stored: `at` in ms since the epoch.
#[derive(serde::Deserialize)]
struct StoredError {
    attempt: u32,
    at: i64,
    error: String,
    #[serde(default)]
    worker: Option<String>,
    #[serde(default)]
    started_at: Option<i64>,
}
