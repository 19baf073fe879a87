//! How the PostgreSQL backend stores each kind of column (`timestamptz`,
//! `jsonb`, `boolean`, `int4` counts and `int8` ids): [`SqlRow`] for its
//! rows. Turning rows into values is shared with SQLite in
//! [`crate::store::sql_row`].

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::error::StoreError;
use crate::store::sql_row::{corrupt, SqlRow};
use crate::store::AttemptError;

impl SqlRow for PgRow {
    fn text(&self, col: &str) -> Result<String, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn opt_text(&self, col: &str) -> Result<Option<String>, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn int(&self, col: &str) -> Result<i64, StoreError> {
        Ok(i64::from(self.try_get::<i32, _>(col)?))
    }

    fn big(&self, col: &str) -> Result<i64, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn opt_big(&self, col: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn flag(&self, col: &str) -> Result<bool, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn time(&self, col: &str) -> Result<DateTime<Utc>, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn json(&self, col: &str) -> Result<serde_json::Value, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn opt_json(&self, col: &str) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self.try_get(col)?)
    }

    fn errors(&self, col: &str) -> Result<Vec<AttemptError>, StoreError> {
        // Stored with `at` as RFC 3339 text, which is how it deserializes.
        let errors: serde_json::Value = self.try_get(col)?;
        serde_json::from_value(errors).map_err(|e| corrupt("task errors", e))
    }
}
