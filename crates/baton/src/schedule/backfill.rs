//! Backfill: run each of a job's past slots in a time range once — the
//! slots a scheduler never reached (the job did not exist yet, was paused,
//! or its misfire policy or catch-up window passed them by) — and leave
//! the slots that already have a run alone, saying what became of each.
//!
//! Each slot goes through the same idempotent trigger as `baton trigger`
//! (keyed by job and slot, forever), so a backfill may be repeated, may
//! overlap a running scheduler, and two backfills of the same range at
//! once still run every slot once.

use chrono::{DateTime, Utc};

use super::job::{Job, JobMode};
use super::slots::{report_of, run_skipped, slot_report, trigger_with, SlotOutcome, SlotReport};
use crate::error::{Error, InvalidInput};
use crate::store::{Store, TaskFilter};

/// The most slots a backfill covers unless [`Backfill::max`] raises it.
pub const BACKFILL_DEFAULT_MAX: usize = 1_000;

/// The most slots any one backfill may cover.
pub const BACKFILL_LIMIT: usize = 100_000;

/// A backfill's range and options (see [`backfill`]).
///
/// ```
/// use baton::schedule::Backfill;
/// use chrono::{TimeZone, Utc};
///
/// let from = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
/// let to = Utc.with_ymd_and_hms(2026, 1, 2, 0, 0, 0).unwrap();
/// let b = Backfill::new(from, to).max(50).dry_run(true);
/// assert_eq!(b.max, 50);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a Backfill does nothing until passed to schedule::backfill"]
pub struct Backfill {
    /// The first instant of the range (inclusive).
    pub from: DateTime<Utc>,
    /// The last instant of the range (inclusive); not after the store's
    /// now.
    pub to: DateTime<Utc>,
    /// The most slots the range may hold (1 to [`BACKFILL_LIMIT`]); a
    /// range with more is refused whole, nothing enqueued.
    pub max: usize,
    /// Report what a backfill would do, enqueue nothing.
    pub dry_run: bool,
    /// Also run the slots the scheduler skipped (overlap, misfire), once
    /// each, as `baton trigger --run-skipped` does; by default they are
    /// left alone and reported.
    pub run_skipped: bool,
}

impl Backfill {
    /// The slots from `from` to `to` (both inclusive), at most
    /// [`BACKFILL_DEFAULT_MAX`] of them, run for real, skipped slots left
    /// alone.
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>) -> Backfill {
        Backfill {
            from,
            to,
            max: BACKFILL_DEFAULT_MAX,
            dry_run: false,
            run_skipped: false,
        }
    }
    /// The most slots the range may hold.
    pub fn max(mut self, n: usize) -> Backfill {
        self.max = n;
        self
    }
    /// Report only, enqueue nothing.
    pub fn dry_run(mut self, on: bool) -> Backfill {
        self.dry_run = on;
        self
    }
    /// Also run skipped slots, once each.
    pub fn run_skipped(mut self, on: bool) -> Backfill {
        self.run_skipped = on;
        self
    }
}

/// One slot of a backfill and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackfilledSlot {
    /// The slot.
    pub slot: DateTime<Utc>,
    /// Its run as it stands after the backfill: `inserted` when this
    /// backfill enqueued it, `rerun` when it ran a skipped slot. `None`
    /// only in a dry run, for a slot with no run yet (the one a backfill
    /// would enqueue).
    pub run: Option<SlotReport>,
}

impl BackfilledSlot {
    /// Whether this backfill enqueued the slot's run (or, in a dry run,
    /// would): it had none, or it was skipped and `run_skipped` is set.
    pub fn runs_now(&self, b: &Backfill) -> bool {
        match &self.run {
            None => true,
            Some(r) if b.dry_run => b.run_skipped && r.outcome == SlotOutcome::Skipped && !r.pruned,
            Some(r) => r.inserted || r.rerun,
        }
    }
}

/// The slots of `job` in `b`'s range, within the job's start and end, in
/// order; refused (naming the field) when the range is empty or inverted,
/// reaches past `now`, or holds more than `b.max` slots.
pub fn backfill_slots(
    job: &Job,
    b: &Backfill,
    now: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, InvalidInput> {
    let ts = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    if b.max == 0 || b.max > BACKFILL_LIMIT {
        return Err(InvalidInput::new(
            "max",
            format!("{} is out of range; use 1 to {BACKFILL_LIMIT} slots", b.max),
        ));
    }
    if b.from > b.to {
        return Err(InvalidInput::new(
            "from",
            format!("{} is after to ({}); give from ≤ to", ts(b.from), ts(b.to)),
        ));
    }
    if b.to > now {
        return Err(InvalidInput::new(
            "to",
            format!(
                "{} is after the store's now ({}); a backfill runs past slots (a future \
                 slot runs on schedule, or `baton trigger --slot` runs it early)",
                ts(b.to),
                ts(now)
            ),
        ));
    }
    let mut slots = Vec::new();
    let mut t = b.from - chrono::Duration::nanoseconds(1);
    while let Some(s) = job.schedule.next_after(t) {
        if s > b.to {
            break;
        }
        if job.in_window(s) {
            if slots.len() == b.max {
                return Err(InvalidInput::new(
                    "max",
                    format!(
                        "the range {} to {} holds more than {} slots of job {:?} ({}); narrow \
                         the range, or raise max (at most {BACKFILL_LIMIT})",
                        ts(b.from),
                        ts(b.to),
                        b.max,
                        job.name,
                        job.schedule
                    ),
                ));
            }
            slots.push(s);
        }
        t = s;
    }
    Ok(slots)
}

/// Run each of `job`'s slots in `b`'s range once: a slot with no run is
/// enqueued (due now, on the job's queue; the job's cursor is not moved,
/// and a scheduler that reaches the slot later finds its run); a slot that
/// already ran, is pending or running, was cancelled, or whose run was
/// pruned is left alone and reported; a skipped slot is reported, or run
/// once with [`Backfill::run_skipped`]. The runs start as the queue's
/// concurrency allows (the job's overlap rule is the scheduler's, not
/// applied here). Only durable jobs can be backfilled.
///
/// With [`Backfill::dry_run`] nothing is written: each slot's existing run
/// is read (`run: None` for those a backfill would enqueue).
pub async fn backfill(
    store: &Store,
    job: &Job,
    b: &Backfill,
) -> Result<Vec<BackfilledSlot>, Error> {
    if let JobMode::Lock { .. } = job.mode {
        return Err(InvalidInput::new(
            format!("job {:?}", job.name),
            "is a lock-mode job; only durable jobs can be backfilled",
        )
        .into());
    }
    let now = store.now().await?;
    let slots = backfill_slots(job, b, now)?;
    let mut out = Vec::with_capacity(slots.len());
    if b.dry_run {
        let existing = existing_runs(store, job, b).await?;
        for slot in slots {
            let run = match existing.iter().find(|(s, _)| *s == slot) {
                Some((_, r)) => Some(r.clone()),
                None => pruned_run(store, job, slot).await?,
            };
            out.push(BackfilledSlot { slot, run });
        }
        return Ok(out);
    }
    for slot in slots {
        let run = if b.run_skipped {
            run_skipped(store, job, slot, false).await?
        } else {
            let e = trigger_with(store, job, slot, false).await?;
            slot_report(store, job, slot, e).await?
        };
        out.push(BackfilledSlot {
            slot,
            run: Some(run),
        });
    }
    Ok(out)
}

/// The runs of `job`'s slots in `b`'s range that still have their task.
async fn existing_runs(
    store: &Store,
    job: &Job,
    b: &Backfill,
) -> Result<Vec<(DateTime<Utc>, SlotReport)>, Error> {
    let tasks = crate::queue::Queue::new(store.clone())
        .tasks_all(&TaskFilter {
            job: Some(job.name.clone()),
            ..TaskFilter::default()
        })
        .await?;
    let mut found = Vec::new();
    for t in tasks {
        let Some(slot) = t.slot else { continue };
        if slot < b.from || slot > b.to {
            continue;
        }
        // The listing is the task: no second read per slot.
        found.push((slot, report_of(t, false)));
    }
    Ok(found)
}

/// A slot's run known only by its tombstone (its task was pruned).
async fn pruned_run(
    store: &Store,
    job: &Job,
    slot: DateTime<Utc>,
) -> Result<Option<SlotReport>, Error> {
    let Some(p) = store.backend().slot_get(&job.slot_key(slot)).await? else {
        return Ok(None);
    };
    let e = crate::store::Enqueued::existing(p.task_id);
    Ok(Some(slot_report(store, job, slot, e).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use chrono::TimeZone;
    use std::time::Duration;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, h, m, 0).unwrap()
    }

    fn every_10m() -> Job {
        Job::new("j", Schedule::every(Duration::from_secs(600)).unwrap())
    }

    #[test]
    fn slots_are_the_schedules_in_the_range_both_ends_included() {
        let b = Backfill::new(at(1, 0), at(2, 0));
        let s = backfill_slots(&every_10m(), &b, at(3, 0)).unwrap();
        assert_eq!(s.len(), 7);
        assert_eq!(s.first(), Some(&at(1, 0)));
        assert_eq!(s.last(), Some(&at(2, 0)));
        let b = Backfill::new(at(1, 1), at(1, 19));
        assert_eq!(
            backfill_slots(&every_10m(), &b, at(3, 0)).unwrap(),
            vec![at(1, 10)]
        );
    }

    #[test]
    fn the_jobs_start_and_end_bound_the_slots() {
        let job = every_10m().starts_at(at(1, 25)).ends_at(at(1, 45));
        let b = Backfill::new(at(1, 0), at(2, 0));
        assert_eq!(
            backfill_slots(&job, &b, at(3, 0)).unwrap(),
            vec![at(1, 30), at(1, 40)]
        );
    }

    #[test]
    fn bad_ranges_are_refused_naming_the_field() {
        let job = every_10m();
        let field = |b: Backfill| backfill_slots(&job, &b, at(3, 0)).unwrap_err().field;
        assert_eq!(field(Backfill::new(at(2, 0), at(1, 0))), "from");
        assert_eq!(field(Backfill::new(at(1, 0), at(4, 0))), "to");
        assert_eq!(field(Backfill::new(at(1, 0), at(2, 0)).max(0)), "max");
        assert_eq!(
            field(Backfill::new(at(1, 0), at(2, 0)).max(BACKFILL_LIMIT + 1)),
            "max"
        );
        // Seven slots, a cap of six: refused whole.
        let e =
            backfill_slots(&job, &Backfill::new(at(1, 0), at(2, 0)).max(6), at(3, 0)).unwrap_err();
        assert_eq!(e.field, "max");
        assert!(e.problem.contains("more than 6 slots"), "{}", e.problem);
        assert!(backfill_slots(&job, &Backfill::new(at(1, 0), at(2, 0)).max(7), at(3, 0)).is_ok());
    }
}
