//! The throughput rollup's counting side: each attempt's start (its wait)
//! and end (outcome, run time) counted in memory per queue, kind, job and
//! minute of store time, and added to the store on the upkeep's timer
//! ([`FLUSH_EVERY`] polls) as one call of additive upserts
//! ([`Backend::stats_add`](crate::store::Backend::stats_add)), each minute
//! also into its 15-minute and 1-hour buckets. Nothing is written per task;
//! an idle worker writes nothing. A crash loses what was counted since the
//! last flush (at most one flush interval); a failed flush keeps its
//! counts for the next one, up to [`MAX_HELD`] series-minutes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::fast_hash::FastMap;

use crate::store::stats::bucket_of;
use crate::store::{from_ms, StatsCounts, StatsRow, STATS_RESOLUTIONS};

/// Polls (of the base poll interval, 1 s by default) between flushes.
pub(super) const FLUSH_EVERY: u32 = 10;

/// The most series-minutes held between flushes (a store that refuses
/// flushes for long loses the oldest, not the process's memory).
pub(super) const MAX_HELD: usize = 10_000;

/// A duration in whole milliseconds, as the rollup counts it.
pub(super) fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How long a stopping worker waits for its last flush.
pub(super) const FINAL_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

/// Add what was counted to the store, if anything (an upkeep call); what
/// the store refuses is kept for the next flush.
pub(super) async fn flush(shared: &super::Shared) {
    let rows = shared.rollup.take();
    if rows.is_empty() {
        return;
    }
    if let Err(e) = shared.upkeep(shared.store.backend().stats_add(&rows)).await {
        shared.counters.store_error("stats_add");
        crate::store::warn_unless_read_only!(e, error = %crate::error::chain(&e), "flushing the throughput rollup failed; kept for the next flush");
        shared.rollup.put_back(&rows);
    }
}

/// One series' counts by minute (bucket start, ms).
type Minutes = BTreeMap<i64, StatsCounts>;

/// One series' minutes by job (`""` for tasks of no job).
type Jobs = FastMap<String, Minutes>;

/// The counts not yet flushed: queue → kind → job → minute → counts.
#[derive(Debug, Default)]
pub(super) struct Rollup(Mutex<FastMap<String, FastMap<String, Jobs>>>);

/// `$map[$key]` of a `FastMap<String, _>`, inserted empty first when
/// missing (the key allocated only then).
macro_rules! slot {
    ($map:expr, $key:expr) => {
        match $map.get_mut($key) {
            Some(v) => v,
            None => $map.entry($key.to_string()).or_default(),
        }
    };
}

impl Rollup {
    /// Count into the minute of `at_ms` (store time); allocates only for
    /// a new queue, kind or job.
    fn count(&self, s: Series<'_>, at_ms: i64, f: impl FnOnce(&mut StatsCounts)) {
        let mut g = super::lock(&self.0);
        let kinds = slot!(g, s.queue);
        let jobs = slot!(kinds, s.kind);
        let minutes = slot!(jobs, s.job.unwrap_or(""));
        f(minutes.entry(bucket_of(at_ms, 60)).or_default());
    }

    /// An attempt started at store time `at_ms`, `wait_ms` after it was due.
    pub(super) fn started(&self, s: Series<'_>, at_ms: i64, wait_ms: i64) {
        self.count(s, at_ms, |c| {
            c.wait_n += 1;
            c.wait_ms += wait_ms;
            c.wait_max_ms = c.wait_max_ms.max(wait_ms);
        });
    }

    /// An attempt ended at store time `at_ms` after `run_ms`: succeeded,
    /// failed (`dead` when for good) or cancelled. Other ends (handed back,
    /// snoozed, lost) are not counted.
    pub(super) fn ended(&self, e: &Ended<'_>) {
        self.count(e.series, e.at_ms, |c| {
            match e.outcome {
                super::Outcome::Succeeded => c.succeeded += 1,
                super::Outcome::Failed => {
                    c.failed += 1;
                    c.dead += i64::from(e.dead);
                }
                super::Outcome::Cancelled => c.cancelled += 1,
                _ => return,
            }
            c.run_n += 1;
            c.run_ms += e.run_ms;
            c.run_max_ms = c.run_max_ms.max(e.run_ms);
        });
    }

    /// Take every count, as rows of each resolution (a minute also into
    /// the coarser buckets holding it); empty when nothing was counted.
    pub(super) fn take(&self) -> Vec<StatsRow> {
        let taken = std::mem::take(&mut *super::lock(&self.0));
        let mut rows = Vec::new();
        for (queue, kinds) in taken {
            for (kind, jobs) in kinds {
                for (job, minutes) in jobs {
                    let job = (!job.is_empty()).then_some(job);
                    for (minute, counts) in minutes {
                        for (w, _) in STATS_RESOLUTIONS {
                            let res = u32::try_from(w.as_secs()).unwrap_or(u32::MAX);
                            let Ok(bucket) = from_ms(bucket_of(minute, res)) else {
                                continue;
                            };
                            rows.push(StatsRow {
                                res_secs: res,
                                bucket,
                                queue: queue.clone(),
                                kind: kind.clone(),
                                job: job.clone(),
                                counts,
                            });
                        }
                    }
                }
            }
        }
        rows
    }

    /// Put back the 1-minute rows of a flush the store refused, to be sent
    /// with the next one (the coarser rows are made again from them), at
    /// most [`MAX_HELD`] series-minutes, the newest kept.
    pub(super) fn put_back(&self, rows: &[StatsRow]) {
        let mut g = super::lock(&self.0);
        let held: usize = g
            .values()
            .flat_map(|k| k.values())
            .flat_map(|j| j.values())
            .map(BTreeMap::len)
            .sum();
        let mut room = MAX_HELD.saturating_sub(held);
        let mut minutes: Vec<&StatsRow> = rows.iter().filter(|r| r.res_secs == 60).collect();
        minutes.sort_by_key(|r| std::cmp::Reverse(r.bucket));
        for r in minutes {
            if room == 0 {
                tracing::warn!(
                    "the store refused the rollup's flushes for long; dropping the oldest counts"
                );
                break;
            }
            room -= 1;
            g.entry(r.queue.clone())
                .or_default()
                .entry(r.kind.clone())
                .or_default()
                .entry(r.job.clone().unwrap_or_default())
                .or_default()
                .entry(r.bucket.timestamp_millis())
                .or_default()
                .add(&r.counts);
        }
    }
}

/// The series an attempt is counted in: its task's queue, kind and job.
#[derive(Debug, Clone, Copy)]
pub(super) struct Series<'a> {
    pub(super) queue: &'a str,
    pub(super) kind: &'a str,
    /// The schedule job the task runs for, if any.
    pub(super) job: Option<&'a str>,
}

impl<'a> Series<'a> {
    /// `t`'s series, in queue `queue`.
    pub(super) fn of(queue: &'a str, t: &'a crate::store::Task) -> Series<'a> {
        Series {
            queue,
            kind: &t.kind,
            job: t.job.as_deref(),
        }
    }
}

/// An attempt's end, as [`Rollup::ended`] counts it.
pub(super) struct Ended<'a> {
    pub(super) series: Series<'a>,
    pub(super) outcome: super::Outcome,
    /// A failure that left the task failed for good.
    pub(super) dead: bool,
    pub(super) at_ms: i64,
    pub(super) run_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Outcome;

    #[test]
    fn counts_go_to_their_minute_and_every_resolution() {
        let r = Rollup::default();
        let t0 = 3_600_000 * 5 + 61_000; // 05:01:01
        let qk = Series {
            queue: "q",
            kind: "k",
            job: None,
        };
        r.started(qk, t0, 40);
        r.started(qk, t0 + 1_000, 60);
        let end = |outcome, dead, at_ms, run_ms| Ended {
            series: qk,
            outcome,
            dead,
            at_ms,
            run_ms,
        };
        r.ended(&end(Outcome::Succeeded, false, t0 + 2_000, 5));
        r.ended(&end(Outcome::Failed, true, t0 + 70_000, 9));
        r.ended(&end(Outcome::HandedBack, false, t0 + 70_000, 1));
        let rows = r.take();
        assert!(r.take().is_empty(), "taken once");
        let at =
            |res: u32| -> Vec<&StatsRow> { rows.iter().filter(|x| x.res_secs == res).collect() };
        assert_eq!(at(60).len(), 2, "two minutes");
        let first = &at(60)[0].counts;
        assert_eq!(
            (first.wait_n, first.wait_ms, first.wait_max_ms),
            (2, 100, 60)
        );
        assert_eq!((first.succeeded, first.run_n, first.run_ms), (1, 1, 5));
        // Both minutes fall in one 15-minute and one 1-hour bucket: the
        // rows there are added by the store (stats_add merges them).
        assert_eq!(at(900).len(), 2);
        assert_eq!(at(3600)[0].bucket.timestamp_millis(), 3_600_000 * 5);
        let second = &at(60)[1].counts;
        assert_eq!((second.failed, second.dead, second.run_n), (1, 1, 1));
        r.put_back(&rows);
        assert_eq!(r.take().len(), rows.len(), "a refused flush is sent again");
    }
}
