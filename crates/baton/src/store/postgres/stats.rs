//! The throughput rollup on PostgreSQL: one row a (resolution, bucket,
//! queue, kind, job) in `<prefix>rollup`, added to by an upsert
//! (`store/stats_sql.rs`).

use super::PgBackend;
use crate::error::StoreError;
use crate::store::stats::{merged, ROWS_PER_STATEMENT};
use crate::store::stats_sql::{self, Dialect};
use crate::store::{StatsQuery, StatsRow};

const DIALECT: Dialect = Dialect {
    placeholder: |i| format!("${i}"),
    on_conflict: "ON CONFLICT (res, bucket, queue, kind, job) DO UPDATE SET",
    add: |t, c| format!("{c} = {t}.{c} + EXCLUDED.{c}"),
    max: |t, c| format!("{c} = GREATEST({t}.{c}, EXCLUDED.{c})"),
};

pub(super) async fn add(b: &PgBackend, rows: &[StatsRow]) -> Result<(), StoreError> {
    for chunk in merged(rows).chunks(ROWS_PER_STATEMENT) {
        let sql = stats_sql::upsert_sql(&b.names.rollup, chunk.len(), &DIALECT);
        stats_sql::bind_rows(b.q(&sql), chunk)
            .execute(b.exec())
            .await?;
    }
    Ok(())
}

pub(super) async fn read(b: &PgBackend, f: &StatsQuery) -> Result<Vec<StatsRow>, StoreError> {
    let sql = stats_sql::read_sql(&b.names.rollup, |i| match i {
        3..=5 => format!("${i}::text"),
        _ => format!("${i}"),
    });
    let rows = b
        .q(&sql)
        .bind(i64::from(f.res_secs))
        .bind(f.since.timestamp_millis())
        .bind(f.queue.as_deref())
        .bind(f.kind.as_deref())
        .bind(f.job.as_deref())
        .fetch_all(b.exec())
        .await?;
    rows.iter().map(stats_sql::stats_row).collect()
}

pub(super) async fn prune(b: &PgBackend) -> Result<u64, StoreError> {
    let now_ms = format!("(({}) / 1000)", b.names.now_us);
    let done = b
        .q(&stats_sql::prune_sql(&b.names.rollup, &now_ms))
        .execute(b.exec())
        .await?;
    Ok(done.rows_affected())
}
