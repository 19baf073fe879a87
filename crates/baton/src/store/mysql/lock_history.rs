//! Lock history on MySQL/MariaDB: `<prefix>lock_history`, one row a
//! release, written in the release's transaction (`locks::lock_release`).

use super::{us, MyBackend};
use crate::error::StoreError;
use crate::store::lock_history_sql::{list_sql, lock_record, prune_sql};
use crate::store::{LockHistoryQuery, LockRecord, LOCK_HISTORY_RETENTION};

pub(super) async fn list(
    b: &MyBackend,
    q: &LockHistoryQuery,
) -> Result<Vec<LockRecord>, StoreError> {
    // `?` binds by position: the name twice.
    let rows = sqlx::query(&list_sql(&b.names.lock_history, |_| "?".to_string()))
        .bind(q.name.as_deref())
        .bind(q.name.as_deref())
        .bind(i64::from(q.size()))
        .fetch_all(&b.pool)
        .await?;
    rows.iter().map(lock_record).collect()
}

pub(super) async fn prune(b: &MyBackend) -> Result<u64, StoreError> {
    let too_old = format!(
        "released_at < {} - INTERVAL {} MICROSECOND",
        b.names.now,
        us(LOCK_HISTORY_RETENTION)
    );
    let done = sqlx::query(&prune_sql(&b.names.lock_history, &too_old))
        .execute(&b.pool)
        .await?;
    Ok(done.rows_affected())
}
