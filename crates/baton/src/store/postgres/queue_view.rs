//! A queue's declared limits (columns of `<prefix>queues`) and its keys'
//! load on PostgreSQL (`store::queue_view`).

use super::PgBackend;
use crate::error::StoreError;
use crate::store::queue_view::sql;
use crate::store::{DeclaredLimits, QueueDeclare, QueueKeys, QueueKeysQuery};

pub(super) async fn declare(
    b: &PgBackend,
    d: &QueueDeclare<'_>,
) -> Result<Option<DeclaredLimits>, StoreError> {
    // One statement: `old` reads the row as it was (every part of a
    // statement sees one snapshot), `up` writes the new declaration.
    let stmt = format!(
        "WITH old AS (SELECT {cols} FROM {q} WHERE name = $1 AND limits IS NOT NULL FOR UPDATE), \
         up AS (INSERT INTO {q} (name, limits, limits_by, limits_at) VALUES ($1, $2, $3, {now}) \
             ON CONFLICT (name) DO UPDATE SET limits = excluded.limits, \
                 limits_by = excluded.limits_by, limits_at = excluded.limits_at) \
         SELECT * FROM old",
        cols = sql::declared_cols("name"),
        q = b.names.queues,
        now = b.names.now
    );
    b.q(&stmt)
        .bind(d.queue)
        .bind(d.limits.encode())
        .bind(d.by)
        .fetch_optional(b.exec())
        .await?
        .map(|r| sql::declared(&r))
        .transpose()
}

pub(super) async fn list(b: &PgBackend) -> Result<Vec<DeclaredLimits>, StoreError> {
    let stmt = format!(
        "SELECT {} FROM {} WHERE limits IS NOT NULL ORDER BY name",
        sql::declared_cols("name"),
        b.names.queues
    );
    b.q(&stmt)
        .fetch_all(b.exec())
        .await?
        .iter()
        .map(sql::declared)
        .collect()
}

pub(super) async fn keys(b: &PgBackend, q: &QueueKeysQuery<'_>) -> Result<QueueKeys, StoreError> {
    let keys = b
        .q(&sql::keys(&b.names.tasks, "$1", "$2"))
        .bind(q.queue)
        .bind(i64::from(q.limit))
        .fetch_all(b.exec())
        .await?;
    let row = b
        .q(&sql::key_totals(&b.names.tasks, "$1"))
        .bind(q.queue)
        .fetch_one(b.exec())
        .await?;
    let mut out = sql::answer(q.queue, &keys, &row)?;
    if !out.keys.is_empty() {
        let listed: Vec<String> = out.keys.iter().map(|k| k.key.clone()).collect();
        let logs = b
            .q(&format!(
                "SELECT ckey, (SELECT coalesce(string_agg(CASE WHEN log[i + 1] = 1 \
                     THEN log[i]::text ELSE log[i] || '*' || log[i + 1] END, ' ' ORDER BY i), '') \
                     FROM generate_series(1, cardinality(log), 2) AS i) AS starts FROM {} \
                 WHERE queue = $1 AND ckey = ANY($2)",
                b.names.key_rates
            ))
            .bind(q.queue)
            .bind(listed)
            .fetch_all(b.exec())
            .await?;
        crate::store::put_starts(&mut out.keys, sql::key_logs(&logs)?)?;
    }
    Ok(out)
}
