//! How the MySQL/MariaDB backend stores each kind of column (`DATETIME(6)`
//! in UTC, text that may come back as binary, `TINYINT(1)` flags, JSON as
//! text): [`SqlRow`] for its rows. Turning rows into values is shared with
//! SQLite and PostgreSQL in [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::error::StoreError;
use crate::store::sql_row::{corrupt, decoded_columns, json_of, to_u32, SqlRow};
use crate::store::AttemptError;

/// Bytes of a text column as UTF-8 (`CHARACTER SET binary` columns and
/// some expressions come back as bytes).
fn utf8(b: Vec<u8>, col: &str) -> Result<String, StoreError> {
    String::from_utf8(b).map_err(|e| corrupt(col, e))
}

impl SqlRow for MySqlRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        utf8(self.try_get_unchecked(col)?, col)
    }

    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
        self.try_get_unchecked::<Option<Vec<u8>>, _>(col)?
            .map(|b| utf8(b, col))
            .transpose()
    }

    decoded_columns! {
        int: i64 as i32,
        big: i64,
        opt_big: Option<i64>,
        flag: bool,
        time: DateTime<Utc>,
        opt_time: Option<DateTime<Utc>>,
    }

    fn json(&self, col: &str) -> Result<serde_json::Value, StoreError> {
        json_of(&self.text(col)?, col)
    }

    fn opt_json(&self, col: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.opt_text(col)?.map(|t| json_of(&t, col)).transpose()
    }

    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError> {
        // Appended by `APPEND_ERROR` with `at` as RFC 3339 UTC.
        serde_json::from_str(&self.text(col)?)
            .map_err(|e| StoreError::Corrupt(format!("task errors: {e}")))
    }
}

/// An attempt count (`attempt`, `max_attempts`).
pub(super) fn attempt_of(row: &MySqlRow, col: &str) -> Result<u32, StoreError> {
    to_u32(row.int(col)?, col)
}
