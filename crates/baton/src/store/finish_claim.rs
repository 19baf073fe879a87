//! Finishing a worker's results and claiming its next tasks in one call
//! ([`Backend::task_finish_and_claim`]): the request
//! ([`TaskFinishAndClaim`]), the answer ([`FinishedAndClaimed`]) and the
//! two-call form every backend without a one-round-trip version uses
//! ([`finish_then_claim`]).

use super::{Backend, Claim, Finish, Task, TaskClaim};
use crate::error::StoreError;

/// A batch of finishes sent with a claim
/// ([`Backend::task_finish_and_claim`]).
#[derive(Debug, Clone)]
pub struct TaskFinishAndClaim<'a> {
    /// The attempts to finish, each a compare-and-set on its claim exactly
    /// as [`Backend::task_finish_many`] makes it; each task at most once.
    pub finish: &'a [(Claim, Finish)],
    /// The claim, as [`Backend::task_claim`] takes it.
    pub claim: &'a TaskClaim<'a>,
}

/// What [`Backend::task_finish_and_claim`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedAndClaimed {
    /// Per finish item, in order, whether its claim was current (as
    /// [`Backend::task_finish_many`] answers).
    pub finished: Vec<bool>,
    /// The tasks claimed, as [`Backend::task_claim`] answers them.
    pub tasks: Vec<Task>,
}

/// The two-call form of [`Backend::task_finish_and_claim`]: the finishes
/// ([`Backend::task_finish_many`]), then the claim ([`Backend::task_claim`]),
/// so the claim sees the finishes (a cap counts the finished tasks as no
/// longer running). A batch without finishes is the claim alone. A failed
/// finish fails the call before anything is claimed.
pub async fn finish_then_claim<B: Backend + ?Sized>(
    backend: &B,
    req: &TaskFinishAndClaim<'_>,
) -> Result<FinishedAndClaimed, StoreError> {
    let finished = finish_ahead(backend, req.finish).await?;
    let tasks = backend.task_claim(req.claim).await?;
    Ok(FinishedAndClaimed { finished, tasks })
}

/// The finishes a claim carries, written as a call of their own before it
/// ([`Backend::task_finish_many`]), answered per item; none: no call. The
/// two-call form of a rated claim's `finish`
/// ([`TaskClaimRated::finish`](super::TaskClaimRated::finish)) on a store
/// that does not write them within the claim's own round trips.
pub async fn finish_ahead<B: Backend + ?Sized>(
    backend: &B,
    finish: &[(Claim, Finish)],
) -> Result<Vec<bool>, StoreError> {
    if finish.is_empty() {
        return Ok(Vec::new());
    }
    let finished = backend.task_finish_many(finish).await?;
    if finished.len() != finish.len() {
        return Err(StoreError::Corrupt(format!(
            "task_finish_many answered {} of {} items",
            finished.len(),
            finish.len()
        )));
    }
    Ok(finished)
}
