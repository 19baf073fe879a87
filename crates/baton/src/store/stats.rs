//! The throughput rollup's rows: per queue, kind and job, per time bucket, how
//! many attempts ended how, and how long tasks waited and ran. Workers
//! count in memory and add their counts to the store on a timer
//! ([`Backend::stats_add`], one additive upsert per row touched), so every
//! instance reads the same series ([`Backend::stats_read`]); each
//! resolution keeps a bounded window ([`STATS_RESOLUTIONS`],
//! [`Backend::stats_prune_many`]).
//!
//! [`Backend::stats_add`]: super::Backend::stats_add
//! [`Backend::stats_read`]: super::Backend::stats_read
//! [`Backend::stats_prune_many`]: super::Backend::stats_prune_many

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The rollup's resolutions: `(bucket width, how long its buckets are
/// kept)`. Every flush adds each count to one bucket of each resolution,
/// so a chart of the last hour reads 1-minute buckets, of the last day
/// 15-minute buckets and of the last week 1-hour buckets; the store keeps
/// at most about 120 + 192 + 192 buckets of each series.
pub const STATS_RESOLUTIONS: [(Duration, Duration); 3] = [
    (Duration::from_secs(60), Duration::from_secs(2 * 3600)),
    (Duration::from_secs(900), Duration::from_secs(2 * 24 * 3600)),
    (
        Duration::from_secs(3600),
        Duration::from_secs(8 * 24 * 3600),
    ),
];

/// What a worker counted for one series in one bucket. Every field is
/// added on [`Backend::stats_add`](super::Backend::stats_add) but the
/// maxima, which keep the larger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsCounts {
    /// Attempts that succeeded.
    pub succeeded: i64,
    /// Attempts that failed (retried later, or dead: [`StatsCounts::dead`]
    /// counts those too).
    pub failed: i64,
    /// Failed attempts that left the task failed for good (out of
    /// attempts, or failed without a retry).
    pub dead: i64,
    /// Attempts that ended cancelled.
    pub cancelled: i64,
    /// Attempts started (whose wait is in `wait_ms`).
    pub wait_n: i64,
    /// Sum over started attempts of due time → start, ms (store time).
    pub wait_ms: i64,
    /// The longest of those waits, ms.
    pub wait_max_ms: i64,
    /// Attempts ended with a result (whose run is in `run_ms`).
    pub run_n: i64,
    /// Sum over those attempts of start → end, ms.
    pub run_ms: i64,
    /// The longest of those runs, ms.
    pub run_max_ms: i64,
}

impl StatsCounts {
    /// Add `o` into this one (maxima keep the larger).
    pub fn add(&mut self, o: &StatsCounts) {
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.dead += o.dead;
        self.cancelled += o.cancelled;
        self.wait_n += o.wait_n;
        self.wait_ms += o.wait_ms;
        self.wait_max_ms = self.wait_max_ms.max(o.wait_max_ms);
        self.run_n += o.run_n;
        self.run_ms += o.run_ms;
        self.run_max_ms = self.run_max_ms.max(o.run_max_ms);
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == StatsCounts::default()
    }
}

/// One series' counts in one bucket at one resolution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsRow {
    /// The bucket's width in seconds (one of [`STATS_RESOLUTIONS`]).
    pub res_secs: u32,
    /// The bucket's start (store time, a multiple of its width since the
    /// epoch).
    pub bucket: DateTime<Utc>,
    /// The queue.
    pub queue: String,
    /// The task kind (a schedule job's tasks have the job's kind).
    pub kind: String,
    /// The schedule job the tasks ran for, `None` for tasks of no job
    /// (and for rows counted before the rollup kept jobs). A job defined
    /// in the store runs tasks of kind `command`: its runs are told apart
    /// from other commands by this.
    #[serde(default)]
    pub job: Option<String>,
    /// What was counted.
    pub counts: StatsCounts,
}

/// Params of [`Backend::stats_read`](super::Backend::stats_read): one
/// resolution's buckets from `since` on, of one queue and/or kind or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsQuery {
    /// The bucket width in seconds (one of [`STATS_RESOLUTIONS`]).
    pub res_secs: u32,
    /// The first bucket start to read (inclusive).
    pub since: DateTime<Utc>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only this schedule job's tasks.
    pub job: Option<String>,
}

/// A row's counts in the order of the rollup's columns (`succeeded`,
/// `failed`, `dead`, `cancelled`, `wait_n`, `wait_ms`, `wait_max_ms`,
/// `run_n`, `run_ms`, `run_max_ms`).
pub(crate) fn count_values(c: &StatsCounts) -> [i64; 10] {
    [
        c.succeeded,
        c.failed,
        c.dead,
        c.cancelled,
        c.wait_n,
        c.wait_ms,
        c.wait_max_ms,
        c.run_n,
        c.run_ms,
        c.run_max_ms,
    ]
}

/// `t` in ms rounded down to a multiple of `res_secs` seconds.
pub fn bucket_of(t_ms: i64, res_secs: u32) -> i64 {
    let w = i64::from(res_secs.max(1)) * 1000;
    t_ms.div_euclid(w) * w
}

/// How long `res_secs`' buckets are kept, if it is one of
/// [`STATS_RESOLUTIONS`].
pub fn retention_of(res_secs: u32) -> Option<Duration> {
    STATS_RESOLUTIONS
        .iter()
        .find(|(w, _)| w.as_secs() == u64::from(res_secs))
        .map(|(_, keep)| *keep)
}

/// The most rows one upsert statement carries (14 values a row); a
/// longer flush is sent in chunks, each additive on its own.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
pub(crate) const ROWS_PER_STATEMENT: usize = 500;

/// `rows` with the rows of one `(res, bucket, queue, kind, job)` added into one,
/// in key order: a multi-row upsert may not touch a row twice, and
/// concurrent flushes that take row locks in one order cannot deadlock.
pub(crate) fn merged(rows: &[StatsRow]) -> Vec<StatsRow> {
    type Key<'a> = (u32, DateTime<Utc>, &'a str, &'a str, Option<&'a str>);
    let mut m: std::collections::BTreeMap<Key<'_>, StatsCounts> = std::collections::BTreeMap::new();
    for r in rows {
        m.entry((r.res_secs, r.bucket, &r.queue, &r.kind, r.job.as_deref()))
            .or_default()
            .add(&r.counts);
    }
    m.into_iter()
        .map(|((res_secs, bucket, queue, kind, job), counts)| StatsRow {
            res_secs,
            bucket,
            queue: queue.to_string(),
            kind: kind.to_string(),
            job: job.map(str::to_string),
            counts,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_down_and_add_keeps_maxima() {
        assert_eq!(bucket_of(125_000, 60), 120_000);
        assert_eq!(bucket_of(-1, 60), -60_000);
        assert_eq!(bucket_of(3_599_999, 900), 2_700_000);
        let mut a = StatsCounts {
            succeeded: 1,
            wait_max_ms: 9,
            run_max_ms: 2,
            ..Default::default()
        };
        a.add(&StatsCounts {
            succeeded: 2,
            dead: 1,
            wait_max_ms: 3,
            run_max_ms: 5,
            ..Default::default()
        });
        assert_eq!(
            (a.succeeded, a.dead, a.wait_max_ms, a.run_max_ms),
            (3, 1, 9, 5)
        );
        assert_eq!(retention_of(900), Some(Duration::from_secs(2 * 24 * 3600)));
        assert_eq!(retention_of(61), None);
    }
}
