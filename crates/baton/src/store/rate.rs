//! A rate limit's start log on the SQL stores, decided once here: each
//! backend locks the limit's row in `<p>rates` (name, starts), reads it
//! with the store's clock, claims with [`plan`]'s room, reads the claimed
//! tasks' `started_at` back and writes [`StartLog::encode`] of the log
//! [`finish`] leaves, all in one transaction (docs/STORE.md, "Rate
//! limits"). Redis keeps the same log in a sorted set (`lua/claim.lua`).
//!
//! The log keeps the `max` latest start instants (µs of the store's
//! clock), latest first, as runs of equal instants ([`StartLog`]). A claim
//! at `now` counts the logged starts later than `now - per`, with no upper
//! bound: on PostgreSQL `now()` is the transaction's start, so a claim that
//! waited for the row may see starts logged after its own `now`. Keeping
//! the `max` latest (rather than only those in the window) keeps that
//! exact: whenever `max` starts fall after `now - per`, the `max` latest
//! do.

use chrono::{DateTime, Utc};

use crate::error::StoreError;
use crate::store::{RatedClaim, Task, TaskClaim, TaskClaimRated};

/// The latest start instants of one limit (µs), latest first, at most
/// `max` in all, kept as runs: an instant and how many starts it holds (a
/// claim logs all its tasks at its one `now`, so a log of 1,000 starts from
/// claims of ~100 is ~10 runs, not 1,000 numbers to read and write).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StartLog(Vec<(i64, u32)>);

impl StartLog {
    /// The stored text: runs separated by spaces, each an instant in µs,
    /// followed by `*` and its count when it holds more than one start
    /// (`"1700000000000000*12 1699999999000000"`). Plain instants, the form
    /// before runs, read as runs of one.
    pub(crate) fn decode(text: &str) -> Result<StartLog, StoreError> {
        let bad = |t: &str| StoreError::Corrupt(format!("rate limit start log: {t:?}"));
        let mut log = StartLog::default();
        for t in text.split_ascii_whitespace() {
            let (at, n) = match t.split_once('*') {
                Some((at, n)) => (at, n.parse::<u32>().map_err(|_| bad(t))?),
                None => (t, 1),
            };
            let at = at.parse::<i64>().map_err(|_| bad(t))?;
            if n == 0 {
                return Err(bad(t));
            }
            log.0.push((at, n));
        }
        log.normalize();
        Ok(log)
    }

    /// The text [`decode`](Self::decode) reads.
    pub(crate) fn encode(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(self.0.len() * 20);
        for (i, &(at, n)) in self.0.iter().enumerate() {
            let sep = if i > 0 { " " } else { "" };
            // Writing to a `String` cannot fail.
            let _ = match n {
                1 => write!(out, "{sep}{at}"),
                _ => write!(out, "{sep}{at}*{n}"),
            };
        }
        out
    }

    /// Every logged start (µs), latest first, an instant as often as it
    /// holds starts.
    pub(crate) fn instants(&self) -> Vec<i64> {
        self.0
            .iter()
            .flat_map(|&(at, n)| std::iter::repeat_n(at, n as usize))
            .collect()
    }

    /// Starts logged after `now - per`.
    pub(crate) fn in_window(&self, now_us: i64, per_us: i64) -> usize {
        self.0
            .iter()
            .take_while(|&&(t, _)| t > now_us - per_us)
            .map(|&(_, n)| n as usize)
            .sum()
    }

    /// Add `starts` and keep the `max` latest.
    pub(crate) fn record(&mut self, starts: &[i64], max: u32) {
        self.0.extend(starts.iter().map(|&at| (at, 1)));
        self.normalize();
        let mut left = max;
        let mut keep = 0;
        for run in &mut self.0 {
            if left == 0 {
                break;
            }
            run.1 = run.1.min(left);
            left -= run.1;
            keep += 1;
        }
        self.0.truncate(keep);
    }

    /// Drop the starts at or before `cutoff_us` (µs).
    pub(crate) fn forget_until(&mut self, cutoff_us: i64) {
        self.0.retain(|&(at, _)| at > cutoff_us);
    }

    /// Latest first, one run per instant.
    fn normalize(&mut self) {
        self.0
            .sort_unstable_by_key(|&(at, _)| std::cmp::Reverse(at));
        self.0.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                kept.1 = kept.1.saturating_add(later.1);
                true
            } else {
                false
            }
        });
    }

    /// The `max`-th latest start (µs), if the log holds that many.
    fn nth(&self, max: u32) -> Option<i64> {
        let mut seen = 0u32;
        for &(at, n) in &self.0 {
            seen = seen.saturating_add(n);
            if seen >= max {
                return Some(at);
            }
        }
        None
    }

    /// The instant (µs) from which the log allows a start: its `max`-th
    /// latest start + `per` (0 while it holds fewer than `max`).
    pub(crate) fn free_at(&self, max: u32, per_us: i64) -> i64 {
        match self.nth(max.max(1)) {
            Some(nth) => nth.saturating_add(per_us),
            None => 0,
        }
    }

    /// The latest start logged (µs), if any.
    pub(crate) fn latest(&self) -> Option<i64> {
        self.0.first().map(|&(at, _)| at)
    }

    /// When the limit next allows a start, if it is used up at `now`: the
    /// `max`-th latest start leaves the window at its instant + `per`.
    fn next_start(&self, now_us: i64, max: u32, per_us: i64) -> Option<i64> {
        if max == 0 {
            return None;
        }
        let nth = self.nth(max)?;
        (nth + per_us > now_us).then_some(nth + per_us)
    }
}

fn per_us(req: &TaskClaimRated<'_>) -> i64 {
    i64::try_from(req.per.as_micros()).unwrap_or(i64::MAX)
}

/// The claim to make at `now_us` under the log `log`: `None` when the
/// limit allows no start now; else the request with its limit cut to the
/// room left (the buffer share cut with it, so the tasks to start at once
/// stay first).
pub(crate) fn plan<'a>(
    req: &TaskClaimRated<'a>,
    log: &StartLog,
    now_us: i64,
) -> Option<TaskClaim<'a>> {
    let used = u32::try_from(log.in_window(now_us, per_us(req))).unwrap_or(u32::MAX);
    let room = req.max.saturating_sub(used);
    let limit = req.claim.limit.min(room);
    if limit == 0 {
        return None;
    }
    let at_once = req.claim.limit - req.claim.buffered.min(req.claim.limit);
    Some(TaskClaim {
        limit,
        buffered: limit.saturating_sub(at_once),
        ..req.claim.clone()
    })
}

/// What a rated claim decided: the log's new text to write (`None`: the
/// claim took nothing, the row stays as it was) and the answer.
pub(crate) struct Decided {
    pub(crate) write: Option<String>,
    pub(crate) answer: RatedClaim,
}

/// Log the claimed `tasks`' `started` instants (µs) in `log`, and judge
/// at `now_us` when the limit next allows a start.
pub(crate) fn finish(
    req: &TaskClaimRated<'_>,
    mut log: StartLog,
    tasks: Vec<Task>,
    started: &[i64],
    now_us: i64,
) -> Result<Decided, StoreError> {
    log.record(started, req.max);
    // The answer is dated no earlier than the latest start in the log. A
    // claimer whose transaction began after this one's (`now_us` may be
    // its start) can take the limit's row first and log its starts at
    // its own later instant; the plan counted them (a window from the
    // earlier instant holds them too), but an answer dated before them
    // would put the next start more than a window after its `now`.
    let now_us = log.latest().map_or(now_us, |latest| latest.max(now_us));
    let next_start = log
        .next_start(now_us, req.max, per_us(req))
        .map(at)
        .transpose()?;
    Ok(Decided {
        write: (!started.is_empty()).then(|| log.encode()),
        answer: RatedClaim {
            finished: Vec::new(),
            tasks,
            now: at(now_us)?,
            next_start,
            key_next: None,
        },
    })
}

/// A store instant in µs as a time.
pub(crate) fn at(now_us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(now_us)
        .ok_or_else(|| StoreError::Corrupt(format!("store clock {now_us} µs")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(max: u32, per_ms: u64, limit: u32, buffered: u32) -> TaskClaimRated<'static> {
        TaskClaimRated {
            claim: TaskClaim {
                queue: "q",
                worker: "w",
                limit,
                lease: Duration::from_secs(1),
                max_running: None,
                per_key_max_running: None,
                buffered,
                fair: false,
            },
            name: None,
            max,
            per: Duration::from_millis(per_ms),
            finish: &[],
        }
    }

    #[test]
    fn the_answer_is_dated_no_earlier_than_a_start_logged_after_its_instant() {
        // Another claimer, whose transaction began 10 ms after this one's,
        // took the limit's row first and logged its start at its instant.
        let r = req(1, 1000, 10, 0);
        let log = StartLog::decode("1010000").unwrap();
        assert!(plan(&r, &log, 1_000_000).is_none(), "used up");
        let d = finish(&r, log, Vec::new(), &[], 1_000_000).unwrap();
        let (now, next) = (d.answer.now, d.answer.next_start.expect("used up"));
        assert_eq!(now, at(1_010_000).unwrap());
        assert_eq!(next, at(2_010_000).unwrap(), "a window after that start");
        assert!(next > now && next <= now + chrono::Duration::seconds(1));
        // A log that reaches back past a window from the latest start: at
        // the answer's instant the window has room again.
        let r = req(2, 1000, 10, 0);
        let log = StartLog::decode("1010000 9000").unwrap();
        let d = finish(&r, log, Vec::new(), &[], 1_000_000).unwrap();
        assert_eq!(d.answer.next_start, None);
    }

    #[test]
    fn counts_the_window_and_keeps_the_latest() {
        let r = req(3, 1000, 10, 0);
        let log = StartLog::default();
        assert_eq!(plan(&r, &log, 0).unwrap().limit, 3);
        let d = finish(&r, log, Vec::new(), &[0, 0], 0).unwrap();
        assert_eq!(d.answer.next_start, None);
        let log = StartLog::decode(&d.write.unwrap()).unwrap();
        assert_eq!(plan(&r, &log, 500_000).unwrap().limit, 1);
        let d = finish(&r, log, Vec::new(), &[500_000], 500_000).unwrap();
        // Used up until the first start leaves the window.
        assert_eq!(d.answer.next_start, Some(at(1_000_000).unwrap()));
        let log = StartLog::decode(&d.write.unwrap()).unwrap();
        assert!(plan(&r, &log, 999_999).is_none());
        assert_eq!(plan(&r, &log, 1_000_000).unwrap().limit, 2);
        // A later start logged before an earlier `now` still counts.
        let mut log = StartLog::decode("2000000 1900000 1800000 5").unwrap();
        assert_eq!(log.0.len(), 4);
        log.record(&[], 3);
        assert_eq!(log.encode(), "2000000 1900000 1800000");
        assert!(plan(&r, &log, 1_500_000).is_none());
        assert!(StartLog::decode("12 x").is_err());
        assert!(StartLog::decode("12*0").is_err());
        assert!(StartLog::decode("12*x").is_err());
    }

    #[test]
    fn runs_hold_a_claims_starts_and_count_as_many() {
        // A claim of 5 at one instant is one run of 5.
        let mut log = StartLog::default();
        log.record(&[100, 100, 100, 100, 100], 8);
        assert_eq!(log.encode(), "100*5");
        // Plain instants and repeated ones (the old form) merge into runs.
        let old = StartLog::decode("300 100 300 200").unwrap();
        assert_eq!(old.encode(), "300*2 200 100");
        assert_eq!(old.instants(), vec![300, 300, 200, 100]);
        // Keeping the latest 8 cuts into the oldest run.
        log.record(&[300, 300, 300, 200], 8);
        assert_eq!(log.encode(), "300*3 200 100*4");
        assert_eq!(log.in_window(300, 150), 4);
        assert_eq!(log.in_window(300, 250), 8);
        // The 8th latest is at 100: free from 100 + per; not used up below 8.
        assert_eq!(log.free_at(8, 1000), 1100);
        assert_eq!(log.free_at(9, 1000), 0);
        assert_eq!(log.next_start(500, 8, 1000), Some(1100));
        assert_eq!(log.next_start(500, 4, 1000), Some(1200));
        assert_eq!(log.next_start(1300, 4, 1000), None);
        // Decoded again, the same log.
        assert_eq!(StartLog::decode(&log.encode()).unwrap(), log);
    }

    #[test]
    fn a_cut_claim_keeps_its_start_at_once_share_first() {
        let r = req(100, 1000, 10, 4);
        let log = StartLog::decode(&vec!["1"; 95].join(" ")).unwrap();
        let c = plan(&r, &log, 2).unwrap();
        // 5 places: the 6 to start at once are cut to 5, no buffer.
        assert_eq!((c.limit, c.buffered), (5, 0));
    }
}
