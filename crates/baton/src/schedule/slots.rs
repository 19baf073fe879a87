//! One slot from outside the loop: a trigger enqueues a job's run for a
//! slot, a report says what became of it (also once pruned), and a
//! skipped slot can be run once, deliberately.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::job::{Job, JobMode};
use super::spec::{due_slots, Misfire, Schedule};
use crate::error::{Error, InvalidInput};
use crate::store::{slot_key, Enqueued, Store, TaskState};

/// Enqueue `job`'s run for `slot` now (an external trigger). Idempotent:
/// the same (job, slot) returns the same task however often it is called,
/// and a slot the scheduler also reaches still runs once. The job's cursor
/// is not moved, so a trigger for a future slot does not hold back the
/// regular schedule.
///
/// `slot` is truncated to the schedule's precision ([`Schedule::truncate`])
/// and must be one of the job's slots ([`Schedule::is_slot`]).
pub async fn trigger(store: &Store, job: &Job, slot: DateTime<Utc>) -> Result<Enqueued, Error> {
    trigger_with(store, job, slot, false).await
}

/// [`trigger`], with `any_slot` to accept an instant that is not one of
/// the job's slots (it is still truncated to the schedule's precision).
pub async fn trigger_with(
    store: &Store,
    job: &Job,
    slot: DateTime<Utc>,
    any_slot: bool,
) -> Result<Enqueued, Error> {
    if let JobMode::Lock { .. } = job.mode {
        return Err(InvalidInput::new(
            format!("job {:?}", job.name),
            "is a lock-mode job; only durable jobs can be triggered",
        )
        .into());
    }
    let slot = trigger_slot(job, slot, any_slot)?;
    let t = job.task(slot, true)?;
    let mut out = store
        .backend()
        .task_insert_many(std::slice::from_ref(&t))
        .await?;
    out.pop().ok_or_else(|| {
        Error::Store(crate::StoreError::Corrupt(
            "enqueue returned nothing".into(),
        ))
    })
}

/// What became of a slot's run: a trigger's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotOutcome {
    /// Waiting to run (just enqueued, or due later, or between retries).
    Pending,
    /// Running now.
    Running,
    /// Ran and succeeded.
    Succeeded,
    /// Ran and failed (out of attempts, or failed for good).
    Failed,
    /// Never ran: the scheduler recorded the slot as skipped (overlap,
    /// misfire, a held lock), with the reason.
    Skipped,
    /// Cancelled (by an operator, or a cancel requested while it ran).
    Cancelled,
}

impl SlotOutcome {
    /// The word used in messages and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotOutcome::Pending => "pending",
            SlotOutcome::Running => "running",
            SlotOutcome::Succeeded => "succeeded",
            SlotOutcome::Failed => "failed",
            SlotOutcome::Skipped => "skipped",
            SlotOutcome::Cancelled => "cancelled",
        }
    }
}

/// A slot's run as a trigger answers it: the task, whether this trigger
/// made it, and what became of it — read from the task, or from the
/// slot's tombstone once pruning deleted the task (DESIGN.md S1: a pruned
/// slot is never run again).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotReport {
    /// The slot's task (its id, also once pruned).
    pub id: i64,
    /// Whether this call enqueued it.
    pub inserted: bool,
    /// What became of the slot.
    pub outcome: SlotOutcome,
    /// Why it was skipped, or its last error.
    pub reason: Option<String>,
    /// When it finished, if it did.
    pub finished_at: Option<DateTime<Utc>>,
    /// True when the task was pruned and this is its tombstone.
    pub pruned: bool,
    /// True when this call ran a skipped slot ([`run_skipped`]).
    pub rerun: bool,
}

/// Whether a cancelled slot task is a skip: never started, with the
/// scheduler's reason (every skip reason starts with "skipped").
fn is_skip(state: TaskState, attempt: u32, reason: Option<&str>) -> bool {
    state == TaskState::Cancelled
        && attempt == 0
        && reason.is_some_and(|r| r.starts_with("skipped"))
}

fn outcome_of(state: TaskState, attempt: u32, reason: Option<&str>) -> SlotOutcome {
    match state {
        TaskState::Pending => SlotOutcome::Pending,
        TaskState::Running => SlotOutcome::Running,
        TaskState::Succeeded => SlotOutcome::Succeeded,
        TaskState::Failed => SlotOutcome::Failed,
        TaskState::Cancelled if is_skip(state, attempt, reason) => SlotOutcome::Skipped,
        TaskState::Cancelled => SlotOutcome::Cancelled,
    }
}

/// A slot's run as its (unpruned) task says: what [`slot_report`]
/// answers for a task it read, and a backfill's dry run for a task it
/// listed.
pub(super) fn report_of(t: crate::store::TaskInfo, inserted: bool) -> SlotReport {
    SlotReport {
        id: t.id,
        inserted,
        outcome: outcome_of(t.state, t.attempt, t.last_error.as_deref()),
        reason: t.last_error,
        finished_at: t.finished_at,
        pruned: false,
        rerun: false,
    }
}

/// What became of `job`'s run for `slot`, whose task is `e` (the answer of
/// [`trigger_with`]).
pub async fn slot_report(
    store: &Store,
    job: &Job,
    slot: DateTime<Utc>,
    e: Enqueued,
) -> Result<SlotReport, Error> {
    let b = store.backend();
    if let Some(t) = b.task_get(e.id).await? {
        return Ok(report_of(t, e.inserted));
    }
    match b.slot_get(&job.slot_key(slot)).await? {
        Some(p) => Ok(SlotReport {
            id: p.task_id,
            inserted: false,
            // A tombstone keeps no attempt count; a skip is never started
            // and keeps its reason.
            outcome: outcome_of(p.state, 0, p.last_error.as_deref()),
            reason: p.last_error,
            finished_at: p.finished_at,
            pruned: true,
            rerun: false,
        }),
        None => Err(Error::Store(crate::StoreError::Corrupt(format!(
            "slot {} of job {:?}: task {} is gone and left no tombstone",
            slot_key(&job.name, slot),
            job.name,
            e.id
        )))),
    }
}

/// Run a slot the scheduler skipped (overlap, misfire), deliberately and
/// once: its skipped task goes back to pending, due now. Any other slot is
/// answered as [`trigger_with`] would (enqueued if it never had a run; a
/// second call finds the run the first one made). A skipped slot whose
/// record was pruned is refused: a pruned slot never runs again.
pub async fn run_skipped(
    store: &Store,
    job: &Job,
    slot: DateTime<Utc>,
    any_slot: bool,
) -> Result<SlotReport, Error> {
    let slot = trigger_slot(job, slot, any_slot)?;
    let e = trigger_with(store, job, slot, any_slot).await?;
    let report = slot_report(store, job, slot, e).await?;
    if report.outcome != SlotOutcome::Skipped {
        return Ok(report);
    }
    if report.pruned {
        return Err(InvalidInput::new(
            "--run-skipped",
            format!(
                "slot {} of job {:?} was skipped ({}) and its record pruned; a pruned slot \
                 is never run again",
                slot_key(&job.name, slot),
                job.name,
                report.reason.as_deref().unwrap_or("no reason kept")
            ),
        )
        .into());
    }
    // Raced by another --run-skipped: the task is no longer cancelled, and
    // the report read again says what it is now.
    let retried = store.backend().task_retry(report.id).await?;
    let mut again = slot_report(store, job, slot, Enqueued::existing(report.id)).await?;
    again.rerun = retried;
    Ok(again)
}

/// The slot a trigger for `slot` stands for: truncated to the schedule's
/// precision, and refused when it is not one of the job's slots (unless
/// `any_slot`).
pub fn trigger_slot(
    job: &Job,
    slot: DateTime<Utc>,
    any_slot: bool,
) -> Result<DateTime<Utc>, InvalidInput> {
    let t = job.schedule.truncate(slot);
    if any_slot || job.schedule.is_slot(t) {
        return Ok(t);
    }
    let text = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let near = job
        .schedule
        .next_after(t)
        .map(|n| format!(" (the next one is {})", text(n)))
        .unwrap_or_default();
    Err(InvalidInput::new(
        "--slot",
        format!(
            "{} is not a slot of job {:?} ({}){near}; give one of its slots, or --any-slot",
            text(slot),
            job.name,
            job.schedule
        ),
    ))
}

/// The latest slot of `schedule` at or before store time `now` (the default
/// slot for a trigger), if any within a year.
pub fn latest_slot(schedule: &Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let from = now - chrono::Duration::days(366);
    due_slots(schedule, from, now, Misfire::Latest, 1, Duration::ZERO)
        .slots
        .last()
        .copied()
}
