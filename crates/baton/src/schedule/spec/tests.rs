use super::cron::gap_end;
use super::*;
use chrono::LocalResult;

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
