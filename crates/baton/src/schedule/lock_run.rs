//! Lock mode: a slot the scheduler runs in-process under the job's lease
//! lock (ShedLock's behaviour), its run record (heartbeated, finished with
//! the outcome), and the fixed-delay loop whose cursor holds when the last
//! run ended.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::job::{Job, JobMode};
use super::scheduler::{pause, read_cursor, StoreClock};
use crate::error::Error;
use crate::lock::{LeaseHandle, LockOptions, Locker};
use crate::queue::{TaskAction, TaskError};
use crate::store::{
    Advanced, Claim, DefinitionSource, Finish, Heartbeat, JobAdvance, SlotRecord, Store,
};

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
    exit_code: Arc<std::sync::Mutex<Option<i32>>>,
}

impl SlotRun {
    /// Record the exit code of the process this run ran, for its `run
    /// ended` log line (as [`TaskContext::set_exit_code`](crate::queue::TaskContext::set_exit_code)
    /// does for a task).
    pub fn set_exit_code(&self, code: i32) {
        if let Ok(mut c) = self.exit_code.lock() {
            *c = Some(code);
        }
    }
}

pub(super) type SlotFut = Pin<Box<dyn Future<Output = Result<(), TaskError>> + Send>>;
pub(super) type SlotFn = Arc<dyn Fn(SlotRun) -> SlotFut + Send + Sync>;

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
pub(super) struct LockRun {
    pub(super) f: SlotFn,
    pub(super) opts: LockOptions,
    pub(super) locker: Locker,
    pub(super) worker: String,
}

impl LockRun {
    pub(super) fn new(store: &Store, job: &Job, f: SlotFn) -> Option<LockRun> {
        let JobMode::Lock { at_most, at_least } = job.mode else {
            return None;
        };
        let opts = LockOptions::new(at_most).at_least(at_least);
        match opts.validate() {
            Ok(()) => Some(LockRun {
                f,
                opts,
                locker: Locker::new(store.clone()),
                worker: format!("{LOCK_RUN_WORKER}{}", crate::node::node_id()),
            }),
            Err(e) => {
                tracing::error!(job = %job.name, error = %crate::error::chain(&e), "bad lock options");
                None
            }
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

pub(super) async fn run_locked(
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
    // The slot's own offset, the same on every instance; counted from
    // now, which is at the slot or after it.
    tokio::time::sleep(job.jitter_at(slot)).await;
    let lease = l.opts.at_most_duration();
    let name = job.name.clone();
    let f = l.f.clone();
    let exit_code = Arc::new(std::sync::Mutex::new(None));
    let exit_seen = exit_code.clone();
    let started = tokio::time::Instant::now();
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
                exit_code,
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
                    tracing::warn!(job = %job.name, slot = %crate::format_time(slot), task = id, "the run's record was rescued (its lease lapsed); the lock still guards the run");
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
    let (finish, outcome) = match r {
        Ok(Some(Ok(()))) => (Finish::Succeeded, "succeeded"),
        Ok(Some(Err(e))) if e.action() == TaskAction::Cancel => (
            Finish::Cancelled {
                reason: e.message().to_string(),
            },
            "cancelled",
        ),
        Ok(Some(Err(e))) => {
            let error = match e.action() {
                TaskAction::Snooze { .. } => {
                    format!("{e} (a lock-mode run is not run again; it failed)")
                }
                _ => e.message().to_string(),
            };
            (
                Finish::Failed {
                    error,
                    retry_in: None,
                },
                "failed",
            )
        }
        Ok(None) => (
            Finish::Cancelled {
                reason: LOCK_BUSY.into(),
            },
            "skipped",
        ),
        Err(e) => (
            Finish::Failed {
                error: e.to_string(),
                retry_in: None,
            },
            "failed",
        ),
    };
    // One line per run, as a task's `task ended`: the outcome, how long it
    // took, the exit code of what it ran, and why it did not succeed.
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let exit_code = exit_seen.lock().ok().and_then(|c| *c);
    let slot_at = crate::format_time(slot);
    match &finish {
        Finish::Succeeded => {
            tracing::info!(job = %job.name, slot = %slot_at, task = id, outcome, duration_ms, exit_code, "run ended")
        }
        Finish::Cancelled { reason } => {
            tracing::info!(job = %job.name, slot = %slot_at, task = id, outcome, duration_ms, exit_code, reason = %reason, "run ended")
        }
        Finish::Failed { error, .. } => {
            tracing::warn!(job = %job.name, slot = %slot_at, task = id, outcome, duration_ms, exit_code, error = %error, "run ended")
        }
        _ => {}
    }
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
                    crate::store::warn_unless_read_only!(e, job = %job.name, slot = %crate::format_time(slot), error = %crate::error::chain(&e), "cannot record the run's outcome; retrying");
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
            tracing::warn!(job = %job.name, slot = %crate::format_time(slot), task = id, "shutting down before the run's outcome could be recorded (the store does not answer); its record fails with \"lease expired\" once its lease lapses");
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

/// A fixed-delay lock-mode job: the cursor holds when the last run ended
/// (or started, while it runs); a run is taken with a compare-and-set to
/// `cursor + delay`, refused by the store before that instant.
pub(super) async fn fixed_delay_loop(
    store: Store,
    clock: StoreClock,
    job: Job,
    l: LockRun,
    delay: Duration,
    source: Option<DefinitionSource>,
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
            source,
            ..JobAdvance::new(&job.name, cursor, target, Some(&task))
        };
        match b.job_advance(&adv).await {
            Ok(Advanced::Enqueued(e) | Advanced::Skipped(e) | Advanced::Waiting(e)) => {
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
            Ok(Advanced::Superseded) => {
                // Another definition governs the run: wait for the reload
                // to stop this loop.
                tracing::debug!(job = %job.name, "another definition of the job governs its next run; waiting for the reload");
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
