//! The values that cross the store seam: lock records and requests, tasks
//! and claims, schedule cursors and wake-ups. Re-exported from
//! [`crate::store`], so `baton::store::Task` and the like keep their paths.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Enqueued, Overlap};
use crate::error::StoreError;

/// A fencing token: strictly greater than every earlier grant's for the same
/// lock name (DESIGN.md L2). Pass it to whatever the lock protects so the
/// protected resource can refuse writes from a holder whose lease lapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(pub u64);

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What the store knows about one lock name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// Who holds (or last held) it: `host:pid:acquisition-id`.
    pub holder: String,
    /// The token of the latest grant.
    pub token: FencingToken,
    /// When the latest grant was made, in store time.
    pub locked_at: DateTime<Utc>,
    /// When the lease ends unless extended, in store time.
    pub lock_until: DateTime<Utc>,
    /// Whether the lease is still in force at `now`.
    pub held: bool,
    /// The store's clock when this was read.
    pub now: DateTime<Utc>,
}

/// A request to take a lease on a lock name.
#[derive(Debug, Clone)]
pub struct LockAcquire<'a> {
    /// Lock name, already validated.
    pub name: &'a str,
    /// Holder identity for this acquisition (unique per acquisition).
    pub holder: &'a str,
    /// Lease length: the lease lapses by itself this long after the grant.
    pub at_most: Duration,
}

/// The store's answer to a [`LockAcquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lease is ours.
    Granted {
        /// The new, strictly higher fencing token.
        token: FencingToken,
        /// Grant time in store time.
        locked_at: DateTime<Utc>,
        /// Expiry in store time.
        lock_until: DateTime<Utc>,
    },
    /// Someone else holds an unexpired lease.
    Busy(LockInfo),
}

/// States a task moves through. `Pending` covers both "available" and
/// "scheduled for later" (`run_at` in the future).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting for `run_at` and a worker.
    Pending,
    /// Leased to a worker.
    Running,
    /// Finished successfully (terminal).
    Succeeded,
    /// Out of attempts or failed for good; the dead letter (terminal).
    Failed,
    /// Cancelled, or skipped by the scheduler's overlap rule (terminal).
    Cancelled,
}

impl TaskState {
    /// Every state, in lifecycle order.
    pub const ALL: [TaskState; 5] = [
        TaskState::Pending,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    /// The lowercase name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }

    /// Whether no further transition happens without an explicit retry.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
}

impl std::fmt::Display for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TaskState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown task state {s:?}")))
    }
}

/// When a new task becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as a worker is free.
    #[default]
    Now,
    /// This long after the store's `now()` at enqueue.
    Delay(Duration),
    /// At this instant.
    At(DateTime<Utc>),
}

/// A task to insert. Built by `queue::TaskBuilder`; fields are validated there.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    /// Queue name.
    pub queue: String,
    /// Handler kind.
    pub kind: String,
    /// JSON payload.
    pub payload: serde_json::Value,
    /// Lower runs first.
    pub priority: i32,
    /// When it becomes due.
    pub run_at: RunAt,
    /// Attempts allowed in total (≥ 1).
    pub max_attempts: u32,
    /// Handler timeout per attempt.
    pub timeout: Option<Duration>,
    /// Idempotency key as stored: while a task with this key holds it
    /// ([`unique_hold`](Self::unique_hold)), enqueueing the key again returns
    /// that task. `queue::TaskBuilder` composes it from the caller's key
    /// and scope ([`UniqueKey`](crate::store::UniqueKey)); a key without
    /// that composite (control characters) is compared as given, across
    /// the store (per queue on Redis).
    pub unique_key: Option<String>,
    /// How long the key stays taken: while the task is unfinished, also
    /// once it succeeded, or in any state until it is pruned.
    pub unique_hold: crate::store::UniqueHold,
    /// The schedule job this task runs for, if any.
    pub job: Option<String>,
    /// The schedule slot this task runs for, if any.
    pub slot: Option<DateTime<Utc>>,
    /// The enqueuer's W3C trace context (`traceparent`, validated by
    /// `queue::TaskBuilder`): the worker's attempt span links to it.
    pub traceparent: Option<String>,
    /// The task's concurrency key (e.g. `customer:42`, validated by
    /// `queue::TaskBuilder`): a claim with
    /// [`TaskClaim::per_key_max_running`](super::TaskClaim::per_key_max_running) starts at most that many tasks
    /// of one key at once, across the cluster. `None`: not limited per key.
    pub concurrency_key: Option<String>,
    /// Debounce or throttle on the unique key (`queue::TaskBuilder`
    /// checks it needs one), decided with the insert.
    pub key_policy: Option<crate::store::KeyPolicy>,
}

/// A task leased to a worker by a claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Task id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Handler kind.
    pub kind: String,
    /// JSON payload.
    pub payload: serde_json::Value,
    /// Priority (lower first).
    pub priority: i32,
    /// This attempt's number, starting at 1 (a handed-back attempt is not
    /// counted, so the next claim has the same number).
    pub attempt: u32,
    /// This claim's fencing token: strictly greater than every earlier
    /// claim's of this task, never reissued (see [`Claim`]).
    pub token: FencingToken,
    /// Attempts allowed in total.
    pub max_attempts: u32,
    /// Handler timeout per attempt.
    pub timeout: Option<Duration>,
    /// When it was due.
    pub run_at: DateTime<Utc>,
    /// When the lease ends unless a heartbeat extends it (store time).
    pub lease_until: DateTime<Utc>,
    /// The schedule job, for scheduled tasks.
    pub job: Option<String>,
    /// The schedule slot, for scheduled tasks.
    pub slot: Option<DateTime<Utc>>,
    /// The enqueuer's W3C trace context, if the enqueue carried one.
    #[serde(default)]
    pub traceparent: Option<String>,
}

impl Task {
    /// The claim this task was leased under: the key of the worker's
    /// heartbeats, progress reports and finish.
    pub fn claim(&self) -> Claim {
        Claim {
            id: self.id,
            attempt: self.attempt,
            token: self.token,
        }
    }
}

/// Identifies one claim of one task: every compare-and-set a worker makes
/// (heartbeat, progress, finish) matches `(id, token)` on a running task
/// (DESIGN.md T2).
///
/// The token is set by each claim to `max(previous + 1, store clock in µs)`
/// and never lowered or reused, so a claim that was handed back, rescued or
/// retried can never match a later one, even where `attempt` repeats (a
/// hand-back does not count the attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// Task id.
    pub id: i64,
    /// Attempt number the worker holds (informational; not compared).
    pub attempt: u32,
    /// The claim's fencing token: what the store compares.
    pub token: FencingToken,
}

/// What a heartbeat found for one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// The lease was extended.
    Extended,
    /// The lease was extended, and someone asked to cancel the task.
    CancelRequested,
    /// The claim is no longer ours (rescued, finished or deleted).
    Lost,
}

/// How a worker ends an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The handler succeeded.
    Succeeded,
    /// The handler failed. With `retry_in` and attempts left, the task goes
    /// back to pending that long after the store's now; otherwise `failed`.
    Failed {
        /// The error text kept on the task.
        error: String,
        /// Backoff before the next attempt, if one is allowed.
        retry_in: Option<Duration>,
    },
    /// The handler stopped because cancellation was requested.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// Shutdown: back to pending now, and the attempt is not counted (or
    /// `cancelled` when cancellation was requested meanwhile). The task
    /// keeps its `run_at`, so its place in line.
    HandBack,
    /// The handler snoozed the task: back to pending, due `run_in` after
    /// the store's now, and the attempt is not counted (or `cancelled`
    /// when cancellation was requested meanwhile), like
    /// [`Finish::HandBack`] with a delay. Its last error is kept.
    Snoozed {
        /// How long after the store's now the task is due again.
        run_in: Duration,
    },
}

/// What [`Queue::delete`](crate::queue::Queue::delete) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeleteOutcome {
    /// The task is gone (a pending one was cancelled first; a schedule
    /// slot's task left its tombstone, so the slot does not run again).
    Deleted,
    /// The task is running: cancel it, and delete it once it has stopped.
    Running,
    /// No such task.
    NotFound,
}

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// The task was pending and is now cancelled.
    Cancelled,
    /// The task is running; its worker stops it at its next heartbeat.
    Requested,
    /// The task had already finished in this state.
    AlreadyFinished(TaskState),
    /// No such task.
    NotFound,
}

/// One failed attempt in a task's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptError {
    /// The attempt's number.
    pub attempt: u32,
    /// When it failed (store time).
    pub at: DateTime<Utc>,
    /// The error text (a command task's ends with its stderr's tail).
    pub error: String,
    /// The worker that ran it (absent in records kept before this field).
    #[serde(default)]
    pub worker: Option<String>,
    /// When it started (store time; absent in records kept before this
    /// field).
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
}

/// Everything the store keeps about a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Task id.
    pub id: i64,
    /// Queue name.
    pub queue: String,
    /// Handler kind.
    pub kind: String,
    /// JSON payload.
    pub payload: serde_json::Value,
    /// Current state.
    pub state: TaskState,
    /// Priority (lower first).
    pub priority: i32,
    /// Attempts started so far.
    pub attempt: u32,
    /// Attempts allowed in total.
    pub max_attempts: u32,
    /// Handler timeout per attempt.
    #[serde(with = "opt_duration_ms")]
    pub timeout: Option<Duration>,
    /// When it is (or was) due.
    pub run_at: DateTime<Utc>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When the latest attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
    /// Lease end while running.
    pub lease_until: Option<DateTime<Utc>>,
    /// The worker holding or last holding it.
    pub worker: Option<String>,
    /// Its idempotency key as stored: a composite of scope and key
    /// ([`UniqueKey`](crate::store::UniqueKey)); read it with
    /// [`TaskInfo::unique`].
    pub unique_key: Option<String>,
    /// How long its unique key stays taken (`Unfinished` for a task
    /// without one).
    #[serde(default)]
    pub unique_hold: crate::store::UniqueHold,
    /// Whether cancellation was requested while it ran.
    pub cancel_requested: bool,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// Every failed attempt, oldest first.
    pub errors: Vec<AttemptError>,
    /// The handler's latest progress report.
    pub progress: Option<serde_json::Value>,
    /// Schedule job, for scheduled tasks.
    pub job: Option<String>,
    /// Schedule slot, for scheduled tasks.
    pub slot: Option<DateTime<Utc>>,
    /// The enqueuer's W3C trace context, if the enqueue carried one.
    #[serde(default)]
    pub traceparent: Option<String>,
    /// Its concurrency key, if it has one ([`NewTask::concurrency_key`]).
    #[serde(default)]
    pub concurrency_key: Option<String>,
}

impl TaskInfo {
    /// Its unique key decoded: the caller's key, scope, period and args
    /// hash (its `Display` is the readable form).
    pub fn unique(&self) -> Option<crate::store::UniqueKey> {
        self.unique_key
            .as_deref()
            .map(crate::store::UniqueKey::parse)
    }
}

mod opt_duration_ms {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        d.map(|d| d.as_millis() as u64).serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// Filter and page for listing tasks. Results are ordered by id descending;
/// `before_id` pages to older tasks.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this state.
    pub state: Option<TaskState>,
    /// Only this job's tasks.
    pub job: Option<String>,
    /// Only this kind.
    pub kind: Option<String>,
    /// Only tasks with this key: a unique key (the caller's key, whatever
    /// its scope, or a slot key) or a concurrency key.
    pub key: Option<String>,
    /// Only tasks whose payload's JSON text contains this text (search a
    /// value, e.g. `alice@example.com`; how a store spaces its JSON
    /// differs, so not a `"field": value` fragment).
    pub text: Option<String>,
    /// Only tasks enqueued at or after this instant.
    pub created_from: Option<DateTime<Utc>>,
    /// Only tasks enqueued before this instant.
    pub created_to: Option<DateTime<Utc>>,
    /// Only ids below this one (the previous page's last id).
    pub before_id: Option<i64>,
    /// Page size (0 means 100).
    pub limit: u32,
}

/// Counts for one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Queue name.
    pub queue: String,
    /// Pending tasks (due now or later).
    pub pending: u64,
    /// Running tasks.
    pub running: u64,
    /// Succeeded tasks not yet pruned.
    pub succeeded: u64,
    /// Failed tasks (dead letter).
    pub failed: u64,
    /// Cancelled tasks not yet pruned.
    pub cancelled: u64,
    /// Age of the oldest due pending task, in milliseconds, by store time.
    pub oldest_pending_ms: Option<u64>,
    /// Claiming is paused cluster-wide (see
    /// [`Backend::queue_set_paused`](super::Backend::queue_set_paused)).
    /// A paused queue is listed even when it holds no tasks.
    #[serde(default)]
    pub paused: bool,
    /// The last pause or resume of the queue: its note, author and time
    /// (`None`: never paused or resumed since the store recorded them).
    #[serde(default)]
    pub pause_change: Option<super::PauseChange>,
    /// The limits its workers declared (`None`: none declared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<super::DeclaredLimits>,
}

/// The schema version a store records at this prefix against the one this
/// build creates and understands ([`Backend::schema_status`](super::Backend::schema_status)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaStatus {
    /// The version the store records; `None` when nothing is recorded (no
    /// baton schema at this prefix).
    pub found: Option<i64>,
    /// The version this build creates and understands.
    pub expected: i64,
}

impl SchemaStatus {
    /// Whether the store records exactly this build's version.
    pub fn is_current(&self) -> bool {
        self.found == Some(self.expected)
    }

    /// Why the schema is not current, in one line naming both versions;
    /// `None` when it is.
    pub fn problem(&self) -> Option<String> {
        let expected = self.expected;
        match self.found {
            Some(v) if v == expected => None,
            Some(v) if v < expected => Some(format!(
                "the store's schema is version {v}, older than this build's {expected}: \
                 connect once with this build to upgrade it"
            )),
            Some(v) => Some(format!(
                "the store's schema is version {v}, newer than this build's {expected}: \
                 upgrade baton"
            )),
            None => Some(format!(
                "no baton schema recorded at this prefix (this build's is version {expected})"
            )),
        }
    }
}

/// What tells one store's data from another's
/// ([`Backend::store_identity`](super::Backend::store_identity)): read at
/// connect and again at the worker's and scheduler's upkeep, so a store
/// that lost its data (a Redis restarted without AOF, a dropped database)
/// or went back in time (a restored older backup) is noticed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreIdentity {
    /// The random id written once, when the store was created or first
    /// migrated by a build that has identities (SQL: the meta row
    /// `store_id`; Redis: the key `B store_id`). `None` when nothing is
    /// recorded: a store not yet migrated, or one that lost its data.
    pub id: Option<String>,
    /// The store's task id counter: the highest id it has handed out (0
    /// when none). It never goes down while the store keeps its data.
    pub last_task_id: i64,
}

/// A new random store identity: 32 hex digits.
pub(crate) fn new_store_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// What one rescue pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rescued {
    /// Expired leases returned to pending.
    pub requeued: u64,
    /// Expired leases of tasks out of attempts, now failed ("lease expired").
    pub failed: u64,
    /// Expired leases of tasks whose cancellation was requested, now cancelled.
    pub cancelled: u64,
}

/// The error recorded on a task whose lease expired.
pub const LEASE_EXPIRED: &str = "lease expired";

/// The `last_error` of a task cancelled at a hand-back because its
/// cancellation was requested; a failed attempt that would have been
/// retried keeps `"cancel requested: <its error>"` instead.
pub const CANCEL_REQUESTED: &str = "cancel requested";

/// A request to move a job's cursor from `expected` to `slot` and record
/// the slot's run (`task`), atomically (DESIGN.md S1).
#[derive(Debug, Clone)]
pub struct JobAdvance<'a> {
    /// Job name.
    pub job: &'a str,
    /// The cursor value the caller read. The advance happens only if the
    /// cursor still has exactly this value.
    pub expected: Option<DateTime<Utc>>,
    /// The slot to take; must be later than `expected`.
    pub slot: DateTime<Utc>,
    /// The slot's task. Its `unique_key` is `job|slot` (unique forever)
    /// so a trigger for the same slot and this advance run it once. `None`
    /// moves the cursor only (a fixed-delay job recording when its run
    /// ended).
    pub task: Option<&'a NewTask>,
    /// How the task is recorded.
    pub record: SlotRecord<'a>,
    /// Overlap rule (for [`SlotRecord::Enqueue`] only).
    pub overlap: Overlap,
    /// A catch-up batch: this job's tasks whose slot is later than this
    /// instant belong to the same catch-up and are not a "previous run"
    /// for the overlap rule. `None`: every pending or running task of the
    /// job is, except (always) tasks the store created once `slot` was
    /// already due by its clock: those belong to the same catch-up as
    /// `slot`, whatever the caller planned (a scheduler whose clock reads a
    /// little behind the store's, or that joined mid-catch-up, may see
    /// `slot` alone).
    pub batch_after: Option<DateTime<Utc>>,
    /// Refuse ([`Advanced::NotDue`]) a slot later than the store's now.
    pub due_only: bool,
    /// Refuse ([`Advanced::NotDue`]) once the store's now has reached this
    /// instant (the next slot, for a policy that runs only the latest).
    pub until: Option<DateTime<Utc>>,
    /// An early take (the scheduler's lead): refuse ([`Advanced::NotDue`])
    /// while the store's now is before this instant (normally
    /// `slot - lead`). While the store's now is also still before `slot`,
    /// the take is early, and under any policy but [`Overlap::Allow`] an unfinished
    /// previous run answers [`Advanced::NotDue`] (nothing recorded, the
    /// cursor unmoved) instead of recording a skip: the overlap rule is
    /// judged at the slot, not `lead` before it. Once the store's now has
    /// reached `slot` the take is an ordinary one. `None`: no early take.
    pub not_before: Option<DateTime<Utc>>,
    /// Which definition of the job the caller runs: refuse
    /// ([`Advanced::Superseded`]) a slot that another definition in the
    /// store governs ([`DefinitionSource`](super::DefinitionSource)).
    /// `None`: no check (a scheduler that does not run the store's
    /// definitions).
    pub source: Option<super::DefinitionSource>,
}

impl<'a> JobAdvance<'a> {
    /// An advance that enqueues `task` for `slot`, overlap allowed, no
    /// catch-up batch and no store-time bounds.
    pub fn new(
        job: &'a str,
        expected: Option<DateTime<Utc>>,
        slot: DateTime<Utc>,
        task: Option<&'a NewTask>,
    ) -> JobAdvance<'a> {
        JobAdvance {
            job,
            expected,
            slot,
            task,
            record: SlotRecord::Enqueue,
            overlap: Overlap::Allow,
            batch_after: None,
            due_only: false,
            until: None,
            not_before: None,
            source: None,
        }
    }

    /// Whether the store refuses the advance ([`Advanced::NotDue`]) by its
    /// clock `now`, before touching anything: `now` is before the slot
    /// under `due_only`, at or after `until`, or before `not_before`. The
    /// early-take overlap rule is [`JobAdvance::early_at`].
    pub fn refused_at(&self, now: DateTime<Utc>) -> bool {
        (self.due_only && self.slot > now)
            || self.until.is_some_and(|u| now >= u)
            || self.not_before.is_some_and(|t| now < t)
    }

    /// Whether a take at store time `now` is early (`not_before` set and
    /// `now` still before the slot): then, under any policy but
    /// [`Overlap::Allow`] with an unfinished previous run, the store answers
    /// [`Advanced::NotDue`].
    pub fn early_at(&self, now: DateTime<Utc>) -> bool {
        self.not_before.is_some() && now < self.slot
    }

    /// Whether the store must look for an unfinished previous run (the
    /// overlap rule applies: an enqueue under any policy but
    /// [`Overlap::Allow`]).
    pub fn checks_overlap(&self) -> bool {
        self.task.is_some() && self.record == SlotRecord::Enqueue && self.overlap != Overlap::Allow
    }
}

/// The claim token of a task inserted by [`SlotRecord::Run`]: the first
/// claim of a new task (any later claim, after a `retry`, is floored at the
/// store clock in µs, so this value is never reissued for the task).
pub const RUN_RECORD_TOKEN: FencingToken = FencingToken(1);

/// How [`JobAdvance`] records the slot's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRecord<'a> {
    /// Enqueue it like `enqueue` (durable mode), subject to the overlap rule.
    Enqueue,
    /// Insert it directly as `running`, attempt 1, leased to `worker` for
    /// `lease` (lock mode: the caller runs the slot itself and finishes
    /// the task with the outcome, heartbeating it meanwhile).
    /// The task's claim token is [`RUN_RECORD_TOKEN`] (it was never claimed).
    Run {
        /// Worker identity recorded on the task.
        worker: &'a str,
        /// Lease from the store's now.
        lease: Duration,
    },
    /// Insert it directly as `cancelled` with this reason (a slot the
    /// scheduler decided not to run, e.g. by its misfire policy).
    Skip {
        /// Why, kept in `last_error`.
        reason: &'a str,
    },
}

/// The store's answer to a [`JobAdvance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Advanced {
    /// The cursor moved and the slot's task exists (`inserted` false when a
    /// trigger had made it already; `id` 0 when no task was given).
    Enqueued(Enqueued),
    /// The cursor moved; the slot was recorded as skipped (overlap).
    Skipped(Enqueued),
    /// The cursor moved; the slot's task was recorded waiting for the
    /// job's previous run ([`Overlap::BufferOne`], [`Overlap::BufferAll`],
    /// [`Overlap::CancelOther`]): pending with `run_at` at
    /// [`WAITING_RUN_AT_MS`](super::WAITING_RUN_AT_MS) until
    /// [`Backend::job_release`](super::Backend::job_release) lets it start.
    Waiting(Enqueued),
    /// The cursor was not `expected` (another instance moved it): here is
    /// the current one.
    Moved(Option<DateTime<Utc>>),
    /// The slot is not due by store time (`due_only`) or no longer the one
    /// to take (`until` reached): nothing changed. `now` is the store's.
    NotDue {
        /// The store's clock when it refused.
        now: DateTime<Utc>,
    },
    /// The job is paused; nothing changed.
    Paused,
    /// No such job (call `job_register` first).
    UnknownJob,
    /// Another definition of the job in the store governs this slot
    /// ([`JobAdvance::source`]): nothing changed; the caller runs an out
    /// of date definition and should read the store's again.
    Superseded,
}

/// The scheduler's per-job state in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobState {
    /// Job name.
    pub name: String,
    /// The last slot enqueued (or skipped) by the scheduler.
    pub last_slot: Option<DateTime<Utc>>,
    /// Whether the job is paused cluster-wide.
    pub paused: bool,
    /// The queue its slot runs go to, as last registered (`None`: a store
    /// that has not seen this job register since it recorded queues).
    pub queue: Option<String>,
    /// Its overlap policy, as last registered (`None`: not registered
    /// since the store recorded policies).
    #[serde(default)]
    pub overlap: Option<super::Overlap>,
    /// The last pause or resume: its note, author and time (`None`: never
    /// paused or resumed since the store recorded them).
    #[serde(default)]
    pub pause_change: Option<super::PauseChange>,
    /// The definition's fingerprint as last registered ([`JobRegister`](super::JobRegister)).
    #[serde(default)]
    pub fingerprint: Option<String>,
}

/// What is kept of a slot's run once pruning deleted its task (the slot's
/// tombstone): enough to refuse the slot a second time and to say what
/// became of it. Written in the same transaction (or script) as the prune
/// that deletes the task; never deleted, so "once per slot" holds forever.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PrunedSlot {
    /// The slot's unique key (`job|RFC3339`).
    pub key: String,
    /// Job name.
    pub job: String,
    /// The slot.
    pub slot: Option<DateTime<Utc>>,
    /// The id the slot's task had.
    pub task_id: i64,
    /// Its terminal state.
    pub state: TaskState,
    /// Its last error (a skipped slot's reason), cut to 1000 bytes.
    pub last_error: Option<String>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}
