//! Job definitions on MySQL/MariaDB: one row a name in `<prefix>jobdefs`,
//! the decisions shared with the other SQL stores (`store::jobdefs`).

use std::time::Duration;

use super::MyBackend;
use crate::error::StoreError;
use crate::store::jobdefs::{jobdef_row, JobDefRows, PRUNED_ROW};
use crate::store::sql_row::SqlRow;
use crate::store::JobDef;

/// The quoted table name.
pub(super) fn table(b: &MyBackend) -> String {
    format!("`{}jobdefs`", b.names.prefix)
}

#[async_trait::async_trait]
impl JobDefRows for MyBackend {
    async fn row(&self, name: &str) -> Result<Option<(i64, bool)>, StoreError> {
        let row: Option<(i64, bool)> = sqlx::query_as(&format!(
            "SELECT version, deleted FROM {} WHERE name = ?",
            table(self)
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }

    async fn insert(&self, name: &str, spec: &str, by: &str) -> Result<bool, StoreError> {
        // IGNORE: a row already there (a racing create) inserts nothing.
        let done = sqlx::query(&format!(
            "INSERT IGNORE INTO {} \
                 (name, version, spec, deleted, created_at, updated_at, updated_by) \
             VALUES (?, 1, ?, 0, {now}, {now}, ?)",
            table(self),
            now = self.names.now
        ))
        .bind(name)
        .bind(spec)
        .bind(by)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn write(
        &self,
        name: &str,
        from: i64,
        from_deleted: bool,
        spec: Option<&str>,
        by: &str,
    ) -> Result<bool, StoreError> {
        // MySQL assigns left to right, each seeing the ones before:
        // `created_at` reads `deleted` before it is set.
        let done = sqlx::query(&format!(
            "UPDATE {} SET version = version + 1, spec = COALESCE(?, spec), \
                 created_at = CASE WHEN deleted <> 0 THEN {now} ELSE created_at END, \
                 deleted = (? IS NULL), updated_at = {now}, updated_by = ? \
             WHERE name = ? AND version = ? AND deleted = ?",
            table(self),
            now = self.names.now
        ))
        .bind(spec)
        .bind(spec)
        .bind(by)
        .bind(name)
        .bind(from)
        .bind(from_deleted)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn announce_change(&self) {
        // In-process only: other processes read the change counter on a
        // timer. No receivers is fine.
        let _ = self.wake.send(crate::store::jobdefs::definitions_wake());
    }
}

pub(super) async fn list(b: &MyBackend) -> Result<Vec<JobDef>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT name, version, spec, deleted, created_at, updated_at, updated_by \
         FROM {} WHERE name <> ? ORDER BY name",
        table(b)
    ))
    .bind(PRUNED_ROW)
    .fetch_all(&b.pool)
    .await?;
    rows.iter().map(jobdef_row).collect()
}

pub(super) async fn revision(b: &MyBackend) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT CAST(COALESCE(SUM(version), 0) AS SIGNED) FROM {}",
        table(b)
    ))
    .fetch_one(&b.pool)
    .await?)
}

/// Delete the tombstones older than `older_than` and add their versions
/// to the pruned row, in one transaction: the tombstones are locked
/// (`FOR UPDATE`) before they are deleted, so a racing re-create waits and
/// a racing prune skips them.
pub(super) async fn prune(b: &MyBackend, older_than: Duration) -> Result<u64, StoreError> {
    let t = table(b);
    let mut tx = b.begin().await?;
    let rows = sqlx::query(&format!(
        "SELECT name, version FROM {t} WHERE name <> ? AND deleted \
         AND updated_at < {} - INTERVAL ? MICROSECOND FOR UPDATE",
        b.names.now
    ))
    .bind(PRUNED_ROW)
    .bind(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX))
    .fetch_all(&mut *tx)
    .await?;
    let gone = rows
        .iter()
        .map(|r| Ok((r.text("name")?, r.big("version")?)))
        .collect::<Result<Vec<(String, i64)>, StoreError>>()?;
    if gone.is_empty() {
        return Ok(0);
    }
    let marks = vec!["?"; gone.len()].join(", ");
    let sql = format!("DELETE FROM {t} WHERE name IN ({marks})");
    let mut q = sqlx::query(&sql);
    for (name, _) in &gone {
        q = q.bind(name.as_str());
    }
    q.execute(&mut *tx).await?;
    sqlx::query(&format!(
        "INSERT INTO {t} (name, version, spec, deleted, created_at, updated_at, updated_by) \
         VALUES (?, ?, '{{}}', 1, {now}, {now}, 'prune') \
         ON DUPLICATE KEY UPDATE version = version + VALUES(version), \
             updated_at = VALUES(updated_at)",
        now = b.names.now
    ))
    .bind(PRUNED_ROW)
    .bind(gone.iter().map(|(_, v)| v).sum::<i64>())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(gone.len() as u64)
}
