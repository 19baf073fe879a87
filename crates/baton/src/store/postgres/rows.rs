//! How the PostgreSQL backend stores each kind of column (`timestamptz`,
//! `jsonb`, `boolean`, `int4` counts and `int8` ids): [`SqlRow`] for its
//! rows. Turning rows into values is shared with SQLite in
//! [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::array;
use crate::error::StoreError;
use crate::store::sql_row::{corrupt, decoded_columns, to_duration, to_u32, token_of, SqlRow};
use crate::store::{AttemptError, Task};

impl SqlRow for PgRow {
    decoded_columns! {
        text: String,
        opt_text: Option<String>,
        int: i64 as i32,
        big: i64,
        opt_big: Option<i64>,
        flag: bool,
        time: DateTime<Utc>,
        opt_time: Option<DateTime<Utc>>,
        json: serde_json::Value,
        opt_json: Option<serde_json::Value>,
    }

    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError> {
        // Stored with `at` as RFC 3339 text, which is how it deserializes.
        let errors: serde_json::Value = self.try_get(col)?;
        serde_json::from_value(errors).map_err(|e| corrupt("task errors", e))
    }
}

/// One column of a packed claim ([`PACKED_CLAIM`](super::sql::PACKED_CLAIM)):
/// its array of `oid` elements, each read by `read` (given `None` for a
/// NULL element; answering `None` refuses it), empty when nothing was
/// claimed (`array_agg` of no rows is NULL), refused when its length
/// differs from the ids' (`n`).
fn packed<'r, T>(
    row: &'r PgRow,
    col: &str,
    oid: u32,
    n: usize,
    read: impl Fn(Option<&'r [u8]>) -> Option<T>,
) -> Result<Vec<T>, StoreError> {
    let elements = array::elements(row, col, oid)?;
    if elements.len() != n {
        return Err(StoreError::Corrupt(format!(
            "claimed tasks: column {col} has {} values for {n} tasks",
            elements.len()
        )));
    }
    elements
        .into_iter()
        .map(|e| {
            read(e).ok_or_else(|| {
                StoreError::Corrupt(format!("claimed tasks: column {col}: an unreadable value"))
            })
        })
        .collect()
}

/// `read` for a column that may hold NULLs.
fn or_null<'r, T>(
    read: impl Fn(&'r [u8]) -> Option<T>,
) -> impl Fn(Option<&'r [u8]>) -> Option<Option<T>> {
    move |e| match e {
        None => Some(None),
        Some(b) => read(b).map(Some),
    }
}

/// The tasks of a packed claim's row ([`PACKED_CLAIM`](super::sql::PACKED_CLAIM)),
/// claimed from `queue`, in the order the store returned them.
pub(super) fn packed_tasks(row: &PgRow, queue: &str) -> Result<Vec<Task>, StoreError> {
    use array::{int4, int8, text, timestamptz, INT4, INT8, TEXT, TIMESTAMPTZ};
    let ids: Vec<i64> = array::elements(row, "ids", INT8)?
        .into_iter()
        .map(|e| e.and_then(int8))
        .collect::<Option<_>>()
        .ok_or_else(|| StoreError::Corrupt("claimed tasks: an unreadable id".into()))?;
    let n = ids.len();
    let kinds = packed(row, "kinds", TEXT, n, |e| e.and_then(text))?;
    let payloads = packed(row, "payloads", TEXT, n, |e| e)?;
    let priorities = packed(row, "priorities", INT4, n, |e| e.and_then(int4))?;
    let attempts = packed(row, "attempts", INT4, n, |e| e.and_then(int4))?;
    let tokens = packed(row, "tokens", INT8, n, |e| e.and_then(int8))?;
    let max_attempts = packed(row, "max_attempts", INT4, n, |e| e.and_then(int4))?;
    let timeouts = packed(row, "timeouts", INT8, n, or_null(int8))?;
    let run_ats = packed(row, "run_ats", TIMESTAMPTZ, n, |e| e.and_then(timestamptz))?;
    let lease_untils = packed(row, "lease_untils", TIMESTAMPTZ, n, |e| {
        e.and_then(timestamptz)
    })?;
    let jobs = packed(row, "jobs", TEXT, n, or_null(text))?;
    let slots = packed(row, "slots", TIMESTAMPTZ, n, or_null(timestamptz))?;
    let traceparents = packed(row, "traceparents", TEXT, n, or_null(text))?;
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tasks.push(Task {
            id: ids[i],
            queue: queue.to_string(),
            kind: kinds[i].to_string(),
            payload: serde_json::from_slice(payloads[i]).map_err(|e| corrupt("task payload", e))?,
            priority: priorities[i],
            attempt: to_u32(i64::from(attempts[i]), "attempt")?,
            token: token_of(tokens[i], "claim token")?,
            max_attempts: to_u32(i64::from(max_attempts[i]), "max_attempts")?,
            timeout: to_duration(timeouts[i], "timeout")?,
            run_at: run_ats[i],
            lease_until: lease_untils[i],
            job: jobs[i].map(str::to_string),
            slot: slots[i],
            traceparent: traceparents[i].map(str::to_string),
        });
    }
    Ok(tasks)
}
