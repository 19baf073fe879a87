//! The requests a claim makes of the store: [`TaskClaim`] (up to `limit`
//! due tasks of one queue, under its caps) and [`TaskClaimRated`] (the same
//! under a rate limit), [`TaskClaimKeyRated`] (under a rate per
//! concurrency key, [`KeyRate`]), and what a rated claim answers
//! ([`RatedClaim`]). Re-exported from [`crate::store`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Claim, Finish, Task};

/// How long a task claimed into a worker's prefetch buffer under a rate
/// per key may wait there: its start is logged in its key's log at the
/// claim's now plus this hold (not at the claim's now), and the worker
/// starts it before the hold has passed since it sent the claim, or
/// hands it back unstarted. So each buffered task's real start lies
/// between the claim and its logged start by the store's clock, and
/// every claim that a later real start could share a window with counts
/// it (see DESIGN "A rate per key with prefetch").
pub(crate) const BUFFER_HOLD: Duration = Duration::from_millis(250);

/// How many tasks a claim under a cap per concurrency key takes at most,
/// given the `places` the keys it walked have to spare (each distinct
/// key's cap less its running tasks, a task of no key one place): the
/// whole `limit` when the places are at least twice it, else only the
/// free slots' share (`limit - buffered`), so a worker's buffered tasks
/// never take the few places another worker's free slots could run
/// (`Backend::key_capped_claims_spare_places`; MySQL's keyed claim calls
/// it, PostgreSQL and SQLite apply the same rule in their statements,
/// Redis in `claim.lua`).
#[cfg(feature = "mysql")]
pub(crate) fn key_capped_take(places: i64, limit: u32, buffered: u32) -> u32 {
    if places >= 2 * i64::from(limit) {
        limit
    } else {
        limit.saturating_sub(buffered)
    }
}

/// A claim request: lease up to `limit` due tasks of one queue.
#[derive(Debug, Clone)]
pub struct TaskClaim<'a> {
    /// Queue to claim from.
    pub queue: &'a str,
    /// Worker identity recorded on the task.
    pub worker: &'a str,
    /// At most this many tasks.
    pub limit: u32,
    /// Lease length from the store's `now()`.
    pub lease: Duration,
    /// A cluster-wide cap on the queue's running tasks: the claim takes at
    /// most `max_running` minus the tasks of this queue running anywhere
    /// (none when that is zero or less), decided atomically with the claim
    /// so that concurrent claimers never overshoot. `None`: no cap.
    pub max_running: Option<u32>,
    /// A cluster-wide cap on the running tasks of each concurrency key
    /// ([`NewTask::concurrency_key`](super::NewTask::concurrency_key)) in this queue: a due task whose key
    /// already has this many tasks running anywhere (counting those this
    /// claim takes) is stepped over and stays pending, untouched (no
    /// attempt counted), and the claim takes the next eligible ones.
    /// Decided atomically with the claim, like `max_running`, so racing
    /// claimers never overshoot. Tasks without a key are not limited.
    /// `None`: no per-key cap.
    pub per_key_max_running: Option<u32>,
    /// Of `limit`, how many the worker will hold unstarted (a prefetch
    /// buffer) rather than start at once. The claim takes the first
    /// `limit - buffered` due tasks in order as usual, then up to
    /// `buffered` more among the following ones that have an attempt to
    /// spare after this one (`attempt + 1 < max_attempts`): a task on its
    /// last attempt is never left waiting in a worker that may crash, where
    /// the rescue would fail it without a run. `0`: every task starts at
    /// once (no filter).
    pub buffered: u32,
    /// Fair claiming across concurrency keys: instead of `(priority,
    /// run_at, id)` order, the claim interleaves the groups of the queue's
    /// due tasks (each concurrency key, and the tasks without a key as one
    /// group): within a priority, the group with the fewest tasks running
    /// (counting those this claim takes) first, ties round-robin from the
    /// group the queue's previous fair claim served last. Priority still
    /// wins across priorities; a group's own tasks keep their order. Its
    /// reads scale with the number of groups with pending tasks, not with
    /// any group's backlog. Decided atomically with the claim, like the
    /// caps, which it honours. A backend without it refuses the claim
    /// ([`StoreError::Config`](crate::StoreError::Config)).
    pub fair: bool,
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl TaskClaim<'_> {
    /// How many candidates a plain claim's locking walk reads: its limit,
    /// and as many again as its buffer share (that share may step over
    /// tasks on their last attempt). PostgreSQL and MySQL; SQLite's
    /// statements write the same bound.
    pub(crate) fn plain_walk(&self) -> u32 {
        self.limit.saturating_add(self.buffered.min(self.limit))
    }

    /// How far a claim limited per key (a cap or a rate per key) walks:
    /// the [plain walk](Self::plain_walk) and three times the free slots'
    /// share further, so keys with one place left do not fill it on their
    /// own; the buffer's share walks once (four times the whole claim
    /// walked ~8 rows a buffered task, docs/BENCHMARKS.md sessions 29 and
    /// 30). Every SQL store's claim under a rate per key, PostgreSQL's and
    /// MySQL's under a cap per key; SQLite's capped statement writes the
    /// same bound.
    pub(crate) fn key_limited_walk(&self) -> u32 {
        self.plain_walk()
            .saturating_add(self.limit.saturating_sub(self.buffered).saturating_mul(3))
    }
}

/// A claim under a rate limit ([`Backend::task_claim_rated`](super::Backend::task_claim_rated)):
/// `claim` as [`Backend::task_claim`](super::Backend::task_claim) takes it,
/// but at most `max` starts (claims) of the limit in any window of `per`
/// of the store's clock, counting every claimer's, decided atomically with
/// the claim. Tasks beyond it stay pending and untouched (no attempt
/// counted).
#[derive(Debug, Clone)]
pub struct TaskClaimRated<'a> {
    /// The claim.
    pub claim: TaskClaim<'a>,
    /// A named limit shared by the queues that name it; `None`: the
    /// queue's own.
    pub name: Option<&'a str>,
    /// Starts allowed per window (≥ 1).
    pub max: u32,
    /// The window (≥ 1 ms).
    pub per: Duration,
    /// Attempts to finish before the claim, each the compare-and-set
    /// [`Backend::task_finish_many`](super::Backend::task_finish_many)
    /// makes and answered in [`RatedClaim::finished`]; each task at most
    /// once. A busy worker sends the results it holds with its next claim
    /// (one round trip where the store can; a rate counts starts, so the
    /// claim need not see them). Empty: the claim alone.
    pub finish: &'a [(Claim, Finish)],
}

impl TaskClaimRated<'_> {
    /// The limit's key in the store: `q:<queue>` for a queue's own limit,
    /// `n:<name>` for a named one.
    pub fn key(&self) -> String {
        match self.name {
            Some(n) => format!("n:{n}"),
            None => format!("q:{}", self.claim.queue),
        }
    }
}

/// What a rated claim took, and when the limit next allows a start.
#[derive(Debug, Clone, PartialEq)]
pub struct RatedClaim {
    /// Per item of the request's `finish`, in order, whether its claim was
    /// current (as [`Backend::task_finish_many`](super::Backend::task_finish_many)
    /// answers); empty when it had none.
    pub finished: Vec<bool>,
    /// The tasks claimed, as [`Backend::task_claim`](super::Backend::task_claim) returns them.
    pub tasks: Vec<Task>,
    /// The store's clock at the claim.
    pub now: DateTime<Utc>,
    /// `Some(t)`: the limit is used up until `t` (store time; no claim
    /// before it can start a task of this limit); `None`: a start is
    /// allowed now.
    pub next_start: Option<DateTime<Utc>>,
    /// Under a rate per concurrency key
    /// ([`Backend::task_claim_key_rated`](super::Backend::task_claim_key_rated)):
    /// when the claim came back short, the earliest instant (store time) at
    /// which a key with pending tasks that its rate holds back may start
    /// again; `None` otherwise (and always for the other claims).
    pub key_next: Option<DateTime<Utc>>,
}

/// A rate per concurrency key: each key of a queue starts at most `max`
/// tasks in any window of `per` of the store's clock
/// ([`WorkerConfig::per_key_rate_limit`](crate::queue::WorkerConfig::per_key_rate_limit)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRate {
    /// Starts allowed per window, per key (≥ 1).
    pub max: u32,
    /// The window (≥ 1 ms).
    pub per: Duration,
}

/// The queue's own or a named rate limit, applied to a
/// [`TaskClaimKeyRated`] on top of its keys' rate (the fields of
/// [`TaskClaimRated`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRateRef<'a> {
    /// A named limit shared by the queues that name it; `None`: the
    /// queue's own.
    pub name: Option<&'a str>,
    /// Starts allowed per window (≥ 1).
    pub max: u32,
    /// The window (≥ 1 ms).
    pub per: Duration,
}

/// A claim under a rate per concurrency key
/// ([`Backend::task_claim_key_rated`](super::Backend::task_claim_key_rated)):
/// `claim` as [`Backend::task_claim`](super::Backend::task_claim) takes it
/// (its caps and buffer share honoured), but no concurrency key starts more
/// than `key_rate.max` tasks in any window of `key_rate.per` of the store's
/// clock, counting every claimer's starts, decided atomically with the
/// claim. A task whose key is used up stays pending and untouched (no
/// attempt counted) while other keys' tasks (and those without a key) are
/// claimed. With `rate`, the queue's (or a named) limit applies too, as in
/// [`TaskClaimRated`]. Not with `claim.fair` (refused with
/// [`StoreError::Config`](crate::StoreError::Config)).
#[derive(Debug, Clone)]
pub struct TaskClaimKeyRated<'a> {
    /// The claim.
    pub claim: TaskClaim<'a>,
    /// The rate every concurrency key of the queue is held to.
    pub key_rate: KeyRate,
    /// A queue's or named rate limit on top, if any.
    pub rate: Option<QueueRateRef<'a>>,
    /// Attempts to finish before the claim, as [`TaskClaimRated::finish`].
    pub finish: &'a [(Claim, Finish)],
}

impl<'a> TaskClaimKeyRated<'a> {
    /// The queue's (or named) limit as a [`TaskClaimRated`] of `claim`.
    pub fn rated(&self) -> Option<TaskClaimRated<'a>> {
        self.rate.map(|r| TaskClaimRated {
            claim: self.claim.clone(),
            name: r.name,
            max: r.max,
            per: r.per,
            finish: self.finish,
        })
    }
}

/// The refusal of a fair claim under a rate per key
/// ([`TaskClaimKeyRated`]), on every store.
pub(crate) fn key_rate_fair_refused() -> crate::StoreError {
    crate::StoreError::Config(
        "a rate per concurrency key (per_key_rate) cannot be combined with fair claiming \
         (fair) yet; drop one of the two"
            .into(),
    )
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use super::key_capped_take;

    #[test]
    fn a_buffer_is_granted_only_where_places_are_twice_the_claim() {
        assert_eq!(
            key_capped_take(6, 10, 8),
            2,
            "scarce: the free slots' share"
        );
        assert_eq!(key_capped_take(19, 10, 8), 2, "just short of twice");
        assert_eq!(key_capped_take(20, 10, 8), 10, "twice: the buffer too");
        assert_eq!(
            key_capped_take(0, 4, 4),
            0,
            "a buffer-only claim, no places"
        );
    }
}
