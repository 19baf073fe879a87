//! Lock history on SQLite: `<prefix>lock_history`, one row a release,
//! written by the release's own statement (`lock_release` here), whose
//! insert's trigger ends the lease.

use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::lock_history_sql::{list_sql, lock_record, prune_sql};
use crate::store::sql_row::token_arg;
use crate::store::{ms, LockHistoryQuery, LockRecord, LockRelease, LOCK_HISTORY_RETENTION};

/// Release the lease (the `lock_release` statement) and, when the store
/// records lock history (`LockRelease::record`), record the release in
/// the same statement: the record is inserted from the lock's row while
/// the lease is current, and the insert's trigger (schema step 19 → 20)
/// ends the lease; whether the lease was current.
pub(super) async fn release(b: &SqliteBackend, p: &LockRelease<'_>) -> Result<bool, StoreError> {
    let sql = if p.record {
        &b.sql.lock_release_recorded
    } else {
        &b.sql.lock_release
    };
    let done = sqlx::query(sql)
        .bind(p.name)
        .bind(token_arg(p.token))
        .bind(ms(p.at_least))
        .execute(&*b.pool)
        .await?;
    Ok(done.rows_affected() > 0)
}

pub(super) async fn list(
    b: &SqliteBackend,
    q: &LockHistoryQuery,
) -> Result<Vec<LockRecord>, StoreError> {
    let rows = sqlx::query(&list_sql(&b.t.lock_history, |i| format!("?{i}")))
        .bind(q.name.as_deref())
        .bind(i64::from(q.size()))
        .fetch_all(&*b.reader)
        .await?;
    rows.iter().map(lock_record).collect()
}

pub(super) async fn prune(b: &SqliteBackend) -> Result<u64, StoreError> {
    let too_old = format!("released_at < {NOW} - {}", ms(LOCK_HISTORY_RETENTION));
    let done = sqlx::query(&prune_sql(&b.t.lock_history, &too_old))
        .execute(&*b.pool)
        .await?;
    Ok(done.rows_affected())
}
