//! The throughput rollup on SQLite: one row a (resolution, bucket, queue,
//! kind, job) in `<prefix>rollup`, added to by an upsert (`store/stats_sql.rs`).

use super::{SqliteBackend, NOW};
use crate::error::StoreError;
use crate::store::stats::{merged, ROWS_PER_STATEMENT};
use crate::store::stats_sql::{self, Dialect};
use crate::store::{StatsQuery, StatsRow};

const DIALECT: Dialect = Dialect {
    placeholder: |i| format!("?{i}"),
    on_conflict: "ON CONFLICT (res, bucket, queue, kind, job) DO UPDATE SET",
    add: |_, c| format!("{c} = {c} + excluded.{c}"),
    max: |_, c| format!("{c} = max({c}, excluded.{c})"),
};

pub(super) async fn add(b: &SqliteBackend, rows: &[StatsRow]) -> Result<(), StoreError> {
    for chunk in merged(rows).chunks(ROWS_PER_STATEMENT) {
        let sql = stats_sql::upsert_sql(&b.t.rollup, chunk.len(), &DIALECT);
        stats_sql::bind_rows(sqlx::query(&sql), chunk)
            .execute(&*b.pool)
            .await?;
    }
    Ok(())
}

pub(super) async fn read(b: &SqliteBackend, f: &StatsQuery) -> Result<Vec<StatsRow>, StoreError> {
    let rows = sqlx::query(&stats_sql::read_sql(&b.t.rollup, |i| format!("?{i}")))
        .bind(i64::from(f.res_secs))
        .bind(f.since.timestamp_millis())
        .bind(f.queue.as_deref())
        .bind(f.kind.as_deref())
        .bind(f.job.as_deref())
        .fetch_all(&*b.reader)
        .await?;
    rows.iter().map(stats_sql::stats_row).collect()
}

pub(super) async fn prune(b: &SqliteBackend) -> Result<u64, StoreError> {
    let done = sqlx::query(&stats_sql::prune_sql(&b.t.rollup, NOW))
        .execute(&*b.pool)
        .await?;
    Ok(done.rows_affected())
}
