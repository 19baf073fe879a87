//! The rollup's SQL, written once for the SQL backends: the additive
//! upsert (one multi-row statement, counts summed, maxima kept, rows in
//! key order so concurrent flushes lock rows in one order), the read and
//! the prune, with each dialect's spelling passed in; and the row decoder.

use super::sql_row::SqlRow;
use super::stats::count_values;
use super::stats::{StatsCounts, StatsRow, STATS_RESOLUTIONS};
use crate::error::StoreError;

/// The rollup's counted columns, in [`StatsCounts`]'s field order.
pub(crate) const COUNT_COLS: [&str; 10] = [
    "succeeded",
    "failed",
    "dead",
    "cancelled",
    "wait_n",
    "wait_ms",
    "wait_max_ms",
    "run_n",
    "run_ms",
    "run_max_ms",
];

/// How a dialect spells the upsert's pieces.
pub(crate) struct Dialect {
    /// The `n`-th placeholder (from 1).
    pub placeholder: fn(usize) -> String,
    /// The conflict clause's head, e.g. `ON CONFLICT (res, bucket, queue,
    /// kind) DO UPDATE SET`.
    pub on_conflict: &'static str,
    /// A counted column's update given the column: `c = c + excluded.c`.
    pub add: fn(&str, &str) -> String,
    /// A maximum's update given the table and column.
    pub max: fn(&str, &str) -> String,
}

/// The upsert of `n` rows into `table`: `res, bucket, queue, kind, job`
/// and [`COUNT_COLS`], 15 placeholders a row (`job` is `''` for tasks of
/// no job, so it can be in the key).
pub(crate) fn upsert_sql(table: &str, n: usize, d: &Dialect) -> String {
    let width = 5 + COUNT_COLS.len();
    let rows: Vec<String> = (0..n)
        .map(|r| {
            let ps: Vec<String> = (1..=width)
                .map(|i| (d.placeholder)(r * width + i))
                .collect();
            format!("({})", ps.join(", "))
        })
        .collect();
    let sets: Vec<String> = COUNT_COLS
        .iter()
        .map(|c| {
            if c.ends_with("_max_ms") {
                (d.max)(table, c)
            } else {
                (d.add)(table, c)
            }
        })
        .collect();
    format!(
        "INSERT INTO {table} (res, bucket, queue, kind, job, {}) VALUES {} {} {}",
        COUNT_COLS.join(", "),
        rows.join(", "),
        d.on_conflict,
        sets.join(", ")
    )
}

/// `q` with `rows`' values bound in [`upsert_sql`]'s order.
pub(crate) fn bind_rows<'q, DB: sqlx::Database>(
    mut q: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    rows: &'q [StatsRow],
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    for r in rows {
        q = q
            .bind(i64::from(r.res_secs))
            .bind(r.bucket.timestamp_millis())
            .bind(r.queue.as_str())
            .bind(r.kind.as_str())
            .bind(r.job.as_deref().unwrap_or(""));
        for v in count_values(&r.counts) {
            q = q.bind(v);
        }
    }
    q
}

/// The read: `res`, `bucket >= since` and the optional queue, kind and
/// job, as placeholders 1 to 5 (queue, kind and job `NULL` for all).
pub(crate) fn read_sql(table: &str, p: fn(usize) -> String) -> String {
    format!(
        "SELECT res, bucket, queue, kind, job, {} FROM {table} \
         WHERE res = {} AND bucket >= {} AND ({q} IS NULL OR queue = {q}) \
         AND ({k} IS NULL OR kind = {k}) AND ({j} IS NULL OR job = {j}) \
         ORDER BY bucket, queue, kind, job",
        COUNT_COLS.join(", "),
        p(1),
        p(2),
        q = p(3),
        k = p(4),
        j = p(5),
    )
}

/// The prune: every resolution's buckets that ended before its retention,
/// given the store's now in ms as SQL.
pub(crate) fn prune_sql(table: &str, now_ms: &str) -> String {
    let conds: Vec<String> = STATS_RESOLUTIONS
        .iter()
        .map(|(w, keep)| {
            let (w, keep) = (w.as_millis(), keep.as_millis());
            format!("(res = {} AND bucket < {now_ms} - {})", w / 1000, keep + w)
        })
        .collect();
    format!("DELETE FROM {table} WHERE {}", conds.join(" OR "))
}

/// One rollup row.
pub(crate) fn stats_row(row: &impl SqlRow) -> Result<StatsRow, StoreError> {
    let res = row.big("res")?;
    let v = |c: &str| row.big(c);
    Ok(StatsRow {
        res_secs: u32::try_from(res).map_err(|_| super::sql_row::corrupt("rollup res", res))?,
        bucket: super::from_ms(row.big("bucket")?)?,
        queue: row.text("queue")?,
        kind: row.text("kind")?,
        job: Some(row.text("job")?).filter(|j| !j.is_empty()),
        counts: StatsCounts {
            succeeded: v("succeeded")?,
            failed: v("failed")?,
            dead: v("dead")?,
            cancelled: v("cancelled")?,
            wait_n: v("wait_n")?,
            wait_ms: v("wait_ms")?,
            wait_max_ms: v("wait_max_ms")?,
            run_n: v("run_n")?,
            run_ms: v("run_ms")?,
            run_max_ms: v("run_max_ms")?,
        },
    })
}
