//! Cron in a time zone: the next slot after an instant, with the
//! daylight-saving rules of the module doc (gaps run once after the gap,
//! repeated hours once or twice by the expression's shape).

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use std::time::Duration;

use super::*;

pub(super) fn interval_like(expr: &str) -> bool {
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
pub(super) fn every_ms(interval: Duration) -> Option<i64> {
    let ms = i64::try_from(interval.as_millis()).ok()?;
    (ms > 0).then_some(ms)
}

/// The next wall-clock time (naive) matching the pattern.
pub(super) fn naive_next(
    cron: &croner::Cron,
    n: NaiveDateTime,
    inclusive: bool,
) -> Option<NaiveDateTime> {
    // UTC has no DST, so croner's search on it is a pure wall-clock search.
    cron.find_next_occurrence(&Utc.from_utc_datetime(&n), inclusive)
        .ok()
        .map(|d| d.naive_utc())
}

pub(super) fn offset_secs(tz: &Tz, t: DateTime<Utc>) -> i64 {
    i64::from(
        tz.offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc(),
    )
}

pub(super) fn floor_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
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
pub(super) fn gap_end(tz: &Tz, n: NaiveDateTime) -> Option<DateTime<Utc>> {
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

pub(super) fn cron_next_after(p: &CronPattern, tz: &Tz, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
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
