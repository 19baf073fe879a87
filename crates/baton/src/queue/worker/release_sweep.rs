//! The waiting-slot sweep: every [`SWEEP_POLLS`] polls a worker asks the
//! store to start each waiting slot (overlap `buffer_one`, `buffer_all`,
//! `cancel_other`, `terminate_other`) of the jobs whose runs go to its
//! queues.
//!
//! A slot waiting for its job's previous run starts when that run ends:
//! the worker that ends it asks at once (`executor.rs`) and every
//! scheduler of the job polls each second (`release_loop`). Neither covers
//! a run that ended while its worker's ask failed (the store cut off,
//! the worker killed just after the finish) when no scheduler polls for
//! the job any more: its schedulers stopped (a drain, a deploy), the job
//! left the config or its policy changed. The sweep does: the store
//! decides each release under the job's row lock, so a sweep racing the
//! others starts a slot once.

use super::*;
use crate::store::Overlap;

/// Polls between two sweeps (30 s at the default poll interval of 2 s).
pub(super) const SWEEP_POLLS: u32 = 15;

/// One sweep: the job records, then a release for each job whose recorded
/// policy may leave a slot waiting (or that recorded none) and whose queue
/// this worker serves (or that recorded none).
pub(super) async fn sweep(shared: &Shared) {
    let jobs = match shared.upkeep(shared.store.backend().job_list()).await {
        Ok(jobs) => jobs,
        Err(e) => {
            shared.counters.store_error("job_list");
            tracing::debug!(error = %crate::error::chain(&e), "listing jobs for the waiting-slot sweep failed");
            return;
        }
    };
    let serves = |queue: &str| shared.config.queues().iter().any(|(q, _)| q == queue);
    let mut released = false;
    for job in jobs {
        if !job.overlap.is_none_or(Overlap::may_wait) {
            continue;
        }
        if job.queue.as_deref().is_some_and(|q| !serves(q)) {
            continue;
        }
        crate::store::release_waiting(&shared.store, &job.name).await;
        released = true;
    }
    // The releases are paid for by one skipped poll in all, not one each:
    // a sweep over many jobs would otherwise thin the polls for minutes.
    if released {
        shared.store.note_upkeep(1);
    }
}
