//! The state the worker's services share: the running attempts, the
//! handlers, the store and the signals between them.

use super::*;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(super) use crate::queue::hooks::{AttemptFuture as BoxFut, HandlerFn};

/// A running attempt, as the heartbeat loop sees it.
pub(super) struct Running {
    pub(super) ctx: TaskContext,
    /// Local monotonic bound on the lease: last heartbeat's send time + lease.
    pub(super) deadline: Instant,
    /// False while the task waits in its queue's prefetch buffer.
    pub(super) started: bool,
    /// For a task buffered under a rate or cap per key: the instant its
    /// handler must have started by (the claim's send plus
    /// `store::BUFFER_HOLD`), else it is handed back unstarted.
    pub(super) start_by: Option<Instant>,
}

/// A finished attempt waiting to be written, with where to send the answer.
pub(super) struct Completion {
    pub(super) claim: Claim,
    pub(super) finish: Finish,
    pub(super) reply: Reply,
}

/// Where a [`Completion`]'s answer goes.
pub(super) enum Reply {
    /// To an attempt's task that waits for it.
    Waiter(tokio::sync::oneshot::Sender<Result<bool, crate::StoreError>>),
    /// To the rest of an attempt that did not wait (its task ended when it
    /// handed the result over): ended where the answer comes, with no wake
    /// of a task of its own (see [`super::executor::Ending`]).
    Ending(Box<super::executor::Ending>),
}

impl Reply {
    /// Deliver the answer: whether the result was recorded, or the error.
    pub(super) fn answer(self, r: Result<bool, crate::StoreError>) {
        match self {
            Reply::Waiter(tx) => {
                let _ = tx.send(r);
            }
            Reply::Ending(e) => e.answered(r),
        }
    }
}

pub(super) struct Shared {
    pub(super) completions: tokio::sync::mpsc::UnboundedSender<Completion>,
    /// Results held for the next claim to carry (see [`Ride`]).
    pub(super) ride: Arc<Ride>,
    pub(super) store: Store,
    pub(super) config: WorkerConfig,
    pub(super) id: String,
    pub(super) handlers: crate::fast_hash::FastMap<String, HandlerFn>,
    pub(super) fallback: Option<HandlerFn>,
    /// Retry schedules of kinds that have their own.
    pub(super) backoffs: HashMap<String, super::super::Backoff>,
    pub(super) running: Mutex<crate::fast_hash::FastMap<Claim, Running>>,
    pub(super) stop_claiming: CancellationToken,
    pub(super) drained: Notify,
    pub(super) counters: WorkerCounters,
    /// Retries this worker wrote, with the local instant they fall due.
    pub(super) due: tokio::sync::mpsc::UnboundedSender<(String, Instant)>,
    /// The urgent shutdown request.
    pub(super) urgent: CancellationToken,
    /// Fired when shutdown gives up on attempts that could not finish in
    /// time: their handlers are dropped and nothing more is written.
    pub(super) abandon: CancellationToken,
    /// Where [`WorkerEvent`]s go ([`Worker::subscribe`]).
    pub(super) events: tokio::sync::broadcast::Sender<WorkerEvent>,
    /// The overlap policies of the jobs whose runs this worker ended:
    /// whether a run's end may start a waiting slot.
    pub(super) waiting_jobs: crate::store::WaitingJobs,
    /// The throughput counts not yet flushed to the store.
    pub(super) rollup: super::rollup::Rollup,
}

impl Shared {
    /// The delay before retrying `task` after its failed attempt: its
    /// kind's backoff, else the worker's.
    pub(super) fn retry_delay(&self, task: &Task) -> Duration {
        self.backoffs
            .get(&task.kind)
            .unwrap_or(&self.config.backoff)
            .delay(task.attempt)
    }

    /// An upkeep store call, counted on the store: the ticker skips a
    /// poll for each, so an idle worker stays at one store call per poll
    /// interval.
    pub(super) async fn upkeep<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.store.note_upkeep(1);
        call.await
    }

    /// The local bound on a running attempt's lease, if it still runs.
    pub(super) fn deadline(&self, claim: Claim) -> Option<Instant> {
        lock(&self.running).get(&claim).map(|r| r.deadline)
    }

    /// The instant a buffered attempt's handler must start by, if held
    /// to one ([`Running::start_by`]).
    pub(super) fn start_by(&self, claim: Claim) -> Option<Instant> {
        lock(&self.running).get(&claim).and_then(|r| r.start_by)
    }

    /// How long before its lease's end an unconfirmed attempt is stopped.
    pub(super) fn guard(&self) -> Duration {
        self.config.stop_grace.min(self.config.lease / 3)
    }

    /// Resolves `before` the attempt's lease ends (its deadline, moved on by
    /// every confirmed heartbeat).
    pub(super) async fn lease_end(&self, claim: Claim, before: Duration) {
        loop {
            let Some(deadline) = self.deadline(claim) else {
                return std::future::pending().await;
            };
            let at = deadline.checked_sub(before).unwrap_or(deadline);
            if Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }
}
