//! Which slots are due: the slots after a job's cursor up to `now`, filtered
//! by the [`Misfire`] policy, and the catch-up window.

use super::*;

/// What to do with slots missed while no instance was running the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Misfire {
    /// Run only the most recent due slot; count the older ones as skipped.
    #[default]
    Latest,
    /// Run every missed slot, oldest first, but at most the latest
    /// `max_catch_up` of them; older ones are skipped.
    All,
    /// Run no missed slot: only slots at most `grace` old run (normally the
    /// one that is due right now); older ones are skipped.
    None,
}

impl fmt::Display for Misfire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Misfire::Latest => "latest",
            Misfire::All => "all",
            Misfire::None => "none",
        })
    }
}

/// The answer of [`due_slots`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Due {
    /// The slots to run now, oldest first.
    pub slots: Vec<DateTime<Utc>>,
    /// How many due slots the misfire policy skipped.
    pub skipped: u64,
    /// The first slot after `max(cursor, now)`: when to look again.
    pub next: Option<DateTime<Utc>>,
    /// The latest slot in `(cursor, now]`, run or skipped: where the cursor
    /// may move once `slots` are enqueued (or right away when `slots` is
    /// empty and `skipped` is not 0).
    pub last_due: Option<DateTime<Utc>>,
    /// The oldest slot the policy skipped (when `skipped > 0`).
    pub skipped_first: Option<DateTime<Utc>>,
    /// The latest slot the policy skipped (when `skipped > 0`): every
    /// skipped slot is at or before it, every slot to run after it.
    pub skipped_last: Option<DateTime<Utc>>,
}

/// The slots of `schedule` that are due at `now`, given that every slot up
/// to and including `cursor` has been handled.
///
/// The due slots are those in `(cursor, now]`. Of them:
///
/// - [`Misfire::All`] runs the latest `max_catch_up` (at least 1), oldest
///   first;
/// - [`Misfire::Latest`] runs the latest one;
/// - [`Misfire::None`] runs those no older than `grace` (`now - slot <=
///   grace`), at most the latest `max_catch_up`.
///
/// The others are counted in `skipped`. `next` is the first slot after
/// `max(cursor, now)`.
///
/// Cost: for `Every` it is arithmetic, however far behind `cursor` is. For
/// cron, the returned slots are found by scanning a window before `now`
/// that widens until it holds enough of them; `skipped` is counted exactly
/// up to 200 000 slots and estimated beyond that (a per-second cron down
/// for days).
///
/// ```
/// use std::time::Duration;
/// use baton::schedule::spec::{due_slots, Misfire, Schedule};
/// use chrono::{TimeZone, Utc};
///
/// let every_second = Schedule::every(Duration::from_secs(1)).unwrap();
/// let now = Utc.with_ymd_and_hms(2025, 1, 11, 0, 0, 0).unwrap();
/// let cursor = now - chrono::Duration::days(10); // down for 10 days
///
/// let due = due_slots(&every_second, cursor, now, Misfire::All, 100, Duration::ZERO);
/// assert_eq!(due.slots.len(), 100);
/// assert_eq!(due.slots.last(), Some(&now));
/// assert_eq!(due.skipped, 864_000 - 100);
/// assert_eq!(due.next, Some(now + chrono::Duration::seconds(1)));
///
/// let due = due_slots(&every_second, cursor, now, Misfire::Latest, 100, Duration::ZERO);
/// assert_eq!(due.slots, vec![now]);
/// ```
pub fn due_slots(
    schedule: &Schedule,
    cursor: DateTime<Utc>,
    now: DateTime<Utc>,
    misfire: Misfire,
    max_catch_up: usize,
    grace: Duration,
) -> Due {
    let next = schedule.next_after(cursor.max(now));
    if now <= cursor {
        return Due {
            next,
            ..Due::default()
        };
    }
    let keep = max_catch_up.max(1);
    // The oldest slot the policy may run is after `lo`.
    let (lo, keep) = match misfire {
        Misfire::All => (cursor, keep),
        Misfire::Latest => (cursor, 1),
        Misfire::None => {
            let grace = chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
            let oldest = now
                .checked_sub_signed(grace)
                .and_then(|o| o.checked_sub_signed(chrono::Duration::nanoseconds(1)))
                .unwrap_or(cursor);
            (cursor.max(oldest), keep)
        }
    };
    match schedule {
        Schedule::Every { interval } => {
            let Some(i) = every_ms(*interval) else {
                return Due {
                    next,
                    ..Due::default()
                };
            };
            // Slot k is at k * i ms. Due: k in [first(cursor), last].
            let first_after = |t: DateTime<Utc>| t.timestamp_millis().div_euclid(i) + 1;
            let last = now.timestamp_millis().div_euclid(i);
            let first = first_after(cursor);
            if last < first {
                return Due {
                    next,
                    ..Due::default()
                };
            }
            let total = (last - first + 1) as u64;
            let run_from = first_after(lo).max(last - keep as i64 + 1).max(first);
            let slots: Vec<DateTime<Utc>> = (run_from..=last)
                .filter_map(|k| DateTime::from_timestamp_millis(k.checked_mul(i)?))
                .collect();
            let skipped = total - slots.len() as u64;
            let at = |k: i64| DateTime::from_timestamp_millis(k.checked_mul(i)?);
            Due {
                skipped,
                skipped_first: if skipped > 0 { at(first) } else { None },
                skipped_last: if skipped > 0 { at(run_from - 1) } else { None },
                slots,
                next,
                last_due: at(last),
            }
        }
        Schedule::Cron { .. } => {
            let slots = cron_tail(schedule, lo, now, keep);
            let last_due = if slots.is_empty() {
                cron_tail(schedule, cursor, now, 1).pop()
            } else {
                slots.last().copied()
            };
            let total = match last_due {
                None => 0,
                Some(_) => count_slots(schedule, cursor, now),
            };
            let skipped = total.saturating_sub(slots.len() as u64);
            let (skipped_first, skipped_last) = if skipped == 0 {
                (None, None)
            } else {
                // The latest skipped slot is the last one before the first
                // slot to run (or the last due one when none runs).
                let before = match slots.first() {
                    Some(f) => {
                        cron_tail(schedule, cursor, *f - chrono::Duration::nanoseconds(1), 1).pop()
                    }
                    None => last_due,
                };
                (schedule.next_after(cursor), before)
            };
            Due {
                skipped,
                skipped_first,
                skipped_last,
                slots,
                next,
                last_due,
            }
        }
    }
}

/// The start (exclusive) of the catch-up window that ends at slot `latest`:
/// the slot just before the latest `keep` slots up to `latest`. Every
/// instance that sees the same latest due slot computes the same window,
/// whatever cursor it read, so the tasks of one catch-up can be told apart
/// from earlier runs (see `JobAdvance::batch_after`). `None` when there
/// is no such slot within a year before `latest`.
pub fn catch_up_window_start(
    schedule: &Schedule,
    latest: DateTime<Utc>,
    keep: usize,
) -> Option<DateTime<Utc>> {
    let keep = keep.max(1);
    match schedule {
        Schedule::Every { interval } => {
            let i = every_ms(*interval)?;
            let k = latest.timestamp_millis().div_euclid(i) - keep as i64;
            DateTime::from_timestamp_millis(k.checked_mul(i)?)
        }
        Schedule::Cron { .. } => {
            let lo = latest.checked_sub_signed(chrono::Duration::days(366))?;
            let tail = cron_tail(schedule, lo, latest, keep + 1);
            (tail.len() == keep + 1).then(|| tail[0])
        }
    }
}

/// The latest `k` slots in `(lo, now]`, oldest first, scanning a window
/// before `now` that grows until it holds `k` slots or reaches `lo`.
fn cron_tail(s: &Schedule, lo: DateTime<Utc>, now: DateTime<Utc>, k: usize) -> Vec<DateTime<Utc>> {
    let mut span = chrono::Duration::minutes(1);
    loop {
        let q = now.checked_sub_signed(span).map_or(lo, |q| q.max(lo));
        let mut ring: VecDeque<DateTime<Utc>> = VecDeque::with_capacity(k.min(1024));
        let mut cur = q;
        let mut found = 0usize;
        while let Some(x) = s.next_after(cur) {
            if x > now {
                break;
            }
            if ring.len() == k {
                ring.pop_front();
            }
            ring.push_back(x);
            found += 1;
            cur = x;
        }
        if found >= k || q <= lo {
            return ring.into();
        }
        span = span
            .checked_mul(4)
            .unwrap_or(chrono::Duration::MAX)
            .min(now - lo);
    }
}

/// The number of slots in `(cursor, now]`: exact up to [`COUNT_LIMIT`],
/// then extrapolated from the density seen so far.
fn count_slots(s: &Schedule, cursor: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    let mut cur = cursor;
    let mut n = 0u64;
    while let Some(x) = s.next_after(cur) {
        if x > now {
            return n;
        }
        n += 1;
        cur = x;
        if n == COUNT_LIMIT {
            let seen = (cur - cursor).num_milliseconds().max(1) as f64;
            let rest = (now - cur).num_milliseconds().max(0) as f64;
            return n + (n as f64 * rest / seen) as u64;
        }
    }
    n
}
