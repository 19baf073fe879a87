//! Lock history on PostgreSQL: `<prefix>lock_history`, one row a release,
//! written by the release statement itself (`Sql::lock_release`).

use super::PgBackend;
use crate::error::StoreError;
use crate::store::lock_history_sql::{list_sql, lock_record, prune_sql};
use crate::store::{ms, LockHistoryQuery, LockRecord, LOCK_HISTORY_RETENTION};

pub(super) async fn list(
    b: &PgBackend,
    q: &LockHistoryQuery,
) -> Result<Vec<LockRecord>, StoreError> {
    let sql = list_sql(&b.names.lock_history, |i| match i {
        1 => "$1::text".to_string(),
        _ => format!("${i}"),
    });
    let rows = b
        .q(&sql)
        .bind(q.name.as_deref())
        .bind(i64::from(q.size()))
        .fetch_all(b.exec())
        .await?;
    rows.iter().map(lock_record).collect()
}

pub(super) async fn prune(b: &PgBackend) -> Result<u64, StoreError> {
    let too_old = format!(
        "released_at < {} - {} * interval '1 millisecond'",
        b.names.now,
        ms(LOCK_HISTORY_RETENTION)
    );
    let done = b
        .q(&prune_sql(&b.names.lock_history, &too_old))
        .execute(b.exec())
        .await?;
    Ok(done.rows_affected())
}
