//! Params structs for the [`Backend`](super::Backend) calls that take more
//! than one value (the seam's rule: entity, verb, one params struct). The
//! older ones live with the values they describe in `types.rs`
//! ([`LockAcquire`](super::LockAcquire) for `lock_acquire`,
//! [`TaskClaim`](super::TaskClaim) for `task_claim`,
//! [`JobAdvance`](super::JobAdvance) for `job_advance`,
//! [`TaskFilter`](super::TaskFilter) for `task_list`).

use std::time::Duration;

use super::{Claim, FencingToken};

/// Params of [`Backend::lock_extend`](super::Backend::lock_extend): extend
/// the lease `token` holds on `name` to the store's `now + at_most`.
#[derive(Debug, Clone, Copy)]
pub struct LockExtend<'a> {
    /// Lock name, already validated.
    pub name: &'a str,
    /// The token the caller was granted.
    pub token: FencingToken,
    /// New lease length from the store's `now()`.
    pub at_most: Duration,
}

/// Params of [`Backend::lock_release`](super::Backend::lock_release): end
/// the lease `token` holds on `name` at `max(now, locked_at + at_least)`.
#[derive(Debug, Clone, Copy)]
pub struct LockRelease<'a> {
    /// Lock name, already validated.
    pub name: &'a str,
    /// The token the caller was granted.
    pub token: FencingToken,
    /// The lease is held at least this long after the grant.
    pub at_least: Duration,
    /// Record the release in the lock history (the store's
    /// [`StoreOptions::lock_history`](super::StoreOptions::lock_history),
    /// on by default; written by the release's own statement or script).
    pub record: bool,
}

/// Params of [`Backend::lock_revoke`](super::Backend::lock_revoke): an
/// operator's force-release of the lease `token` holds on `name`. The
/// lease is revoked (the token is bumped, so its holder's extensions and
/// release are refused from then on) and ends at `min(lock_until, now +
/// within)`, not at once: `within` is the bound in which a live holder
/// learns of it and stops its work ([`crate::lock::RELEASE_BOUND`]).
#[derive(Debug, Clone, Copy)]
pub struct LockRevoke<'a> {
    /// Lock name, already validated.
    pub name: &'a str,
    /// The token of the grant to revoke (the one the operator saw).
    pub token: FencingToken,
    /// The revoked lease ends at most this long after the store's `now()`.
    pub within: Duration,
}

/// Params of [`Backend::task_heartbeat_many`](super::Backend::task_heartbeat_many):
/// extend every claim's lease to the store's `now + lease`.
#[derive(Debug, Clone, Copy)]
pub struct TaskHeartbeatMany<'a> {
    /// The running claims, answered in this order.
    pub claims: &'a [Claim],
    /// New lease length from the store's `now()`.
    pub lease: Duration,
}

/// Params of [`Backend::task_set_progress`](super::Backend::task_set_progress):
/// store a progress report on a running claim.
#[derive(Debug, Clone, Copy)]
pub struct TaskSetProgress<'a> {
    /// The running claim.
    pub claim: Claim,
    /// Any JSON; it replaces the previous report.
    pub progress: &'a serde_json::Value,
}

/// Params of [`Backend::job_set_paused`](super::Backend::job_set_paused):
/// pause or resume a job cluster-wide.
#[derive(Debug, Clone, Copy)]
pub struct JobSetPaused<'a> {
    /// Job name, already validated.
    pub job: &'a str,
    /// True to pause, false to resume.
    pub paused: bool,
    /// The note and author recorded with the change (already validated,
    /// [`PauseNote::validate`](super::PauseNote::validate)), kept with the
    /// store's now as the job's [`PauseChange`](super::PauseChange).
    pub note: super::PauseNote<'a>,
}

/// Params of [`Backend::queue_set_paused`](super::Backend::queue_set_paused):
/// pause or resume claiming from a queue cluster-wide.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetPaused<'a> {
    /// Queue name, already validated.
    pub queue: &'a str,
    /// True to pause, false to resume.
    pub paused: bool,
    /// The note and author recorded with the change (already validated),
    /// kept with the store's now as the queue's
    /// [`PauseChange`](super::PauseChange).
    pub note: super::PauseNote<'a>,
}

/// Params of [`Backend::job_register`](super::Backend::job_register):
/// create a job's cursor if absent, and record the queue its runs go to.
#[derive(Debug, Clone, Copy)]
pub struct JobRegister<'a> {
    /// Job name, already validated.
    pub job: &'a str,
    /// The queue the job's slot runs are enqueued on (durable jobs), kept
    /// in the job's record so that a trigger without the job's
    /// configuration can use it. `None` leaves a recorded queue as it is.
    pub queue: Option<&'a str>,
    /// The job's overlap policy, kept in the job's record: a worker ending
    /// one of the job's runs asks the store to start a waiting slot
    /// ([`Backend::job_release`](super::Backend::job_release)) only when
    /// the recorded policy may leave one waiting ([`Overlap::may_wait`](super::Overlap::may_wait)).
    /// `None` leaves a recorded policy as it is.
    pub overlap: Option<super::Overlap>,
    /// A fingerprint of the registering instance's definition of the job
    /// (`Job::fingerprint`), kept so that an instance can see that another
    /// one defines the job otherwise. `None` leaves a recorded one as it is.
    pub fingerprint: Option<&'a str>,
}

impl<'a> JobRegister<'a> {
    /// Record `fingerprint` as the job's definition fingerprint.
    pub fn fingerprint(mut self, fingerprint: &'a str) -> JobRegister<'a> {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Register `job` without naming its queue or policy.
    pub fn new(job: &'a str) -> JobRegister<'a> {
        JobRegister {
            job,
            queue: None,
            overlap: None,
            fingerprint: None,
        }
    }

    /// Record `overlap` as the job's overlap policy.
    pub fn overlap(mut self, overlap: super::Overlap) -> JobRegister<'a> {
        self.overlap = Some(overlap);
        self
    }

    /// Record `queue` as the job's queue.
    pub fn queue(mut self, queue: &'a str) -> JobRegister<'a> {
        self.queue = Some(queue);
        self
    }
}
