//! A queue's declared limits (columns of `<prefix>queues`) and its keys'
//! load on SQLite (`store::queue_view`).

use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::queue_view::sql;
use crate::store::{DeclaredLimits, QueueDeclare, QueueKeys, QueueKeysQuery};

pub(super) async fn declare(
    b: &SqliteBackend,
    d: &QueueDeclare<'_>,
) -> Result<Option<DeclaredLimits>, StoreError> {
    let mut tx = b.immediate().await?;
    let before = sqlx::query(&format!(
        "SELECT {} FROM {} WHERE name = ?1 AND limits IS NOT NULL",
        sql::declared_cols("name"),
        b.t.queues
    ))
    .bind(d.queue)
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| sql::declared(&r))
    .transpose()?;
    sqlx::query(&format!(
        "INSERT INTO {} (name, paused, limits, limits_by, limits_at) \
         VALUES (?1, 0, ?2, ?3, {NOW}) \
         ON CONFLICT (name) DO UPDATE SET limits = excluded.limits, \
             limits_by = excluded.limits_by, limits_at = excluded.limits_at",
        b.t.queues
    ))
    .bind(d.queue)
    .bind(d.limits.encode())
    .bind(d.by)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(before)
}

pub(super) async fn list(b: &SqliteBackend) -> Result<Vec<DeclaredLimits>, StoreError> {
    sqlx::query(&format!(
        "SELECT {} FROM {} WHERE limits IS NOT NULL ORDER BY name",
        sql::declared_cols("name"),
        b.t.queues
    ))
    .fetch_all(&*b.reader)
    .await?
    .iter()
    .map(sql::declared)
    .collect()
}

pub(super) async fn keys(
    b: &SqliteBackend,
    q: &QueueKeysQuery<'_>,
) -> Result<QueueKeys, StoreError> {
    let keys = sqlx::query(&sql::keys(&b.t.tasks, "?1", "?2"))
        .bind(q.queue)
        .bind(i64::from(q.limit))
        .fetch_all(&*b.reader)
        .await?;
    let row = sqlx::query(&sql::key_totals(&b.t.tasks, "?1"))
        .bind(q.queue)
        .fetch_one(&*b.reader)
        .await?;
    let mut out = sql::answer(q.queue, &keys, &row)?;
    if !out.keys.is_empty() {
        let listed: Vec<&str> = out.keys.iter().map(|k| k.key.as_str()).collect();
        let logs = sqlx::query(&format!(
            "SELECT ckey, starts FROM {} WHERE queue = ?1 \
             AND ckey IN (SELECT value FROM json_each(?2))",
            b.t.key_rates
        ))
        .bind(q.queue)
        .bind(serde_json::to_string(&listed).map_err(|e| StoreError::Corrupt(e.to_string()))?)
        .fetch_all(&*b.reader)
        .await?;
        crate::store::put_starts(&mut out.keys, sql::key_logs(&logs)?)?;
    }
    Ok(out)
}
