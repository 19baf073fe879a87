//! What a handler sees: its [`TaskContext`] (the task, its stop signal and
//! lease) and why it was asked to stop ([`StopReason`]).

use super::*;

/// Why a handler is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The lease was lost: another worker may run (or has run) this attempt's
    /// task. The result will be refused.
    LeaseLost,
    /// Someone cancelled the task.
    Cancelled,
    /// The worker is shutting down; the task is handed back.
    Shutdown,
    /// The attempt's timeout elapsed.
    TimedOut,
    /// No heartbeat confirmed the lease in time (the store is slow or
    /// unreachable): the handler is stopped before the lease can lapse, and
    /// dropped when it would. Treated like [`StopReason::LeaseLost`]:
    /// nothing is written, and the task is rescued after its lease.
    LeaseExpiring,
}

impl StopReason {
    /// The reason as logs write it: `lease_lost`, `cancelled`, `shutdown`,
    /// `timed_out`, `lease_expiring`.
    ///
    /// ```
    /// use baton::queue::worker::StopReason;
    /// assert_eq!(StopReason::Shutdown.as_str(), "shutdown");
    /// assert_eq!(StopReason::LeaseExpiring.to_string(), "lease_expiring");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::LeaseLost => "lease_lost",
            StopReason::Cancelled => "cancelled",
            StopReason::Shutdown => "shutdown",
            StopReason::TimedOut => "timed_out",
            StopReason::LeaseExpiring => "lease_expiring",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a context's progress reports go.
#[derive(Clone)]
pub(super) enum ProgressSink {
    /// A worker's attempt: the store's backend, fenced on the claim.
    Store(Arc<dyn crate::store::Backend>),
    /// A test context ([`TaskContext::for_test`]): kept in order.
    Recorded(Arc<Mutex<Vec<serde_json::Value>>>),
}

/// An attempt's mutable state, shared by its [`TaskContext`]'s clones.
pub(super) struct AttemptState {
    /// Fired when the handler should stop. Here, not on each context
    /// clone: a token's clone and drop lock its node in the token tree.
    pub(super) stop: CancellationToken,
    /// Why the attempt was asked to stop (the first reason wins).
    pub(super) reason: Mutex<Option<StopReason>>,
    /// A command handler's exit code, for the attempt's span and log line.
    pub(super) exit_code: Mutex<Option<i32>>,
    /// The attempt's local lease bound (last confirmed heartbeat's send
    /// time + lease), as the heartbeat loop moves it.
    lease_bound: Mutex<LeaseBound>,
}

/// An attempt's lease bound, and the watch that follows it once someone
/// asked to ([`TaskContext::watch_stop_by`]): made on demand, since most
/// attempts are never watched and a watch channel costs an allocation and
/// a wake-up list per attempt.
struct LeaseBound {
    at: Instant,
    watch: Option<tokio::sync::watch::Sender<Instant>>,
}

impl AttemptState {
    /// A fresh attempt's state, its lease bound `bound`.
    pub(super) fn new(bound: Instant) -> Arc<AttemptState> {
        Arc::new(AttemptState {
            stop: CancellationToken::new(),
            reason: Mutex::new(None),
            exit_code: Mutex::new(None),
            lease_bound: Mutex::new(LeaseBound {
                at: bound,
                watch: None,
            }),
        })
    }

    /// Move the lease bound (a confirmed heartbeat), telling a watcher.
    pub(super) fn set_lease_bound(&self, at: Instant) {
        let mut b = lock(&self.lease_bound);
        b.at = at;
        if let Some(w) = &b.watch {
            w.send_replace(at);
        }
    }

    /// The lease bound now.
    fn lease_bound(&self) -> Instant {
        lock(&self.lease_bound).at
    }

    /// A receiver that follows the lease bound (the watch made on first
    /// use); it sees the sender gone once the attempt's state is dropped.
    fn watch_lease_bound(&self) -> tokio::sync::watch::Receiver<Instant> {
        let mut b = lock(&self.lease_bound);
        let at = b.at;
        b.watch
            .get_or_insert_with(|| tokio::sync::watch::Sender::new(at))
            .subscribe()
    }
}

/// What a handler gets: the task, a stop signal, progress reporting.
#[derive(Clone)]
pub struct TaskContext {
    pub(super) task: Arc<Task>,
    /// Its stop signal, why it was stopped, its exit code and its lease bound: one
    /// allocation per attempt, shared by the context's clones.
    pub(super) state: Arc<AttemptState>,
    /// Where progress goes: the store, or a test context's list.
    pub(super) progress: ProgressSink,
    /// [`crate::lease::stop_margin`] of the queue's lease.
    pub(super) margin: Duration,
}

impl TaskContext {
    /// The task (id, attempt, payload, job and slot for scheduled runs…).
    pub fn task(&self) -> &Task {
        &self.task
    }
    /// The task, shared (for [`WorkerEvent`](crate::queue::WorkerEvent)s).
    pub(crate) fn task_shared(&self) -> Arc<Task> {
        self.task.clone()
    }
    /// The claim this attempt holds.
    pub fn claim(&self) -> Claim {
        self.task.claim()
    }
    /// Resolves when the handler should stop (lease lost, cancelled,
    /// shutdown after the grace period, timeout). After it fires the handler
    /// has the worker's grace period to return before it is dropped.
    pub async fn stopped(&self) {
        self.state.stop.cancelled().await
    }
    /// Whether the handler was asked to stop.
    pub fn is_stopped(&self) -> bool {
        self.state.stop.is_cancelled()
    }
    /// The instant by which this attempt's work must be gone: its local
    /// lease bound (the last confirmed heartbeat's send time + the lease,
    /// moved on by every confirmed heartbeat) less
    /// [`crate::lease::stop_margin`] of the lease. The worker drops the
    /// handler there at the latest; a process run for the task should be
    /// killed by then too, even if this process is frozen (see
    /// [`TaskContext::watch_stop_by`]).
    pub fn stop_by(&self) -> Instant {
        let bound = self.state.lease_bound();
        bound.checked_sub(self.margin).unwrap_or(bound)
    }
    /// Follow [`TaskContext::stop_by`] as heartbeats move it: for a
    /// watchdog outside this process (`baton work` sends each new value to
    /// its command's supervisor, which kills the command there by itself).
    pub fn watch_stop_by(&self) -> crate::lock::StopBy {
        crate::lock::StopBy::new(self.state.watch_lease_bound(), self.margin)
    }
    /// Why the handler was asked to stop, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        lock(&self.state.reason).as_ref().copied()
    }
    /// For handlers that run a process: its exit code, shown on the
    /// attempt's `task ended` line and recorded on its `task` span.
    pub fn set_exit_code(&self, code: i32) {
        *lock(&self.state.exit_code) = Some(code);
    }
    /// A context for running a handler in a test, without a worker or a
    /// store: the task as given (see [`crate::testing::task`]), never
    /// stopped unless [`crate::testing::stop`] stops it, its lease bound an
    /// hour away, its progress reports kept for
    /// [`TaskContext::recorded_progress`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), baton::Error> {
    /// use baton::queue::{TaskBuilder, TaskContext};
    /// let task = baton::testing::task_of(TaskBuilder::new("export", serde_json::json!({"report": 7})))?;
    /// let ctx = TaskContext::for_test(task);
    /// ctx.progress(serde_json::json!({"rows": 10})).await?;
    /// assert_eq!(ctx.recorded_progress(), [serde_json::json!({"rows": 10})]);
    /// assert_eq!(ctx.task().attempt, 1);
    /// # Ok(()) }
    /// ```
    pub fn for_test(task: Task) -> TaskContext {
        let lease = Duration::from_secs(3600);
        TaskContext {
            task: Arc::new(task),
            state: AttemptState::new(Instant::now() + lease),
            progress: ProgressSink::Recorded(Arc::default()),
            margin: crate::lease::stop_margin(lease),
        }
    }

    /// The progress a handler reported on a test context
    /// ([`TaskContext::for_test`]), in order; empty on a worker's (whose
    /// progress is on the task in the store).
    pub fn recorded_progress(&self) -> Vec<serde_json::Value> {
        match &self.progress {
            ProgressSink::Recorded(list) => lock(list).clone(),
            ProgressSink::Store(_) => Vec::new(),
        }
    }

    /// The exit code a handler set ([`TaskContext::set_exit_code`]).
    pub fn exit_code(&self) -> Option<i32> {
        *lock(&self.state.exit_code)
    }

    /// Record progress on the task (any JSON). Fails with
    /// [`Error::LeaseLost`] when the claim is no longer this worker's.
    pub async fn progress(&self, value: serde_json::Value) -> Result<(), Error> {
        let backend = match &self.progress {
            ProgressSink::Store(backend) => backend,
            ProgressSink::Recorded(list) => {
                lock(list).push(value);
                return Ok(());
            }
        };
        if backend
            .task_set_progress(&crate::store::TaskSetProgress {
                claim: self.claim(),
                progress: &value,
            })
            .await?
        {
            Ok(())
        } else {
            Err(Error::LeaseLost(format!("task {}", self.task.id)))
        }
    }
    pub(crate) fn stop_with(&self, why: StopReason) {
        let mut r = lock(&self.state.reason);
        if r.is_none() {
            *r = Some(why);
        }
        drop(r);
        self.state.stop.cancel();
    }
}
