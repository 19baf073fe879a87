//! Schedule arithmetic: which instants are a job's slots, and which of them
//! are due. Pure: no IO, no clock (the caller passes the store's `now`).
//!
//! A job has a [`Schedule`]:
//!
//! - [`Schedule::Cron`]: a cron expression evaluated in an IANA time zone.
//!   5 fields (`minute hour day-of-month month day-of-week`) or 6 fields
//!   (seconds first), with ranges, steps, lists, month and weekday names,
//!   `L` (last day of month; `5L` / `5#L` last Friday), `#` (`FRI#2`, the
//!   second Friday), `W` (`15W`, the weekday nearest the 15th), `?` (same as
//!   `*`) and the nicknames `@yearly`, `@annually`, `@monthly`, `@weekly`,
//!   `@daily`, `@hourly`. Day-of-month and day-of-week combine with OR when
//!   both are restricted, as in Vixie cron. Parsing is done by the `croner`
//!   crate; the time-zone and daylight-saving rules below are baton's own.
//! - [`Schedule::Every`]: a fixed rate anchored at the Unix epoch. The slots
//!   are exactly the multiples of the interval since 1970-01-01T00:00:00Z,
//!   so every instance computes the same slots, with no drift, whenever it
//!   starts.
//!
//! Slots are instants ([`DateTime<Utc>`]). [`Schedule::next_after`] gives
//! the first slot strictly after an instant; the next slot is always
//! computed from the previous slot, never as "now + interval".
//!
//! # Daylight-saving time (cron schedules)
//!
//! A cron expression names wall-clock times in the job's zone. Where the
//! wall clock jumps, baton follows the rule of Vixie cron / cronie, adjusted
//! so that no slot is ever lost:
//!
//! - **Spring forward (a gap).** A wall-clock time that does not exist that
//!   day runs **once, at the first instant after the gap**. `30 2 * * *` in
//!   Europe/Berlin on 2025-03-30 runs at 03:00 CEST (01:00Z). Several
//!   times in the same gap (`*/15 2 * * *`) collapse into that one run; a
//!   time that also matches the end of the gap (`*/15 * * * *` at 03:00) is
//!   the same instant and runs once. This holds for every expression.
//! - **Fall back (a repeated hour).** It depends on the expression:
//!   - a *fixed-time* expression — neither the minute nor the hour field
//!     starts with `*` (or `?`), e.g. `30 1 * * *`, `0 9-17 * * *`,
//!     `@daily` — runs a repeated wall-clock time **once, at its first
//!     occurrence** (01:30 EDT, not again at 01:30 EST);
//!   - an *interval-like* expression — the minute or hour field starts with
//!     `*` (`*/15 * * * *`, `0 * * * *`, `@hourly`, `0 */6 * * *`,
//!     `* 2 * * *`) — runs at **every real instant whose wall-clock reading
//!     matches**, so both passes through the repeated hour run: `*/15` keeps
//!     firing every 15 real minutes and `@hourly` every real hour. Both
//!     passes are distinct instants, and an interval-like job is about
//!     elapsed time, not about a time of day. This is cronie's "wildcard
//!     jobs run on the new time" rule.
//!
//! Clock changes of up to 3 hours (every real DST rule) are handled as
//! above; zones whose offset changes twice within 3 hours are not
//! special-cased.
//!
//! # Catching up
//!
//! [`due_slots`] lists the slots after the job's cursor (the last slot it
//! ran) up to `now`, filtered by the [`Misfire`] policy. For `Every` it is
//! pure arithmetic however far behind the cursor is; for cron it scans only
//! a window near `now` for the slots it returns (see [`due_slots`]).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// The shortest [`Schedule::Every`] interval. Each slot is a compare-and-set
/// on the store; a faster cadence would be a busy loop against it.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The default number of missed slots [`Misfire::All`] runs after a downtime.
pub const DEFAULT_MAX_CATCH_UP: usize = 100;

/// The largest clock change (seconds) the DST handling looks around.
const MAX_SHIFT_SECS: i64 = 3 * 3600;

/// How many naive matches `next_after` may step over inside a repeated
/// hour before giving up (at most 3 h of second-resolution matches).
const FORWARD_LIMIT: usize = 20_000;

/// How many cron slots [`due_slots`] counts exactly before estimating the
/// rest of `skipped`.
const COUNT_LIMIT: u64 = 200_000;

const CRON_FORM: &str = "use 5 fields (minute hour day-of-month month day-of-week, e.g. \
     \"0 */6 * * *\"), 6 fields with seconds first (e.g. \"*/10 * * * * *\"), or \
     @hourly / @daily / @weekly / @monthly / @yearly";

/// A parsed cron expression (opaque). Built by [`Schedule::cron`].
#[derive(Clone)]
pub struct CronPattern {
    cron: Box<croner::Cron>,
    /// Minute or hour field starts with `*`: runs both passes of a repeated
    /// hour (see the module docs).
    interval_like: bool,
}

impl CronPattern {
    /// Whether the expression is interval-like (its minute or hour field
    /// starts with `*`), which decides how a repeated fall-back hour runs.
    pub fn is_interval_like(&self) -> bool {
        self.interval_like
    }
}

impl fmt::Debug for CronPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronPattern")
            .field("normalized", &self.cron.pattern.as_str())
            .field("interval_like", &self.interval_like)
            .finish()
    }
}

/// When a job's slots are.
///
/// ```
/// use baton::schedule::spec::Schedule;
/// use chrono::{TimeZone, Utc};
///
/// // Every 6 hours in Seoul (UTC+9, no DST): 00:00, 06:00, ... KST.
/// let s = Schedule::cron("0 */6 * * *", "Asia/Seoul").unwrap();
/// let t = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap(); // 09:00 KST
/// assert_eq!(s.next_after(t), Some(Utc.with_ymd_and_hms(2025, 1, 1, 3, 0, 0).unwrap()));
///
/// // A wall-clock time in the spring-forward gap runs once, right after it.
/// let s = Schedule::cron("30 2 * * *", "Europe/Berlin").unwrap();
/// let t = Utc.with_ymd_and_hms(2025, 3, 29, 12, 0, 0).unwrap();
/// assert_eq!(s.next_after(t), Some(Utc.with_ymd_and_hms(2025, 3, 30, 1, 0, 0).unwrap()));
///
/// // Every 30 s, anchored at the Unix epoch: the same slots on every instance.
/// let s = Schedule::every(std::time::Duration::from_secs(30)).unwrap();
/// let t = Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 10).unwrap();
/// assert_eq!(s.next_after(t), Some(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 30).unwrap()));
///
/// // Errors name the field.
/// assert_eq!(Schedule::cron("0 0 * *", None).unwrap_err().field, "cron");
/// assert_eq!(Schedule::cron("@daily", "Mars/Olympus").unwrap_err().field, "tz");
/// ```
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A cron expression in a time zone.
    #[non_exhaustive]
    Cron {
        /// The expression as given.
        expr: String,
        /// The zone the expression's wall-clock times are in.
        tz: Tz,
        /// The parsed expression.
        pattern: CronPattern,
    },
    /// A fixed rate anchored at the Unix epoch.
    #[non_exhaustive]
    Every {
        /// The interval: at least [`MIN_INTERVAL`], whole milliseconds.
        interval: Duration,
    },
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Schedule::Cron {
                    expr: a, tz: ta, ..
                },
                Schedule::Cron {
                    expr: b, tz: tb, ..
                },
            ) => a == b && ta == tb,
            (Schedule::Every { interval: a }, Schedule::Every { interval: b }) => a == b,
            _ => false,
        }
    }
}

impl Eq for Schedule {}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron { expr, tz, .. } => write!(f, "cron {expr:?} in {}", tz.name()),
            Schedule::Every { interval } => {
                write!(f, "every {}", crate::duration::format_duration(*interval))
            }
        }
    }
}

impl Schedule {
    /// A cron schedule. `tz` is an IANA zone name such as `Asia/Seoul`;
    /// `None` (or an empty string) means UTC.
    ///
    /// Errors name the field: `cron` for a bad expression (or one that
    /// never matches, like `0 0 31 2 *`), `tz` for an unknown zone.
    pub fn cron<'a>(expr: &str, tz: impl Into<Option<&'a str>>) -> Result<Schedule, InvalidInput> {
        let tz_name = tz.into().map(str::trim).filter(|s| !s.is_empty());
        let tz: Tz = match tz_name {
            None => Tz::UTC,
            Some(name) => name.parse().map_err(|_| {
                InvalidInput::new(
                    "tz",
                    format!(
                        "{name:?} is not an IANA time zone; use a name like \"UTC\", \
                         \"Europe/Berlin\" or \"Asia/Seoul\""
                    ),
                )
            })?,
        };
        let trimmed = expr.trim();
        let bad = |why: String| {
            InvalidInput::new(
                "cron",
                format!("{expr:?} is not a cron expression ({why}); {CRON_FORM}"),
            )
        };
        if trimmed.is_empty() {
            return Err(bad("it is empty".into()));
        }
        let cron = croner::Cron::new(trimmed)
            .with_seconds_optional()
            .parse()
            .map_err(|e| bad(e.to_string()))?;
        let pattern = CronPattern {
            interval_like: interval_like(trimmed),
            cron: Box::new(cron),
        };
        // A pattern with no date at all (Feb 30) would make every search run
        // to croner's year limit: refuse it here. Cron has no year field, so
        // a pattern that matches at all matches within 28 years of any date.
        let probe = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
        let ok = probe
            .and_then(|p| naive_next(&pattern.cron, p.naive_utc(), false))
            .is_some();
        if !ok {
            return Err(InvalidInput::new(
                "cron",
                format!("{expr:?} matches no date; {CRON_FORM}"),
            ));
        }
        Ok(Schedule::Cron {
            expr: trimmed.to_string(),
            tz,
            pattern,
        })
    }

    /// A fixed-rate schedule: slots at every multiple of `interval` since
    /// the Unix epoch. The interval must be at least [`MIN_INTERVAL`] (100 ms)
    /// and a whole number of milliseconds.
    pub fn every(interval: Duration) -> Result<Schedule, InvalidInput> {
        let shown = crate::duration::format_duration(interval);
        if interval < MIN_INTERVAL {
            return Err(InvalidInput::new(
                "every",
                format!("{shown} is too short; use at least 100ms (e.g. \"1s\", \"30s\", \"15m\")"),
            ));
        }
        if interval.subsec_nanos() % 1_000_000 != 0 {
            return Err(InvalidInput::new(
                "every",
                format!("{interval:?} is not a whole number of milliseconds"),
            ));
        }
        if i64::try_from(interval.as_millis()).is_err() {
            return Err(InvalidInput::new("every", format!("{shown} is too long")));
        }
        Ok(Schedule::Every { interval })
    }

    /// The first slot strictly after `t`, or `None` when there is none
    /// (beyond the representable range).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Schedule::Every { interval } => {
                let i = every_ms(*interval)?;
                let k = t.timestamp_millis().div_euclid(i).checked_add(1)?;
                DateTime::from_timestamp_millis(k.checked_mul(i)?)
            }
            Schedule::Cron { tz, pattern, .. } => cron_next_after(pattern, tz, t),
        }
    }
}

impl Schedule {
    /// `t` truncated to the schedule's precision: whole seconds for cron,
    /// whole milliseconds for `Every`. Every slot is already at that
    /// precision, and so is the slot a store keeps (milliseconds or finer),
    /// so a slot given from outside (a trigger) names the same stored slot
    /// and the same unique key as the scheduler's.
    pub fn truncate(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Schedule::Cron { .. } => floor_to_second(t),
            Schedule::Every { .. } => {
                DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
            }
        }
    }

    /// Whether `t` is exactly one of the schedule's slots.
    pub fn is_slot(&self, t: DateTime<Utc>) -> bool {
        t.checked_sub_signed(chrono::Duration::nanoseconds(1))
            .and_then(|b| self.next_after(b))
            == Some(t)
    }
}

/// Cronie's rule: the minute or hour field starts with `*` (`?` is `*`).
fn interval_like(expr: &str) -> bool {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if fields.len() == 1 && fields[0].starts_with('@') {
        return fields[0].eq_ignore_ascii_case("@hourly");
    }
    let (minute, hour) = match fields.len() {
        5 => (fields[0], fields[1]),
        6 => (fields[1], fields[2]),
        _ => return false,
    };
    let star = |f: &str| f.starts_with('*') || f.starts_with('?');
    star(minute) || star(hour)
}

/// The interval in ms, `None` for an interval no valid `Every` can have.
fn every_ms(interval: Duration) -> Option<i64> {
    let ms = i64::try_from(interval.as_millis()).ok()?;
    (ms > 0).then_some(ms)
}

/// The next wall-clock time (naive) matching the pattern.
fn naive_next(cron: &croner::Cron, n: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
    // UTC has no DST, so croner's search on it is a pure wall-clock search.
    cron.find_next_occurrence(&Utc.from_utc_datetime(&n), inclusive)
        .ok()
        .map(|d| d.naive_utc())
}

fn offset_secs(tz: &Tz, t: DateTime<Utc>) -> i64 {
    i64::from(
        tz.offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc(),
    )
}

fn floor_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// The instants a matching wall-clock time `n` stands for: the first (or
/// only) one, and for a repeated time the second one.
fn resolve(tz: &Tz, n: NaiveDateTime) -> Option<(DateTime<Utc>, Option<DateTime<Utc>>)> {
    match tz.from_local_datetime(&n) {
        LocalResult::Single(d) => Some((d.with_timezone(&Utc), None)),
        LocalResult::Ambiguous(a, b) => {
            let (a, b) = (a.with_timezone(&Utc), b.with_timezone(&Utc));
            Some((a.min(b), Some(a.max(b))))
        }
        LocalResult::None => gap_end(tz, n).map(|e| (e, None)),
    }
}

/// The first instant after the spring-forward gap that contains `n`.
fn gap_end(tz: &Tz, n: NaiveDateTime) -> Option<DateTime<Utc>> {
    if let Some(end) = chrono_tz::GapInfo::new(&n, tz).and_then(|g| g.end) {
        return Some(end.with_timezone(&Utc));
    }
    // Fallback: the smallest instant whose wall clock is past `n`. Offsets
    // are within ±14 h, so the answer lies within a day of `n` read as UTC.
    let base = n.and_utc().timestamp();
    let (mut lo, mut hi) = (base - 26 * 3600, base + 26 * 3600);
    let past =
        |s: i64| DateTime::from_timestamp(s, 0).map(|d| d.with_timezone(tz).naive_local() > n);
    if past(lo)? || !past(hi)? {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if past(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    DateTime::from_timestamp(hi, 0)
}

/// The first instant in `(a, b]` whose offset differs from `a`'s, given
/// that `b`'s does (one transition assumed in between).
fn transition_between(tz: &Tz, a: DateTime<Utc>, b: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let off_a = offset_secs(tz, a);
    let (mut lo, mut hi) = (a.timestamp(), b.timestamp());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_secs(tz, DateTime::from_timestamp(mid, 0)?) == off_a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    DateTime::from_timestamp(hi, 0)
}

fn cron_next_after(p: &CronPattern, tz: &Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    // Cron slots are whole seconds: the first one after t is the first one
    // after t's second.
    let t = floor_to_second(t);
    let local = t.with_timezone(tz).naive_local();
    let mut best: Option<DateTime<Utc>> = None;

    // 1. Wall-clock times after t's. The first one whose instant is after t
    //    (inside a repeated hour, earlier wall times of the first pass may
    //    still lie before t when t is in the second pass).
    let mut n = local;
    for _ in 0..FORWARD_LIMIT {
        let Some(next) = naive_next(&p.cron, n, false) else {
            break;
        };
        n = next;
        let Some((first, second)) = resolve(tz, n) else {
            continue;
        };
        let candidate = if first > t {
            Some(first)
        } else if p.interval_like {
            second.filter(|s| *s > t)
        } else {
            None
        };
        if candidate.is_some() {
            best = candidate;
            break;
        }
    }

    // 2. Interval-like only: the second pass through a repeated hour that
    //    begins within 3 h after t revisits wall times at or before t's.
    if p.interval_like {
        let horizon = t + chrono::Duration::seconds(MAX_SHIFT_SECS);
        let off_t = offset_secs(tz, t);
        if offset_secs(tz, horizon) < off_t {
            if let Some(tr) = transition_between(tz, t, horizon) {
                let off_new = offset_secs(tz, tr);
                let fold_start = tr.naive_utc() + chrono::Duration::seconds(off_new);
                let fold_end = tr.naive_utc() + chrono::Duration::seconds(off_t);
                if let Some(m) = naive_next(&p.cron, fold_start, true) {
                    if m < fold_end {
                        let b = (m - chrono::Duration::seconds(off_new)).and_utc();
                        if b > t && best.is_none_or(|x| b < x) {
                            best = Some(b);
                        }
                    }
                }
            }
        }
    }
    best
}

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
/// from earlier runs (see `SlotAdvance::batch_after`). `None` when there
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_up_window_is_the_same_from_any_cursor() {
        let ev = Schedule::every(Duration::from_secs(1)).unwrap();
        let latest = utc(2025, 1, 1, 0, 1, 40);
        assert_eq!(
            catch_up_window_start(&ev, latest, 100),
            Some(utc(2025, 1, 1, 0, 0, 0))
        );
        assert_eq!(
            catch_up_window_start(&ev, latest, 1),
            Some(utc(2025, 1, 1, 0, 1, 39))
        );
        let c = cron("0 */6 * * *", "UTC");
        assert_eq!(
            catch_up_window_start(&c, utc(2025, 1, 2, 12, 0, 0), 3),
            Some(utc(2025, 1, 1, 18, 0, 0))
        );
    }

    #[test]
    fn truncate_and_is_slot() {
        let ev = Schedule::every(Duration::from_secs(1)).unwrap();
        let t = utc(2025, 1, 1, 0, 0, 5);
        let off = t + chrono::Duration::microseconds(1);
        assert_eq!(ev.truncate(off), t, "a microsecond off is the same slot");
        assert_eq!(ev.truncate(t + chrono::Duration::nanoseconds(100)), t);
        assert!(ev.is_slot(t));
        assert!(!ev.is_slot(t + chrono::Duration::milliseconds(500)));
        assert!(!ev.is_slot(off));
        let ms = Schedule::every(Duration::from_millis(250)).unwrap();
        assert!(ms.is_slot(t + chrono::Duration::milliseconds(750)));
        assert_eq!(
            ms.truncate(t + chrono::Duration::microseconds(750_400)),
            t + chrono::Duration::milliseconds(750)
        );
        let c = cron("0 */6 * * *", "Asia/Seoul");
        // 06:00 KST is 21:00Z the day before.
        let six = utc(2024, 12, 31, 21, 0, 0);
        assert!(c.is_slot(six));
        assert!(!c.is_slot(six + chrono::Duration::hours(1)));
        assert_eq!(c.truncate(six + chrono::Duration::milliseconds(999)), six);
        assert!(c.is_slot(c.truncate(six + chrono::Duration::microseconds(3))));
    }

    #[test]
    fn skipped_range_is_reported() {
        let ev = Schedule::every(Duration::from_secs(1)).unwrap();
        let cursor = utc(2025, 1, 1, 0, 0, 0);
        let now = cursor + chrono::Duration::milliseconds(5_500);
        let due = due_slots(&ev, cursor, now, Misfire::Latest, 100, Duration::ZERO);
        assert_eq!(due.slots, [utc(2025, 1, 1, 0, 0, 5)]);
        assert_eq!(due.skipped, 4);
        assert_eq!(due.skipped_first, Some(utc(2025, 1, 1, 0, 0, 1)));
        assert_eq!(due.skipped_last, Some(utc(2025, 1, 1, 0, 0, 4)));
        let due = due_slots(&ev, cursor, now, Misfire::All, 2, Duration::ZERO);
        assert_eq!(
            due.slots,
            [utc(2025, 1, 1, 0, 0, 4), utc(2025, 1, 1, 0, 0, 5)]
        );
        assert_eq!(due.skipped_last, Some(utc(2025, 1, 1, 0, 0, 3)));
        let due = due_slots(&ev, cursor, now, Misfire::All, 100, Duration::ZERO);
        assert_eq!(due.skipped, 0);
        assert_eq!((due.skipped_first, due.skipped_last), (None, None));
        // None with no slot inside the grace: all skipped, up to the last due.
        let due = due_slots(
            &ev,
            cursor,
            now,
            Misfire::None,
            100,
            Duration::from_millis(100),
        );
        assert!(due.slots.is_empty());
        assert_eq!(due.skipped_last, Some(utc(2025, 1, 1, 0, 0, 5)));
        // Cron: the same, by scanning.
        let c = cron("* * * * *", "UTC");
        let now = cursor + chrono::Duration::seconds(5 * 60 + 30);
        let due = due_slots(&c, cursor, now, Misfire::Latest, 100, Duration::ZERO);
        assert_eq!(due.slots, [utc(2025, 1, 1, 0, 5, 0)]);
        assert_eq!(due.skipped, 4);
        assert_eq!(due.skipped_first, Some(utc(2025, 1, 1, 0, 1, 0)));
        assert_eq!(due.skipped_last, Some(utc(2025, 1, 1, 0, 4, 0)));
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    fn cron(expr: &str, tz: &str) -> Schedule {
        Schedule::cron(expr, tz).unwrap_or_else(|e| panic!("{expr} {tz}: {e}"))
    }

    /// The first `n` slots after `from`, as `YYYY-MM-DDTHH:MM:SSZ`.
    fn slots(s: &Schedule, from: DateTime<Utc>, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut t = from;
        for _ in 0..n {
            t = s.next_after(t).expect("a next slot");
            out.push(t.format("%Y-%m-%dT%H:%M:%SZ").to_string());
        }
        out
    }

    /// The same slots, shown as wall-clock time in the schedule's zone.
    fn local_slots(s: &Schedule, from: DateTime<Utc>, n: usize) -> Vec<String> {
        let Schedule::Cron { tz, .. } = s else {
            panic!("cron only")
        };
        let mut out = Vec::new();
        let mut t = from;
        for _ in 0..n {
            t = s.next_after(t).expect("a next slot");
            out.push(t.with_timezone(tz).format("%m-%d %H:%M:%S %Z").to_string());
        }
        out
    }

    // ---- cron syntax ------------------------------------------------------

    #[test]
    fn five_field_cron_in_utc() {
        let s = cron("0 */6 * * *", "UTC");
        assert_eq!(
            slots(&s, utc(2025, 1, 1, 0, 0, 0), 4),
            [
                "2025-01-01T06:00:00Z",
                "2025-01-01T12:00:00Z",
                "2025-01-01T18:00:00Z",
                "2025-01-02T00:00:00Z"
            ]
        );
        // Strictly after: a slot instant itself is not returned.
        assert_eq!(
            s.next_after(utc(2025, 1, 1, 6, 0, 0)),
            Some(utc(2025, 1, 1, 12, 0, 0))
        );
        // Sub-second instants: the slot at the next whole second is after t.
        let t = utc(2025, 1, 1, 5, 59, 59) + chrono::Duration::milliseconds(999);
        assert_eq!(s.next_after(t), Some(utc(2025, 1, 1, 6, 0, 0)));
        let t = utc(2025, 1, 1, 6, 0, 0) + chrono::Duration::milliseconds(1);
        assert_eq!(s.next_after(t), Some(utc(2025, 1, 1, 12, 0, 0)));
        // No zone given means UTC.
        assert_eq!(Schedule::cron("0 */6 * * *", None).unwrap(), s);
        assert_eq!(Schedule::cron("0 */6 * * *", "").unwrap(), s);
    }

    #[test]
    fn six_field_cron_has_seconds_first() {
        let s = cron("*/20 * * * * *", "UTC");
        assert_eq!(
            slots(&s, utc(2025, 1, 1, 0, 0, 5), 4),
            [
                "2025-01-01T00:00:20Z",
                "2025-01-01T00:00:40Z",
                "2025-01-01T00:01:00Z",
                "2025-01-01T00:01:20Z"
            ]
        );
        let s = cron("30 15 12 * * *", "UTC");
        assert_eq!(
            slots(&s, utc(2025, 1, 1, 0, 0, 0), 2),
            ["2025-01-01T12:15:30Z", "2025-01-02T12:15:30Z"]
        );
    }

    #[test]
    fn last_day_nth_weekday_and_nearest_weekday() {
        // L: last day of the month, leap years included.
        let s = cron("0 0 L * *", "UTC");
        assert_eq!(
            slots(&s, utc(2024, 1, 15, 0, 0, 0), 4),
            [
                "2024-01-31T00:00:00Z",
                "2024-02-29T00:00:00Z",
                "2024-03-31T00:00:00Z",
                "2024-04-30T00:00:00Z"
            ]
        );
        // 5L and 5#L: the last Friday.
        for expr in ["0 0 * * 5L", "0 0 * * FRI#L"] {
            assert_eq!(
                slots(&cron(expr, "UTC"), utc(2025, 1, 1, 0, 0, 0), 3),
                [
                    "2025-01-31T00:00:00Z",
                    "2025-02-28T00:00:00Z",
                    "2025-03-28T00:00:00Z"
                ],
                "{expr}"
            );
        }
        // #: the first Monday.
        assert_eq!(
            slots(&cron("0 9 * * MON#1", "UTC"), utc(2025, 1, 1, 0, 0, 0), 3),
            [
                "2025-01-06T09:00:00Z",
                "2025-02-03T09:00:00Z",
                "2025-03-03T09:00:00Z"
            ]
        );
        // W: the weekday nearest the 15th (Sat 15 Feb -> Fri 14, Sun 15
        // Jun -> Mon 16, Wed 15 Jan -> 15).
        let s = cron("0 0 15W * *", "UTC");
        let got = slots(&s, utc(2025, 1, 1, 0, 0, 0), 6);
        assert_eq!(got[0], "2025-01-15T00:00:00Z");
        assert_eq!(got[1], "2025-02-14T00:00:00Z");
        assert_eq!(got[5], "2025-06-16T00:00:00Z");
    }

    #[test]
    fn names_and_nicknames() {
        let s = cron("0 12 * JAN,JUL sun", "UTC");
        assert_eq!(
            slots(&s, utc(2025, 1, 20, 0, 0, 0), 3),
            [
                "2025-01-26T12:00:00Z",
                "2025-07-06T12:00:00Z",
                "2025-07-13T12:00:00Z"
            ]
        );
        // Day of month and day of week combine with OR (Vixie cron).
        assert_eq!(
            slots(&cron("0 0 1 * MON", "UTC"), utc(2025, 1, 1, 0, 0, 0), 2),
            ["2025-01-06T00:00:00Z", "2025-01-13T00:00:00Z"]
        );
        let t = utc(2025, 1, 1, 0, 30, 0); // a Wednesday
        for (nick, next) in [
            ("@hourly", utc(2025, 1, 1, 1, 0, 0)),
            ("@daily", utc(2025, 1, 2, 0, 0, 0)),
            ("@weekly", utc(2025, 1, 5, 0, 0, 0)),
            ("@monthly", utc(2025, 2, 1, 0, 0, 0)),
            ("@yearly", utc(2026, 1, 1, 0, 0, 0)),
            ("@annually", utc(2026, 1, 1, 0, 0, 0)),
            ("@DAILY", utc(2025, 1, 2, 0, 0, 0)),
        ] {
            assert_eq!(cron(nick, "UTC").next_after(t), Some(next), "{nick}");
        }
        // `?` is `*`.
        assert_eq!(
            cron("0 0 ? * *", "UTC").next_after(t),
            Some(utc(2025, 1, 2, 0, 0, 0))
        );
    }

    #[test]
    fn interval_like_follows_cronie() {
        for (expr, like) in [
            ("*/15 * * * *", true),
            ("0 * * * *", true),
            ("0 */6 * * *", true),
            ("* 2 * * *", true),
            ("? 2 * * *", true),
            ("0 * * * * *", true),
            ("@hourly", true),
            ("30 1 * * *", false),
            ("0 9-17 * * *", false),
            ("*/10 30 2 * * *", false),
            ("@daily", false),
        ] {
            let Schedule::Cron { pattern, .. } = cron(expr, "UTC") else {
                unreachable!()
            };
            assert_eq!(pattern.is_interval_like(), like, "{expr}");
        }
    }

    // ---- errors -------------------------------------------------------------

    #[test]
    fn errors_name_the_field_and_the_form() {
        for bad in [
            "",
            "0 0 * *",
            "0 0 * * * * *",
            "61 * * * *",
            "a b c d e",
            "0 0 31 2 *",
        ] {
            let e = Schedule::cron(bad, "UTC").unwrap_err();
            assert_eq!(e.field, "cron", "{bad:?}");
            assert!(e.problem.contains("5 fields"), "{bad:?}: {}", e.problem);
            assert!(e.problem.contains(&format!("{bad:?}")), "{}", e.problem);
        }
        assert!(Schedule::cron("0 0 31 2 *", None)
            .unwrap_err()
            .problem
            .contains("matches no date"));
        for bad in ["Mars/Olympus", "CEST", "europe/berlin", "+09:00"] {
            let e = Schedule::cron("@daily", bad).unwrap_err();
            assert_eq!(e.field, "tz", "{bad}");
            assert!(e.problem.contains("IANA"), "{}", e.problem);
            assert!(e.to_string().starts_with("tz: "), "{e}");
        }
        for (bad, why) in [
            (Duration::ZERO, "too short"),
            (Duration::from_millis(99), "too short"),
            (Duration::from_micros(1_500_500), "milliseconds"),
        ] {
            let e = Schedule::every(bad).unwrap_err();
            assert_eq!(e.field, "every");
            assert!(e.problem.contains(why), "{}", e.problem);
        }
        assert!(Schedule::every(Duration::from_millis(1500)).is_ok());
    }

    // ---- time zones and DST ----------------------------------------------

    #[test]
    fn seoul_has_no_dst_and_a_nine_hour_offset() {
        let s = cron("0 */6 * * *", "Asia/Seoul");
        // 00/06/12/18 KST = 15/21/03/09 UTC, on any date.
        assert_eq!(
            slots(&s, utc(2025, 3, 29, 12, 0, 0), 5),
            [
                "2025-03-29T15:00:00Z",
                "2025-03-29T21:00:00Z",
                "2025-03-30T03:00:00Z",
                "2025-03-30T09:00:00Z",
                "2025-03-30T15:00:00Z"
            ]
        );
        assert_eq!(
            local_slots(&s, utc(2025, 10, 25, 12, 0, 0), 4),
            [
                "10-26 00:00:00 KST",
                "10-26 06:00:00 KST",
                "10-26 12:00:00 KST",
                "10-26 18:00:00 KST"
            ]
        );
        // Dates where Europe and America change clocks change nothing here.
        let s = cron("30 2 * * *", "Asia/Seoul");
        for day in [(2025, 3, 9), (2025, 3, 30), (2025, 10, 26), (2025, 11, 2)] {
            let (y, m, d) = day;
            let before = utc(y, m, d, 0, 0, 0) - chrono::Duration::days(1);
            assert_eq!(s.next_after(before), Some(utc(y, m, d - 1, 17, 30, 0)));
        }
    }

    #[test]
    fn berlin_spring_forward_runs_gap_times_once_after_the_gap() {
        // 2025-03-30 02:00 CET -> 03:00 CEST at 01:00Z.
        let s = cron("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            slots(&s, utc(2025, 3, 28, 12, 0, 0), 4),
            [
                "2025-03-29T01:30:00Z", // 02:30 CET
                "2025-03-30T01:00:00Z", // 03:00 CEST: 02:30 does not exist
                "2025-03-31T00:30:00Z", // 02:30 CEST
                "2025-04-01T00:30:00Z"
            ]
        );
        // Several gap times collapse into one run at 03:00 CEST.
        let s = cron("*/15 2 * * *", "Europe/Berlin");
        assert_eq!(
            slots(&s, utc(2025, 3, 29, 12, 0, 0), 2),
            ["2025-03-30T01:00:00Z", "2025-03-31T00:00:00Z"]
        );
        // Interval-like: 03:00 matches anyway; one run, no gap slots.
        let s = cron("*/15 * * * *", "Europe/Berlin");
        assert_eq!(
            local_slots(&s, utc(2025, 3, 30, 0, 30, 0), 4),
            [
                "03-30 01:45:00 CET",
                "03-30 03:00:00 CEST",
                "03-30 03:15:00 CEST",
                "03-30 03:30:00 CEST"
            ]
        );
        // A gap time with a minute the end of the gap does not match.
        let s = cron("5-55/10 * * * *", "Europe/Berlin");
        assert_eq!(
            local_slots(&s, utc(2025, 3, 30, 0, 50, 0), 3),
            [
                "03-30 01:55:00 CET",
                "03-30 03:00:00 CEST",
                "03-30 03:05:00 CEST"
            ]
        );
    }

    #[test]
    fn berlin_fall_back() {
        // 2025-10-26 03:00 CEST -> 02:00 CET at 01:00Z; 02:00-02:59 twice.
        // Fixed time: the first occurrence only.
        let s = cron("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            slots(&s, utc(2025, 10, 25, 12, 0, 0), 2),
            ["2025-10-26T00:30:00Z", "2025-10-27T01:30:00Z"]
        );
        // From inside the second pass the answer is still in the future.
        assert_eq!(
            s.next_after(utc(2025, 10, 26, 1, 10, 0)),
            Some(utc(2025, 10, 27, 1, 30, 0))
        );
        assert_eq!(
            s.next_after(utc(2025, 10, 26, 0, 30, 0)),
            Some(utc(2025, 10, 27, 1, 30, 0))
        );
        // Interval-like: every real 15 minutes, both passes.
        let s = cron("*/15 * * * *", "Europe/Berlin");
        let got = slots(&s, utc(2025, 10, 25, 23, 50, 0), 10);
        let want: Vec<String> = (0..10)
            .map(|i| {
                (utc(2025, 10, 26, 0, 0, 0) + chrono::Duration::minutes(15 * i))
                    .format("%Y-%m-%dT%H:%M:%SZ")
                    .to_string()
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            local_slots(&s, utc(2025, 10, 26, 0, 40, 0), 3),
            [
                "10-26 02:45:00 CEST",
                "10-26 02:00:00 CET",
                "10-26 02:15:00 CET"
            ]
        );
        // From inside the second pass: the next real quarter hour.
        assert_eq!(
            s.next_after(utc(2025, 10, 26, 1, 20, 0)),
            Some(utc(2025, 10, 26, 1, 30, 0))
        );
        // @hourly: every real hour.
        let s = cron("@hourly", "Europe/Berlin");
        assert_eq!(
            local_slots(&s, utc(2025, 10, 25, 23, 30, 0), 3),
            [
                "10-26 02:00:00 CEST",
                "10-26 02:00:00 CET",
                "10-26 03:00:00 CET"
            ]
        );
        // A fixed time at the hour that repeats: once.
        let s = cron("0 2 * * *", "Europe/Berlin");
        assert_eq!(
            slots(&s, utc(2025, 10, 25, 12, 0, 0), 2),
            ["2025-10-26T00:00:00Z", "2025-10-27T01:00:00Z"]
        );
    }

    #[test]
    fn new_york_spring_forward_and_fall_back() {
        // 2025-03-09 02:00 EST -> 03:00 EDT at 07:00Z.
        let s = cron("30 2 * * *", "America/New_York");
        assert_eq!(
            slots(&s, utc(2025, 3, 8, 12, 0, 0), 3),
            [
                "2025-03-09T07:00:00Z", // 03:00 EDT
                "2025-03-10T06:30:00Z", // 02:30 EDT
                "2025-03-11T06:30:00Z"
            ]
        );
        let s = cron("0 2 * * *", "America/New_York");
        assert_eq!(
            slots(&s, utc(2025, 3, 8, 12, 0, 0), 2),
            ["2025-03-09T07:00:00Z", "2025-03-10T06:00:00Z"]
        );
        // 2025-11-02 02:00 EDT -> 01:00 EST at 06:00Z; 01:00-01:59 twice.
        let s = cron("30 1 * * *", "America/New_York");
        assert_eq!(
            slots(&s, utc(2025, 11, 1, 12, 0, 0), 2),
            ["2025-11-02T05:30:00Z", "2025-11-03T06:30:00Z"]
        );
        let s = cron("*/30 * * * *", "America/New_York");
        assert_eq!(
            local_slots(&s, utc(2025, 11, 2, 4, 15, 0), 6),
            [
                "11-02 00:30:00 EDT",
                "11-02 01:00:00 EDT",
                "11-02 01:30:00 EDT",
                "11-02 01:00:00 EST",
                "11-02 01:30:00 EST",
                "11-02 02:00:00 EST"
            ]
        );
    }

    /// Around every transition: slots strictly increase, and each one is a
    /// matching wall-clock time or the end of a gap.
    #[test]
    fn slots_strictly_increase_across_transitions() {
        for (tz, day) in [
            ("Europe/Berlin", utc(2025, 3, 29, 0, 0, 0)),
            ("Europe/Berlin", utc(2025, 10, 25, 0, 0, 0)),
            ("America/New_York", utc(2025, 3, 8, 0, 0, 0)),
            ("America/New_York", utc(2025, 11, 1, 0, 0, 0)),
            ("Australia/Lord_Howe", utc(2025, 4, 5, 0, 0, 0)), // 30-minute shift
        ] {
            for expr in [
                "*/7 * * * *",
                "0 * * * *",
                "30 1,2 * * *",
                "*/20 * * * * *",
                "15 2 * * *",
            ] {
                let s = cron(expr, tz);
                let mut t = day;
                let end = day + chrono::Duration::days(3);
                let mut n = 0;
                while t < end {
                    let next = s.next_after(t).unwrap();
                    assert!(next > t, "{expr} {tz}: {next} after {t}");
                    t = next;
                    n += 1;
                }
                assert!(n > 0);
            }
        }
    }

    /// `next_after` against a brute-force reading of the documented rules,
    /// minute by minute, two days either side of each transition.
    #[test]
    fn next_after_matches_the_rules_brute_force() {
        use std::collections::BTreeSet;
        for (tz_name, day) in [
            ("Europe/Berlin", utc(2025, 3, 30, 0, 0, 0)),
            ("Europe/Berlin", utc(2025, 10, 26, 0, 0, 0)),
            ("America/New_York", utc(2025, 3, 9, 0, 0, 0)),
            ("America/New_York", utc(2025, 11, 2, 0, 0, 0)),
            ("Australia/Lord_Howe", utc(2025, 4, 5, 12, 0, 0)),
            ("Australia/Lord_Howe", utc(2025, 10, 4, 12, 0, 0)),
            ("Asia/Seoul", utc(2025, 3, 30, 0, 0, 0)),
        ] {
            let tz: Tz = tz_name.parse().unwrap();
            for expr in [
                "*/15 * * * *",
                "0 * * * *",
                "30 2 * * *",
                "0 2 * * *",
                "30 1 * * *",
                "15,45 1-3 * * *",
                "* 2 * * *",
                "5-55/10 * * * *",
                "0 */6 * * *",
                "10 0-4 * * *",
            ] {
                let s = cron(expr, tz_name);
                let Schedule::Cron { pattern, .. } = &s else {
                    unreachable!()
                };
                let from = day - chrono::Duration::days(2);
                let to = day + chrono::Duration::days(2);
                // Instants whose wall clock matches; a repeated wall time
                // counts twice only for interval-like expressions.
                let mut want = BTreeSet::new();
                let mut u = from + chrono::Duration::minutes(1);
                while u <= to {
                    let local = u.with_timezone(&tz).naive_local();
                    let matches = pattern.cron.is_time_matching(&local.and_utc()).unwrap();
                    let earliest = tz.from_local_datetime(&local).earliest().unwrap();
                    if matches && (pattern.interval_like || earliest.with_timezone(&Utc) == u) {
                        want.insert(u);
                    }
                    u += chrono::Duration::minutes(1);
                }
                // Matching wall times in a gap run once at the gap's end.
                let mut n = from.naive_utc() - chrono::Duration::days(1);
                while n <= to.naive_utc() + chrono::Duration::days(1) {
                    if tz.from_local_datetime(&n) == LocalResult::None
                        && pattern.cron.is_time_matching(&n.and_utc()).unwrap()
                    {
                        let end = gap_end(&tz, n).unwrap();
                        if end > from && end <= to {
                            want.insert(end);
                        }
                    }
                    n += chrono::Duration::minutes(1);
                }
                let mut got = BTreeSet::new();
                let mut t = from;
                loop {
                    let next = s.next_after(t).unwrap();
                    if next > to {
                        break;
                    }
                    got.insert(next);
                    t = next;
                }
                let diff: Vec<_> = got.symmetric_difference(&want).collect();
                assert!(
                    diff.is_empty(),
                    "{expr} in {tz_name} around {day}: only in one of got/want: {diff:?}"
                );
            }
        }
    }

    // ---- every --------------------------------------------------------------

    #[test]
    fn every_is_anchored_at_the_epoch() {
        let s = Schedule::every(Duration::from_secs(7)).unwrap();
        for start in [
            utc(2025, 6, 1, 12, 0, 3),
            utc(2025, 6, 1, 12, 0, 5),
            utc(1969, 12, 31, 23, 59, 58),
        ] {
            let mut t = start;
            for _ in 0..5 {
                let next = s.next_after(t).unwrap();
                assert!(next > t);
                assert!(next - t <= chrono::Duration::seconds(7));
                assert_eq!(next.timestamp_millis().rem_euclid(7000), 0, "{next}");
                t = next;
            }
        }
        // Two instances starting at different times agree on the slots.
        let a = slots(&s, utc(2025, 6, 1, 12, 0, 3), 10);
        let b = slots(&s, utc(2025, 6, 1, 12, 0, 12), 10);
        let at = a
            .iter()
            .position(|x| *x == b[0])
            .expect("b starts on a slot of a");
        assert_eq!(a[at..], b[..10 - at]);
        // Slot instants themselves are not "after".
        let slot = s.next_after(utc(2025, 6, 1, 0, 0, 0)).unwrap();
        assert_eq!(
            s.next_after(slot),
            Some(slot + chrono::Duration::seconds(7))
        );
        // 30 s and 6 h land on round times.
        let s = Schedule::every(Duration::from_secs(30)).unwrap();
        assert_eq!(
            s.next_after(utc(2025, 1, 1, 0, 0, 29)),
            Some(utc(2025, 1, 1, 0, 0, 30))
        );
        let s = Schedule::every(Duration::from_secs(6 * 3600)).unwrap();
        assert_eq!(
            s.next_after(utc(2025, 1, 1, 0, 0, 0)),
            Some(utc(2025, 1, 1, 6, 0, 0))
        );
        let s = Schedule::every(Duration::from_millis(1500)).unwrap();
        assert_eq!(
            s.next_after(utc(1970, 1, 1, 0, 0, 1)),
            Some(utc(1970, 1, 1, 0, 0, 1) + chrono::Duration::milliseconds(500))
        );
        assert_eq!(s.to_string(), "every 1500ms");
    }

    // ---- due_slots ----------------------------------------------------------

    #[test]
    fn due_every_second_ten_days_behind_is_arithmetic() {
        let s = Schedule::every(Duration::from_secs(1)).unwrap();
        let now = utc(2025, 1, 11, 0, 0, 0) + chrono::Duration::milliseconds(400);
        let cursor = utc(2025, 1, 1, 0, 0, 0);
        let total = 10 * 86_400u64;
        let whole = utc(2025, 1, 11, 0, 0, 0);

        let due = due_slots(&s, cursor, now, Misfire::All, 100, Duration::ZERO);
        assert_eq!(due.slots.len(), 100);
        assert_eq!(due.slots[0], whole - chrono::Duration::seconds(99));
        assert_eq!(due.slots[99], whole);
        assert!(due.slots.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(due.skipped, total - 100);
        assert_eq!(due.next, Some(whole + chrono::Duration::seconds(1)));
        assert_eq!(due.last_due, Some(whole));

        let due = due_slots(&s, cursor, now, Misfire::Latest, 100, Duration::ZERO);
        assert_eq!(due.slots, [whole]);
        assert_eq!(due.skipped, total - 1);

        let due = due_slots(&s, cursor, now, Misfire::None, 100, Duration::from_secs(3));
        assert_eq!(
            due.slots,
            [
                whole - chrono::Duration::seconds(3),
                whole - chrono::Duration::seconds(2),
                whole - chrono::Duration::seconds(1),
                whole
            ]
            .iter()
            .filter(|s| now - **s <= chrono::Duration::seconds(3))
            .copied()
            .collect::<Vec<_>>()
        );
        assert_eq!(due.slots.len(), 3); // 00:00:00.4 - 3 s = 23:59:57.4
        assert_eq!(due.skipped, total - 3);

        // Caught up: one slot due, none skipped.
        let due = due_slots(
            &s,
            whole - chrono::Duration::seconds(1),
            now,
            Misfire::All,
            100,
            Duration::ZERO,
        );
        assert_eq!(due.slots, [whole]);
        assert_eq!(due.skipped, 0);
    }

    #[test]
    fn due_cron_policies() {
        let s = cron("0 * * * *", "UTC");
        let cursor = utc(2025, 1, 1, 0, 0, 0);
        let now = utc(2025, 1, 1, 5, 5, 0);
        let hour = |h| utc(2025, 1, 1, h, 0, 0);

        let due = due_slots(&s, cursor, now, Misfire::All, 100, Duration::ZERO);
        assert_eq!(due.slots, [hour(1), hour(2), hour(3), hour(4), hour(5)]);
        assert_eq!(due.skipped, 0);
        assert_eq!(due.next, Some(hour(6)));
        assert_eq!(due.last_due, Some(hour(5)));

        let due = due_slots(&s, cursor, now, Misfire::All, 2, Duration::ZERO);
        assert_eq!(due.slots, [hour(4), hour(5)]);
        assert_eq!(due.skipped, 3);

        // max_catch_up 0 still runs the latest slot.
        let due = due_slots(&s, cursor, now, Misfire::All, 0, Duration::ZERO);
        assert_eq!(due.slots, [hour(5)]);
        assert_eq!(due.skipped, 4);

        let due = due_slots(&s, cursor, now, Misfire::Latest, 100, Duration::ZERO);
        assert_eq!(due.slots, [hour(5)]);
        assert_eq!(due.skipped, 4);

        // None: 05:00 is 5 minutes old: runs within a 10-minute grace...
        let grace = Duration::from_secs(600);
        let due = due_slots(&s, cursor, now, Misfire::None, 100, grace);
        assert_eq!(due.slots, [hour(5)]);
        assert_eq!(due.skipped, 4);
        // ...exactly at the grace edge too...
        let due = due_slots(
            &s,
            cursor,
            hour(5) + chrono::Duration::minutes(10),
            Misfire::None,
            100,
            grace,
        );
        assert_eq!(due.slots, [hour(5)]);
        // ...and not after it; the cursor may still move to 05:00.
        let late = hour(5) + chrono::Duration::minutes(10) + chrono::Duration::milliseconds(1);
        let due = due_slots(&s, cursor, late, Misfire::None, 100, grace);
        assert!(due.slots.is_empty());
        assert_eq!(due.skipped, 5);
        assert_eq!(due.last_due, Some(hour(5)));
        assert_eq!(due.next, Some(hour(6)));

        // Nothing due.
        let due = due_slots(&s, hour(5), now, Misfire::All, 100, Duration::ZERO);
        assert_eq!(
            due,
            Due {
                next: Some(hour(6)),
                ..Due::default()
            }
        );
        // A cursor ahead of now (another instance's clock): nothing, and
        // next is after the cursor.
        let due = due_slots(&s, hour(7), now, Misfire::All, 100, Duration::ZERO);
        assert!(due.slots.is_empty());
        assert_eq!(due.next, Some(hour(8)));
        // The slot exactly at now is due.
        let due = due_slots(&s, hour(4), hour(5), Misfire::All, 100, Duration::ZERO);
        assert_eq!(due.slots, [hour(5)]);
    }

    #[test]
    fn due_cron_far_behind_is_bounded() {
        // A daily job down for ~3 years: exact count, last 100 slots.
        let s = cron("0 3 * * *", "Asia/Seoul");
        let cursor = utc(2022, 1, 1, 0, 0, 0);
        let now = utc(2025, 1, 1, 0, 0, 0);
        let due = due_slots(&s, cursor, now, Misfire::All, 100, Duration::ZERO);
        assert_eq!(due.slots.len(), 100);
        assert_eq!(due.skipped + 100, 1096);
        assert_eq!(due.slots[99], utc(2024, 12, 31, 18, 0, 0));
        assert_eq!(due.last_due, Some(utc(2024, 12, 31, 18, 0, 0)));

        // A per-second cron down for 10 days: the tail is exact, skipped
        // is estimated past COUNT_LIMIT, and it is quick.
        let s = cron("* * * * * *", "UTC");
        let cursor = utc(2025, 1, 1, 0, 0, 0);
        let now = utc(2025, 1, 11, 0, 0, 0);
        let started = std::time::Instant::now();
        let due = due_slots(&s, cursor, now, Misfire::All, 100, Duration::ZERO);
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        assert_eq!(due.slots.len(), 100);
        assert_eq!(due.slots[99], now);
        assert_eq!(due.slots[0], now - chrono::Duration::seconds(99));
        let exact = 864_000u64 - 100;
        assert!(
            due.skipped.abs_diff(exact) <= exact / 100,
            "{}",
            due.skipped
        );
        let due = due_slots(&s, cursor, now, Misfire::Latest, 100, Duration::ZERO);
        assert_eq!(due.slots, [now]);
    }

    #[test]
    fn due_cron_across_fall_back_counts_real_quarters() {
        let s = cron("*/15 * * * *", "Europe/Berlin");
        // 23:55Z .. 02:05Z on 2025-10-26: 00:00Z..02:00Z every 15 min = 9.
        let due = due_slots(
            &s,
            utc(2025, 10, 25, 23, 55, 0),
            utc(2025, 10, 26, 2, 5, 0),
            Misfire::All,
            100,
            Duration::ZERO,
        );
        assert_eq!(due.slots.len(), 9);
        assert_eq!(due.slots[0], utc(2025, 10, 26, 0, 0, 0));
        assert_eq!(due.slots[8], utc(2025, 10, 26, 2, 0, 0));
    }

    #[test]
    fn misfire_serde_is_lowercase() {
        #[derive(Deserialize)]
        struct W {
            m: Misfire,
        }
        for (text, want) in [
            ("m = \"latest\"", Misfire::Latest),
            ("m = \"all\"", Misfire::All),
            ("m = \"none\"", Misfire::None),
        ] {
            let w: W = serde_json::from_str(&format!(
                "{{\"m\": {}}}",
                text.split('=').nth(1).unwrap().trim()
            ))
            .unwrap();
            assert_eq!(w.m, want);
            assert_eq!(serde_json::to_string(&want).unwrap(), format!("\"{want}\""));
        }
        assert!(serde_json::from_str::<Misfire>("\"Latest\"").is_err());
        assert_eq!(Misfire::default(), Misfire::Latest);
    }
}
