//! The slot loop's planning rules, without a store: catch-up, misfire,
//! the lead of on-time slots, lock mode, and the answer to "not due".

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

use super::*;
use crate::schedule::spec::Schedule;

/// 2026-03-01 00:00:00 UTC plus `secs` seconds.
fn at(secs: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + chrono::Duration::seconds(secs)
}

fn ms(n: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(n)
}

fn every_minute(misfire: Misfire) -> Job {
    Job::new("report", Schedule::every(Duration::from_secs(60)).unwrap()).misfire(misfire)
}

fn run(slot: DateTime<Utc>, until: Option<DateTime<Utc>>) -> Step {
    Step {
        slot,
        skip: None,
        early: false,
        until,
        not_before: None,
    }
}

#[test]
fn catch_up_runs_every_missed_slot_oldest_first_in_one_batch() {
    let job = every_minute(Misfire::All);
    let round = Planner::durable(&job).plan(Some(at(0)), at(190), None);
    assert_eq!(
        round.steps,
        vec![run(at(60), None), run(at(120), None), run(at(180), None)]
    );
    // The line is the catch-up window's start (the latest slot less
    // max_catch_up slots), the same for every instance.
    let line = at(180) - chrono::Duration::minutes(100);
    assert_eq!(round.batch_after, Some(line));
    assert_eq!(
        round.catch_up,
        Some(CatchUp {
            batch_after: Some(line),
            latest: at(180)
        })
    );
}

#[test]
fn catch_up_keeps_at_most_max_catch_up_and_records_the_rest_skipped() {
    let mut job = every_minute(Misfire::All);
    job.max_catch_up = 2;
    let round = Planner::durable(&job).plan(Some(at(0)), at(300), None);
    let slots: Vec<_> = round.steps.iter().map(|s| s.slot).collect();
    assert_eq!(slots, vec![at(180), at(240), at(300)]);
    let reason = round.steps[0].skip.as_deref().unwrap();
    assert!(
        reason.starts_with("skipped by misfire = all: 3 missed slot(s)"),
        "{reason}"
    );
    assert!(round.steps[1..].iter().all(|s| s.skip.is_none()));
}

#[test]
fn a_replan_mid_catch_up_keeps_the_catch_ups_line_and_a_later_slot_drops_it() {
    let job = every_minute(Misfire::All);
    let planner = Planner::durable(&job);
    let first = planner.plan(Some(at(0)), at(190), None);
    // Another instance moved the cursor to the second slot: one slot of
    // the same catch-up is left, and it keeps the catch-up's line.
    let replan = planner.plan(Some(at(120)), at(190), first.catch_up);
    assert_eq!(replan.steps, vec![run(at(180), None)]);
    assert_eq!(replan.batch_after, first.batch_after);
    assert_eq!(replan.catch_up, first.catch_up);
    // The next slot after the catch-up is no part of it.
    let later = planner.plan(Some(at(180)), at(245), replan.catch_up);
    assert_eq!(later.steps, vec![run(at(240), None)]);
    assert_eq!(later.batch_after, None);
    assert_eq!(later.catch_up, None);
}

#[test]
fn misfire_latest_records_the_missed_slots_then_runs_the_latest_until_the_next() {
    let job = every_minute(Misfire::Latest);
    let round = Planner::durable(&job).plan(Some(at(0)), at(190), None);
    assert_eq!(round.steps.len(), 2, "{:?}", round.steps);
    let skip = &round.steps[0];
    assert_eq!(skip.slot, at(120));
    assert_eq!(
        skip.skip.as_deref(),
        Some(
            "skipped by misfire = latest: 2 missed slot(s) \
             (2026-03-01T00:01:00Z to 2026-03-01T00:02:00Z)"
        )
    );
    assert_eq!(skip.until, None, "a skip record is taken whenever it comes");
    // Only the latest slot runs, and the store refuses it once the next
    // slot came (the plan went stale).
    assert_eq!(round.steps[1], run(at(180), Some(at(240))));
    assert_eq!(round.batch_after, None);
}

#[test]
fn misfire_none_runs_only_a_slot_within_its_grace() {
    let mut job = every_minute(Misfire::None);
    job.misfire_grace = Duration::from_secs(30);
    let planner = Planner::durable(&job);
    let round = planner.plan(Some(at(0)), at(190), None);
    assert_eq!(round.steps[0].slot, at(120));
    assert!(round.steps[0].skip.is_some());
    assert_eq!(round.steps[1], run(at(180), Some(at(210) + ms(1))));
    // 40 s late: past the grace, every missed slot is only recorded.
    let late = planner.plan(Some(at(0)), at(220), None);
    assert_eq!(late.steps.len(), 1);
    assert_eq!(late.steps[0].slot, at(180));
    assert!(late.steps[0]
        .skip
        .as_deref()
        .is_some_and(|r| r.starts_with("skipped by misfire = none: 3 missed slot(s)")));
}

#[test]
fn an_on_time_slot_is_taken_early_within_its_lead_and_not_before() {
    let job = every_minute(Misfire::Latest); // lead: DEFAULT_LEAD, 150 ms
    let planner = Planner::durable(&job);
    // 100 ms before the slot: inside the lead.
    let round = planner.plan(Some(at(60)), at(120) - ms(100), None);
    assert_eq!(
        round.steps,
        vec![Step {
            slot: at(120),
            skip: None,
            early: true,
            until: Some(at(180)),
            not_before: Some(at(120) - ms(150)),
        }]
    );
    // 200 ms before: nothing yet; plan again when the lead begins.
    let round = planner.plan(Some(at(60)), at(120) - ms(200), None);
    assert!(round.steps.is_empty());
    assert_eq!(
        planner.wake_at(Some(at(60)), at(120) - ms(200)),
        at(120) - ms(150)
    );
}

#[test]
fn the_lead_is_at_most_a_quarter_of_the_gap_to_the_next_slot() {
    let job = Job::new("fast", Schedule::every(Duration::from_millis(200)).unwrap());
    let planner = Planner::durable(&job);
    let slot = DateTime::from_timestamp_millis(1_000_000).unwrap();
    assert_eq!(planner.lead_for(slot), ms(50));
    assert_eq!(planner.early_spread(slot), Duration::from_micros(37_500));
    let minute = every_minute(Misfire::Latest);
    assert_eq!(Planner::durable(&minute).lead_for(at(60)), ms(150));
}

#[test]
fn lock_mode_runs_from_its_start_never_catches_up_and_is_never_early() {
    let job = every_minute(Misfire::All);
    let start = at(150);
    let planner = Planner::locked(&job, start);
    // The job never ran: slots before the loop's start are not its to run.
    assert!(planner.plan(None, start + ms(10), None).steps.is_empty());
    // 100 ms before the next slot: no lead in lock mode.
    assert!(planner.plan(None, at(180) - ms(100), None).steps.is_empty());
    assert_eq!(planner.wake_at(None, at(180) - ms(100)), at(180));
    // Late by three slots (whatever the job's own policy): only the latest
    // runs, the others are recorded skipped.
    let round = planner.plan(Some(at(180)), at(370), None);
    assert_eq!(round.steps.len(), 2);
    assert!(round.steps[0].skip.is_some());
    assert_eq!(round.steps[1], run(at(360), Some(at(420))));
}

#[test]
fn overlap_forbid_defers_an_early_take_to_the_slot_without_recalibrating() {
    let step = Step {
        slot: at(120),
        skip: None,
        early: true,
        until: Some(at(180)),
        not_before: Some(at(120) - ms(150)),
    };
    // The store's clock passed `not_before` and still said "not due": the
    // previous run is unfinished, judged at the slot.
    assert_eq!(
        step.after_not_due(at(120) - ms(100)),
        NotDueRetry {
            wait: Duration::from_millis(100),
            recalibrate: false
        }
    );
    // The store's clock is behind `not_before`: our estimate was ahead.
    assert_eq!(
        step.after_not_due(at(120) - ms(400)),
        NotDueRetry {
            wait: Duration::from_millis(250),
            recalibrate: true
        }
    );
    // A due-only take refused: the estimate was ahead of the store's clock.
    assert_eq!(
        run(at(120), None).after_not_due(at(120) - ms(30)),
        NotDueRetry {
            wait: Duration::from_millis(30),
            recalibrate: true
        }
    );
}

/// A job with a start runs nothing before it (not even as catch-up) and
/// its slot at the start; one with an end runs nothing once the store's
/// clock is past it, and takes no early slot beyond it.
#[test]
fn start_and_end_bound_the_slots_that_run() {
    let job = every_minute(Misfire::All).starts_at(at(120));
    let p = Planner::durable(&job);
    // Before the start: nothing, and the next plan at the start's slot.
    let round = p.plan(Some(at(0)), at(90), None);
    assert!(round.steps.iter().all(|s| s.slot >= at(120)), "{round:?}");
    assert!(round.steps.iter().all(|s| s.early), "{round:?}");
    assert_eq!(
        p.wake_at(Some(at(0)), at(30)),
        at(120) - p.lead_for(at(120))
    );
    // Down from 0 to 250 with misfire = all: slots 120, 180, 240 only.
    let round = p.plan(Some(at(0)), at(250), None);
    let slots: Vec<_> = round.steps.iter().map(|s| s.slot).collect();
    assert_eq!(slots, [at(120), at(180), at(240)]);
    assert!(round.steps.iter().all(|s| s.skip.is_none()));

    let job = every_minute(Misfire::Latest).ends_at(at(180));
    let p = Planner::durable(&job);
    let round = p.plan(Some(at(120)), at(180), None);
    assert_eq!(round.steps, vec![run(at(180), Some(at(240)))]);
    // Within the lead of 240, beyond the end: no early take.
    let round = p.plan(Some(at(180)), at(240) - ms(50), None);
    assert!(round.steps.is_empty(), "{round:?}");
    // Past the end: nothing, even the slots missed before it.
    let round = p.plan(Some(at(0)), at(181), None);
    assert!(round.steps.is_empty(), "{round:?}");
    assert_eq!(
        p.wake_at(Some(at(180)), at(181)),
        at(181) + chrono::Duration::seconds(60)
    );
}

#[test]
fn an_end_not_after_the_start_is_refused_naming_end_at() {
    let job = every_minute(Misfire::Latest)
        .starts_at(at(120))
        .ends_at(at(120));
    let e = job.validate().unwrap_err();
    assert!(e.field.ends_with("end_at"), "{e}");
}
