//! Claiming: one loop per queue takes due tasks as slots free (with
//! prefetch and its pace), and registers each claimed attempt.

use super::*;

/// How long after a failed claim a queue is polled every [`RECOVERY_POLL`]
/// (longer than a wake-up channel's longest reconnect backoff plus a claim's).
pub(super) const RECOVERY_WINDOW: Duration = Duration::from_secs(15);

/// The longest wait between claims that failed (from 50 ms, doubling): a
/// store back from an outage is found within it. At 5 s a worker started
/// the first slot after a 4 s Redis restart 3 s late, behind slots due
/// meanwhile (`cli_outage::redis_restart_latest_due_slot_runs` on a
/// loaded machine); one failed call a second is no load on a store.
pub(super) const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(1);

/// The claim period while recovering from a store error.
pub(super) const RECOVERY_POLL: Duration = Duration::from_millis(100);

/// With slots freed as handlers return, how long a claim for fewer than
/// half the slots waits for more to free.
pub(super) const CLAIM_GATHER: Duration = Duration::from_millis(2);

pub(super) async fn claim_loop(
    shared: Arc<Shared>,
    queue: String,
    concurrency: usize,
    poke: Arc<Notify>,
) {
    let mut buffer = VecDeque::new();
    claim_into(&shared, &queue, concurrency, &poke, &mut buffer).await;
    // Stopped: what waits in the prefetch buffer goes back unstarted.
    if !buffer.is_empty() {
        let all: Vec<TaskContext> = buffer.drain(..).collect();
        hand_back_buffered(&shared, &all).await;
        shared.drained.notify_waiters();
    }
}

/// How long a worker under a cap per key asks for no buffer after a claim
/// that was granted none (the keys' places were scarce).
const PLACES_SHORT: Duration = Duration::from_secs(1);

/// Hand back tasks from the prefetch buffer unstarted, and forget them.
async fn hand_back_buffered(shared: &Shared, ctxs: &[TaskContext]) {
    let tasks: Vec<Task> = ctxs.iter().map(|c| c.task().clone()).collect();
    hand_back(shared, &tasks).await;
    let mut running = lock(&shared.running);
    for ctx in ctxs {
        running.remove(&ctx.claim());
    }
}

/// The buffered tasks at the front of `buffer` whose hold has passed at
/// `now` (`Running::start_by`; buffered in claim order, so their holds
/// rise from front to back), taken out.
fn overdue(shared: &Shared, buffer: &mut VecDeque<TaskContext>, now: Instant) -> Vec<TaskContext> {
    let mut out = Vec::new();
    while let Some(ctx) = buffer.front() {
        if shared.start_by(ctx.claim()).is_none_or(|by| by > now) {
            break;
        }
        if let Some(ctx) = buffer.pop_front() {
            out.push(ctx);
        }
    }
    out
}

/// The claim loop proper: returns when claiming stops, leaving in `buffer`
/// the prefetched tasks not started (registered as running, unstarted).
pub(super) async fn claim_into(
    shared: &Arc<Shared>,
    queue: &str,
    concurrency: usize,
    poke: &Notify,
    buffer: &mut VecDeque<TaskContext>,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let early = shared.config.free_slot_on_return_on();
    let capped = shared.config.capped(queue);
    // A buffered task counts as running against a cluster-wide cap: capped
    // queues claim only for free slots. Limited by a rate per key only, a
    // queue prefetches, each buffered task held to start within
    // `store::BUFFER_HOLD` of its claim's send (the store logs its
    // start at the claim plus the hold) or be handed back.
    let held = shared.config.prefetch_held(
        queue,
        shared.store.backend().key_capped_claims_spare_places(),
    );
    let max_prefetch = if capped && !held {
        0
    } else {
        shared.config.prefetch_tasks_of(queue)
    };
    // Attempts whose handler has returned but whose result the store has
    // not acknowledged yet, beyond the running ones: at most `concurrency`
    // plus the prefetch bound, as many as the worker may hold claimed
    // but not started (see `start_task`); results written in batches
    // grow to that.
    let unacked = Arc::new(Semaphore::new(if early {
        concurrency + max_prefetch
    } else {
        0
    }));
    let freed = Arc::new(Notify::new());
    let slot = |permit| Slot {
        permit: Some(permit),
        is_slot: true,
        unacked: unacked.clone(),
        freed: freed.clone(),
    };
    let mut more = true; // the last claim filled every free slot: there may be more
                         // Under a cluster-wide cap a claim can come back short while work
                         // waits; a slot freed here is then a reason to look again.
    let mut pace = shared
        .config
        .prefetch_adaptive()
        .then(|| Pace::new(Instant::now(), shared.config.prefetch_horizon()));
    // The last claim came back short of its buffer share only (see below).
    let mut filtered = false;
    // Under a cap per key the store grants a buffer only where the walked
    // keys have places to spare (twice the claim); when it granted none,
    // ask for none for a while: a claim's walk grows with what it asks
    // for, and the places are scarce.
    let key_capped = shared.config.per_key_max_running_of(queue).is_some();
    let mut places_short: Option<Instant> = None;
    let mut backoff = Duration::from_millis(50);
    // After a failed claim the store may have restarted, and the wake-ups
    // sent while the wake-up channel reconnects (with a backoff of its own,
    // up to 5 s) are lost: look often until that window has passed, so work
    // due meanwhile is not left for the next poll.
    let mut recovering_until: Option<Instant> = None;
    let rated = shared.config.rates.get(queue).cloned();
    // When the queue's rate limit next allows a start, if it is used up.
    let mut rate_until: Option<Instant> = None;
    let key_rate = shared.config.per_key_rate_limit_of(queue);
    // Whether this queue's claims carry the results held for them (see
    // `Ride`): with slots freed as handlers return (a held result keeps
    // no slot taken). Capped, rated and fair queues too: their results
    // are written before their claim counts running tasks or starts (one
    // call where the store can, else the finish then the claim), so they
    // send a few large finishes with their claims instead of many small
    // ones between them (PostgreSQL, 10 keys capped at 10: 7.6–8.5k →
    // 10.1–10.5k jobs/s; a rate per key +12–15 %; fair +21 %;
    // docs/BENCHMARKS.md session 27).
    let carry = early;
    let mut hot = Hot::new(&shared.ride);
    // When the earliest key held back by its rate may start again (a
    // reason to claim again, as a wake-up is).
    let mut key_until: Option<Instant> = None;
    loop {
        if shared.stop_claiming.is_cancelled() {
            return;
        }
        // Buffered tasks past their hold go back unstarted (the store
        // logged their starts at the hold's end; they may not start later).
        if held {
            let late = overdue(shared, buffer, Instant::now());
            if !late.is_empty() {
                tracing::debug!(queue = %queue, tasks = late.len(), "buffered tasks not started within their hold; handing them back");
                hand_back_buffered(shared, &late).await;
                // With every slot busy, claim again when one frees (not
                // at once, to buffer tasks that would go back again).
                more = slots.available_permits() > 0;
            }
        }
        // Buffered tasks take the free slots first, without a round trip.
        while !buffer.is_empty() {
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                break;
            };
            if let Some(ctx) = buffer.pop_front() {
                start_task(shared.clone(), ctx, Instant::now(), slot(permit));
                if let Some(p) = pace.as_mut() {
                    p.started(1);
                }
            }
        }
        let prefetch = match pace.as_mut() {
            Some(p) => p.buffer(Instant::now(), max_prefetch),
            None => max_prefetch,
        };
        let prefetch = if places_short.is_some_and(|t| t > Instant::now()) {
            0
        } else {
            prefetch
        };
        let low_water = prefetch / 2;
        let mut free = slots.available_permits();
        if free > 0
            && more
            && early
            && (prefetch == 0 || filtered)
            && free < concurrency.div_ceil(2)
        {
            // Slots free one by one as handlers return (see `Slot`): let a
            // few more free before claiming, so claims stay large rather
            // than one round trip (and commit) per task or two.
            tokio::select! {
                _ = tokio::time::sleep(CLAIM_GATHER) => {}
                _ = shared.stop_claiming.cancelled() => return,
            }
            free = slots.available_permits();
        }
        // Claim for the free slots plus the buffer's room, once the buffer
        // is down to its low-water mark.
        let want = if buffer.len() <= low_water {
            free + prefetch - buffer.len()
        } else {
            0
        };
        // Under a rate limit used up until `rate_until`, no claim can
        // start a task before then: wait for it (below).
        let rate_open = rate_until.is_none_or(|t| t <= Instant::now());
        if want > 0 && more && rate_open {
            let req = TaskClaim {
                queue,
                worker: &shared.id,
                limit: u32::try_from(want).unwrap_or(u32::MAX),
                lease: shared.config.lease,
                max_running: shared.config.max_running.get(queue).copied(),
                per_key_max_running: shared.config.per_key_max_running_of(queue),
                buffered: u32::try_from(want.saturating_sub(free)).unwrap_or(u32::MAX),
                fair: shared.config.fair_of(queue),
            };
            let sent = Instant::now();
            match claim(shared, req, rated.as_ref(), key_rate, carry).await {
                Ok((mut batch, until, key_next)) => {
                    rate_until = until;
                    key_until = key_next;
                    shared.counters.claimed(queue, sent.elapsed());
                    backoff = Duration::from_millis(50);
                    let full = batch.len() == want;
                    if key_capped && want > free && batch.len() <= free {
                        places_short = Some(Instant::now() + PLACES_SHORT);
                    }
                    // The buffer's share is taken only among tasks with an
                    // attempt to spare (see `TaskClaim::buffered`), so a
                    // claim that filled the free slots but not the buffer
                    // may have stepped over tasks on their last attempt:
                    // claim again when a slot frees, gathering a few.
                    filtered = !full && free > 0 && batch.len() >= free;
                    more = full || filtered;
                    // A full claim: the backlog goes on, so another claim
                    // is near, and results may wait for it.
                    hot.set(carry && full);
                    // Tasks on their last attempt start at once (the store
                    // returns at most `free` of them): ahead of the rest.
                    batch.sort_by_key(|t| t.attempt < t.max_attempts);
                    // A claim that came back so late (a store that was just
                    // restarted, a pool waiting for connections) that its
                    // lease, counted from the send, is already inside the
                    // stop guard would be stopped as it starts — while a
                    // command may still finish and then be discarded and run
                    // again. Hand such tasks back unstarted instead.
                    if sent.elapsed() + shared.guard() >= shared.config.lease {
                        tracing::warn!(queue = %queue, tasks = batch.len(), took_ms = ms(sent.elapsed()), "claim answered too late to run within its lease; handing the tasks back");
                        hand_back(shared, &batch).await;
                        more = true;
                        continue;
                    }
                    let start_by = held.then(|| sent + crate::store::BUFFER_HOLD);
                    for task in batch {
                        let ctx = register(shared, task, sent);
                        match slots.clone().try_acquire_owned() {
                            Ok(permit) => {
                                start_task(shared.clone(), ctx, sent, slot(permit));
                                if let Some(p) = pace.as_mut() {
                                    p.started(1);
                                }
                            }
                            // Beyond the free slots: into the buffer (heartbeated
                            // from now on, like the running ones), held to
                            // start by `start_by` when the queue is limited
                            // per key (the store logged its start then).
                            Err(_) => {
                                if let Some(r) = lock(&shared.running).get_mut(&ctx.claim()) {
                                    r.start_by = start_by;
                                }
                                buffer.push_back(ctx);
                            }
                        }
                    }
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    hot.set(false);
                    shared.counters.store_error("task_claim");
                    crate::store::warn_unless_read_only!(e, queue = %queue, error = %crate::error::chain(&e), "claim failed; backing off");
                    recovering_until = Some(Instant::now() + RECOVERY_WINDOW);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shared.stop_claiming.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(MAX_CLAIM_BACKOFF);
                    continue;
                }
            }
        }
        // Wait for a reason to claim again: a wake-up or poll tick (there may
        // be new work), or a freed slot when the last claim was full or a
        // buffered task waits for it.
        let recovering = recovering_until.filter(|t| *t > Instant::now());
        tokio::select! {
            _ = poke.notified() => more = true,
            _ = sleep_until_opt(rate_until), if !rate_open => {
                rate_until = None;
                more = true;
            }
            _ = sleep_until_opt(key_until), if key_until.is_some() => {
                key_until = None;
                more = true;
            }
            // The front buffered task's hold ends: hand it back (above).
            _ = sleep_until_opt(buffer.front().and_then(|c| shared.start_by(c.claim()))),
                if held && !buffer.is_empty() => {}
            _ = tokio::time::sleep(RECOVERY_POLL), if recovering.is_some() => more = true,
            _ = freed.notified(), if more || capped || !buffer.is_empty() => {
                more = more || capped;
                // Slots free in bursts (completions are written in batches):
                // let the burst land so the next claim takes them together.
                if buffer.is_empty() && slots.available_permits() < concurrency.div_ceil(4) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            _ = shared.stop_claiming.cancelled() => return,
        }
    }
}

/// One claim, through the queue's rate limit and its rate per key if it
/// has them: the tasks, the local instant the limit next allows a start
/// when it is used up, and the one at which the earliest key held back by
/// its rate may start again (the store's answers, counted from the reply,
/// so never early). With `carry`, the results held for a claim go with it
/// (see [`Ride`]), each answered from the store's answer.
async fn claim(
    shared: &Shared,
    req: TaskClaim<'_>,
    rated: Option<&QueueRate>,
    key_rate: Option<RateLimit>,
    carry: bool,
) -> Result<(Vec<Task>, Option<Instant>, Option<Instant>), StoreError> {
    let backend = shared.store.backend();
    let carried = if carry && shared.ride.enabled {
        shared.ride.take_for_claim()
    } else {
        Vec::new()
    };
    let items: Vec<(Claim, Finish)> = carried
        .iter()
        .map(|c| (c.claim, c.finish.clone()))
        .collect();
    let r = if let Some(k) = key_rate {
        backend
            .task_claim_key_rated(&TaskClaimKeyRated {
                claim: req,
                key_rate: KeyRate {
                    max: k.max(),
                    per: k.per(),
                },
                rate: rated.map(|r| QueueRateRef {
                    name: r.name.as_deref(),
                    max: r.limit.max(),
                    per: r.limit.per(),
                }),
                finish: &items,
            })
            .await
    } else if let Some(rate) = rated {
        backend
            .task_claim_rated(&TaskClaimRated {
                claim: req,
                name: rate.name.as_deref(),
                max: rate.limit.max(),
                per: rate.limit.per(),
                finish: &items,
            })
            .await
    } else if items.is_empty() {
        return Ok((backend.task_claim(&req).await?, None, None));
    } else {
        let r = backend
            .task_finish_and_claim(&TaskFinishAndClaim {
                finish: &items,
                claim: &req,
            })
            .await;
        return match r {
            Ok(r) => {
                ride::answer(carried, Ok(&r.finished));
                Ok((r.tasks, None, None))
            }
            Err(e) => {
                ride::answer(carried, Err(&e));
                Err(e)
            }
        };
    };
    // A rated claim writes the results it carries before it claims (in
    // its own round trips where the store can).
    let r = match r {
        Ok(r) => {
            ride::answer(carried, Ok(&r.finished));
            r
        }
        Err(e) => {
            ride::answer(carried, Err(&e));
            return Err(e);
        }
    };
    let local = |t: chrono::DateTime<chrono::Utc>| {
        Instant::now() + (t - r.now).to_std().unwrap_or_default()
    };
    Ok((r.tasks, r.next_start.map(local), r.key_next.map(local)))
}

/// A queue's recent pace (tasks started per second), which sizes an
/// adaptive prefetch buffer to its horizon of work
/// ([`WorkerConfig::prefetch_horizon`](crate::queue::WorkerConfig::prefetch_horizon)).
pub(super) struct Pace {
    /// Start of the current window.
    pub(super) since: Instant,
    /// Tasks started in the current window.
    pub(super) count: u32,
    /// The estimate: each finished window averaged with the one before.
    pub(super) per_sec: f64,
    /// How much work the buffer holds at that rate.
    pub(super) horizon: Duration,
}

impl Pace {
    /// How long a window of counted starts lasts before it updates the
    /// estimate.
    const WINDOW: Duration = Duration::from_millis(50);

    pub(super) fn new(now: Instant, horizon: Duration) -> Pace {
        Pace {
            since: now,
            count: 0,
            per_sec: 0.0,
            horizon,
        }
    }

    pub(super) fn started(&mut self, n: u32) {
        self.count = self.count.saturating_add(n);
    }

    /// The buffer to keep now: the estimate times `horizon`, at most
    /// `max`. A window that ended updates the estimate first; a long quiet
    /// spell (many windows without a look) replaces it, so a queue that
    /// went idle starts again from its free slots.
    pub(super) fn buffer(&mut self, now: Instant, max: usize) -> usize {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= Self::WINDOW {
            let rate = f64::from(self.count) / elapsed.as_secs_f64();
            self.per_sec = if elapsed >= Self::WINDOW * 8 {
                rate
            } else {
                (self.per_sec + rate) / 2.0
            };
            self.since = now;
            self.count = 0;
        }
        // Saturating float-to-int: a huge rate is `max`.
        ((self.per_sec * self.horizon.as_secs_f64()) as usize).min(max)
    }
}

/// An attempt's concurrency slot, and how it is given back.
pub(super) struct Slot {
    /// The slot (one of the queue's `concurrency` handlers), or, after
    /// [`Slot::handler_returned`], a place for an unacknowledged result.
    pub(super) permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Whether `permit` is still the slot.
    pub(super) is_slot: bool,
    /// Places for attempts whose handler returned and whose result is not
    /// acknowledged yet (as many as the queue's concurrency).
    pub(super) unacked: Arc<Semaphore>,
    /// Told when the slot is free again.
    pub(super) freed: Arc<Notify>,
}

impl Slot {
    /// The handler has returned: free the slot for the next task now, while
    /// the result is still being written, when a place for an unacknowledged
    /// result is left (held until the write is answered). With none left
    /// the slot stays taken until then, so the results waiting on a slow
    /// store stay bounded. The attempt itself stays in the running set
    /// (heartbeated, its lease watched) until its result is answered.
    pub(super) fn handler_returned(&mut self) {
        if !self.is_slot {
            return;
        }
        if let Ok(place) = self.unacked.clone().try_acquire_owned() {
            drop(self.permit.replace(place));
            self.is_slot = false;
            self.freed.notify_one();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Free the slot before saying so: the claimer counts free slots.
        drop(self.permit.take());
        if self.is_slot {
            self.freed.notify_one();
        }
    }
}

/// Record a claimed task as this worker's (heartbeated, its lease watched)
/// before it starts: at once, or after a wait in the prefetch buffer.
pub(super) fn register(shared: &Shared, task: Task, sent: Instant) -> TaskContext {
    let ctx = TaskContext {
        task: Arc::new(task),
        state: AttemptState::new(sent + shared.config.lease),
        progress: ProgressSink::Store(shared.store.backend_shared()),
        margin: crate::lease::stop_margin(shared.config.lease),
    };
    lock(&shared.running).insert(
        ctx.claim(),
        Running {
            ctx: ctx.clone(),
            deadline: sent + shared.config.lease,
            started: false,
            start_by: None,
        },
    );
    ctx
}
