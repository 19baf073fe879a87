//! Schedule arithmetic: which instants are a job's slots, and which of them
//! are due. Pure: no IO, no clock (the caller passes the store's `now`).
//!
//! Files: this one (the [`Schedule`] type), `cron.rs` (cron in a time zone:
//! the daylight-saving rules below), `due.rs` (which slots are due: the
//! [`Misfire`] policy and catching up), `tests.rs`.
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

use chrono::{DateTime, TimeZone, Utc};
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

/// One fire time of a schedule, as an operator reads it: the instant, and
/// the wall clock of the schedule's zone (UTC for an interval).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FireTime {
    /// The slot (UTC).
    pub at: DateTime<Utc>,
    /// RFC 3339 with the zone's offset, e.g. `2027-03-14T03:00:00-07:00`.
    pub local: String,
    /// The zone's abbreviation then, e.g. `PDT`, `KST`, `UTC`.
    pub zone: String,
    /// Whether daylight saving time is in effect then.
    pub dst: bool,
}

impl Schedule {
    /// The next `n` slots strictly after `t`, each with its wall clock in
    /// the schedule's zone (what `baton jobs next` prints). A daylight
    /// saving change shows as the offset and abbreviation changing, and
    /// the slots are the scheduler's own under the rules of the module
    /// docs (a wall-clock time a spring-forward skips fires once, at the
    /// first instant after the gap).
    ///
    /// ```
    /// use baton::schedule::spec::Schedule;
    /// use chrono::{TimeZone, Utc};
    ///
    /// let s = Schedule::cron("30 2 * * *", "America/Los_Angeles").unwrap();
    /// let from = Utc.with_ymd_and_hms(2027, 3, 12, 12, 0, 0).unwrap();
    /// let next: Vec<String> = s.next_fires(from, 3).into_iter().map(|f| f.local).collect();
    /// // 2:30 does not exist on 14 March 2027 (clocks go from 2:00 to 3:00):
    /// // that night's run is at 3:00, right after the gap.
    /// assert_eq!(next, ["2027-03-13T02:30:00-08:00", "2027-03-14T03:00:00-07:00", "2027-03-15T02:30:00-07:00"]);
    /// ```
    pub fn next_fires(&self, t: DateTime<Utc>, n: usize) -> Vec<FireTime> {
        use chrono_tz::OffsetComponents;
        let mut out = Vec::with_capacity(n.min(1000));
        let mut at = t;
        while out.len() < n {
            let Some(next) = self.next_after(at) else {
                break;
            };
            let fire = match self {
                Schedule::Cron { tz, .. } => {
                    let local = next.with_timezone(tz);
                    let offset = *local.offset();
                    FireTime {
                        at: next,
                        local: local.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                        zone: offset.to_string(),
                        dst: !offset.dst_offset().is_zero(),
                    }
                }
                Schedule::Every { .. } => FireTime {
                    at: next,
                    local: next.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                    zone: "UTC".into(),
                    dst: false,
                },
            };
            out.push(fire);
            at = next;
        }
        out
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
mod cron;
mod due;
#[cfg(test)]
mod tests;

use cron::{cron_next_after, every_ms, floor_to_second, interval_like, naive_next};
pub use due::{catch_up_window_start, due_slots, Due, Misfire};
