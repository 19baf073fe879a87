//! The slot loop's decisions, made without a store: given a job, the
//! store's now (as this instance estimates it), the cursor and the
//! catch-up in progress, which slots to take next and how (a record of
//! the slots the misfire policy skips, the slots to run, an on-time slot
//! taken within its lead), and when to plan again. The scheduler's
//! `slot_loop` acts on a [`Round`]; the store's compare-and-set stays the
//! judge of every step (DESIGN.md S1), so a stale plan is refused and
//! made again, never acted on.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::job::Job;
use super::spec::{catch_up_window_start, due_slots, Due, Misfire};

/// The catch-up in progress: the line its tasks are drawn after
/// (`JobAdvance::batch_after`) and its latest slot. A plan made after
/// losing a race mid-catch-up may hold only its last slot, which still
/// belongs to the same catch-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CatchUp {
    /// Tasks of slots after this one are not each other's previous run.
    pub batch_after: Option<DateTime<Utc>>,
    /// The catch-up's latest slot.
    pub latest: DateTime<Utc>,
}

/// One slot to take, as the loop asks the store for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    /// The slot the cursor moves to.
    pub slot: DateTime<Utc>,
    /// For the record of slots the misfire policy skipped: the reason
    /// kept on it (the step is then a skip, not a run).
    pub skip: Option<String>,
    /// An on-time slot taken within its lead, before it is due.
    pub early: bool,
    /// The store refuses the take from this instant on, by its clock (only
    /// the latest slot may run, or a slot older than the misfire grace may
    /// not).
    pub until: Option<DateTime<Utc>>,
    /// The store refuses an early take before this instant, by its clock.
    pub not_before: Option<DateTime<Utc>>,
}

/// What one round of the loop takes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// First the record of skipped slots (if any), then the slots to run,
    /// or one early take.
    pub steps: Vec<Step>,
    /// The line the round's tasks are drawn after (`JobAdvance::batch_after`).
    pub batch_after: Option<DateTime<Utc>>,
    /// The catch-up in progress after this round, for the next plan.
    pub catch_up: Option<CatchUp>,
}

/// What to do when the store answered a step "not due" (at store time
/// `now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotDueRetry {
    /// How long to wait before planning again (the loop caps it).
    pub wait: Duration,
    /// Whether the clock estimate must be read again first: it was ahead
    /// of the store's, or the plan went stale.
    pub recalibrate: bool,
}

impl Step {
    /// The answer to the store's "not due" for this step at its clock's
    /// `now`. An early take the store deferred because the previous run is
    /// unfinished (any overlap policy but `allow`; `now` already past `not_before`) is
    /// judged again at the slot, as the rule says. Otherwise the estimate
    /// was ahead or the plan stale: recalibrate and come back when the
    /// store will take it.
    pub fn after_not_due(&self, now: DateTime<Utc>) -> NotDueRetry {
        let (at, recalibrate) = match self.not_before {
            Some(nb) if now >= nb => (self.slot, false),
            nb => (nb.unwrap_or(self.slot), true),
        };
        NotDueRetry {
            wait: (at - now).to_std().unwrap_or(Duration::ZERO),
            recalibrate,
        }
    }
}

/// The planning rules of one job's loop: its schedule and policies, fixed
/// for the loop's life.
#[derive(Debug, Clone)]
pub(crate) struct Planner<'a> {
    job: &'a Job,
    misfire: Misfire,
    /// How long before an on-time slot it is taken (zero: not early).
    lead: chrono::Duration,
    /// Slots at or before this instant are not run (lock mode: its start).
    floor: Option<DateTime<Utc>>,
}

impl<'a> Planner<'a> {
    /// A durable job's planner: its own misfire policy and lead.
    pub fn durable(job: &'a Job) -> Planner<'a> {
        Planner {
            job,
            misfire: job.misfire,
            lead: chrono::Duration::from_std(job.lead).unwrap_or_default(),
            floor: None,
        }
    }

    /// A lock-mode job's planner: like ShedLock, it runs slots from its
    /// start (`floor`) on, no catch-up, only the latest slot when late,
    /// and never early.
    pub fn locked(job: &'a Job, floor: DateTime<Utc>) -> Planner<'a> {
        Planner {
            job,
            misfire: Misfire::Latest,
            lead: chrono::Duration::zero(),
            floor: Some(floor),
        }
    }

    /// The lead for `slot`: the job's, but at most a quarter of the gap to
    /// the next slot, so a fast schedule is never taken more than one slot
    /// ahead.
    pub fn lead_for(&self, slot: DateTime<Utc>) -> chrono::Duration {
        self.job
            .schedule
            .next_after(slot)
            .map_or(self.lead, |n| self.lead.min((n - slot) / 4))
    }

    /// How long an early take waits, at most, before it reads the cursor
    /// (a random part of this, so that N instances' losers learn the
    /// winner's cursor without a compare-and-set).
    pub fn early_spread(&self, slot: DateTime<Utc>) -> Duration {
        (self.lead_for(slot) * 3 / 4).to_std().unwrap_or_default()
    }

    /// The round to take at estimated store time `now` with the cursor
    /// read (`None`: the job never ran) and the catch-up in progress.
    pub fn plan(
        &self,
        cursor: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        catch_up: Option<CatchUp>,
    ) -> Round {
        let job = self.job;
        if job.end_at.is_some_and(|e| now > e) {
            // Ended: nothing more runs.
            return Round {
                steps: Vec::new(),
                batch_after: None,
                catch_up: None,
            };
        }
        let base = cursor.unwrap_or(now);
        let from = self.floor.map_or(base, |f| base.max(f));
        // Slots after `from` are due: a start moves it to just before
        // the start, so a slot at the start runs.
        let from = match job.start_at {
            Some(s) => from.max(s - chrono::Duration::nanoseconds(1)),
            None => from,
        };
        let mut due = due_slots(
            &job.schedule,
            from,
            now,
            self.misfire,
            job.max_catch_up,
            job.misfire_grace,
        );
        let windowed = self.apply_window(&mut due, now);
        // First a record of the slots the policy skips (one cancelled task,
        // at the latest of them, saying how many), then the slots to run.
        let mut steps = Vec::new();
        if due.skipped > 0 {
            if let Some(last) = due.skipped_last {
                steps.push(Step {
                    slot: last,
                    skip: Some(skip_reason(self.misfire, windowed, &due)),
                    early: false,
                    until: None,
                    not_before: None,
                });
            }
        }
        steps.extend(due.slots.iter().map(|&slot| Step {
            slot,
            skip: None,
            early: false,
            until: self.run_until(slot),
            not_before: None,
        }));
        // On time (nothing due): take the next slot within its lead. The
        // store judges it in the same call: not before `slot - lead` by its
        // clock, and under any overlap policy but `allow` an unfinished previous run
        // makes it wait for the slot (`JobAdvance::not_before`).
        if steps.is_empty() && self.lead > chrono::Duration::zero() {
            if let Some(next) = job.schedule.next_after(from).filter(|n| job.in_window(*n)) {
                if next - self.lead_for(next) <= now {
                    steps.push(Step {
                        slot: next,
                        skip: None,
                        early: true,
                        until: self.run_until(next),
                        not_before: Some(next - self.lead_for(next)),
                    });
                }
            }
        }
        // Tasks of one catch-up are not each other's previous run: the
        // window is fixed by the latest due slot, so every instance (whatever
        // cursor it read mid-catch-up) draws the same line. The store also
        // leaves out, by its own clock, tasks created once the slot was due:
        // a slot this plan missed (the clock estimate a little behind the
        // store's) or sees alone (joined mid-catch-up) stays in the batch.
        // A re-plan after another instance moved the cursor mid-catch-up
        // can leave one slot of that catch-up: it keeps the catch-up's line.
        let (batch_after, catch_up) = match (due.slots.len() > 1, due.slots.last()) {
            (true, Some(&latest)) => {
                let after = catch_up_window_start(&job.schedule, latest, job.max_catch_up);
                (
                    after,
                    Some(CatchUp {
                        batch_after: after,
                        latest,
                    }),
                )
            }
            (false, Some(&only)) => match catch_up {
                Some(c) if only <= c.latest => (c.batch_after, Some(c)),
                _ => (None, None),
            },
            _ => (None, catch_up),
        };
        Round {
            steps,
            batch_after,
            catch_up,
        }
    }

    /// Move the due slots older than the job's catch-up window (`now -
    /// window`) to the skipped ones; the window that cut any, for the
    /// record's reason. The skipped slots stay one run: the policy's are
    /// older than every due slot, the window's the oldest due ones.
    fn apply_window(&self, due: &mut Due, now: DateTime<Utc>) -> Option<Duration> {
        let window = self.job.catch_up_window?;
        let edge = now - chrono::Duration::from_std(window).ok()?;
        let cut = due.slots.iter().take_while(|s| **s < edge).count();
        if cut == 0 {
            return None;
        }
        let gone: Vec<_> = due.slots.drain(..cut).collect();
        due.skipped += gone.len() as u64;
        due.skipped_first = due.skipped_first.or(gone.first().copied());
        due.skipped_last = gone.last().copied();
        Some(window)
    }

    /// When the store stops taking a run of `slot`: under misfire `latest`
    /// at the next slot, under `none` once it is older than the grace;
    /// never under `all`.
    fn run_until(&self, slot: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self.misfire {
            Misfire::All => None,
            Misfire::Latest => self.job.schedule.next_after(slot),
            Misfire::None => chrono::Duration::from_std(self.job.misfire_grace)
                .ok()
                .and_then(|g| slot.checked_add_signed(g + chrono::Duration::milliseconds(1))),
        }
    }

    /// When to plan again after a round, at estimated store time `now`
    /// with the cursor it left: the next slot less its lead (a minute on
    /// when the schedule has no next slot).
    pub fn wake_at(&self, cursor: Option<DateTime<Utc>>, now: DateTime<Utc>) -> DateTime<Utc> {
        let idle = now + chrono::Duration::seconds(60);
        let mut after = now.max(cursor.unwrap_or(now));
        if let Some(s) = self.job.start_at {
            after = after.max(s - chrono::Duration::nanoseconds(1));
        }
        match self.job.schedule.next_after(after) {
            // Past the end: look again now and then (nothing will run).
            Some(n) if !self.job.in_window(n) => idle,
            Some(n) => n - self.lead_for(n),
            None => idle,
        }
    }
}

/// The reason kept on the record of slots a misfire policy (or the
/// catch-up `window`) did not run.
fn skip_reason(misfire: Misfire, window: Option<Duration>, due: &Due) -> String {
    let text = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let range = match (due.skipped_first, due.skipped_last) {
        (Some(a), Some(b)) if a != b => format!(" ({} to {})", text(a), text(b)),
        _ => String::new(),
    };
    let by = match window {
        Some(w) => format!(
            "misfire = {misfire} and catch_up_window = {}",
            crate::format_duration(w)
        ),
        None => format!("misfire = {misfire}"),
    };
    format!("skipped by {by}: {} missed slot(s){range}", due.skipped)
}

#[cfg(test)]
mod tests;
