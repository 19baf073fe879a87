//! The audit log on PostgreSQL: one row an action in `<prefix>audit`.

use std::time::Duration;

use super::PgBackend;
use crate::error::StoreError;
use crate::store::sql_row::audit_record;
use crate::store::{AuditAppend, AuditPage, AuditRecord};

pub(super) async fn append(b: &PgBackend, e: &AuditAppend<'_>) -> Result<(), StoreError> {
    let sql = format!(
        "INSERT INTO {} (at, actor, action, target, source, outcome) \
         VALUES ({}, $1, $2, $3, $4, $5)",
        b.names.audit, b.names.now
    );
    b.q(&sql)
        .bind(e.actor)
        .bind(e.action)
        .bind(e.target)
        .bind(e.source)
        .bind(e.outcome)
        .execute(b.exec())
        .await?;
    Ok(())
}

pub(super) async fn list(b: &PgBackend, page: &AuditPage) -> Result<Vec<AuditRecord>, StoreError> {
    let sql = format!(
        "SELECT id, at, actor, action, target, source, outcome FROM {} \
         WHERE $1::int8 IS NULL OR id < $1 ORDER BY id DESC LIMIT $2",
        b.names.audit
    );
    let rows = b
        .q(&sql)
        .bind(page.before_id)
        .bind(i64::from(page.size()))
        .fetch_all(b.exec())
        .await?;
    rows.iter().map(audit_record).collect()
}

pub(super) async fn prune(b: &PgBackend, older_than: Duration) -> Result<u64, StoreError> {
    let sql = format!(
        "DELETE FROM {} WHERE at < {} - $1 * interval '1 millisecond'",
        b.names.audit, b.names.now
    );
    let done = b
        .q(&sql)
        .bind(crate::store::ms(older_than))
        .execute(b.exec())
        .await?;
    Ok(done.rows_affected())
}
