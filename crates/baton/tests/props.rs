//! Property tests of the parsers on stable Rust (proptest): durations,
//! cron and fixed-rate schedules, and store URLs. None may panic on any
//! input; a duration reads back what it formats; a valid schedule's next
//! slot is after the given time, on the schedule, the first one, and
//! monotonic in the time; bad input is an error naming its field.
//!
//! CI runs 256 cases per property (proptest's default). A long run:
//! `PROPTEST_CASES=100000 cargo test -p baton --test props`.

use std::time::Duration;

use baton::schedule::spec::Schedule;
use chrono::{DateTime, Datelike, TimeZone, Timelike, Utc};
use proptest::prelude::*;

/// Any text, biased towards the characters the parsers look at.
fn texty() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        proptest::collection::vec(
            prop_oneof![
                Just('0'),
                Just('1'),
                Just('5'),
                Just('9'),
                Just('.'),
                Just('-'),
                Just(' '),
                Just('*'),
                Just('/'),
                Just(','),
                Just('?'),
                Just('@'),
                Just(':'),
                Just('P'),
                Just('T'),
                Just('H'),
                Just('M'),
                Just('S'),
                Just('D'),
                Just('W'),
                Just('m'),
                Just('s'),
                Just('h'),
                Just('d'),
                Just('L'),
                Just('#'),
                any::<char>(),
            ],
            0..24
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

/// Times from 1970 to 2100, at millisecond precision.
fn time() -> impl Strategy<Value = DateTime<Utc>> {
    (0i64..4_102_444_800_000).prop_map(|ms| DateTime::from_timestamp_millis(ms).unwrap())
}

proptest! {
    // --- durations ---

    #[test]
    fn duration_parse_never_panics(s in texty()) {
        match baton::parse_duration("field", &s) {
            Ok(d) => prop_assert!(d.as_millis() <= 1_000_000_000_000_000u128 * 1000),
            Err(e) => {
                prop_assert_eq!(e.field, "field");
                prop_assert!(e.problem.contains("PT15M"), "{}", e.problem);
            }
        }
    }

    #[test]
    fn duration_format_reads_back(ms in 0u64..=10 * 365 * 86_400_000) {
        let d = Duration::from_millis(ms);
        let text = baton::format_duration(d);
        prop_assert_eq!(baton::parse_duration("d", &text).unwrap(), d, "{}", text);
    }

    #[test]
    fn duration_human_sums_its_parts(
        d in 0u64..1000, h in 0u64..1000, m in 0u64..1000, s in 0u64..1000, ms in 0u64..1000
    ) {
        let text = format!("{d}d{h}h{m}m{s}s{ms}ms");
        let want = (((d * 24 + h) * 60 + m) * 60 + s) * 1000 + ms;
        prop_assert_eq!(baton::parse_duration("d", &text).unwrap(), Duration::from_millis(want));
        let iso = format!("P{d}DT{h}H{m}M{s}S");
        prop_assert_eq!(
            baton::parse_duration("d", &iso).unwrap(),
            Duration::from_millis(want - ms)
        );
    }

    #[test]
    fn negative_durations_are_refused(n in 1u64..1_000_000, unit in prop::sample::select(vec!["ms", "s", "m", "h", "d"])) {
        let text = format!("-{}{}", n, unit);
        prop_assert!(baton::parse_duration("d", &text).is_err(), "{}", text);
    }

    // --- cron ---

    #[test]
    fn cron_parse_never_panics(s in texty(), tz in prop::option::of(texty())) {
        match Schedule::cron(&s, tz.as_deref()) {
            Ok(sched) => {
                // A pattern that parsed matches some date (it was probed).
                let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
                prop_assert!(sched.next_after(t).is_some(), "{s:?}");
            }
            Err(e) => prop_assert!(e.field == "cron" || e.field == "tz", "{}", e.field),
        }
    }

    #[test]
    fn cron_fields_out_of_range_are_refused(field in 0usize..5, over in 0u32..200) {
        // Each field's first value out of range, or a larger one.
        let value = [60u32, 24, 32, 13, 8][field] + over;
        let mut parts = vec!["*".to_string(); 5];
        parts[field] = value.to_string();
        let expr = parts.join(" ");
        let e = Schedule::cron(&expr, None).unwrap_err();
        prop_assert_eq!(e.field, "cron");
        prop_assert!(e.problem.contains("5 fields"), "{}", e.problem);
    }

    #[test]
    fn cron_next_is_the_first_slot_on_the_schedule(
        minutes in prop::collection::btree_set(0u32..60, 1..4),
        hours in prop::option::of(prop::collection::btree_set(0u32..24, 1..4)),
        weekday in prop::option::of(0u32..7),
        t in time(),
    ) {
        let list = |s: &std::collections::BTreeSet<u32>| {
            s.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        };
        let expr = format!(
            "{} {} * * {}",
            list(&minutes),
            hours.as_ref().map_or("*".to_string(), list),
            weekday.map_or("*".to_string(), |w| w.to_string()),
        );
        let sched = Schedule::cron(&expr, None).unwrap();
        let matches = |x: DateTime<Utc>| {
            x.second() == 0
                && x.nanosecond() == 0
                && minutes.contains(&x.minute())
                && hours.as_ref().is_none_or(|h| h.contains(&x.hour()))
                && weekday.is_none_or(|w| x.weekday().num_days_from_sunday() == w)
        };
        let next = sched.next_after(t).unwrap();
        prop_assert!(next > t, "{expr}: {next} not after {t}");
        prop_assert!(matches(next), "{expr}: {next} is off the schedule");
        prop_assert!(sched.is_slot(next), "{expr}: {next}");
        // No slot in between: every whole minute in (t, next) misses.
        let mut m = t
            .with_second(0)
            .unwrap()
            .with_nanosecond(0)
            .unwrap()
            + chrono::Duration::minutes(1);
        while m < next {
            prop_assert!(!matches(m), "{expr}: {m} was skipped before {next}");
            m += chrono::Duration::minutes(1);
        }
        // Monotonic: a later time never has an earlier next slot.
        let later = t + chrono::Duration::seconds(97);
        prop_assert!(sched.next_after(later).unwrap() >= next);
        // The slot after a slot is the next one, strictly later.
        prop_assert!(sched.next_after(next).unwrap() > next);
    }

    #[test]
    fn cron_in_a_zone_is_monotonic(
        t in time(),
        step in 1i64..200_000,
        zone in prop::sample::select(vec!["Europe/Berlin", "America/New_York", "Asia/Seoul", "Australia/Lord_Howe"]),
        expr in prop::sample::select(vec!["30 2 * * *", "0 */6 * * *", "*/15 * * * *", "0 0 1 * *", "0 9 * * MON-FRI"]),
    ) {
        let sched = Schedule::cron(expr, Some(zone)).unwrap();
        let a = sched.next_after(t).unwrap();
        let b = sched.next_after(t + chrono::Duration::seconds(step)).unwrap();
        prop_assert!(a > t);
        prop_assert!(b >= a, "{expr} in {zone}: next({t}) = {a}, but a later time gives {b}");
        prop_assert!(sched.is_slot(a));
    }

    // --- fixed rate ---

    #[test]
    fn every_next_is_the_next_multiple(ms in 100u64..=86_400_000 * 7, t in time()) {
        let sched = Schedule::every(Duration::from_millis(ms)).unwrap();
        let next = sched.next_after(t).unwrap();
        prop_assert!(next > t);
        prop_assert!((next - t).num_milliseconds() as u64 <= ms);
        prop_assert_eq!(next.timestamp_millis() % ms as i64, 0);
        prop_assert!(sched.is_slot(next));
    }

    #[test]
    fn every_below_100ms_is_refused(ms in 0u64..100) {
        let e = Schedule::every(Duration::from_millis(ms)).unwrap_err();
        prop_assert_eq!(e.field, "every");
        prop_assert!(e.problem.contains("at least 100ms"), "{}", e.problem);
    }

    // --- store URLs ---

    #[test]
    fn redact_hides_the_password(
        scheme in prop::sample::select(vec!["postgres", "mysql", "redis", "rediss"]),
        user in "[a-z]{1,8}",
        password in "[A-Za-z0-9]{6,16}",
        host in "[a-z0-9.]{1,20}",
        rest in texty(),
    ) {
        let url = format!("{scheme}://{user}:{password}@{host}/{rest}");
        let shown = baton::store::redact(&url);
        prop_assert!(!shown.contains(&format!(":{password}@")), "{shown}");
        prop_assert!(shown.starts_with(&format!("{scheme}://{user}:***@")), "{shown}");
    }

    #[test]
    fn redact_never_panics(s in texty()) {
        let _ = baton::store::redact(&s);
    }
}

/// A store URL of an unknown scheme (or none) is a configuration error
/// naming the accepted schemes, without touching the network.
#[test]
fn unknown_schemes_are_config_errors() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cases = if let Ok(n) = std::env::var("PROPTEST_CASES") {
        n.parse().unwrap_or(256)
    } else {
        256
    };
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        ..Default::default()
    });
    let strat = (
        "[a-z][a-z0-9+.-]{0,10}".prop_filter("a known scheme", |s| {
            !matches!(
                s.as_str(),
                "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb" | "redis" | "rediss"
            ) && !s.starts_with("sqlite")
        }),
        texty(),
    );
    runner
        .run(&strat, |(scheme, rest)| {
            let url = format!("{scheme}://{rest}");
            let res = rt.block_on(baton::Store::connect_with(&url, Default::default()));
            match res {
                Err(baton::StoreError::Config(m)) => {
                    prop_assert!(m.contains("unknown scheme"), "{m}");
                    prop_assert!(m.contains("sqlite://PATH"), "{m}");
                }
                Err(e) => prop_assert!(false, "{url:?}: not a config error: {e}"),
                Ok(_) => prop_assert!(false, "{url:?} connected"),
            }
            Ok(())
        })
        .unwrap();
}
