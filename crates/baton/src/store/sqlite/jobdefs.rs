//! Job definitions on SQLite: one row a name in `<prefix>jobdefs`, the
//! decisions shared with the other SQL stores (`store::jobdefs`).

use std::time::Duration;

use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::jobdefs::{jobdef_row, JobDefRows, PRUNED_ROW};
use crate::store::{ms, JobDef};

/// The quoted table name.
pub(super) fn table(b: &SqliteBackend) -> String {
    format!("\"{}jobdefs\"", b.t.prefix)
}

#[async_trait::async_trait]
impl JobDefRows for SqliteBackend {
    async fn row(&self, name: &str) -> Result<Option<(i64, bool)>, StoreError> {
        let row: Option<(i64, i64)> = sqlx::query_as(&format!(
            "SELECT version, deleted FROM {} WHERE name = ?1",
            table(self)
        ))
        .bind(name)
        .fetch_optional(&*self.pool)
        .await?;
        Ok(row.map(|(v, d)| (v, d != 0)))
    }

    async fn insert(&self, name: &str, spec: &str, by: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(&format!(
            "INSERT INTO {} (name, version, spec, deleted, created_at, updated_at, updated_by) \
             VALUES (?1, 1, ?2, 0, {NOW}, {NOW}, ?3) ON CONFLICT (name) DO NOTHING",
            table(self)
        ))
        .bind(name)
        .bind(spec)
        .bind(by)
        .execute(&*self.pool)
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
        let done = sqlx::query(&format!(
            "UPDATE {} SET version = version + 1, spec = COALESCE(?3, spec), \
                 deleted = ?3 IS NULL, \
                 created_at = CASE WHEN deleted <> 0 THEN {NOW} ELSE created_at END, \
                 updated_at = {NOW}, updated_by = ?4 \
             WHERE name = ?1 AND version = ?2 AND deleted = ?5",
            table(self)
        ))
        .bind(name)
        .bind(from)
        .bind(spec)
        .bind(by)
        .bind(i64::from(from_deleted))
        .execute(&*self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn announce_change(&self) {
        // In-process only: other processes read the change counter on a
        // timer. No receivers is fine.
        let _ = self.wake.send(crate::store::jobdefs::definitions_wake());
    }
}

pub(super) async fn list(b: &SqliteBackend) -> Result<Vec<JobDef>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT name, version, spec, deleted, created_at, updated_at, updated_by \
         FROM {} WHERE name <> ?1 ORDER BY name",
        table(b)
    ))
    .bind(PRUNED_ROW)
    .fetch_all(&*b.reader)
    .await?;
    rows.iter().map(jobdef_row).collect()
}

pub(super) async fn revision(b: &SqliteBackend) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT COALESCE(SUM(version), 0) FROM {}",
        table(b)
    ))
    .fetch_one(&*b.reader)
    .await?)
}

/// Delete the tombstones older than `older_than` and add their versions
/// to the pruned row, in one `BEGIN IMMEDIATE` transaction (a reader sees
/// the revision before or after, never between).
pub(super) async fn prune(b: &SqliteBackend, older_than: Duration) -> Result<u64, StoreError> {
    let mut tx = b.immediate().await?;
    let gone: Vec<i64> = sqlx::query_scalar(&format!(
        "DELETE FROM {} WHERE name <> ?1 AND deleted <> 0 AND updated_at < {NOW} - ?2 \
         RETURNING version",
        table(b)
    ))
    .bind(PRUNED_ROW)
    .bind(ms(older_than))
    .fetch_all(&mut *tx)
    .await?;
    if gone.is_empty() {
        return Ok(0);
    }
    sqlx::query(&format!(
        "INSERT INTO {} (name, version, spec, deleted, created_at, updated_at, updated_by) \
         VALUES (?1, ?2, '{{}}', 1, {NOW}, {NOW}, 'prune') \
         ON CONFLICT (name) DO UPDATE SET version = version + excluded.version, \
             updated_at = excluded.updated_at",
        table(b)
    ))
    .bind(PRUNED_ROW)
    .bind(gone.iter().sum::<i64>())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(gone.len() as u64)
}
