//! The throughput rollup on MySQL/MariaDB: one row a (resolution, bucket,
//! queue, kind, job) in `<prefix>rollup`, added to by an upsert
//! (`store/stats_sql.rs`).

use super::MyBackend;
use crate::error::StoreError;
use crate::store::stats::{merged, ROWS_PER_STATEMENT};
use crate::store::stats_sql::{self, Dialect};
use crate::store::{StatsQuery, StatsRow};

const DIALECT: Dialect = Dialect {
    placeholder: |_| "?".to_string(),
    on_conflict: "ON DUPLICATE KEY UPDATE",
    add: |_, c| format!("{c} = {c} + VALUES({c})"),
    max: |_, c| format!("{c} = GREATEST({c}, VALUES({c}))"),
};

pub(super) async fn add(b: &MyBackend, rows: &[StatsRow]) -> Result<(), StoreError> {
    for chunk in merged(rows).chunks(ROWS_PER_STATEMENT) {
        let sql = stats_sql::upsert_sql(&b.names.rollup, chunk.len(), &DIALECT);
        stats_sql::bind_rows(sqlx::query(&sql), chunk)
            .execute(&b.pool)
            .await?;
    }
    Ok(())
}

pub(super) async fn read(b: &MyBackend, f: &StatsQuery) -> Result<Vec<StatsRow>, StoreError> {
    // `?` binds by position: the queue, kind and job are bound twice.
    let sql = stats_sql::read_sql(&b.names.rollup, |_| "?".to_string());
    let rows = sqlx::query(&sql)
        .bind(i64::from(f.res_secs))
        .bind(f.since.timestamp_millis())
        .bind(f.queue.as_deref())
        .bind(f.queue.as_deref())
        .bind(f.kind.as_deref())
        .bind(f.kind.as_deref())
        .bind(f.job.as_deref())
        .bind(f.job.as_deref())
        .fetch_all(&b.pool)
        .await?;
    rows.iter().map(stats_sql::stats_row).collect()
}

pub(super) async fn prune(b: &MyBackend) -> Result<u64, StoreError> {
    let now_ms = format!("({} DIV 1000)", b.names.now_us);
    let done = sqlx::query(&stats_sql::prune_sql(&b.names.rollup, &now_ms))
        .execute(&b.pool)
        .await?;
    Ok(done.rows_affected())
}
