//! Shutdown: stop claiming, give running handlers the grace, stop the
//! rest and hand their tasks back, bounded even when the store does not
//! answer.

use super::*;

/// Shut down after the ticker stopped: stop claiming (a claim in flight is
/// not waited for past the grace), give running handlers
/// `shutdown_grace`, stop the rest ([`StopReason::Shutdown`]) and wait for
/// their hand-backs — every wait cut short once `urgent` fires — and, when
/// the store does not answer in time, abandon what is left to rescue.
pub(super) async fn drain(shared: &Shared, mut tasks: JoinSet<()>, urgent: &CancellationToken) {
    // Shutdown: stop claiming, give running handlers the grace period.
    tracing::info!(worker = %shared.id, "shutting down: no new claims");
    shared.stop_claiming.cancel();
    let grace_end = Instant::now() + shared.config.shutdown_grace;
    // A claim in flight on a store that does not answer is not waited
    // for past the grace (1 s after an urgent request).
    tokio::select! {
        _ = async { while tasks.join_next().await.is_some() {} } => {}
        _ = tokio::time::sleep_until(grace_end) => {}
        _ = after(urgent, URGENT_STOP) => {}
    }
    if !tasks.is_empty() {
        tracing::warn!("a claim got no answer from the store; abandoning it (anything it claimed is rescued after its lease)");
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    // Claim loops hand their prefetched tasks back as they stop; an
    // aborted one could not: its buffered tasks are left to rescue.
    let unstarted = {
        let mut running = lock(&shared.running);
        let before = running.len();
        running.retain(|_, r| r.started);
        before - running.len()
    };
    if unstarted > 0 {
        tracing::warn!(count = unstarted, "prefetched tasks could not be handed back (the store does not answer); they are rescued after their lease");
        shared.drained.notify_waiters();
    }
    loop {
        let notified = shared.drained.notified();
        if lock(&shared.running).is_empty() || Instant::now() >= grace_end || urgent.is_cancelled()
        {
            break;
        }
        tokio::select! {
            _ = tokio::time::timeout_at(grace_end, notified) => {}
            _ = urgent.cancelled() => {}
        }
    }
    let left: Vec<TaskContext> = lock(&shared.running)
        .values()
        .map(|r| r.ctx.clone())
        .collect();
    if !left.is_empty() {
        tracing::info!(
            count = left.len(),
            urgent = urgent.is_cancelled(),
            "stopping handlers and handing their tasks back"
        );
    }
    for ctx in &left {
        ctx.stop_with(StopReason::Shutdown);
    }
    // Every attempt ends by itself within stop_grace + its lease (the
    // handler is dropped at its lease's end, and writes stop there); the
    // bound below is the backstop, much shorter after an urgent request.
    let drain_end = Instant::now() + shared.config.stop_grace + shared.config.lease;
    let mut urgent_end: Option<Instant> = None;
    loop {
        let notified = shared.drained.notified();
        if lock(&shared.running).is_empty() {
            break;
        }
        if urgent.is_cancelled() && urgent_end.is_none() {
            urgent_end = Some(Instant::now() + URGENT_STOP + URGENT_HAND_BACK);
        }
        let end = urgent_end.map_or(drain_end, |u| u.min(drain_end));
        if Instant::now() >= end {
            break;
        }
        tokio::select! {
            _ = tokio::time::timeout_at(end, notified) => {}
            _ = urgent.cancelled(), if urgent_end.is_none() => {}
        }
    }
    let stuck = lock(&shared.running).len();
    if stuck > 0 {
        tracing::warn!(
            count = stuck,
            "tasks could not be handed back in time (the store does not answer); they are rescued after their lease"
        );
        shared.abandon.cancel();
        // Let the abandoned attempts unwind (their handlers are dropped).
        let unwound = async {
            loop {
                let notified = shared.drained.notified();
                if lock(&shared.running).is_empty() {
                    break;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), unwound).await;
    }
}

/// After an urgent shutdown request, how long a stopped handler may take to
/// return before it is dropped.
pub(super) const URGENT_STOP: Duration = Duration::from_secs(1);

/// After an urgent shutdown request and [`URGENT_STOP`], how long hand-backs
/// may take before their tasks are left to rescue.
pub(super) const URGENT_HAND_BACK: Duration = Duration::from_secs(3);

/// Resolves `wait` after `token` fires.
pub(super) async fn after(token: &CancellationToken, wait: Duration) {
    token.cancelled().await;
    tokio::time::sleep(wait).await;
}
