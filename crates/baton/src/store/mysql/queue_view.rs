//! A queue's declared limits (columns of `<prefix>queues`) and its keys'
//! load on MySQL/MariaDB (`store::queue_view`).

use super::MyBackend;
use crate::error::StoreError;
use crate::store::queue_view::sql;
use crate::store::{DeclaredLimits, QueueDeclare, QueueKeys, QueueKeysQuery};

pub(super) async fn declare(
    b: &MyBackend,
    d: &QueueDeclare<'_>,
) -> Result<Option<DeclaredLimits>, StoreError> {
    let mut tx = b.pool.begin().await?;
    let before = sqlx::query(&format!(
        "SELECT {} FROM {} WHERE queue = ? AND limits IS NOT NULL FOR UPDATE",
        sql::declared_cols("queue"),
        b.names.queues
    ))
    .bind(d.queue)
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| sql::declared(&r))
    .transpose()?;
    sqlx::query(&format!(
        "INSERT INTO {} (queue, limits, limits_by, limits_at) VALUES (?, ?, ?, {}) \
         ON DUPLICATE KEY UPDATE limits = VALUES(limits), limits_by = VALUES(limits_by), \
             limits_at = VALUES(limits_at)",
        b.names.queues, b.names.now
    ))
    .bind(d.queue)
    .bind(d.limits.encode())
    .bind(d.by)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(before)
}

pub(super) async fn list(b: &MyBackend) -> Result<Vec<DeclaredLimits>, StoreError> {
    sqlx::query(&format!(
        "SELECT {} FROM {} WHERE limits IS NOT NULL ORDER BY queue",
        sql::declared_cols("queue"),
        b.names.queues
    ))
    .fetch_all(&b.pool)
    .await?
    .iter()
    .map(sql::declared)
    .collect()
}

pub(super) async fn keys(b: &MyBackend, q: &QueueKeysQuery<'_>) -> Result<QueueKeys, StoreError> {
    let keys = sqlx::query(&sql::keys(&b.names.tasks, "?", "?"))
        .bind(q.queue)
        .bind(i64::from(q.limit))
        .fetch_all(&b.pool)
        .await?;
    let row = sqlx::query(&sql::key_totals(&b.names.tasks, "?"))
        .bind(q.queue)
        .fetch_one(&b.pool)
        .await?;
    let mut out = sql::answer(q.queue, &keys, &row)?;
    if !out.keys.is_empty() {
        let marks = vec!["?"; out.keys.len()].join(", ");
        let text = format!(
            "SELECT ckey, starts FROM {} WHERE queue = ? AND ckey IN ({marks})",
            b.names.key_rates
        );
        let mut read = sqlx::query(&text).bind(q.queue);
        for k in &out.keys {
            read = read.bind(k.key.as_str());
        }
        let logs = read.fetch_all(&b.pool).await?;
        crate::store::put_starts(&mut out.keys, sql::key_logs(&logs)?)?;
    }
    Ok(out)
}
