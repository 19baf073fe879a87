//! The completer: finished attempts written in batches, each a
//! compare-and-set on its claim, with retries for a store that failed.

use super::*;

/// Write finished attempts in batches: whatever queued up while the last
/// batches were being written goes in the next one (one statement or round
/// trip where the backend can), with up to `in_flight` batches written at
/// once (see [`WorkerConfig::result_batches_in_flight`]), so a busy worker does not pay one commit per
/// task, nor wait for one batch's commit before sending the next, and an
/// idle one adds no delay. While a claim is due soon (see [`Ride`]) the
/// batch is held for it instead, at most [`RIDE_MAX`]; what no claim took
/// is then written as usual.
pub(super) async fn complete_loop(
    store: Store,
    lease: Duration,
    in_flight: usize,
    ride: Arc<Ride>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Completion>,
) {
    const MAX_BATCH: usize = 256;
    let gate = Arc::new(Semaphore::new(in_flight.max(1)));
    let mut writes = JoinSet::new();
    let mut open = true;
    while open {
        // A free place first, then the batch: what queues up while every
        // place is taken joins the next batch.
        let Ok(place) = gate.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            break;
        };
        let mut batch = vec![first];
        drain_into(&mut rx, &mut batch, usize::MAX);
        if ride.holding() {
            let deadline = Instant::now() + RIDE_MAX;
            let mut held = ride.hold(batch);
            // Until a claim took them all, no claim is due any more, the
            // wait is over, or as many as may wait have gathered.
            while held > 0 && held < ride.hold_max && ride.holding() {
                tokio::select! {
                    c = rx.recv() => match c {
                        Some(c) => {
                            let mut more = vec![c];
                            drain_into(&mut rx, &mut more, usize::MAX);
                            held = ride.hold(more);
                        }
                        None => {
                            open = false;
                            break;
                        }
                    },
                    _ = ride.changed.notified() => held = ride.held(),
                    _ = tokio::time::sleep_until(deadline) => break,
                }
            }
            batch = ride.take_all();
            if batch.is_empty() {
                continue;
            }
        } else {
            drain_into(&mut rx, &mut batch, MAX_BATCH);
        }
        while writes.try_join_next().is_some() {}
        // A held batch may exceed a write's size: the first chunk takes
        // the place, the others wait for places of their own.
        let mut chunks = batch_chunks(batch, MAX_BATCH);
        if let Some(first) = chunks.pop() {
            writes.spawn(write_batch(store.clone(), lease, first, place));
        }
        for chunk in chunks {
            let Ok(place) = gate.clone().acquire_owned().await else {
                return;
            };
            writes.spawn(write_batch(store.clone(), lease, chunk, place));
        }
    }
    while writes.join_next().await.is_some() {}
}

/// Move what is queued in `rx` into `batch`, up to `max` in all.
fn drain_into(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Completion>,
    batch: &mut Vec<Completion>,
    max: usize,
) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(c) => batch.push(c),
            Err(_) => break,
        }
    }
}

/// `batch` in chunks of at most `size` (the last chunk first).
fn batch_chunks(mut batch: Vec<Completion>, size: usize) -> Vec<Vec<Completion>> {
    let mut chunks = Vec::new();
    while batch.len() > size {
        chunks.push(batch.split_off(batch.len() - size));
    }
    chunks.push(batch);
    chunks
}

/// Write one batch of results and answer each waiter.
pub(super) async fn write_batch(
    store: Store,
    lease: Duration,
    batch: Vec<Completion>,
    _place: tokio::sync::OwnedSemaphorePermit,
) {
    let items: Vec<(Claim, Finish)> = batch.iter().map(|c| (c.claim, c.finish.clone())).collect();
    // No batch waits past a lease: its waiters have given up by then.
    let call = crate::store::bounded(lease, "task_finish_many", store.task_finish_many(&items));
    match call.await {
        Ok(answers) => ride::answer(batch, Ok(&answers)),
        Err(e) => ride::answer(batch, Err(&e)),
    }
}

pub(super) async fn finish_once(
    shared: &Shared,
    claim: Claim,
    finish: &Finish,
) -> Result<bool, crate::StoreError> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let sent = shared.completions.send(Completion {
        claim,
        finish: finish.clone(),
        reply: Reply::Waiter(reply),
    });
    if sent.is_err() {
        // The completer is gone (shutdown): write directly.
        return shared
            .store
            .task_finish_many(&[(claim, finish.clone())])
            .await
            .map(|r| r == [true]);
    }
    match answer.await {
        Ok(r) => r,
        Err(_) => shared
            .store
            .task_finish_many(&[(claim, finish.clone())])
            .await
            .map(|r| r == [true]),
    }
}

/// Record the attempt's result, retrying store errors while the lease
/// lasts; whether it was recorded. No call outlives the lease: past it the
/// result is unknown or refused, and the task is rescued.
pub(super) async fn finish_with_retries(shared: &Shared, claim: Claim, finish: &Finish) -> bool {
    finish_with_retries_from(shared, claim, finish, FIRST_BACKOFF).await
}

/// The first wait before a failed result write is sent again.
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

/// The local end of `claim`'s lease while its result may still be
/// written: `None` when the lease is unknown or has ended (the task is
/// rescued).
pub(super) fn write_deadline(shared: &Shared, claim: Claim) -> Option<Instant> {
    let deadline = shared.deadline(claim)?;
    if Instant::now() >= deadline {
        tracing::warn!(
            task = claim.id,
            attempt = claim.attempt,
            "lease lost: it ended before the result was recorded; the task will be rescued"
        );
        return None;
    }
    Some(deadline)
}

/// After a write of `claim`'s result failed with `e`: how long to wait
/// before sending it again, or `None` when the lease would end first.
fn wait_after_error(
    shared: &Shared,
    claim: Claim,
    e: &crate::StoreError,
    backoff: Duration,
) -> Option<Duration> {
    shared.counters.store_error("task_finish_many");
    let deadline = lock(&shared.running).get(&claim).map(|r| r.deadline);
    if deadline.is_none_or(|d| Instant::now() + backoff >= d) {
        tracing::warn!(task = claim.id, error = %crate::error::chain(e), "could not record the result before the lease ends; the task will be rescued and run again");
        return None;
    }
    crate::store::warn_unless_read_only!(e, task = claim.id, error = %crate::error::chain(e), "finish failed; retrying");
    Some(backoff)
}

/// [`finish_with_retries`] for a result whose first write (handed to the
/// completer by an attempt that did not wait) failed with `e`.
pub(super) async fn finish_after_error(
    shared: &Shared,
    claim: Claim,
    finish: &Finish,
    e: &crate::StoreError,
) -> bool {
    let Some(wait) = wait_after_error(shared, claim, e, FIRST_BACKOFF) else {
        return false;
    };
    tokio::time::sleep(wait).await;
    finish_with_retries_from(
        shared,
        claim,
        finish,
        (wait * 2).min(Duration::from_secs(1)),
    )
    .await
}

async fn finish_with_retries_from(
    shared: &Shared,
    claim: Claim,
    finish: &Finish,
    mut backoff: Duration,
) -> bool {
    loop {
        let Some(deadline) = write_deadline(shared, claim) else {
            return false;
        };
        let answer = match tokio::time::timeout_at(deadline, finish_once(shared, claim, finish))
            .await
        {
            Ok(a) => a,
            Err(_) => {
                tracing::warn!(
                    task = claim.id,
                    attempt = claim.attempt,
                    "lease lost: the store did not answer before it ended; result not recorded, the task will be rescued"
                );
                return false;
            }
        };
        match answer {
            Ok(true) => {
                tracing::debug!(
                    task = claim.id,
                    attempt = claim.attempt,
                    ?finish,
                    "task finished"
                );
                return true;
            }
            Ok(false) => {
                tracing::warn!(
                    task = claim.id,
                    attempt = claim.attempt,
                    "result refused: the claim was lost"
                );
                return false;
            }
            Err(e) => {
                let Some(wait) = wait_after_error(shared, claim, &e, backoff) else {
                    return false;
                };
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}
