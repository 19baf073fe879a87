//! How the PostgreSQL backend stores each kind of column (`timestamptz`,
//! `jsonb`, `boolean`, `int4` counts and `int8` ids): [`SqlRow`] for its
//! rows. Turning rows into values is shared with SQLite in
//! [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

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
/// its array, empty when nothing was claimed (`array_agg` of no rows is
/// NULL), refused when its length differs from the ids'.
fn packed<T>(row: &PgRow, col: &str, n: usize) -> Result<Vec<T>, StoreError>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    Vec<T>: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let v: Vec<T> = row.try_get::<Option<Vec<T>>, _>(col)?.unwrap_or_default();
    if v.len() == n {
        Ok(v)
    } else {
        Err(StoreError::Corrupt(format!(
            "claimed tasks: column {col} has {} values for {n} tasks",
            v.len()
        )))
    }
}

/// The tasks of a packed claim's row ([`PACKED_CLAIM`](super::sql::PACKED_CLAIM)),
/// claimed from `queue`, in the order the store returned them.
pub(super) fn packed_tasks(row: &PgRow, queue: &str) -> Result<Vec<Task>, StoreError> {
    let ids: Vec<i64> = row
        .try_get::<Option<Vec<i64>>, _>("ids")?
        .unwrap_or_default();
    let n = ids.len();
    let kinds = packed::<String>(row, "kinds", n)?;
    let payloads = packed::<String>(row, "payloads", n)?;
    let priorities = packed::<i32>(row, "priorities", n)?;
    let attempts = packed::<i32>(row, "attempts", n)?;
    let tokens = packed::<i64>(row, "tokens", n)?;
    let max_attempts = packed::<i32>(row, "max_attempts", n)?;
    let timeouts = packed::<Option<i64>>(row, "timeouts", n)?;
    let run_ats = packed::<DateTime<Utc>>(row, "run_ats", n)?;
    let lease_untils = packed::<DateTime<Utc>>(row, "lease_untils", n)?;
    let jobs = packed::<Option<String>>(row, "jobs", n)?;
    let slots = packed::<Option<DateTime<Utc>>>(row, "slots", n)?;
    let traceparents = packed::<Option<String>>(row, "traceparents", n)?;
    let mut tasks = Vec::with_capacity(n);
    let columns = kinds
        .into_iter()
        .zip(payloads)
        .zip(jobs)
        .zip(traceparents)
        .enumerate();
    for (i, (((kind, payload), job), traceparent)) in columns {
        tasks.push(Task {
            id: ids[i],
            queue: queue.to_string(),
            kind,
            payload: serde_json::from_str(&payload).map_err(|e| corrupt("task payload", e))?,
            priority: priorities[i],
            attempt: to_u32(i64::from(attempts[i]), "attempt")?,
            token: token_of(tokens[i], "claim token")?,
            max_attempts: to_u32(i64::from(max_attempts[i]), "max_attempts")?,
            timeout: to_duration(timeouts[i], "timeout")?,
            run_at: run_ats[i],
            lease_until: lease_untils[i],
            job,
            slot: slots[i],
            traceparent,
        });
    }
    Ok(tasks)
}
