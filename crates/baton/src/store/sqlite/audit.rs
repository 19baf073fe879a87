//! The audit log on SQLite: one row an action in `<prefix>audit`.

use std::time::Duration;

use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::sql_row::audit_record;
use crate::store::{ms, AuditAppend, AuditPage, AuditRecord};

pub(super) async fn append(b: &SqliteBackend, e: &AuditAppend<'_>) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO {} (at, actor, action, target, source, outcome) \
         VALUES ({NOW}, ?1, ?2, ?3, ?4, ?5)",
        b.t.audit
    ))
    .bind(e.actor)
    .bind(e.action)
    .bind(e.target)
    .bind(e.source)
    .bind(e.outcome)
    .execute(&*b.pool)
    .await?;
    Ok(())
}

pub(super) async fn list(
    b: &SqliteBackend,
    page: &AuditPage,
) -> Result<Vec<AuditRecord>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT id, at, actor, action, target, source, outcome FROM {} \
         WHERE ?1 IS NULL OR id < ?1 ORDER BY id DESC LIMIT ?2",
        b.t.audit
    ))
    .bind(page.before_id)
    .bind(i64::from(page.size()))
    .fetch_all(&*b.reader)
    .await?;
    rows.iter().map(audit_record).collect()
}

pub(super) async fn prune(b: &SqliteBackend, older_than: Duration) -> Result<u64, StoreError> {
    let done = sqlx::query(&format!("DELETE FROM {} WHERE at < {NOW} - ?1", b.t.audit))
        .bind(ms(older_than))
        .execute(&*b.pool)
        .await?;
    Ok(done.rows_affected())
}
