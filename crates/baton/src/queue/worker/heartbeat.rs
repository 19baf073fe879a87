//! Heartbeats: the leases of running attempts extended in one store call
//! per beat; an attempt whose lease is lost is stopped.

use super::*;

/// Renew the leases of every running attempt, often enough that one slow
/// answer does not stop a handler: every third of `lease - guard`, each
/// call bounded by that period, and again soon after an error.
pub(super) async fn heartbeat_loop(shared: Arc<Shared>) {
    let lease = shared.config.lease;
    let period = ((lease - shared.guard()) / 3).max(Duration::from_millis(5));
    let mut wait = period;
    loop {
        tokio::time::sleep(wait).await;
        wait = period;
        let claims: Vec<Claim> = lock(&shared.running).keys().copied().collect();
        if claims.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let params = crate::store::TaskHeartbeatMany {
            claims: &claims,
            lease,
        };
        let call = shared.store.backend().task_heartbeat_many(&params);
        match crate::store::bounded(period, "task_heartbeat_many", call).await {
            Ok(answers) => {
                let mut running = lock(&shared.running);
                for (claim, answer) in claims.iter().zip(answers) {
                    let Some(r) = running.get_mut(claim) else {
                        continue;
                    };
                    match answer {
                        Heartbeat::Extended => {
                            r.deadline = sent + lease;
                            r.ctx.state.set_lease_bound(r.deadline);
                        }
                        Heartbeat::CancelRequested => {
                            r.deadline = sent + lease;
                            r.ctx.state.set_lease_bound(r.deadline);
                            if !r.ctx.is_stopped() {
                                tracing::info!(
                                    task = claim.id,
                                    attempt = claim.attempt,
                                    "cancel requested; stopping the handler"
                                );
                            }
                            r.ctx.stop_with(StopReason::Cancelled)
                        }
                        Heartbeat::Lost => {
                            if !r.ctx.is_stopped() {
                                tracing::warn!(
                                    task = claim.id,
                                    attempt = claim.attempt,
                                    "lease lost: the claim is no longer ours; stopping the handler"
                                );
                            }
                            r.ctx.stop_with(StopReason::LeaseLost)
                        }
                    }
                }
            }
            Err(e) => {
                // Each attempt's own watch stops its handler before its
                // lease can lapse; here we only try again soon.
                shared.counters.heartbeat_failed();
                shared.counters.store_error("task_heartbeat_many");
                crate::store::warn_unless_read_only!(e, tasks = claims.len(), error = %crate::error::chain(&e), "heartbeat failed; retrying soon");
                wait = period.min(Duration::from_millis(250));
            }
        }
    }
}
