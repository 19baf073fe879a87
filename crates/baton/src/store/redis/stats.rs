//! The throughput rollup on Redis: a hash a bucket under the index base,
//! fields per queue, kind, job and column (`<queue> \x1f <kind> \x1f
//! <column>` for tasks of no job, `<queue> \x1f <kind> \x1f <job> \x1f
//! <column>` for a job's: names hold no control character), and a sorted set of each
//! resolution's buckets (`lua/rollup.lua`). Its prune counts buckets, not
//! rows.

use std::collections::BTreeMap;

use super::RedisBackend;
use crate::error::StoreError;
use crate::store::stats::{merged, ROWS_PER_STATEMENT};
use crate::store::{from_ms, StatsCounts, StatsQuery, StatsRow, STATS_RESOLUTIONS};

pub(super) async fn add(b: &RedisBackend, rows: &[StatsRow]) -> Result<(), StoreError> {
    for chunk in merged(rows).chunks(ROWS_PER_STATEMENT) {
        let mut args = vec!["add".to_string()];
        for r in chunk {
            args.extend([
                r.res_secs.to_string(),
                r.bucket.timestamp_millis().to_string(),
                r.queue.clone(),
                match &r.job {
                    // The script joins queue, kind and column with \x1f.
                    Some(job) => format!("{}\u{1f}{job}", r.kind),
                    None => r.kind.clone(),
                },
            ]);
            args.extend(
                crate::store::stats::count_values(&r.counts)
                    .iter()
                    .map(i64::to_string),
            );
        }
        let _: i64 = b.q(&b.scripts.rollup, args).await?;
    }
    Ok(())
}

pub(super) async fn read(b: &RedisBackend, f: &StatsQuery) -> Result<Vec<StatsRow>, StoreError> {
    let flat: Vec<String> = b
        .q(
            &b.scripts.rollup,
            sargs!["read", f.res_secs, f.since.timestamp_millis()],
        )
        .await?;
    let bad = |what: &str| StoreError::Corrupt(format!("rollup {what}"));
    type Key = (i64, String, String, Option<String>);
    let mut rows: BTreeMap<Key, StatsCounts> = BTreeMap::new();
    for t in flat.chunks(3) {
        let [bucket, field, value] = t else {
            return Err(bad("reply"));
        };
        let parts: Vec<&str> = field.split('\u{1f}').collect();
        let (queue, kind, job, col) = match parts[..] {
            [queue, kind, col] => (queue, kind, None, col),
            [queue, kind, job, col] => (queue, kind, Some(job), col),
            _ => return Err(bad(&format!("field {field:?}"))),
        };
        if f.queue.as_deref().is_some_and(|q| q != queue)
            || f.kind.as_deref().is_some_and(|k| k != kind)
            || f.job.is_some() && f.job.as_deref() != job
        {
            continue;
        }
        let bucket: i64 = bucket.parse().map_err(|_| bad("bucket"))?;
        let v: i64 = value.parse().map_err(|_| bad("value"))?;
        let c = rows
            .entry((
                bucket,
                queue.to_string(),
                kind.to_string(),
                job.map(str::to_string),
            ))
            .or_default();
        match col {
            "succeeded" => c.succeeded = v,
            "failed" => c.failed = v,
            "dead" => c.dead = v,
            "cancelled" => c.cancelled = v,
            "wait_n" => c.wait_n = v,
            "wait_ms" => c.wait_ms = v,
            "wait_max_ms" => c.wait_max_ms = v,
            "run_n" => c.run_n = v,
            "run_ms" => c.run_ms = v,
            "run_max_ms" => c.run_max_ms = v,
            _ => return Err(bad(&format!("column {col:?}"))),
        }
    }
    rows.into_iter()
        .map(|((bucket, queue, kind, job), counts)| {
            Ok(StatsRow {
                res_secs: f.res_secs,
                bucket: from_ms(bucket)?,
                queue,
                kind,
                job,
                counts,
            })
        })
        .collect()
}

pub(super) async fn prune(b: &RedisBackend) -> Result<u64, StoreError> {
    let mut args = vec!["prune".to_string()];
    for (w, keep) in STATS_RESOLUTIONS {
        args.push(w.as_secs().to_string());
        args.push((keep + w).as_millis().to_string());
    }
    let mut total = 0u64;
    loop {
        let gone: u64 = b.q(&b.scripts.rollup, args.clone()).await?;
        total += gone;
        if gone < 1000 {
            return Ok(total);
        }
    }
}
