//! The scheduler: every instance computes the same slots and races to move
//! each job's cursor in the store; the one compare-and-set that wins
//! enqueues the slot's task. No leader, no slot run twice, none lost.
//!
//! Two modes per job:
//!
//! - **durable** (default): the slot becomes a queued task (lease, heartbeat,
//!   retries), run by whichever worker claims it and resumed elsewhere if
//!   that worker dies. The task's kind is the job's name (unless set), and
//!   it carries its `job` and `slot`.
//! - **lock**: ShedLock's behaviour, once per slot. Every instance's timer
//!   fires at each slot; the one that wins the cursor compare-and-set (which
//!   the store refuses before the slot by its clock) records the run as a
//!   `running` task and runs the job's function in-process under a lease
//!   lock named after the job (`at_most` / `at_least`, mutual exclusion with
//!   a run still going). The record ends with the outcome; a crash loses
//!   that slot's run (rescue fails the record). Fixed-delay loops are
//!   supported: the cursor holds when the last run ended.
//!
//! Time is the store's: each instance keeps an estimate of the store clock
//! (calibrated with `now()` and advanced on the monotonic clock), so a node
//! whose wall clock is minutes off fires at the same instants as the rest.
//!
//! ```no_run
//! # async fn demo() -> Result<(), baton::Error> {
//! use baton::schedule::{Job, Scheduler, spec::Schedule};
//! let store = baton::Store::connect("sqlite://baton.db").await?;
//! let mut s = Scheduler::new(store.clone());
//! s.add(Job::new("batch", Schedule::cron("0 */6 * * *", "Asia/Seoul")?).max_attempts(3))?;
//! // A worker handles kind "batch"; the scheduler enqueues one task per slot.
//! s.run(tokio_util::sync::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::spec::{catch_up_window_start, due_slots, Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use crate::error::{Error, InvalidInput};
use crate::lock::{validate_name, LeaseHandle, LockOptions, Locker};
use crate::queue::{TaskAction, TaskBuilder, TaskError};
use crate::store::{
    Advanced, Claim, Enqueued, Finish, Heartbeat, JobAdvance, NewTask, Overlap, SlotRecord, Store,
    TaskState, IDENTITY_CHECK,
};

/// How a job's slots are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobMode {
    /// Each slot is a durable task in the queue.
    Durable,
    /// Each instance fires; a lease lock lets one run (ShedLock).
    Lock {
        /// Lease length (the run's upper bound if its holder dies).
        at_most: Duration,
        /// Minimum hold after the grant.
        at_least: Duration,
    },
}

/// A job definition.
#[derive(Debug, Clone)]
#[must_use = "a Job does nothing until added to a Scheduler"]
pub struct Job {
    /// Name: unique per store; the cursor's key and the lock's name.
    pub name: String,
    /// When its slots are.
    pub schedule: Schedule,
    /// Durable (queued) or lock mode.
    pub mode: JobMode,
    /// Lock mode only: wait this long after each run instead of firing at
    /// slot instants (ShedLock's `fixedDelay`).
    pub fixed_delay: Option<Duration>,
    /// Missed-slot policy (durable mode).
    pub misfire: Misfire,
    /// Most missed slots run with [`Misfire::All`].
    pub max_catch_up: usize,
    /// How old a slot may be and still run with [`Misfire::None`].
    pub misfire_grace: Duration,
    /// What to do when the previous run is unfinished.
    pub overlap: Overlap,
    /// Random delay up to this long added to each run (not to the slot).
    pub jitter: Duration,
    /// Queue for durable runs.
    pub queue: String,
    /// Task kind for durable runs (default: the job's name).
    pub kind: String,
    /// Task payload for durable runs.
    pub payload: serde_json::Value,
    /// Task priority.
    pub priority: i32,
    /// Attempts per slot.
    pub max_attempts: u32,
    /// Timeout per attempt.
    pub timeout: Option<Duration>,
    /// Durable mode: take each on-time slot this long before it (by store
    /// time), so its task, due at the slot, is queued and announced ahead
    /// and a worker claims it as the slot comes (at most a quarter of the
    /// gap to the following slot). The store refuses the take before
    /// `slot - lead` by its clock; pause is judged that much earlier, but
    /// `overlap = forbid` still at the slot (an unfinished previous run
    /// defers the take to the slot, where the rule applies). Missed slots
    /// (misfire, catch-up) are taken only once due. Lock mode ignores it:
    /// its run starts at once.
    pub lead: Duration,
}

/// The default [`Job::lead`].
pub const DEFAULT_LEAD: Duration = Duration::from_millis(150);

impl Job {
    /// A durable job on the default queue, misfire `latest`, overlap
    /// `forbid`, 3 attempts, kind = name.
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Job {
        let name = name.into();
        Job {
            kind: name.clone(),
            name,
            schedule,
            mode: JobMode::Durable,
            fixed_delay: None,
            misfire: Misfire::Latest,
            max_catch_up: DEFAULT_MAX_CATCH_UP,
            misfire_grace: Duration::from_secs(60),
            overlap: Overlap::Forbid,
            jitter: Duration::ZERO,
            queue: crate::queue::DEFAULT_QUEUE.into(),
            payload: serde_json::json!({}),
            priority: 0,
            max_attempts: crate::queue::DEFAULT_MAX_ATTEMPTS,
            timeout: None,
            lead: DEFAULT_LEAD,
        }
    }
    /// Lock mode with these lease bounds.
    pub fn lock_mode(mut self, at_most: Duration, at_least: Duration) -> Job {
        self.mode = JobMode::Lock { at_most, at_least };
        self
    }
    /// Set the misfire policy.
    pub fn misfire(mut self, m: Misfire) -> Job {
        self.misfire = m;
        self
    }
    /// Set the overlap rule.
    pub fn overlap(mut self, o: Overlap) -> Job {
        self.overlap = o;
        self
    }
    /// Set the queue.
    pub fn queue(mut self, q: impl Into<String>) -> Job {
        self.queue = q.into();
        self
    }
    /// Set attempts per slot.
    pub fn max_attempts(mut self, n: u32) -> Job {
        self.max_attempts = n;
        self
    }

    fn validate(&self) -> Result<(), InvalidInput> {
        let ctx = |e: InvalidInput| {
            InvalidInput::new(format!("job {:?}: {}", self.name, e.field), e.problem)
        };
        validate_name("job name", &self.name)?;
        if let JobMode::Lock { at_most, at_least } = self.mode {
            // Checked only: the scheduler builds its own when it runs.
            let _checked = LockOptions::new(at_most)
                .and_then(|o| o.at_least(at_least))
                .map_err(ctx)?;
        } else if self.fixed_delay.is_some() {
            return Err(ctx(InvalidInput::new(
                "fixed_delay",
                "applies only to lock mode",
            )));
        }
        self.task(Utc::now(), false).map(|_| ()).map_err(ctx)
    }

    /// The unique key of this job's run for `slot`: `job|RFC3339`.
    pub fn slot_key(&self, slot: DateTime<Utc>) -> String {
        slot_key(&self.name, slot)
    }

    /// The task that runs `slot`. Triggered runs are due now; scheduled
    /// runs at the slot (plus jitter).
    pub fn task(&self, slot: DateTime<Utc>, triggered: bool) -> Result<NewTask, InvalidInput> {
        let mut t = TaskBuilder::new(self.kind.clone(), self.payload.clone())
            .queue(self.queue.clone())
            .priority(self.priority)
            // A lock-mode run is its instance's one attempt: if that
            // instance dies, rescue fails it ("lease expired").
            .max_attempts(match self.mode {
                JobMode::Durable => self.max_attempts,
                JobMode::Lock { .. } => 1,
            })
            .unique_key(self.slot_key(slot))
            .unique_forever(true)
            .slot(self.name.clone(), slot);
        if !triggered {
            let jitter = random_upto(self.jitter);
            t = t.run_at(slot + chrono::Duration::from_std(jitter).unwrap_or_default());
        }
        if let Some(d) = self.timeout {
            t = t.timeout(d);
        }
        t.build()
    }
}

/// The unique key of `job`'s run for `slot`.
pub fn slot_key(job: &str, slot: DateTime<Utc>) -> String {
    format!(
        "{job}|{}",
        slot.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    )
}

/// Whether `key` has the form of a slot key (`JOB|RFC3339`), which is
/// reserved for the scheduler and triggers: a task enqueued with such a key
/// would take that slot's place.
pub fn is_slot_key(key: &str) -> bool {
    key.rsplit_once('|')
        .is_some_and(|(job, t)| !job.is_empty() && DateTime::parse_from_rfc3339(t).is_ok())
}

fn random_upto(d: Duration) -> Duration {
    if d.is_zero() {
        Duration::ZERO
    } else {
        Duration::from_millis(fastrand::u64(0..=d.as_millis() as u64))
    }
}

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
        return Ok(SlotReport {
            id: e.id,
            inserted: e.inserted,
            outcome: outcome_of(t.state, t.attempt, t.last_error.as_deref()),
            reason: t.last_error,
            finished_at: t.finished_at,
            pruned: false,
            rerun: false,
        });
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
    let mut again = slot_report(
        store,
        job,
        slot,
        Enqueued {
            id: report.id,
            inserted: false,
        },
    )
    .await?;
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

/// A run in lock mode, as the job's function sees it.
#[derive(Debug, Clone)]
pub struct SlotRun {
    /// Job name.
    pub job: String,
    /// The slot (for fixed-delay jobs, the instant the run became allowed:
    /// the previous run's end plus the delay).
    pub slot: DateTime<Utc>,
    /// The lease that makes this run exclusive.
    pub lease: LeaseHandle,
}

type SlotFut = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;
type SlotFn = Arc<dyn Fn(SlotRun) -> SlotFut + Send + Sync>;

pub use crate::clock::StoreClock;

/// Runs jobs' slots. See the module docs.
pub struct Scheduler {
    store: Store,
    jobs: Vec<(Job, Option<SlotFn>)>,
}

impl Scheduler {
    /// A scheduler with no jobs.
    pub fn new(store: Store) -> Scheduler {
        Scheduler {
            store,
            jobs: Vec::new(),
        }
    }

    /// Add a durable job (its runs are tasks of `job.kind`).
    pub fn add(&mut self, job: Job) -> Result<&mut Self, InvalidInput> {
        if job.mode != JobMode::Durable {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is a lock-mode job; add it with add_locked and a function to run",
            ));
        }
        self.push(job, None)
    }

    /// Add a lock-mode job that runs `f` on whichever instance takes the lock.
    ///
    /// `f` returns the handlers' [`TaskError`]. A lock-mode run is one
    /// slot's run, never retried: an error records the run as `failed`
    /// with its message, except [`TaskError::cancel`], which records it
    /// `cancelled` with its reason (a snooze is a failure here, saying so).
    pub fn add_locked<F, Fut>(&mut self, job: Job, f: F) -> Result<&mut Self, InvalidInput>
    where
        F: Fn(SlotRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), TaskError>> + Send + 'static,
    {
        if job.mode == JobMode::Durable {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is durable; add it with add",
            ));
        }
        self.push(job, Some(Arc::new(move |r| Box::pin(f(r)) as SlotFut)))
    }

    fn push(&mut self, job: Job, f: Option<SlotFn>) -> Result<&mut Self, InvalidInput> {
        job.validate()?;
        if self.jobs.iter().any(|(j, _)| j.name == job.name) {
            return Err(InvalidInput::new(
                format!("job {:?}", job.name),
                "is defined twice; job names must be unique",
            ));
        }
        self.jobs.push((job, f));
        Ok(self)
    }

    /// Run every job until `shutdown` fires. Lock-mode runs in progress are
    /// awaited (and their leases released) before returning.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let clock = StoreClock::new(self.store.clone()).await?;
        let mut set = tokio::task::JoinSet::new();
        for (job, f) in self.jobs {
            let (store, clock, stop) = (self.store.clone(), clock.clone(), shutdown.clone());
            match f {
                None => {
                    set.spawn(slot_loop(store, clock, job, None, stop));
                }
                Some(f) => {
                    let Some(l) = LockRun::new(&store, &job, f) else {
                        continue;
                    };
                    match job.fixed_delay {
                        Some(d) => set.spawn(fixed_delay_loop(store, clock, job, l, d, stop)),
                        None => set.spawn(slot_loop(store, clock, job, Some(l), stop)),
                    };
                }
            }
        }
        // Background calls, each counted on the store (a worker on the
        // same store skips a poll for each) and a little off any beat (a
        // call at the same instant as another would need a second
        // connection).
        let calib = {
            let (clock, store) = (clock.clone(), self.store.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RECALIBRATION + random_upto(BEAT_JITTER)).await;
                    store.note_upkeep(1);
                    clock.recalibrate().await;
                }
            })
        };
        // Is it still the store we connected to? Checked at the lock-mode
        // rescue's cadence (unless a worker on the same store just did);
        // a change is logged by the check, once.
        let identity = {
            let store = self.store.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(IDENTITY_CHECK + random_upto(BEAT_JITTER)).await;
                    if !store.identity().take_due(IDENTITY_CHECK) {
                        continue;
                    }
                    store.note_upkeep(1);
                    if let Err(e) = store.check_identity().await {
                        tracing::debug!(error = %crate::error::chain(&e), "reading the store's identity failed");
                    }
                    if store.read_only().is_some() {
                        if let Err(e) = store.check_writable().await {
                            tracing::debug!(error = %crate::error::chain(&e), "probing whether the store takes writes failed");
                        }
                    }
                }
            })
        };
        while set.join_next().await.is_some() {}
        calib.abort();
        identity.abort();
        Ok(())
    }
}

/// How often a scheduler reads the store's clock again.
const RECALIBRATION: Duration = Duration::from_secs(30);

/// Up to this much is added to each background period, so that those
/// calls drift off the beat of a worker's polls.
const BEAT_JITTER: Duration = Duration::from_millis(400);

/// How long a lock-mode run's outcome may still take to be written once
/// the scheduler is stopping (a store that answers writes it in
/// milliseconds; one that does not would hold the shutdown for its retries).
const OUTCOME_ON_STOP: Duration = Duration::from_secs(2);

/// The reason kept on a lock-mode slot whose lock was held (by a run of an
/// earlier slot still going, or within its `at_least`).
pub const LOCK_BUSY: &str =
    "skipped: the job's lock is held (previous run still running or within at_least)";

/// How the record of a lock-mode run names its runner: `scheduler:` and
/// the instance's `host:pid`.
const LOCK_RUN_WORKER: &str = "scheduler:";

/// Whether `t` is the record of a lock-mode run: a slot the scheduler ran
/// in-process under the job's lock, not a task any worker can run. Such a
/// record cannot be retried through the queue (no handler exists for it);
/// a slot runs again only by the schedule or `baton trigger`.
pub fn is_lock_run_record(t: &crate::store::TaskInfo) -> bool {
    t.job.is_some()
        && t.worker
            .as_deref()
            .is_some_and(|w| w.starts_with(LOCK_RUN_WORKER))
}

/// What a lock-mode loop needs to run a slot itself.
struct LockRun {
    f: SlotFn,
    opts: LockOptions,
    locker: Locker,
    worker: String,
}

impl LockRun {
    fn new(store: &Store, job: &Job, f: SlotFn) -> Option<LockRun> {
        let JobMode::Lock { at_most, at_least } = job.mode else {
            return None;
        };
        match LockOptions::new(at_most).and_then(|o| o.at_least(at_least)) {
            Ok(opts) => Some(LockRun {
                f,
                opts,
                locker: Locker::new(store.clone()),
                worker: format!("{LOCK_RUN_WORKER}{}", crate::lock::node_id()),
            }),
            Err(e) => {
                tracing::error!(job = %job.name, error = %crate::error::chain(&e), "bad lock options");
                None
            }
        }
    }
}

/// The reason kept on the record of slots a misfire policy did not run.
fn misfire_reason(misfire: Misfire, due: &super::spec::Due) -> String {
    let text = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let range = match (due.skipped_first, due.skipped_last) {
        (Some(a), Some(b)) if a != b => format!(" ({} to {})", text(a), text(b)),
        _ => String::new(),
    };
    format!(
        "skipped by misfire = {misfire}: {} missed slot(s){range}",
        due.skipped
    )
}

/// The loop of a durable job, or of a lock-mode job on a cron/interval
/// schedule (`lock` set). Each round re-plans from the cursor and the
/// store-clock estimate; every advance is checked against the store's own
/// clock (`due_only`, and `until` the next slot when only the latest slot
/// may run), so a stale plan is refused and re-made, never acted on.
async fn slot_loop(
    store: Store,
    clock: StoreClock,
    job: Job,
    lock: Option<LockRun>,
    stop: CancellationToken,
) {
    const MAX_WAIT: Duration = Duration::from_secs(1);
    let b = store.backend();
    let mut backoff = Duration::from_millis(100);
    let mut cursor: Option<DateTime<Utc>> = None;
    // The cursor was read from the store since the last error.
    let mut fresh = false;
    let mut recalibrate = false;
    // The catch-up in progress, as (batch_after, its latest slot): a plan
    // made after losing a race mid-catch-up may hold only its last slot,
    // which still belongs to the same catch-up.
    let mut catch_up: Option<(Option<DateTime<Utc>>, DateTime<Utc>)> = None;
    // Lock mode runs slots from its start on (no catch-up, like ShedLock),
    // only the latest when it is late.
    let floor = lock.as_ref().map(|_| clock.now());
    let misfire = if lock.is_some() {
        Misfire::Latest
    } else {
        job.misfire
    };
    let mut last_rescue: Option<Instant> = None;
    let lead = match lock {
        Some(_) => chrono::Duration::zero(),
        None => chrono::Duration::from_std(job.lead).unwrap_or_default(),
    };
    // The lead for `slot`: at most a quarter of the gap to the next one, so
    // a fast schedule is never taken more than one slot ahead.
    let lead_for = |slot: DateTime<Utc>| -> chrono::Duration {
        job.schedule
            .next_after(slot)
            .map_or(lead, |n| lead.min((n - slot) / 4))
    };
    'outer: while !stop.is_cancelled() {
        if !fresh {
            match read_cursor(b, &job, &stop, &mut backoff).await {
                Some(c) => {
                    cursor = c;
                    fresh = true;
                }
                None => continue,
            }
        }
        if std::mem::take(&mut recalibrate) {
            clock.recalibrate().await;
        }
        clock.recalibrate_if_suspended().await;
        if lock.is_some() && last_rescue.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            // A lock-mode run whose instance died is failed ("lease
            // expired") by rescue; without a worker nobody else may run it.
            last_rescue = Some(Instant::now());
            if let Err(e) = b.task_rescue_many().await {
                tracing::debug!(job = %job.name, error = %crate::error::chain(&e), "rescue failed");
            }
        }
        let now = clock.now();
        let base = cursor.unwrap_or(now);
        let from = floor.map_or(base, |f| base.max(f));
        let due = due_slots(
            &job.schedule,
            from,
            now,
            misfire,
            job.max_catch_up,
            job.misfire_grace,
        );
        // First a record of the slots the policy skips (one cancelled task,
        // at the latest of them, saying how many), then the slots to run.
        let mut steps: Vec<(DateTime<Utc>, Option<String>)> = Vec::new();
        if due.skipped > 0 {
            if let Some(last) = due.skipped_last {
                steps.push((last, Some(misfire_reason(misfire, &due))));
            }
        }
        steps.extend(due.slots.iter().map(|s| (*s, None)));
        // On time (nothing due): take the next slot within its lead. The
        // store judges it in the same call: not before `slot - lead` by its
        // clock, and under `overlap = forbid` an unfinished previous run
        // makes it wait for the slot (`JobAdvance::not_before`).
        let mut early = false;
        if steps.is_empty() && lead > chrono::Duration::zero() {
            if let Some(next) = job.schedule.next_after(from) {
                if next - lead_for(next) <= now {
                    steps.push((next, None));
                    early = true;
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
        let batch_after = match (due.slots.len() > 1, due.slots.last()) {
            (true, Some(latest)) => {
                let after = catch_up_window_start(&job.schedule, *latest, job.max_catch_up);
                catch_up = Some((after, *latest));
                after
            }
            (false, Some(only)) => match catch_up {
                Some((after, latest)) if *only <= latest => after,
                _ => {
                    catch_up = None;
                    None
                }
            },
            _ => None,
        };
        for (slot, skip) in steps {
            let task = match job.task(slot, false) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(job = %job.name, error = %crate::error::chain(&e), "cannot build the slot's task");
                    return;
                }
            };
            let until = match (skip.is_some(), misfire) {
                (true, _) | (false, Misfire::All) => None,
                (false, Misfire::Latest) => job.schedule.next_after(slot),
                (false, Misfire::None) => chrono::Duration::from_std(job.misfire_grace)
                    .ok()
                    .and_then(|g| slot.checked_add_signed(g + chrono::Duration::milliseconds(1))),
            };
            let record = match (&skip, &lock) {
                (Some(reason), _) => SlotRecord::Skip { reason },
                (None, Some(l)) => SlotRecord::Run {
                    worker: &l.worker,
                    lease: l.opts.at_most_duration(),
                },
                (None, None) => SlotRecord::Enqueue,
            };
            let adv = JobAdvance {
                record,
                overlap: job.overlap,
                batch_after,
                // An early slot is refused before `slot - lead` by the
                // store's clock; `until` still bounds it.
                due_only: !early,
                until,
                not_before: early.then(|| slot - lead_for(slot)),
                ..JobAdvance::new(&job.name, cursor, slot, Some(&task))
            };
            if early {
                // Every instance takes the same slot: make the losers cheap.
                // Each waits a random part of the lead, then reads the
                // cursor; one that finds it moved learns it without a
                // compare-and-set. The first of N instances comes about
                // lead / N in, so the slot's task is still queued ahead of
                // the slot, and only those that read before its commit
                // race it (the CAS stays the only judge: a failed read
                // just goes on to it).
                let spread = (lead_for(slot) * 3 / 4).to_std().unwrap_or_default();
                tokio::select! {
                    _ = tokio::time::sleep(random_upto(spread)) => {}
                    _ = stop.cancelled() => return,
                }
                if let Ok(Some(st)) = b.job_get(&job.name).await {
                    if st.last_slot != cursor {
                        cursor = st.last_slot;
                        continue 'outer;
                    }
                }
            }
            match b.job_advance(&adv).await {
                Ok(Advanced::Enqueued(e)) => {
                    cursor = Some(slot);
                    if let Some(reason) = &skip {
                        tracing::info!(job = %job.name, %slot, task = e.id, %reason, "missed slots recorded as skipped");
                    } else if let Some(l) = &lock {
                        if e.inserted {
                            run_locked(b, l, &job, slot, e.id, None, &stop).await;
                        } else {
                            tracing::debug!(job = %job.name, %slot, "the slot already has a run");
                        }
                    } else {
                        tracing::info!(job = %job.name, %slot, task = e.id, new = e.inserted, "slot enqueued");
                    }
                }
                Ok(Advanced::Skipped(e)) => {
                    tracing::info!(job = %job.name, %slot, task = e.id, "slot skipped: previous run unfinished (overlap = forbid)");
                    cursor = Some(slot);
                }
                Ok(Advanced::Moved(c)) => {
                    // Another instance got there first: learn its cursor.
                    cursor = c;
                    continue 'outer;
                }
                Ok(Advanced::NotDue { now }) => {
                    let wait = match adv.not_before {
                        // An early take the store deferred (overlap =
                        // forbid, the previous run unfinished): the rule is
                        // judged at the slot, so come back then.
                        Some(nb) if now >= nb => {
                            tracing::debug!(job = %job.name, %slot, "previous run unfinished; judging the slot when it comes");
                            slot - now
                        }
                        // The clock estimate is ahead, or the plan went
                        // stale (the store passed the next slot): re-read
                        // the clock and plan again.
                        nb => {
                            tracing::debug!(job = %job.name, %slot, store_now = %now, "slot not due by store time; re-planning");
                            recalibrate = true;
                            nb.unwrap_or(slot) - now
                        }
                    };
                    let wait = wait.to_std().unwrap_or(Duration::ZERO);
                    tokio::select! {
                        _ = tokio::time::sleep(wait.min(MAX_WAIT)) => {}
                        _ = stop.cancelled() => return,
                    }
                    continue 'outer;
                }
                Ok(Advanced::Paused) => {
                    tracing::debug!(job = %job.name, "paused");
                    break;
                }
                Ok(Advanced::UnknownJob) => {
                    fresh = false;
                    continue 'outer;
                }
                Err(e) => {
                    // The call may or may not have happened: re-read the
                    // cursor and the store's clock before planning again.
                    crate::store::warn_unless_read_only!(e, job = %job.name, error = %crate::error::chain(&e), "cannot advance the job; retrying");
                    fresh = false;
                    recalibrate = true;
                    pause(&stop, &mut backoff).await;
                    continue 'outer;
                }
            }
        }
        backoff = Duration::from_millis(100);
        let now = clock.now();
        let next = job
            .schedule
            .next_after(now.max(cursor.unwrap_or(now)))
            .map(|n| n - lead_for(n))
            .unwrap_or(now + chrono::Duration::seconds(60));
        tokio::select! {
            _ = clock.sleep_until(next, MAX_WAIT) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Run a lock-mode slot whose record (task `id`, attempt 1, `running`) this
/// instance just created: take the lease lock, run, and finish the record
/// with the outcome; heartbeat the record meanwhile. Once `stop` fires,
/// the outcome gets [`OUTCOME_ON_STOP`] to be written, so a shutdown does
/// not wait on a store that does not answer.
/// [`Locker::run`], with the lock held on release until `hold_until`
/// (see [`crate::lock::Lease::hold_until`]) rather than the grant plus
/// `at_least`.
async fn run_holding<F, Fut, T>(
    locker: &Locker,
    name: &str,
    opts: &LockOptions,
    hold_until: Option<DateTime<Utc>>,
    work: F,
) -> Result<Option<T>, Error>
where
    F: FnOnce(crate::lock::LeaseHandle) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let Some(mut lease) = locker.try_lock(name, opts).await? else {
        return Ok(None);
    };
    if let Some(until) = hold_until {
        lease.hold_until(until);
    }
    lease.run(work).await.map(Some)
}

async fn run_locked(
    b: &dyn crate::store::Backend,
    l: &LockRun,
    job: &Job,
    slot: DateTime<Utc>,
    id: i64,
    end_cursor: Option<&std::sync::Mutex<Option<DateTime<Utc>>>>,
    stop: &CancellationToken,
) {
    let claim = Claim {
        id,
        attempt: 1,
        token: crate::store::RUN_RECORD_TOKEN,
    };
    tokio::time::sleep(random_upto(job.jitter)).await;
    let lease = l.opts.at_most_duration();
    let name = job.name.clone();
    let f = l.f.clone();
    // `at_least` counts from the slot, not the grant (which comes a few ms
    // later): an `at_least` equal to the interval then ends exactly at the
    // next slot instead of overlapping its grant.
    let hold_until = chrono::Duration::from_std(l.opts.at_least_duration())
        .ok()
        .and_then(|d| slot.checked_add_signed(d));
    let run = run_holding(
        &l.locker,
        &job.name,
        &l.opts,
        hold_until,
        move |lease| async move {
            let out = f(SlotRun {
                job: name,
                slot,
                lease,
            })
            .await;
            // Fixed delay: the next run counts from this one's end, so move the
            // cursor there while the lock is still held (once it is released,
            // another instance may otherwise take `slot + delay`).
            if let Some(cell) = end_cursor {
                let moved = cursor_to_end(b, &job.name, slot).await;
                if let Ok(mut c) = cell.lock() {
                    *c = moved;
                }
            }
            out
        },
    );
    let beat = async {
        loop {
            tokio::time::sleep((lease / 3).max(Duration::from_millis(100))).await;
            match b
                .task_heartbeat_many(&crate::store::TaskHeartbeatMany {
                    claims: &[claim],
                    lease,
                })
                .await
            {
                Ok(h) if h.first() == Some(&Heartbeat::Lost) => {
                    tracing::warn!(job = %job.name, %slot, task = id, "the run's record was rescued (its lease lapsed); the lock still guards the run");
                    std::future::pending::<()>().await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(job = %job.name, error = %crate::error::chain(&e), "run record heartbeat failed")
                }
            }
        }
    };
    let r = tokio::select! {
        r = run => r,
        _ = beat => return,
    };
    let finish = match r {
        Ok(Some(Ok(()))) => {
            tracing::info!(job = %job.name, %slot, "ran under lock");
            Finish::Succeeded
        }
        Ok(Some(Err(e))) if e.action() == TaskAction::Cancel => {
            tracing::info!(job = %job.name, %slot, reason = %e, "run cancelled");
            Finish::Cancelled {
                reason: e.message().to_string(),
            }
        }
        Ok(Some(Err(e))) => {
            tracing::warn!(job = %job.name, %slot, error = %e, "run failed");
            let error = match e.action() {
                TaskAction::Snooze { .. } => {
                    format!("{e} (a lock-mode run is not run again; it failed)")
                }
                _ => e.message().to_string(),
            };
            Finish::Failed {
                error,
                retry_in: None,
            }
        }
        Ok(None) => {
            tracing::info!(job = %job.name, %slot, "lock held elsewhere; slot recorded as skipped");
            Finish::Cancelled {
                reason: LOCK_BUSY.into(),
            }
        }
        Err(e) => {
            tracing::warn!(job = %job.name, %slot, error = %crate::error::chain(&e), "lock-mode run ended with an error");
            Finish::Failed {
                error: e.to_string(),
                retry_in: None,
            }
        }
    };
    // A store blip must not leave the record running; if every try fails,
    // rescue fails it with "lease expired" once its lease lapses.
    let record = async {
        let mut backoff = Duration::from_millis(100);
        for _ in 0..5 {
            match b
                .task_finish_many(&[(claim, finish.clone())])
                .await
                .map(|r| r == [true])
            {
                Ok(_) => return,
                Err(e) => {
                    crate::store::warn_unless_read_only!(e, job = %job.name, %slot, error = %crate::error::chain(&e), "cannot record the run's outcome; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
            }
        }
    };
    tokio::select! {
        () = record => {}
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(OUTCOME_ON_STOP).await;
        } => {
            tracing::warn!(job = %job.name, %slot, task = id, "shutting down before the run's outcome could be recorded (the store does not answer); its record fails with \"lease expired\" once its lease lapses");
        }
    }
}

/// Move a fixed-delay job's cursor from `from` (its run's start) to the
/// store's now (the run's end); if another instance moved it meanwhile to
/// an earlier instant, move it on from there. The cursor it leaves, if
/// this instance moved it.
async fn cursor_to_end(
    b: &dyn crate::store::Backend,
    job: &str,
    from: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let end = b.now().await.ok()?;
    let mut expected = Some(from);
    for _ in 0..3 {
        if expected.is_some_and(|c| c >= end) {
            return None;
        }
        match b
            .job_advance(&JobAdvance::new(job, expected, end, None))
            .await
        {
            Ok(Advanced::Enqueued(_)) => return Some(end),
            Ok(Advanced::Moved(c)) => expected = c,
            _ => return None,
        }
    }
    None
}

/// Register the job (if new; its queue recorded either way) and read its
/// cursor; `None` after a store error (logged, and `backoff` waited), so
/// the caller tries again.
async fn read_cursor(
    b: &dyn crate::store::Backend,
    job: &Job,
    stop: &CancellationToken,
    backoff: &mut Duration,
) -> Option<Option<DateTime<Utc>>> {
    let reg = crate::store::JobRegister::new(&job.name).queue(&job.queue);
    let job = job.name.as_str();
    match b.job_register(&reg).await {
        Ok(st) => {
            *backoff = Duration::from_millis(100);
            Some(st.last_slot)
        }
        Err(e) => {
            crate::store::warn_unless_read_only!(e, job, error = %crate::error::chain(&e), "cannot read the job's cursor; retrying");
            pause(stop, backoff).await;
            None
        }
    }
}

async fn pause(stop: &CancellationToken, backoff: &mut Duration) {
    tokio::select! {
        _ = tokio::time::sleep(*backoff) => {}
        _ = stop.cancelled() => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}

/// A fixed-delay lock-mode job: the cursor holds when the last run ended
/// (or started, while it runs); a run is taken with a compare-and-set to
/// `cursor + delay`, refused by the store before that instant.
async fn fixed_delay_loop(
    store: Store,
    clock: StoreClock,
    job: Job,
    l: LockRun,
    delay: Duration,
    stop: CancellationToken,
) {
    const MAX_WAIT: Duration = Duration::from_secs(1);
    let b = store.backend();
    let mut backoff = Duration::from_millis(100);
    let mut cursor: Option<DateTime<Utc>> = None;
    let mut fresh = false;
    let delay_c = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
    while !stop.is_cancelled() {
        if !fresh {
            match read_cursor(b, &job, &stop, &mut backoff).await {
                Some(c) => {
                    cursor = c;
                    fresh = true;
                }
                None => continue,
            }
        }
        let target = match cursor.and_then(|c| c.checked_add_signed(delay_c)) {
            Some(t) => t,
            None => clock.now(),
        };
        while clock.now() < target {
            clock.recalibrate_if_suspended().await;
            tokio::select! {
                _ = clock.sleep_until(target, MAX_WAIT) => {}
                _ = stop.cancelled() => return,
            }
        }
        let task = match job.task(target, false) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(job = %job.name, error = %crate::error::chain(&e), "cannot build the run's task");
                return;
            }
        };
        let adv = JobAdvance {
            record: SlotRecord::Run {
                worker: &l.worker,
                lease: l.opts.at_most_duration(),
            },
            due_only: true,
            ..JobAdvance::new(&job.name, cursor, target, Some(&task))
        };
        match b.job_advance(&adv).await {
            Ok(Advanced::Enqueued(e)) | Ok(Advanced::Skipped(e)) => {
                cursor = Some(target);
                if e.inserted {
                    // The delay counts from the run's end: run_locked moves
                    // the cursor there before it releases the lock.
                    let end = std::sync::Mutex::new(None);
                    run_locked(b, &l, &job, target, e.id, Some(&end), &stop).await;
                    match end.into_inner().ok().flatten() {
                        Some(end) => cursor = Some(end),
                        None => fresh = false,
                    }
                }
            }
            Ok(Advanced::Moved(c)) => cursor = c,
            Ok(Advanced::NotDue { now }) => {
                clock.recalibrate().await;
                let wait = (target - now).to_std().unwrap_or(Duration::ZERO);
                tokio::select! {
                    _ = tokio::time::sleep(wait.clamp(Duration::from_millis(2), MAX_WAIT)) => {}
                    _ = stop.cancelled() => return,
                }
            }
            Ok(Advanced::Paused) => {
                tokio::select! {
                    _ = tokio::time::sleep(MAX_WAIT) => {}
                    _ = stop.cancelled() => return,
                }
                fresh = false;
            }
            Ok(Advanced::UnknownJob) => fresh = false,
            Err(e) => {
                crate::store::warn_unless_read_only!(e, job = %job.name, error = %crate::error::chain(&e), "cannot advance the job; retrying");
                fresh = false;
                pause(&stop, &mut backoff).await;
                clock.recalibrate().await;
            }
        }
    }
}

/// Pause (or resume) a job cluster-wide: while paused, no instance
/// enqueues its slots. False if the store has never seen the job.
pub async fn set_paused(store: &Store, job: &str, paused: bool) -> Result<bool, Error> {
    validate_name("job name", job)?;
    Ok(store
        .backend()
        .job_set_paused(&crate::store::JobSetPaused { job, paused })
        .await?)
}

/// A job as the store knows it, with its latest run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobStatus {
    /// Cursor and pause flag.
    #[serde(flatten)]
    pub state: crate::store::JobState,
    /// The newest task of this job (its latest run or trigger), if any.
    pub last_run: Option<crate::store::TaskInfo>,
}

/// Every job the store knows, with its latest run.
pub async fn job_statuses(store: &Store) -> Result<Vec<JobStatus>, Error> {
    let b = store.backend();
    let mut out = Vec::new();
    for state in b.job_list().await? {
        let last_run = b
            .task_list(&crate::store::TaskFilter {
                job: Some(state.name.clone()),
                limit: 1,
                ..Default::default()
            })
            .await?
            .pop();
        out.push(JobStatus { state, last_run });
    }
    Ok(out)
}
