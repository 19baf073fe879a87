//! The audit log on MySQL/MariaDB: one row an action in `<prefix>audit`.

use std::time::Duration;

use super::MyBackend;
use crate::error::StoreError;
use crate::store::sql_row::audit_record;
use crate::store::{AuditAppend, AuditPage, AuditRecord};

pub(super) async fn append(b: &MyBackend, e: &AuditAppend<'_>) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO {} (at, actor, action, target, source, outcome) \
         VALUES ({}, ?, ?, ?, ?, ?)",
        b.names.audit, b.names.now
    ))
    .bind(e.actor)
    .bind(e.action)
    .bind(e.target)
    .bind(e.source)
    .bind(e.outcome)
    .execute(&b.pool)
    .await?;
    Ok(())
}

pub(super) async fn list(b: &MyBackend, page: &AuditPage) -> Result<Vec<AuditRecord>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT id, at, actor, action, target, source, outcome FROM {} \
         WHERE id < ? ORDER BY id DESC LIMIT ?",
        b.names.audit
    ))
    .bind(page.before_id.unwrap_or(i64::MAX))
    .bind(i64::from(page.size()))
    .fetch_all(&b.pool)
    .await?;
    rows.iter().map(audit_record).collect()
}

pub(super) async fn prune(b: &MyBackend, older_than: Duration) -> Result<u64, StoreError> {
    let done = sqlx::query(&format!(
        "DELETE FROM {} WHERE at < {} - INTERVAL ? MICROSECOND",
        b.names.audit, b.names.now
    ))
    .bind(older_than.as_micros().min(i64::MAX as u128) as i64)
    .execute(&b.pool)
    .await?;
    Ok(done.rows_affected())
}
