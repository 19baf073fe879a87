//! Throughput, failures and latency over the last hour, day or week, read
//! from the store's rollup (which every worker adds its counts to every
//! 10 s), so every instance answers the same series, also after a
//! restart. A point a bucket (1 minute for an hour, 15 minutes for a day,
//! 1 hour for a week), empty buckets included, summed over the queues,
//! kinds and jobs asked for.
//!
//! ```no_run
//! # async fn demo(store: baton::Store) -> baton::Result<()> {
//! use baton::stats::{series, Range, SeriesFilter};
//!
//! let s = series(&store, Range::Hour, &SeriesFilter::default()).await?;
//! for p in &s.points {
//!     println!("{} {} ok, {} failed", p.at, p.counts.succeeded, p.counts.failed);
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{Error, InvalidInput};
use crate::store::stats::bucket_of;
use crate::store::{from_ms, StatsCounts, StatsQuery};
use crate::Store;

/// How far back a series reaches, and so its bucket width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Range {
    /// The last hour, by minute.
    #[serde(rename = "1h")]
    Hour,
    /// The last day, by 15 minutes.
    #[serde(rename = "1d")]
    Day,
    /// The last week, by hour.
    #[serde(rename = "1w")]
    Week,
}

impl Range {
    /// `(bucket width, span)`.
    pub fn step_and_span(self) -> (Duration, Duration) {
        match self {
            Range::Hour => (Duration::from_secs(60), Duration::from_secs(3600)),
            Range::Day => (Duration::from_secs(900), Duration::from_secs(24 * 3600)),
            Range::Week => (
                Duration::from_secs(3600),
                Duration::from_secs(7 * 24 * 3600),
            ),
        }
    }

    /// Its name: `1h`, `1d` or `1w`.
    pub fn as_str(self) -> &'static str {
        match self {
            Range::Hour => "1h",
            Range::Day => "1d",
            Range::Week => "1w",
        }
    }
}

impl std::str::FromStr for Range {
    type Err = InvalidInput;

    /// `1h`, `1d` or `1w`.
    fn from_str(s: &str) -> Result<Range, InvalidInput> {
        match s {
            "1h" => Ok(Range::Hour),
            "1d" => Ok(Range::Day),
            "1w" => Ok(Range::Week),
            _ => Err(InvalidInput::new(
                "range",
                format!("{s:?} is not a range; give 1h, 1d or 1w"),
            )),
        }
    }
}

/// Which series to sum: one queue, one kind, one job, any of them
/// together, or all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this kind (a schedule job's tasks have the job's kind, by
    /// default its name; a job defined in the store runs kind `command`).
    pub kind: Option<String>,
    /// Only the tasks of this schedule job, however it was defined (in
    /// the config, the library or the store).
    pub job: Option<String>,
}

/// One bucket of a series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Point {
    /// The bucket's start (store time).
    pub at: DateTime<Utc>,
    /// What was counted in it.
    #[serde(flatten)]
    pub counts: StatsCounts,
}

/// One queue, kind and job's totals over the range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesTotal {
    /// The queue.
    pub queue: String,
    /// The kind.
    pub kind: String,
    /// The schedule job, `None` for tasks of no job.
    pub job: Option<String>,
    /// Its counts summed over the range.
    #[serde(flatten)]
    pub counts: StatsCounts,
}

/// A series over a range: a point a bucket, oldest first, the totals and
/// each queue and kind's totals (every one in the range, whatever the
/// filter's kind, so a chart can offer them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Series {
    /// The range.
    pub range: Range,
    /// The bucket width, seconds.
    pub step_secs: u64,
    /// The first bucket's start.
    pub from: DateTime<Utc>,
    /// The store's now when read.
    pub to: DateTime<Utc>,
    /// A point a bucket from `from` to `to`, empty ones included.
    pub points: Vec<Point>,
    /// The points summed.
    pub totals: StatsCounts,
    /// Each queue, kind and job that has counts in the range, with its
    /// totals.
    pub series: Vec<SeriesTotal>,
}

/// The series of `range` up to the store's now, summed over the queues,
/// kinds and jobs `filter` selects.
pub async fn series(store: &Store, range: Range, filter: &SeriesFilter) -> Result<Series, Error> {
    let (step, span) = range.step_and_span();
    let res = u32::try_from(step.as_secs()).unwrap_or(u32::MAX);
    let now = store.now().await?;
    let now_ms = now.timestamp_millis();
    let step_ms = i64::from(res) * 1000;
    let span_ms = i64::try_from(span.as_millis()).unwrap_or(i64::MAX);
    // The bucket holding now, and the span's worth before it.
    let first = bucket_of(now_ms, res) - span_ms + step_ms;
    let rows = store
        .backend()
        .stats_read(&StatsQuery {
            res_secs: res,
            since: from_ms(first)?,
            queue: filter.queue.clone(),
            kind: None,
            job: None,
        })
        .await?;
    let mut by_bucket: BTreeMap<i64, StatsCounts> = BTreeMap::new();
    type Key = (String, String, Option<String>);
    let mut per: BTreeMap<Key, StatsCounts> = BTreeMap::new();
    for r in rows {
        per.entry((r.queue.clone(), r.kind.clone(), r.job.clone()))
            .or_default()
            .add(&r.counts);
        if filter.kind.as_deref().is_some_and(|k| k != r.kind)
            || filter.job.is_some() && filter.job != r.job
        {
            continue;
        }
        by_bucket
            .entry(r.bucket.timestamp_millis())
            .or_default()
            .add(&r.counts);
    }
    let mut points = Vec::new();
    let mut totals = StatsCounts::default();
    let mut at = first;
    while at <= now_ms.max(first) {
        let counts = by_bucket.get(&at).copied().unwrap_or_default();
        totals.add(&counts);
        points.push(Point {
            at: from_ms(at)?,
            counts,
        });
        at += step_ms;
    }
    Ok(Series {
        range,
        step_secs: step.as_secs(),
        from: from_ms(first)?,
        to: now,
        points,
        totals,
        series: per
            .into_iter()
            .map(|((queue, kind, job), counts)| SeriesTotal {
                queue,
                kind,
                job,
                counts,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_name_the_field() {
        assert_eq!("1d".parse::<Range>().unwrap(), Range::Day);
        assert_eq!(Range::Week.step_and_span().0, Duration::from_secs(3600));
        let e = "2h".parse::<Range>().unwrap_err().to_string();
        assert!(e.contains("range") && e.contains("1h, 1d or 1w"), "{e}");
    }
}
