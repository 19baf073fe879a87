//! How the PostgreSQL backend stores each kind of column (`timestamptz`,
//! `jsonb`, `boolean`, `int4` counts and `int8` ids): [`SqlRow`] for its
//! rows. Turning rows into values is shared with SQLite in
//! [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::StoreError;
use crate::store::sql_row::{corrupt, decoded_columns, SqlRow};
use crate::store::AttemptError;

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
