//! Running an attempt: the handler in its span, stopped before its lease
//! could lapse, and its outcome turned into a [`Finish`].

use futures_util::FutureExt as _;

use super::rollup::millis;
use super::*;

/// Run a registered attempt in `slot`; `sent` is when its duration starts.
pub(super) fn start_task(shared: Arc<Shared>, ctx: TaskContext, sent: Instant, mut slot: Slot) {
    let claim = ctx.claim();
    if let Some(r) = lock(&shared.running).get_mut(&claim) {
        r.started = true;
    }
    let task = ctx.task();
    let queue = task.queue.as_str();
    shared.counters.started(queue);
    // The slot's lag: from the slot task's due time (the slot plus its
    // jitter; a trigger's or a retry's own time) to this claim, by the
    // store's clock (the claim set the lease to end `lease` after its own
    // now). A slot triggered long after it was due is not late.
    let claimed_at =
        task.lease_until - chrono::Duration::from_std(shared.config.lease).unwrap_or_default();
    let wait = (claimed_at - task.run_at).to_std().unwrap_or_default();
    let claimed_ms = claimed_at.timestamp_millis();
    shared.rollup.started(
        super::rollup::Series::of(queue, task),
        claimed_ms,
        millis(wait),
    );
    let lag = task.slot.map(|_| wait);
    if let (Some(lag), Some(slot)) = (lag, task.slot) {
        let on_time = crate::queue::counters::on_time(slot, task.run_at);
        shared.counters.slot_lag(queue, lag, on_time);
    }
    let slot_at = task.slot.map(crate::format_time);
    let span = tracing::info_span!(
        "task",
        id = task.id,
        queue = %task.queue,
        kind = %task.kind,
        attempt = task.attempt,
        job = task.job.as_deref(),
        slot = slot_at.as_deref(),
        traceparent = task.traceparent.as_deref(),
        outcome = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
        exit_code = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(tp) = &task.traceparent {
        crate::queue::trace::link(&span, tp);
    }
    tracing::info!(
        task = task.id,
        worker = %shared.id,
        queue = %task.queue,
        kind = %task.kind,
        attempt = task.attempt,
        max_attempts = task.max_attempts,
        job = task.job.as_deref(),
        slot = slot_at.as_deref(),
        slot_lag_ms = lag.map(ms),
        "task started"
    );
    let _ = shared.events.send(WorkerEvent::AttemptStarted {
        task: ctx.task_shared(),
    });
    // Boxed: the attempt's future is large (the handler's, the result's
    // write with its retries, the release), and tokio moves a spawned
    // future into its task cell and writes the output over it; a box
    // makes those moves a pointer's (a memcpy of the whole future was
    // ~6 % of a busy worker's CPU, docs/BENCHMARKS.md session 37).
    let end = End {
        shared,
        ctx,
        span,
        sent,
        claimed_ms,
    };
    tokio::spawn(Box::pin(async move {
        let attempt = {
            let (shared, ctx) = (end.shared.clone(), end.ctx.clone());
            async move {
                let result = execute(&shared, ctx.clone()).await;
                let error = match &result {
                    Some(Finish::Failed { error, .. }) => Some(error.clone()),
                    _ => None,
                };
                // A retry (or a snooze) we write falls due `retry_in` after
                // the store's now at the write, which is no later than our
                // now when the write returns.
                let retry_in = match &result {
                    Some(Finish::Failed {
                        retry_in: Some(d), ..
                    }) if ctx.task().attempt < ctx.task().max_attempts => Some(*d),
                    Some(Finish::Snoozed { run_in }) => Some(*run_in),
                    _ => None,
                };
                if result.is_some() {
                    slot.handler_returned();
                }
                let Some(finish) = result else {
                    return Attempted::Ended(Outcome::Lost, retry_in, error, Some(slot));
                };
                if ctx.task().job.is_none() {
                    // Nothing left to await after the write: hand the
                    // result over and end here; the completer ends the
                    // attempt where the write is answered.
                    return Attempted::HandedOff(finish, retry_in, error, slot);
                }
                let outcome = if finish_with_retries(&shared, claim, &finish).await {
                    outcome_of(&finish)
                } else {
                    Outcome::Lost
                };
                Attempted::Ended(outcome, retry_in, error, Some(slot))
            }
            .instrument(end.span.clone())
        };
        let attempted = tokio::select! {
            biased;
            o = attempt => o,
            _ = end.shared.abandon.cancelled() => Attempted::Ended(Outcome::Lost, None, None, None),
        };
        match attempted {
            Attempted::HandedOff(finish, retry_in, error, slot) => {
                let ending = Ending {
                    parts: Some(EndingParts {
                        end,
                        slot,
                        retry_in,
                        error,
                        finish,
                    }),
                };
                ending.hand_off(claim);
            }
            Attempted::Ended(outcome, retry_in, error, slot) => {
                if let (Some(job), true) = (&end.ctx.task().job, outcome != Outcome::Lost) {
                    // A slot's run ended: a later slot of its job may be
                    // waiting for it (overlap buffer_one, buffer_all,
                    // cancel_other); the store starts it only if no run of
                    // the job is left unfinished. Awaited (one store call,
                    // only for jobs whose policy may leave a slot waiting)
                    // before the attempt counts as ended, so a worker
                    // shutting down right after the run does not drop the
                    // release: with no scheduler left to poll, the slot
                    // would wait forever (found by `baton chaos`, S2's
                    // jobs). Bounded: a store that does not answer in time
                    // leaves the release to the schedulers' poll, not the
                    // stop to wait.
                    let release = end.shared.waiting_jobs.release(&end.shared.store, job);
                    let _ = tokio::time::timeout(RELEASE_WAIT, release).await;
                }
                end.finish(slot, outcome, retry_in, error);
            }
        }
    }));
}

/// The outcome of an attempt whose result `finish` was recorded.
fn outcome_of(finish: &Finish) -> Outcome {
    match finish {
        Finish::Succeeded => Outcome::Succeeded,
        Finish::Failed { .. } => Outcome::Failed,
        Finish::Cancelled { .. } => Outcome::Cancelled,
        Finish::HandBack => Outcome::HandedBack,
        Finish::Snoozed { .. } => Outcome::Snoozed,
    }
}

/// How an attempt's task left it.
enum Attempted {
    /// Its result is to be written by the completer, which ends it
    /// ([`Ending`]).
    HandedOff(Finish, Option<Duration>, Option<String>, Slot),
    /// Its outcome is known (the result written, refused or lost), with
    /// the retry's delay, the error, and the slot (`None` once dropped).
    Ended(Outcome, Option<Duration>, Option<String>, Option<Slot>),
}

/// What ending an attempt needs once its outcome is known.
pub(super) struct End {
    shared: Arc<Shared>,
    ctx: TaskContext,
    span: tracing::Span,
    /// When its duration started.
    sent: Instant,
    /// When the store claimed it (ms, the store's clock).
    claimed_ms: i64,
}

impl End {
    /// The attempt ended with `outcome`: say so (log, span, counters,
    /// rollup, events), leave the running set and free the slot.
    fn finish(
        self,
        slot: Option<Slot>,
        outcome: Outcome,
        retry_in: Option<Duration>,
        error: Option<String>,
    ) {
        let End {
            shared,
            ctx,
            span,
            sent,
            claimed_ms,
        } = self;
        let claim = ctx.claim();
        let t = ctx.task();
        let queue = t.queue.as_str();
        if let (Some(d), Outcome::Failed | Outcome::Snoozed) = (retry_in, &outcome) {
            let _ = shared.due.send((queue.to_string(), Instant::now() + d));
        }
        if outcome != Outcome::Lost && shared.config.capped(queue) {
            // Under a cap (whole queue or per key) the store now counts one
            // running task less (a retry or a snooze too: it is pending
            // again): a task waiting on this one's place can start, so
            // claim now rather than at the next poll (a slot freed when
            // the handler returned was claimed for before the store had
            // the result).
            let _ = shared.due.send((queue.to_string(), Instant::now()));
        }
        let took = sent.elapsed();
        let exit_code = *lock(&ctx.state.exit_code);
        span.record("outcome", outcome.as_str());
        span.record("duration_ms", ms(took));
        if let Some(code) = exit_code {
            span.record("exit_code", code);
        }
        drop(span);
        macro_rules! ended {
            ($level:ident) => {
                tracing::$level!(
                    task = t.id,
                    worker = %shared.id,
                    queue = %t.queue,
                    kind = %t.kind,
                    attempt = t.attempt,
                    outcome = outcome.as_str(),
                    duration_ms = ms(took),
                    exit_code,
                    error = error.as_deref(),
                    retry_in_ms = retry_in.map(ms),
                    "task ended"
                )
            };
        }
        match outcome {
            Outcome::Succeeded | Outcome::Cancelled | Outcome::HandedBack | Outcome::Snoozed => {
                ended!(info)
            }
            Outcome::Failed | Outcome::Lost => ended!(warn),
        }
        if outcome == Outcome::Lost {
            shared.counters.lease_lost(queue);
        }
        shared.counters.ended(queue, outcome, took);
        shared.rollup.ended(&super::rollup::Ended {
            series: super::rollup::Series::of(queue, t),
            outcome,
            dead: outcome == Outcome::Failed && retry_in.is_none(),
            at_ms: claimed_ms.saturating_add(millis(took)),
            run_ms: millis(took),
        });
        let _ = shared.events.send(WorkerEvent::AttemptEnded {
            task: ctx.task_shared(),
            outcome,
            duration: took,
            error,
        });
        lock(&shared.running).remove(&claim);
        drop(slot);
        shared.drained.notify_waiters();
    }
}

/// The rest of an attempt whose task handed its result to the completer
/// and ended: it ends where the write is answered ([`Reply::Ending`]),
/// with no task of its own to wake for it.
pub(super) struct Ending {
    /// `None` once ended.
    parts: Option<EndingParts>,
}

struct EndingParts {
    end: End,
    slot: Slot,
    retry_in: Option<Duration>,
    error: Option<String>,
    /// The result being written (kept for a retry after a failed write).
    finish: Finish,
}

impl Ending {
    /// Send the result to the completer, unless the lease already ended.
    fn hand_off(self, claim: Claim) {
        let Some(p) = &self.parts else { return };
        let (shared, finish) = (p.end.shared.clone(), p.finish.clone());
        if super::completer::write_deadline(&shared, claim).is_none() {
            return self.end_as(Outcome::Lost);
        }
        let sent = shared.completions.send(Completion {
            claim,
            finish,
            reply: Reply::Ending(Box::new(self)),
        });
        if let Err(unsent) = sent {
            // The completer is gone (shutdown): the write waits in a task
            // (`finish_with_retries` writes directly then).
            if let Reply::Ending(ending) = unsent.0.reply {
                ending.retry(None);
            }
        }
    }

    /// The completer's answer for the result.
    pub(super) fn answered(self: Box<Self>, r: Result<bool, StoreError>) {
        match r {
            Ok(true) => {
                let outcome = self
                    .parts
                    .as_ref()
                    .map_or(Outcome::Lost, |p| outcome_of(&p.finish));
                self.end_as(outcome);
            }
            Ok(false) => {
                if let Some(p) = &self.parts {
                    let claim = p.end.ctx.claim();
                    tracing::warn!(
                        task = claim.id,
                        attempt = claim.attempt,
                        "result refused: the claim was lost"
                    );
                }
                self.end_as(Outcome::Lost);
            }
            // Rare (the store failed the batch): the retries wait in a
            // task of their own.
            Err(e) => self.retry(Some(e)),
        }
    }

    /// Write the result again from a task of its own (after the error
    /// `e` of the first write, if any), then end.
    fn retry(mut self: Box<Self>, e: Option<StoreError>) {
        if let Some(p) = self.parts.take() {
            write_again(p, e);
        }
    }

    /// End the attempt with `outcome`.
    fn end_as(mut self, outcome: Outcome) {
        if let Some(p) = self.parts.take() {
            p.end.finish(Some(p.slot), outcome, p.retry_in, p.error);
        }
    }
}

/// Dropped unanswered (a claim that carried the result was aborted, the
/// completer stopped): the result is written from a task of its own, as a
/// waiting attempt would have.
impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(p) = self.parts.take() {
            write_again(p, None);
        }
    }
}

/// Write an attempt's result again from a task of its own (after the
/// error `e` of its first write, if any; the completer's, or directly
/// when it is gone), then end it. Once the worker abandoned its attempts,
/// or with no runtime left, it ends as lost (the task is rescued).
fn write_again(p: EndingParts, e: Option<StoreError>) {
    let rt = tokio::runtime::Handle::try_current();
    let Some(rt) = rt.ok().filter(|_| !p.end.shared.abandon.is_cancelled()) else {
        // Abandoned (a shutdown the store did not answer in time) or no
        // runtime left: nothing more is written; the task is rescued.
        return p
            .end
            .finish(Some(p.slot), Outcome::Lost, p.retry_in, p.error);
    };
    rt.spawn(async move {
        let shared = p.end.shared.clone();
        let claim = p.end.ctx.claim();
        let written = match &e {
            Some(e) => super::completer::finish_after_error(&shared, claim, &p.finish, e).await,
            None => finish_with_retries(&shared, claim, &p.finish).await,
        };
        let outcome = if written {
            outcome_of(&p.finish)
        } else {
            Outcome::Lost
        };
        p.end.finish(Some(p.slot), outcome, p.retry_in, p.error);
    });
}

/// How long an ending slot's run waits for the release of its job's
/// waiting slot before leaving it to the schedulers' poll.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Sends of a hand-back that fails with an error worth retrying (the
/// store briefly unavailable, a deadlock victim) before its tasks are
/// left to the rescue, which counts their attempt.
const HAND_BACK_SENDS: u32 = 3;

/// Hand claimed tasks back unstarted (the attempt is not counted), in one
/// call, sent again (up to [`HAND_BACK_SENDS`] in all, 100 ms apart and
/// more) while the store answers with a retryable error: a compare-and-set,
/// so a send whose answer was lost is refused the second time, nothing
/// more. A task that cannot be handed back is rescued after its lease.
pub(super) async fn hand_back(shared: &Shared, tasks: &[Task]) {
    if tasks.is_empty() {
        return;
    }
    let items: Vec<(Claim, Finish)> = tasks
        .iter()
        .map(|t| (t.claim(), Finish::HandBack))
        .collect();
    let mut sends = 1;
    loop {
        match shared.store.task_finish_many(&items).await {
            Ok(answers) => {
                for (task, ok) in tasks.iter().zip(answers) {
                    if ok {
                        tracing::info!(task = task.id, queue = %task.queue, attempt = task.attempt, "task handed back unstarted")
                    } else {
                        tracing::warn!(task = task.id, queue = %task.queue, attempt = task.attempt, "handing the task back was refused: its claim was lost")
                    }
                }
                return;
            }
            Err(e) => {
                shared.counters.store_error("task_finish_many");
                if sends < HAND_BACK_SENDS && e.is_retryable() {
                    tracing::debug!(tasks = tasks.len(), error = %crate::error::chain(&e), "handing tasks back failed; trying again");
                    tokio::time::sleep(Duration::from_millis(100) * sends).await;
                    sends += 1;
                    continue;
                }
                tracing::warn!(tasks = tasks.len(), error = %crate::error::chain(&e), "handing tasks back failed; they are rescued after their lease");
                return;
            }
        }
    }
}

/// A duration in whole milliseconds, for log fields.
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Run the handler to an outcome; `None` when the lease was lost (nothing
/// may be written for this attempt any more).
pub(super) async fn execute(shared: &Shared, ctx: TaskContext) -> Option<Finish> {
    let task = ctx.task_shared();
    let handler = shared
        .handlers
        .get(&task.kind)
        .or(shared.fallback.as_ref())
        .cloned();
    // An attempt that waited in the prefetch buffer may have been stopped
    // meanwhile (its lease lost, a cancel requested), or its lease may be
    // too near its end to start (no heartbeat confirmed it lately): it does
    // not run.
    let claim = ctx.claim();
    if let Some(why) = ctx.stop_reason() {
        return match why {
            StopReason::LeaseLost | StopReason::LeaseExpiring => None,
            StopReason::Cancelled => Some(Finish::Cancelled {
                reason: "cancelled".into(),
            }),
            StopReason::Shutdown | StopReason::TimedOut => Some(Finish::HandBack),
        };
    }
    if shared
        .deadline(claim)
        .is_none_or(|d| Instant::now() + shared.guard() >= d)
    {
        tracing::warn!(
            task = task.id,
            attempt = task.attempt,
            "lease too near its end to start (no heartbeat confirmed it); handing the task back"
        );
        return Some(Finish::HandBack);
    }
    let Some(handler) = handler else {
        return Some(Finish::Failed {
            error: format!("no handler for kind {:?} on this worker", task.kind),
            retry_in: Some(shared.retry_delay(&task)),
        });
    };
    // A task that waited in the buffer under a hold (`Running::start_by`)
    // runs only if its handler is called before the hold ends (checked
    // here, with no await before the handler's first poll below: the store
    // logged its start at the hold's end); else it goes back.
    if shared
        .start_by(claim)
        .is_some_and(|by| Instant::now() >= by)
    {
        tracing::debug!(
            task = task.id,
            attempt = task.attempt,
            "buffered past its hold before its handler started; handing the task back"
        );
        return Some(Finish::HandBack);
    }
    // The handler runs inside the attempt's own task (and so inside its
    // `task` span), a panic caught as a failure; dropping the attempt drops
    // (stops) the handler. No second spawned task per attempt.
    let mut run = std::panic::AssertUnwindSafe(handler(ctx.clone())).catch_unwind();
    let timeout = async {
        match task.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    // The handler first: one that is done at its first poll (a short task)
    // never arms the lease and timeout timers. Work that completed is
    // recorded as done whatever stop came with it (below), so a finished
    // handler may win a tie.
    let result = tokio::select! {
        biased;
        r = &mut run => Some(r),
        _ = ctx.stopped() => None,
        _ = timeout => { ctx.stop_with(StopReason::TimedOut); None }
        _ = shared.lease_end(claim, shared.guard()) => {
            tracing::warn!(task = task.id, attempt = task.attempt, "no heartbeat confirmed the lease in time; stopping the handler before the lease can lapse");
            ctx.stop_with(StopReason::LeaseExpiring);
            None
        }
    };
    let mut expired = false;
    let result = match result {
        Some(r) => r,
        None => {
            // Asked to stop: give the handler its grace to return, but never
            // past its lease's end (nor long after an urgent shutdown).
            let why = tokio::select! {
                r = &mut run => Ok(r),
                _ = tokio::time::sleep(shared.config.stop_grace) => Err("the grace period"),
                _ = shared.lease_end(claim, crate::lease::stop_margin(shared.config.lease)) => {
                    expired = true;
                    Err("its lease's end")
                }
                _ = after(&shared.urgent, URGENT_STOP) => Err("the urgent shutdown"),
            };
            match why {
                Ok(r) => r,
                Err(when) => {
                    // Dropped here (a command's child is killed on drop).
                    drop(run);
                    tracing::warn!(
                        task = task.id,
                        attempt = task.attempt,
                        before = when,
                        "handler did not stop in time; dropped"
                    );
                    Ok(Err(TaskError::retry(format!(
                        "handler did not stop before {when}"
                    ))))
                }
            }
        }
    };
    if expired {
        // The lease may have lapsed (no heartbeat confirmed it): write
        // nothing; the task is rescued and run again.
        ctx.stop_with(StopReason::LeaseExpiring);
        tracing::warn!(
            task = task.id,
            attempt = task.attempt,
            "lease lost: it ended unconfirmed; nothing recorded, the task will be rescued"
        );
        return None;
    }
    let reason = ctx.stop_reason();
    let attempt_error = |msg: String, retry: bool| Finish::Failed {
        retry_in: retry.then(|| shared.retry_delay(&task)),
        error: msg,
    };
    match (reason, result) {
        (Some(StopReason::LeaseLost | StopReason::LeaseExpiring), _) => {
            tracing::warn!(
                task = task.id,
                attempt = task.attempt,
                "lease lost; result discarded"
            );
            None
        }
        // Work that completed is recorded as done, whatever stop came late.
        (_, Ok(Ok(()))) => Some(Finish::Succeeded),
        (Some(StopReason::Shutdown), _) => Some(Finish::HandBack),
        (Some(StopReason::Cancelled), _) => Some(Finish::Cancelled {
            reason: "cancelled".into(),
        }),
        (Some(StopReason::TimedOut), _) => Some(attempt_error(
            format!(
                "timed out after {}",
                crate::format_duration(task.timeout.unwrap_or_default())
            ),
            true,
        )),
        (None, Ok(Err(e))) => Some(match e.action() {
            TaskAction::Retry { after: Some(d) } => Finish::Failed {
                error: e.message().to_string(),
                retry_in: Some(d),
            },
            TaskAction::Retry { after: None } => attempt_error(e.message().to_string(), true),
            TaskAction::Fail => attempt_error(e.message().to_string(), false),
            TaskAction::Cancel => Finish::Cancelled {
                reason: e.message().to_string(),
            },
            TaskAction::Snooze { after } => Finish::Snoozed { run_in: after },
        }),
        (None, Err(panic)) => {
            let msg = panic
                .downcast::<String>()
                .map(|s| *s)
                .or_else(|p| p.downcast::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|_| "panic".into());
            Some(attempt_error(format!("handler panicked: {msg}"), true))
        }
    }
}
