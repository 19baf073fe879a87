//! `job_advance` and `task_cancel` decided once, over a small per-backend
//! transaction trait each ([`SlotTx`], [`CancelTx`]): the decisions are
//! here, the SQL in each backend's own files. Redis runs the same decisions
//! in one Lua script each (`redis/lua/job_advance.lua`, `cancel.lua`),
//! since a script is atomic where a SQL backend needs a transaction with
//! row locks; those scripts mirror [`job_advance`] and [`task_cancel`] step
//! for step.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::jobdefs::DefinitionMark;
use super::state::{self, Facts, Op, Target};
use super::{
    waiting_run_at, Advanced, CancelOutcome, Enqueued, JobAdvance, NewTask, Overlap, RunAt,
    SlotRecord, TaskState, OVERLAP_BUFFER_FULL, OVERLAP_REPLACED, OVERLAP_SKIPPED,
};
use crate::error::StoreError;

/// The job's row as the advance reads it, locked until the transaction
/// ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobRow {
    /// The job is paused.
    pub paused: bool,
    /// The cursor is the advance's `expected`.
    pub cursor_matches: bool,
    /// The cursor.
    pub last_slot: Option<DateTime<Utc>>,
    /// The store's clock.
    pub now: DateTime<Utc>,
}

/// An unfinished run of the job as the overlap rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreviousRun {
    /// The task.
    pub id: i64,
    /// `pending` or `running`.
    pub state: TaskState,
    /// Pending and waiting for an earlier run (`run_at` at
    /// [`super::WAITING_RUN_AT_MS`]).
    pub waiting: bool,
}

/// How the slot's task comes into the store: the births of
/// [`state::TRANSITIONS`] that `job_advance` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Birth<'a> {
    /// `pending`, like any enqueued task ([`Op::Insert`]).
    Pending,
    /// `pending` with `run_at` at [`super::WAITING_RUN_AT_MS`]: waiting for
    /// the job's previous run ([`Op::Insert`]; the task given to
    /// [`SlotTx::insert`] carries that `run_at` already).
    Waiting,
    /// `cancelled` with this reason kept in `last_error` and `finished_at`
    /// now: a skipped slot ([`Op::AdvanceSkip`]).
    Cancelled {
        /// Why the slot is skipped.
        reason: &'a str,
    },
    /// `running`, attempt 1, claim token [`super::RUN_RECORD_TOKEN`],
    /// leased to `worker` for `lease` ([`Op::AdvanceRun`]).
    Running {
        /// The worker recorded on the task.
        worker: &'a str,
        /// The lease from the store's now.
        lease: Duration,
    },
}

/// One backend's side of `job_advance`: one transaction, which ends with
/// [`SlotTx::commit`] or (dropped, or [`SlotTx::rollback`]) rolls back.
#[async_trait]
pub(crate) trait SlotTx: CancelTx {
    /// Lock the job's row and read it; `None` when there is no such job.
    async fn job_row(&mut self, adv: &JobAdvance<'_>) -> Result<Option<JobRow>, StoreError>;
    /// The job's definition row in the store, if it has one (read only
    /// when the advance gives its `source`).
    async fn definition(&mut self, job: &str) -> Result<Option<DefinitionMark>, StoreError>;
    /// The job's unfinished previous runs, by id (the overlap rule, with
    /// `adv.batch_after` and the task's creation before the slot: see
    /// [`JobAdvance::batch_after`]); at most 100.
    async fn previous_runs(&mut self, adv: &JobAdvance<'_>)
        -> Result<Vec<PreviousRun>, StoreError>;
    /// Make the waiting task `id` due now (`run_at` = the store's now) and
    /// wake its queue after the commit ([`job_release`]).
    async fn release(&mut self, id: i64) -> Result<(), StoreError>;
    /// Move the job's cursor to `adv.slot`.
    async fn set_cursor(&mut self, adv: &JobAdvance<'_>) -> Result<(), StoreError>;
    /// Insert the slot's task born as `birth` (a taken key or a tombstoned
    /// slot: the holder's id, `inserted = false`, nothing written).
    async fn insert(&mut self, task: &NewTask, birth: Birth<'_>) -> Result<Enqueued, StoreError>;
    /// Commit; then, with `announce`, wake the workers for the task
    /// inserted (as an enqueue does).
    async fn commit(self, announce: bool) -> Result<(), StoreError>;
    /// Roll back (nothing was written).
    async fn rollback(self) -> Result<(), StoreError>;
}

/// `job_advance` on a backend's [`SlotTx`]: the one decision of which
/// slot is taken and how it is recorded (docs/STORE.md, "Schedules").
pub(crate) async fn job_advance<T: SlotTx>(
    mut tx: T,
    adv: &JobAdvance<'_>,
) -> Result<Advanced, StoreError> {
    let Some(row) = tx.job_row(adv).await? else {
        SlotTx::rollback(tx).await?;
        return Ok(Advanced::UnknownJob);
    };
    if row.paused {
        SlotTx::rollback(tx).await?;
        return Ok(Advanced::Paused);
    }
    if !row.cursor_matches {
        SlotTx::rollback(tx).await?;
        return Ok(Advanced::Moved(row.last_slot));
    }
    let now = row.now;
    if adv.refused_at(now) {
        SlotTx::rollback(tx).await?;
        return Ok(Advanced::NotDue { now });
    }
    if let Some(source) = adv.source {
        // Read under the job row's lock: a definition written after this
        // read is written after the advance's store time, so it governs
        // only slots after this one's lead (DESIGN.md D2).
        if source.superseded(tx.definition(adv.job).await?, adv.slot) {
            SlotTx::rollback(tx).await?;
            return Ok(Advanced::Superseded);
        }
    }
    let mut previous = if adv.checks_overlap() {
        tx.previous_runs(adv).await?
    } else {
        Vec::new()
    };
    if adv.overlap.replaces() {
        // The runs to stop, each row locked and its state read again: a
        // pending one claimed since the read above is running now, and
        // must be waited for rather than cancelled as pending.
        let mut locked = Vec::with_capacity(previous.len());
        for p in previous {
            if let Some(state @ (TaskState::Pending | TaskState::Running)) = tx.state(p.id).await? {
                locked.push(PreviousRun { state, ..p });
            }
        }
        previous = locked;
    }
    let busy = !previous.is_empty();
    if busy && adv.early_at(now) {
        // Early, and the previous run is unfinished: judge the overlap
        // rule at the slot, not before it.
        SlotTx::rollback(tx).await?;
        return Ok(Advanced::NotDue { now });
    }
    tx.set_cursor(adv).await?;
    let Some(task) = adv.task else {
        SlotTx::commit(tx, false).await?;
        return Ok(Advanced::Enqueued(Enqueued::existing(0)));
    };
    let birth = match adv.record {
        SlotRecord::Skip { reason } => Birth::Cancelled { reason },
        _ if busy => overlap_birth(adv.overlap, &previous),
        SlotRecord::Run { worker, lease } => Birth::Running { worker, lease },
        SlotRecord::Enqueue => Birth::Pending,
    };
    let waiting_task;
    let task = if birth == Birth::Waiting {
        waiting_task = NewTask {
            run_at: RunAt::At(waiting_run_at()),
            ..task.clone()
        };
        &waiting_task
    } else {
        task
    };
    let e = tx.insert(task, birth).await?;
    if e.inserted && adv.overlap.replaces() && busy {
        // The slot replaces the previous runs: those not started are
        // cancelled with the reason, a running one is asked to stop (it
        // learns it at its next heartbeat; its lease keeps it fenced).
        for p in &previous {
            match p.state {
                TaskState::Pending => tx.cancel_pending(p.id, Some(OVERLAP_REPLACED)).await?,
                TaskState::Running => tx.request_cancel(p.id).await?,
                _ => {}
            }
        }
    }
    let answer = if !e.inserted {
        // The slot's task exists already (a trigger made it): the slot is
        // not skipped, it runs as that task.
        Advanced::Enqueued(e)
    } else {
        match birth {
            Birth::Cancelled { .. } => Advanced::Skipped(e),
            Birth::Waiting => Advanced::Waiting(e),
            _ => Advanced::Enqueued(e),
        }
    };
    SlotTx::commit(tx, e.inserted && birth == Birth::Pending).await?;
    Ok(answer)
}

/// How a slot is recorded when the job's previous runs (`previous`, not
/// empty) are unfinished, by the job's overlap policy.
fn overlap_birth(overlap: Overlap, previous: &[PreviousRun]) -> Birth<'static> {
    match overlap {
        Overlap::Skip => Birth::Cancelled {
            reason: OVERLAP_SKIPPED,
        },
        Overlap::Allow => Birth::Pending,
        Overlap::BufferOne if previous.iter().any(|p| p.waiting) => Birth::Cancelled {
            reason: OVERLAP_BUFFER_FULL,
        },
        Overlap::BufferOne | Overlap::BufferAll => Birth::Waiting,
        // The pending previous runs are cancelled (never started): only a
        // running one is waited for.
        Overlap::CancelOther | Overlap::TerminateOther
            if previous.iter().any(|p| p.state == TaskState::Running) =>
        {
            Birth::Waiting
        }
        Overlap::CancelOther | Overlap::TerminateOther => Birth::Pending,
    }
}

/// `job_release` on a backend's [`SlotTx`]: under the job's row lock, the
/// earliest waiting slot of the job becomes due once no other run of the
/// job is pending or running.
pub(crate) async fn job_release<T: SlotTx>(
    mut tx: T,
    job: &str,
) -> Result<Option<i64>, StoreError> {
    // Every unfinished task of the job counts (no batch, any creation
    // time before the far future).
    let all = JobAdvance::new(job, None, waiting_run_at(), None);
    if tx.job_row(&all).await?.is_none() {
        SlotTx::rollback(tx).await?;
        return Ok(None);
    }
    let runs = SlotTx::previous_runs(&mut tx, &all).await?;
    let first_waiting = runs.iter().filter(|r| r.waiting).map(|r| r.id).min();
    let (Some(id), false) = (first_waiting, runs.iter().any(|r| !r.waiting)) else {
        SlotTx::rollback(tx).await?;
        return Ok(None);
    };
    tx.release(id).await?;
    SlotTx::commit(tx, true).await?;
    Ok(Some(id))
}

/// One backend's side of `task_cancel`: one transaction, as [`SlotTx`].
#[async_trait]
pub(crate) trait CancelTx: Send + Sized {
    /// The task's state, its row locked; `None` when there is no such task.
    async fn state(&mut self, id: i64) -> Result<Option<TaskState>, StoreError>;
    /// Pending → `cancelled` now (`finished_at` now, no lease), keeping
    /// `reason` in `last_error` when given.
    async fn cancel_pending(&mut self, id: i64, reason: Option<&str>) -> Result<(), StoreError>;
    /// Running: set `cancel_requested` (the worker learns it at its next
    /// heartbeat).
    async fn request_cancel(&mut self, id: i64) -> Result<(), StoreError>;
    /// Commit.
    async fn commit(self) -> Result<(), StoreError>;
    /// Roll back (nothing was written).
    async fn rollback(self) -> Result<(), StoreError>;
}

/// `task_cancel` on a backend's [`CancelTx`], by the state table's
/// [`Op::Cancel`] rows: pending → `Cancelled`, running → `Requested`,
/// finished → `AlreadyFinished`, missing → `NotFound`.
pub(crate) async fn task_cancel<T: CancelTx>(
    mut tx: T,
    id: i64,
) -> Result<CancelOutcome, StoreError> {
    let Some(from) = tx.state(id).await? else {
        tx.rollback().await?;
        return Ok(CancelOutcome::NotFound);
    };
    // The facts do not matter to a cancel's rows.
    let outcome = match state::next(from, Op::Cancel, Facts::default()) {
        Some(Target::State(TaskState::Cancelled)) => {
            tx.cancel_pending(id, None).await?;
            CancelOutcome::Cancelled
        }
        Some(Target::State(TaskState::Running)) => {
            tx.request_cancel(id).await?;
            CancelOutcome::Requested
        }
        _ => {
            tx.rollback().await?;
            return Ok(CancelOutcome::AlreadyFinished(from));
        }
    };
    tx.commit().await?;
    Ok(outcome)
}
