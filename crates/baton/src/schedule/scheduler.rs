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
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(super) use super::job::random_upto;
pub use super::job::{Job, JobMode, DEFAULT_LEAD};
use super::lock_run::{fixed_delay_loop, run_locked, LockRun, SlotFn, SlotFut};
pub use super::lock_run::{is_lock_run_record, SlotRun, LOCK_BUSY};
use super::plan::{CatchUp, Planner};
use super::reload::Definitions;
pub use super::slots::{
    latest_slot, run_skipped, slot_report, trigger, trigger_slot, trigger_with, SlotOutcome,
    SlotReport,
};
pub use super::status::{job_state, job_statuses, set_paused, set_paused_with, JobStatus};
use crate::error::{Error, InvalidInput};
use crate::store::{Advanced, DefinitionSource, JobAdvance, SlotRecord, Store, IDENTITY_CHECK};

pub use crate::clock::StoreClock;

/// Runs jobs' slots. See the module docs.
pub struct Scheduler {
    store: Store,
    jobs: Vec<(Job, Option<SlotFn>)>,
    /// Also run the definitions kept in the store (see
    /// [`Scheduler::definitions`]).
    defs: Option<Definitions>,
}

impl Scheduler {
    /// A scheduler with no jobs.
    pub fn new(store: Store) -> Scheduler {
        Scheduler {
            store,
            jobs: Vec::new(),
            defs: None,
        }
    }

    /// Also run the jobs whose definitions are kept in the store
    /// ([`definitions`](super::definitions)): when a definitions write is
    /// announced on the store's wake-up channel (PostgreSQL's `NOTIFY`,
    /// Redis pub/sub; on SQLite and MySQL writes through this process),
    /// and on a timer — [`RELOAD_EVERY`] plus a little jitter, or 30 s
    /// where announcements reach every process — the scheduler reads the
    /// store's definition counter and, when it moved, the definitions,
    /// turns each new version into a [`Job`] with `decode`, and runs
    /// exactly the store's jobs plus those added here whose names the
    /// store does not define (the store's definition wins; a job added
    /// here comes back when the store's is deleted). A changed definition
    /// applies from its job's next slot: the job's cursor is kept, and no
    /// slot before the change's store time runs under it (DESIGN.md D2). A
    /// deleted one stops (a run in progress finishes). A definition
    /// `decode` refuses, or a lock-mode one, is logged once per version as
    /// an error and does not run.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// use baton::schedule::{Job, Schedule, Scheduler};
    /// let store = baton::Store::connect("sqlite://app.db").await?;
    /// let mut s = Scheduler::new(store.clone());
    /// s.definitions(|def| {
    ///     let every = def.spec["every_secs"].as_u64().unwrap_or(60);
    ///     let schedule = Schedule::every(std::time::Duration::from_secs(every))?;
    ///     Ok(Job::new(def.name.clone(), schedule).kind("report"))
    /// });
    /// s.run(tokio_util::sync::CancellationToken::new()).await?;
    /// # Ok(()) }
    /// ```
    pub fn definitions<F>(&mut self, decode: F) -> &mut Self
    where
        F: Fn(&crate::store::JobDef) -> Result<Job, InvalidInput> + Send + Sync + 'static,
    {
        self.defs = Some(Definitions {
            decode: Arc::new(decode),
            every: RELOAD_EVERY,
        });
        self
    }

    /// How often the definitions are read again on the timer (default
    /// [`RELOAD_EVERY`]); only with [`Scheduler::definitions`]. Where the
    /// store announces definition writes to every process (PostgreSQL with
    /// its `LISTEN`, Redis) a write is read at once and the timer is only a
    /// safety net: at least 30 s, whatever is set here.
    pub fn definitions_every(&mut self, every: Duration) -> &mut Self {
        if let Some(d) = &mut self.defs {
            d.every = every.max(Duration::from_millis(100));
        }
        self
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
    /// `f` returns the handlers' [`TaskError`](crate::queue::TaskError). A
    /// lock-mode run is one slot's run, never retried: an error records the
    /// run as `failed` with its message, except
    /// [`TaskError::cancel`](crate::queue::TaskError::cancel), which records
    /// it `cancelled` with its reason (a snooze is a failure here, saying so).
    pub fn add_locked<F, Fut>(&mut self, job: Job, f: F) -> Result<&mut Self, InvalidInput>
    where
        F: Fn(SlotRun) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), crate::queue::TaskError>> + Send + 'static,
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
    ///
    /// The store's clock is read first; while it cannot be (the store is
    /// down, stalls, or this process is out of file descriptors), the
    /// scheduler logs it and tries again, each second, until it can or
    /// `shutdown` fires (then it returns at once, `Ok`).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Some(clock) = calibrated(&self.store, &shutdown).await else {
            return Ok(());
        };
        let mut set = tokio::task::JoinSet::new();
        match self.defs {
            Some(defs) => {
                set.spawn(super::reload::run(
                    self.store.clone(),
                    clock.clone(),
                    self.jobs,
                    defs,
                    shutdown.clone(),
                ));
            }
            None => {
                for (job, f) in self.jobs {
                    let (store, clock) = (self.store.clone(), clock.clone());
                    if let Some(run) = job_loops(store, clock, job, f, None, shutdown.clone()) {
                        set.spawn(run);
                    }
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

/// How long a scheduler waits before reading the store's clock again
/// after it could not ([`Scheduler::run`]'s start).
const CALIBRATION_RETRY: Duration = Duration::from_secs(1);

/// The store's clock, read again each [`CALIBRATION_RETRY`] until a
/// reading succeeds; `None` once `stop` fires first.
async fn calibrated(store: &Store, stop: &CancellationToken) -> Option<StoreClock> {
    loop {
        let read = tokio::select! {
            c = StoreClock::new(store.clone()) => c,
            _ = stop.cancelled() => return None,
        };
        match read {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::warn!(error = %crate::error::chain(&e), "scheduler: reading the store's clock failed; retrying in 1s");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(CALIBRATION_RETRY) => {}
            _ = stop.cancelled() => return None,
        }
    }
}

/// How often a scheduler with [`Scheduler::definitions`] reads the
/// store's definition counter (plus up to 400 ms of jitter) where writes
/// are not announced across processes (SQLite, MySQL, PostgreSQL behind a
/// transaction pooler without a direct `LISTEN` connection).
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// The loops that run one job until `stop` fires: its slots (durable, on
/// a schedule under a lock, or a fixed-delay loop) and, for a durable job
/// whose overlap policy may leave a slot waiting, the poll that starts
/// it. `None` for a lock-mode job without valid lease bounds (logged).
pub(super) fn job_loops(
    store: Store,
    clock: StoreClock,
    job: Job,
    f: Option<SlotFn>,
    source: Option<DefinitionSource>,
    stop: CancellationToken,
) -> Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> {
    Some(match f {
        None => {
            let release = job
                .overlap
                .may_wait()
                .then(|| release_loop(store.clone(), job.name.clone(), stop.clone()));
            let slots = slot_loop(store, clock, job, None, source, stop);
            Box::pin(async move {
                match release {
                    Some(r) => {
                        tokio::join!(r, slots);
                    }
                    None => slots.await,
                }
            })
        }
        Some(f) => {
            let l = LockRun::new(&store, &job, f)?;
            match job.fixed_delay {
                Some(d) => Box::pin(fixed_delay_loop(store, clock, job, l, d, source, stop)),
                None => Box::pin(slot_loop(store, clock, job, Some(l), source, stop)),
            }
        }
    })
}

/// How often a scheduler asks the store to start a job's waiting slot
/// (overlap `buffer_one`, `buffer_all`, `cancel_other`), plus up to
/// [`BEAT_JITTER`]. The worker that ends a slot's run asks at once; this
/// poll covers a run ended otherwise (rescued, cancelled while pending,
/// its worker gone before it asked).
const RELEASE_POLL: Duration = Duration::from_secs(1);

/// Start a job's waiting slots as the runs before them finish, until
/// `stop` fires (every instance runs it; the store decides once).
async fn release_loop(store: Store, job: String, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RELEASE_POLL + random_upto(BEAT_JITTER)) => {}
            _ = stop.cancelled() => return,
        }
        crate::store::release_waiting(&store, &job).await;
    }
}

/// How often a scheduler reads the store's clock again.
const RECALIBRATION: Duration = Duration::from_secs(30);

/// Up to this much is added to each background period, so that those
/// calls drift off the beat of a worker's polls.
pub(super) const BEAT_JITTER: Duration = Duration::from_millis(400);

/// The loop of a durable job, or of a lock-mode job on a cron/interval
/// schedule (`lock` set). Each round re-plans from the cursor and the
/// store-clock estimate ([`Planner::plan`], which decides without a
/// store); every advance is checked against the store's own clock
/// (`due_only`, and `until` the next slot when only the latest slot may
/// run), so a stale plan is refused and re-made, never acted on.
async fn slot_loop(
    store: Store,
    clock: StoreClock,
    job: Job,
    lock: Option<LockRun>,
    source: Option<DefinitionSource>,
    stop: CancellationToken,
) {
    const MAX_WAIT: Duration = Duration::from_secs(1);
    let b = store.backend();
    let mut backoff = Duration::from_millis(100);
    let mut cursor: Option<DateTime<Utc>> = None;
    // The cursor was read from the store since the last error.
    let mut fresh = false;
    let mut recalibrate = false;
    let mut catch_up: Option<CatchUp> = None;
    // Lock mode runs slots from its start on (no catch-up, like ShedLock),
    // only the latest when it is late.
    let planner = match lock {
        Some(_) => Planner::locked(&job, clock.now()),
        None => Planner::durable(&job),
    };
    let mut last_rescue: Option<Instant> = None;
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
        let round = planner.plan(cursor, clock.now(), catch_up);
        catch_up = round.catch_up;
        for step in &round.steps {
            let slot = step.slot;
            let task = match job.task(slot, false) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!(job = %job.name, error = %crate::error::chain(&e), "cannot build the slot's task");
                    return;
                }
            };
            let record = match (&step.skip, &lock) {
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
                batch_after: round.batch_after,
                // An early slot is refused before `slot - lead` by the
                // store's clock; `until` still bounds it.
                due_only: !step.early,
                until: step.until,
                not_before: step.not_before,
                source,
                ..JobAdvance::new(&job.name, cursor, slot, Some(&task))
            };
            if step.early {
                // Every instance takes the same slot: make the losers cheap.
                // Each waits a random part of the lead, then reads the
                // cursor; one that finds it moved learns it without a
                // compare-and-set. The first of N instances comes about
                // lead / N in, so the slot's task is still queued ahead of
                // the slot, and only those that read before its commit
                // race it (the CAS stays the only judge: a failed read
                // just goes on to it).
                tokio::select! {
                    _ = tokio::time::sleep(random_upto(planner.early_spread(slot))) => {}
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
                    if let Some(reason) = &step.skip {
                        tracing::info!(job = %job.name, slot = %crate::format_time(slot), task = e.id, %reason, "missed slots recorded as skipped");
                    } else if let Some(l) = &lock {
                        if e.inserted {
                            run_locked(b, l, &job, slot, e.id, None, &stop).await;
                        } else {
                            tracing::debug!(job = %job.name, slot = %crate::format_time(slot), "the slot already has a run");
                        }
                    } else {
                        tracing::info!(job = %job.name, slot = %crate::format_time(slot), task = e.id, new = e.inserted, "slot enqueued");
                    }
                }
                Ok(Advanced::Skipped(e)) => {
                    tracing::info!(job = %job.name, slot = %crate::format_time(slot), task = e.id, overlap = %job.overlap, "slot skipped: previous run unfinished");
                    cursor = Some(slot);
                }
                Ok(Advanced::Waiting(e)) => {
                    tracing::info!(job = %job.name, slot = %crate::format_time(slot), task = e.id, overlap = %job.overlap, "slot waiting for the previous run");
                    cursor = Some(slot);
                }
                Ok(Advanced::Moved(c)) => {
                    // Another instance got there first: learn its cursor.
                    cursor = c;
                    continue 'outer;
                }
                Ok(Advanced::NotDue { now }) => {
                    let retry = step.after_not_due(now);
                    if retry.recalibrate {
                        // The clock estimate is ahead, or the plan went
                        // stale (the store passed the next slot).
                        tracing::debug!(job = %job.name, slot = %crate::format_time(slot), store_now = %crate::format_time(now), "slot not due by store time; re-planning");
                        recalibrate = true;
                    } else {
                        tracing::debug!(job = %job.name, slot = %crate::format_time(slot), "previous run unfinished; judging the slot when it comes");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(retry.wait.min(MAX_WAIT)) => {}
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
                Ok(Advanced::Superseded) => {
                    // Another definition in the store governs the slot:
                    // this loop's is out of date, and the reload stops it
                    // when it reads the change.
                    tracing::debug!(job = %job.name, slot = %crate::format_time(slot), "another definition of the job governs this slot; waiting for the reload");
                    tokio::select! {
                        _ = tokio::time::sleep(MAX_WAIT) => {}
                        _ = stop.cancelled() => return,
                    }
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
        let next = planner.wake_at(cursor, clock.now());
        tokio::select! {
            _ = clock.sleep_until(next, MAX_WAIT) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Register the job (if new; its queue recorded either way) and read its
/// cursor; `None` after a store error (logged, and `backoff` waited), so
/// the caller tries again.
pub(super) async fn read_cursor(
    b: &dyn crate::store::Backend,
    job: &Job,
    stop: &CancellationToken,
    backoff: &mut Duration,
) -> Option<Option<DateTime<Utc>>> {
    let fingerprint = job.fingerprint();
    note_other_definition(b, job, &fingerprint).await;
    let reg = crate::store::JobRegister::new(&job.name)
        .queue(&job.queue)
        .overlap(job.overlap)
        .fingerprint(&fingerprint);
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

/// Warn when the job's record holds another instance's fingerprint of it:
/// two instances define the job two ways (e.g. config files that differ),
/// and its slots run whichever way the instance that takes each one says.
async fn note_other_definition(b: &dyn crate::store::Backend, job: &Job, mine: &str) {
    if let Ok(Some(st)) = b.job_get(&job.name).await {
        if let Some(theirs) = st.fingerprint.filter(|f| f != mine) {
            tracing::warn!(job = %job.name, registered = %theirs, this_instance = %mine, "another instance registered a different definition of this job; its slots run whichever way the instance taking each says: make the definitions agree, or define the job in the store");
        }
    }
}

pub(super) async fn pause(stop: &CancellationToken, backoff: &mut Duration) {
    tokio::select! {
        _ = tokio::time::sleep(*backoff) => {}
        _ = stop.cancelled() => {}
    }
    *backoff = (*backoff * 2).min(Duration::from_secs(5));
}
