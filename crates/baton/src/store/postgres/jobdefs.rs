//! Job definitions on PostgreSQL: one row a name in `<prefix>jobdefs`, the
//! decisions shared with the other SQL stores (`store::jobdefs`).

use sqlx::Row;

use std::time::Duration;

use super::PgBackend;
use crate::error::StoreError;
use crate::store::jobdefs::{jobdef_row, JobDefRows, PRUNED_ROW};
use crate::store::{ms, JobDef};

/// The quoted table name.
pub(super) fn table(b: &PgBackend) -> String {
    format!("\"{}jobdefs\"", b.names.prefix)
}

#[async_trait::async_trait]
impl JobDefRows for PgBackend {
    async fn row(&self, name: &str) -> Result<Option<(i64, bool)>, StoreError> {
        let sql = format!(
            "SELECT version, deleted FROM {} WHERE name = $1",
            table(self)
        );
        let row = self.q(&sql).bind(name).fetch_optional(self.exec()).await?;
        Ok(match row {
            Some(r) => Some((r.try_get("version")?, r.try_get("deleted")?)),
            None => None,
        })
    }

    async fn insert(&self, name: &str, spec: &str, by: &str) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO {} (name, version, spec, deleted, created_at, updated_at, updated_by) \
             VALUES ($1, 1, $2, false, {now}, {now}, $3) ON CONFLICT (name) DO NOTHING",
            table(self),
            now = self.names.now
        );
        let done = self
            .q(&sql)
            .bind(name)
            .bind(spec)
            .bind(by)
            .execute(self.exec())
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
        let sql = format!(
            "UPDATE {} SET version = version + 1, spec = COALESCE($3, spec), \
                 deleted = $3::text IS NULL, \
                 created_at = CASE WHEN deleted THEN {now} ELSE created_at END, \
                 updated_at = {now}, updated_by = $4 \
             WHERE name = $1 AND version = $2 AND deleted = $5",
            table(self),
            now = self.names.now
        );
        let done = self
            .q(&sql)
            .bind(name)
            .bind(from)
            .bind(spec)
            .bind(by)
            .bind(from_deleted)
            .execute(self.exec())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn announce_change(&self) {
        // Sent at the statement's commit to every LISTEN session on the
        // channel, the workers' and the schedulers'.
        let r = self
            .q("SELECT pg_notify($1, $2)")
            .bind(&self.names.chan)
            .bind(crate::store::jobdefs::DEFINITIONS_WAKE)
            .execute(self.exec())
            .await;
        if let Err(e) = r {
            tracing::warn!(error = %crate::error::chain(&e), "cannot announce the job definitions' change; schedulers see it on their next read");
        }
    }
}

pub(super) async fn list(b: &PgBackend) -> Result<Vec<JobDef>, StoreError> {
    let sql = format!(
        "SELECT name, version, spec, deleted, created_at, updated_at, updated_by \
         FROM {} WHERE name <> $1 ORDER BY name",
        table(b)
    );
    let rows = b.q(&sql).bind(PRUNED_ROW).fetch_all(b.exec()).await?;
    rows.iter().map(jobdef_row).collect()
}

pub(super) async fn revision(b: &PgBackend) -> Result<i64, StoreError> {
    let sql = format!("SELECT COALESCE(SUM(version), 0)::int8 FROM {}", table(b));
    Ok(b.qs(&sql).fetch_one(b.exec()).await?)
}

/// Delete the tombstones older than `older_than` and add their versions
/// to the pruned row, in one statement (a reader sees the revision before
/// or after, never between; a racing prune skips the rows this one
/// deleted).
pub(super) async fn prune(b: &PgBackend, older_than: Duration) -> Result<u64, StoreError> {
    let sql = format!(
        "WITH gone AS (DELETE FROM {t} WHERE name <> $1 AND deleted \
             AND updated_at < {now} - $2 * interval '1 millisecond' RETURNING version), \
         kept AS (INSERT INTO {t} (name, version, spec, deleted, created_at, updated_at, updated_by) \
             SELECT $1, SUM(version), '{{}}', true, {now}, {now}, 'prune' FROM gone \
             HAVING COUNT(*) > 0 \
             ON CONFLICT (name) DO UPDATE SET version = {t}.version + EXCLUDED.version, \
                 updated_at = EXCLUDED.updated_at) \
         SELECT COUNT(*)::int8 FROM gone",
        t = table(b),
        now = b.names.now
    );
    let n: i64 = b
        .qs(&sql)
        .bind(PRUNED_ROW)
        .bind(ms(older_than))
        .fetch_one(b.exec())
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
