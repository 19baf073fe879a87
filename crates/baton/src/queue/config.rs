//! [`WorkerConfig`]: how a [`Worker`](super::Worker) runs, built with
//! chained setters from [`WorkerConfig::default`] (no public fields) and
//! checked when the worker is made ([`Worker::new`](super::Worker::new)).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{Backoff, QueueRate, RateLimit};
use crate::error::InvalidInput;

/// The largest [`WorkerConfig::prefetch`] accepted.
const MAX_PREFETCH: usize = 10_000;
/// The shortest lease a worker accepts: a heartbeat every third of it
/// must still fit a store round trip.
pub const MIN_LEASE: Duration = Duration::from_millis(30);

/// How a worker runs: a builder, starting from [`WorkerConfig::default`] (or
/// [`WorkerConfig::new`]), every setter taking and returning the config.
/// [`Worker::new`](super::Worker::new) refuses an invalid config with an
/// [`InvalidInput`] naming the field (as does [`WorkerConfig::validate`]).
///
/// ```
/// use std::time::Duration;
/// use baton::queue::WorkerConfig;
///
/// let cfg = WorkerConfig::new()
///     .queue("default", 4)                     // 4 handlers at a time
///     .queue("exports", 2)
///     .lease(Duration::from_secs(60))
///     .poll_interval(Duration::from_millis(500))
///     .shutdown_grace(Duration::from_secs(20));
/// assert_eq!(cfg.queues(), [("default".to_string(), 4), ("exports".to_string(), 2)]);
/// assert_eq!(cfg.lease_duration(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a WorkerConfig does nothing until a Worker is made with it"]
pub struct WorkerConfig {
    pub(super) queues: Vec<(String, usize)>,
    pub(super) lease: Duration,
    pub(super) poll_interval: Option<Duration>,
    /// Whether the store's wake-ups reach across processes (set by
    /// [`Worker::run`](super::Worker::run) from its store).
    pub(super) listening: bool,
    pub(super) rescue_interval: Option<Duration>,
    pub(super) shutdown_grace: Duration,
    pub(super) stop_grace: Duration,
    pub(super) backoff: Backoff,
    pub(super) rescue: bool,
    pub(super) retention: Option<Duration>,
    pub(super) max_running: BTreeMap<String, u32>,
    pub(super) per_key_max_running: BTreeMap<String, u32>,
    pub(super) fair: BTreeSet<String>,
    pub(super) rates: BTreeMap<String, QueueRate>,
    pub(super) per_key_rates: BTreeMap<String, RateLimit>,
    pub(super) free_slot_on_return: Option<bool>,
    pub(super) result_batches_in_flight: Option<usize>,
    pub(super) prefetch: Option<Prefetch>,
    /// The store's larger default bound for queues with no limit per
    /// key (set by [`WorkerConfig::with_store_defaults`] on PostgreSQL and
    /// MySQL when no prefetch was chosen; see
    /// [`WorkerConfig::prefetch_tasks_of`]).
    pub(super) plain_prefetch: Option<usize>,
    /// The adaptive buffer's horizon (unset: [`PREFETCH_HORIZON`]; set by
    /// [`WorkerConfig::with_store_defaults`]).
    pub(super) prefetch_horizon: Option<Duration>,
}

/// How a queue's prefetch buffer is sized (see [`WorkerConfig::prefetch`]
/// and [`WorkerConfig::prefetch_up_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prefetch {
    /// Always this many tasks.
    Fixed(usize),
    /// What the queue starts in [`PREFETCH_HORIZON`] at its recent rate,
    /// at most this many.
    UpTo(usize),
}

/// The idle poll period of a worker whose store hears only this process's
/// work (SQLite, MySQL; see [`WorkerConfig::poll_interval`]).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The idle poll period of a worker whose store's wake-ups reach across
/// processes (PostgreSQL's `LISTEN`, Redis pub/sub): the poll is only the
/// safety net for a lost wake-up, so it may be slower, as graphile-worker's
/// and pg-boss's 2 s are (see [`WorkerConfig::poll_interval`]).
pub const LISTENING_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// An adaptive prefetch buffer ([`WorkerConfig::prefetch_up_to`]) holds
/// what its queue starts in this long, at the queue's recent rate.
pub const PREFETCH_HORIZON: Duration = Duration::from_millis(100);

/// The adaptive buffer's horizon on PostgreSQL and MySQL: each claim
/// there walks the claim index's entries for the tasks claimed lately
/// (InnoDB's not yet purged; PostgreSQL's not yet dead to every snapshot,
/// each a heap fetch) and steps over the rows other workers' claims hold
/// locked, a cost per claim, not per task, so claims are made fewer and
/// larger (docs/BENCHMARKS.md, session 25, "MySQL's claims walk
/// unpurged entries"; session 39 for PostgreSQL).
pub const SERVER_SQL_PREFETCH_HORIZON: Duration = Duration::from_millis(300);

/// The adaptive buffer's bound by default
/// ([`WorkerConfig::with_store_defaults`]).
const DEFAULT_PREFETCH: usize = 512;

/// The adaptive buffer's bound by default on PostgreSQL and MySQL for a
/// queue with no limit per key: each claim there is a commit with a cost
/// of its own (on MySQL a walk over the claim index's unpurged entries),
/// so a fast queue's claims are made larger. No-op tasks, 4 workers x 24,
/// side by side against 512: PostgreSQL +8 %, MariaDB +15 %; SQLite and
/// Redis gained nothing, and MySQL's queues under a cap or rate per key
/// lost 20-30 % (their walks grow with what a claim asks for), so those
/// keep 512 (docs/BENCHMARKS.md, session 37). The buffer still holds only
/// its horizon of work at the queue's pace.
const PLAIN_SERVER_SQL_PREFETCH: usize = 2048;

impl Default for WorkerConfig {
    /// No queues (name at least one with [`WorkerConfig::queue`]), a 30 s
    /// lease, a 1 s poll (2 s where wake-ups reach across processes), rescue every 5 s, 10 s shutdown grace, 5 s
    /// stop grace, the default [`Backoff`], 7 days' retention, no cluster
    /// caps; the pipeline knobs ([`free_slot_on_return`](Self::free_slot_on_return),
    /// [`result_batches_in_flight`](Self::result_batches_in_flight),
    /// [`prefetch`](Self::prefetch)) follow the store
    /// ([`with_store_defaults`](Self::with_store_defaults)).
    fn default() -> Self {
        WorkerConfig {
            queues: Vec::new(),
            lease: Duration::from_secs(30),
            poll_interval: None,
            listening: false,
            rescue_interval: None,
            shutdown_grace: Duration::from_secs(10),
            stop_grace: Duration::from_secs(5),
            backoff: Backoff::default(),
            rescue: true,
            retention: Some(super::DEFAULT_RETENTION),
            max_running: BTreeMap::new(),
            per_key_max_running: BTreeMap::new(),
            fair: BTreeSet::new(),
            rates: BTreeMap::new(),
            per_key_rates: BTreeMap::new(),
            free_slot_on_return: None,
            result_batches_in_flight: None,
            prefetch: None,
            plain_prefetch: None,
            prefetch_horizon: None,
        }
    }
}

impl WorkerConfig {
    /// The defaults (same as [`WorkerConfig::default`]).
    pub fn new() -> WorkerConfig {
        WorkerConfig::default()
    }

    /// Serve `queue` with `concurrency` handlers at a time (at least 1).
    /// Call once per queue; naming a queue again replaces its concurrency.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        let queue = queue.into();
        match self.queues.iter_mut().find(|(q, _)| *q == queue) {
            Some(entry) => entry.1 = concurrency,
            None => self.queues.push((queue, concurrency)),
        }
        self
    }

    /// Lease length (default 30 s, at least 30 ms). Heartbeats renew it
    /// every third of `lease - guard`, where the guard is
    /// `min(stop_grace, lease / 3)`: a handler whose lease no heartbeat has
    /// confirmed by `deadline - guard` is stopped
    /// ([`StopReason::LeaseExpiring`](super::worker::StopReason::LeaseExpiring)),
    /// and dropped at the deadline (the send time of the last confirmed
    /// heartbeat, or of the claim, plus the lease). A stalled store can
    /// delay work, never overlap it.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Idle poll period: each tick claims for one queue, in turn, except a
    /// tick after an upkeep call (rescue, prune, clock reading), which
    /// stands in for that poll (never two ticks in a row), so an idle
    /// worker makes one store call per tick.
    ///
    /// Unset, it is [`LISTENING_POLL_INTERVAL`] (2 s) on a store whose
    /// wake-ups reach across processes (PostgreSQL with its `LISTEN`
    /// session, Redis), where the poll only catches a wake-up that was lost,
    /// and [`DEFAULT_POLL_INTERVAL`] (1 s) elsewhere (SQLite, MySQL, and
    /// PostgreSQL behind a transaction pooler without a direct URL), where
    /// it is how work enqueued by other processes is found. Rescue and
    /// prune keep their own timers, based on this period when it is set and
    /// on 1 s when not.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = Some(every);
        self
    }

    /// The idle poll period this config ticks at (see
    /// [`poll_interval`](Self::poll_interval)) on a store whose wake-ups do
    /// (`true`) or do not reach across processes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use baton::queue::WorkerConfig;
    /// assert_eq!(WorkerConfig::new().poll_period(true), Duration::from_secs(2));
    /// assert_eq!(WorkerConfig::new().poll_period(false), Duration::from_secs(1));
    /// let set = WorkerConfig::new().poll_interval(Duration::from_millis(500));
    /// assert_eq!(set.poll_period(true), Duration::from_millis(500));
    /// ```
    pub fn poll_period(&self, wakes_across_processes: bool) -> Duration {
        self.poll_interval.unwrap_or(if wakes_across_processes {
            LISTENING_POLL_INTERVAL
        } else {
            DEFAULT_POLL_INTERVAL
        })
    }

    /// The period this worker ticks at (once [`Worker::run`](super::Worker::run)
    /// has told it whether its store's wake-ups reach across processes).
    pub(super) fn tick(&self) -> Duration {
        self.poll_period(self.listening)
    }

    /// The period rescue (five of them) and prune (300) are counted in:
    /// the poll set, else [`DEFAULT_POLL_INTERVAL`], whatever the store.
    pub(super) fn upkeep_base(&self) -> Duration {
        self.poll_interval.unwrap_or(DEFAULT_POLL_INTERVAL)
    }

    /// How often to rescue expired leases (when rescue is on), on a timer of
    /// its own. Default: every five poll intervals when
    /// [`poll_interval`](Self::poll_interval) is set, else every 5 s.
    pub fn rescue_interval(mut self, every: Duration) -> Self {
        self.rescue_interval = Some(every);
        self
    }

    /// On shutdown, how long running handlers may finish before they are
    /// stopped and their tasks handed back (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// After a stop signal, how long a handler has to return before it is
    /// dropped (default 5 s); never past its lease's end. When the lease is
    /// at stake the stop comes `min(stop_grace, lease / 3)` before the
    /// lease's end.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Retry delays (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Run rescue passes that return expired leases of dead workers
    /// (default on).
    pub fn rescue(mut self, on: bool) -> Self {
        self.rescue = on;
        self
    }

    /// Delete finished tasks older than this, every 300 poll intervals (5
    /// min when no poll is set), on a timer of its own; `None`: never.
    /// Default 7 days.
    pub fn retention(mut self, keep: Option<Duration>) -> Self {
        self.retention = keep;
        self
    }

    /// Cap `queue` at `max` running tasks across every worker of the
    /// cluster: however many workers serve the queue, at most this many of
    /// its tasks run at once. A worker that finds the queue at its cap
    /// checks again on its next poll tick.
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// // Each worker runs up to 8 exports, but the cluster at most 3 at once.
    /// let cfg = WorkerConfig::default().queue("exports", 8).max_running("exports", 3);
    /// assert_eq!(cfg.max_running_of("exports"), Some(3));
    /// ```
    pub fn max_running(mut self, queue: impl Into<String>, max: u32) -> Self {
        self.max_running.insert(queue.into(), max);
        self
    }

    /// Cap each concurrency key of `queue` at `max` running tasks across
    /// every worker of the cluster: at most this many tasks with the same
    /// [`concurrency_key`](super::TaskBuilder::concurrency_key) (e.g.
    /// `customer:42`) run at once; the rest wait pending, no attempt
    /// counted, while tasks of other keys (and tasks without a key) are
    /// claimed as usual. Every worker serving the queue should declare the
    /// same cap: a claimer without it does not look at keys. A buffered
    /// task counts as running, so such a queue prefetches (with a 250 ms
    /// hold) only where the keys a claim walks have places to spare, twice
    /// the claim; with `max_running`, a rate or fair claiming as well it
    /// never prefetches.
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// // At most 2 exports per customer at once, cluster-wide.
    /// let cfg = WorkerConfig::default().queue("exports", 8).per_key_max_running("exports", 2);
    /// assert_eq!(cfg.per_key_max_running_of("exports"), Some(2));
    /// ```
    pub fn per_key_max_running(mut self, queue: impl Into<String>, max: u32) -> Self {
        self.per_key_max_running.insert(queue.into(), max);
        self
    }

    /// Claim `queue`'s tasks fairly across concurrency keys
    /// ([`TaskBuilder::concurrency_key`](super::TaskBuilder::concurrency_key)):
    /// instead of strict `(priority, run_at, id)` order, each claim
    /// interleaves the keys with due tasks (the tasks without a key are one
    /// group of their own), the key with the fewest tasks running first,
    /// ties taken round-robin, so one tenant's backlog does not hold back
    /// another tenant's few tasks. Priority still wins across priorities,
    /// and each key's own tasks keep their order. Decided atomically with
    /// the claim, and combined with the caps and the rate limit. Every
    /// worker serving the queue should declare it (a claimer without it
    /// takes tasks in order). Fair queues never prefetch (a buffer would
    /// hold one key's tasks ahead of the others). Supported on SQLite and
    /// PostgreSQL; a worker on another store refuses it at start (field
    /// `fair`).
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// let cfg = WorkerConfig::default().queue("exports", 8).fair("exports");
    /// assert!(cfg.fair_of("exports"));
    /// ```
    pub fn fair(mut self, queue: impl Into<String>) -> Self {
        self.fair.insert(queue.into());
        self
    }

    /// Start at most `limit` tasks of `queue` per window (e.g. `100/1m`:
    /// [`RateLimit`]), exactly, in every window of the store's clock,
    /// counting every worker of the cluster. A task over the limit stays
    /// pending (no attempt counted) and is claimed when the limit allows:
    /// the claim answers when the next start is allowed and the queue's
    /// claims wait until then (or until stopped). A start is a claim: a
    /// claimed attempt that is handed back still counted. Every worker
    /// serving the queue should declare the same limit: a claimer without
    /// it does not look at the log. Such queues never prefetch (a buffered
    /// task was started when it was claimed).
    ///
    /// ```
    /// use baton::queue::{RateLimit, WorkerConfig};
    /// let cfg = WorkerConfig::default().queue("mail", 8).rate_limit("mail", "100/1m".parse()?);
    /// assert_eq!(cfg.rate_limit_of("mail").unwrap().1.to_string(), "100/1m");
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn rate_limit(mut self, queue: impl Into<String>, limit: RateLimit) -> Self {
        self.rates
            .insert(queue.into(), QueueRate { name: None, limit });
        self
    }

    /// Like [`rate_limit`](Self::rate_limit), but the limit is the named
    /// one `name`, shared by every queue (of any worker) that names it:
    /// e.g. `partner-api` at `10/1s` for queues `a` and `b` starts at most
    /// 10 tasks of `a` and `b` together per second. Every user of the name
    /// should declare the same limit (a worker refuses one name with two
    /// limits). On a Redis Cluster a shared limit is refused (its log and
    /// the queues' keys would sit on different slots): give each queue its
    /// own [`rate_limit`](Self::rate_limit) there.
    ///
    /// ```
    /// use baton::queue::{RateLimit, WorkerConfig};
    /// let api: RateLimit = "10/1s".parse()?;
    /// let cfg = WorkerConfig::default()
    ///     .queue("a", 4)
    ///     .queue("b", 4)
    ///     .shared_rate_limit("a", "partner-api", api)
    ///     .shared_rate_limit("b", "partner-api", api);
    /// assert_eq!(cfg.rate_limit_of("b").unwrap().0, Some("partner-api"));
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn shared_rate_limit(
        mut self,
        queue: impl Into<String>,
        name: impl Into<String>,
        limit: RateLimit,
    ) -> Self {
        self.rates.insert(
            queue.into(),
            QueueRate {
                name: Some(name.into()),
                limit,
            },
        );
        self
    }

    /// Start at most `limit` tasks of each concurrency key of `queue` per
    /// window (e.g. `10/1m`: each customer at most 10 starts a minute),
    /// exactly, in every window of the store's clock, counting every worker
    /// of the cluster. A task whose key is used up stays pending (no
    /// attempt counted) while tasks of other keys (and without a key) are
    /// claimed; the claim answers when the earliest held-back key may start
    /// again, and the queue claims again then (or on a wake-up), without
    /// polling. Combines with [`per_key_max_running`](Self::per_key_max_running),
    /// [`max_running`](Self::max_running) and the queue's
    /// [`rate_limit`](Self::rate_limit) or
    /// [`shared_rate_limit`](Self::shared_rate_limit); not (yet) with
    /// [`fair`](Self::fair) (refused, field `per_key_rate`). Every worker
    /// serving the queue should declare the same rate: a claimer without it
    /// does not look at the keys' logs. Such queues never prefetch.
    ///
    /// ```
    /// use baton::queue::{RateLimit, WorkerConfig};
    /// let cfg = WorkerConfig::default()
    ///     .queue("partner-calls", 8)
    ///     .per_key_rate_limit("partner-calls", "10/1m".parse()?);
    /// assert_eq!(cfg.per_key_rate_limit_of("partner-calls").unwrap().to_string(), "10/1m");
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn per_key_rate_limit(mut self, queue: impl Into<String>, limit: RateLimit) -> Self {
        self.per_key_rates.insert(queue.into(), limit);
        self
    }

    /// Free a handler's slot as soon as it returns: its result is still
    /// being written, and the attempt stays leased and heartbeated until the
    /// store answers; at most `concurrency` plus the
    /// [`prefetch`](Self::prefetch) bound such results wait per queue (as
    /// many as it may hold claimed and not started), beyond that a slot is
    /// freed only by an answer. False: every slot waits for its result's
    /// answer. Default: true ([`with_store_defaults`](Self::with_store_defaults)).
    pub fn free_slot_on_return(mut self, on: bool) -> Self {
        self.free_slot_on_return = Some(on);
        self
    }

    /// How many batches of results a worker writes at once (at least 1).
    /// While they are in flight the next batch gathers what queues up, so a
    /// busy worker's batches grow instead of multiplying. Default: 2
    /// ([`with_store_defaults`](Self::with_store_defaults)).
    pub fn result_batches_in_flight(mut self, n: usize) -> Self {
        self.result_batches_in_flight = Some(n);
        self
    }

    /// Hold up to `n` claimed tasks per queue beyond its running ones (0:
    /// claim only for free slots). A claim then asks for the free slots plus
    /// the room left in this buffer, and is sent when the buffer falls to
    /// half; buffered tasks start as slots free, without a round trip.
    /// While buffered a task is leased to this worker like a running one:
    /// its lease is renewed by the heartbeats (so it is not rescued), it is
    /// not started once its lease is too close to its end to run (it is
    /// handed back instead), and on shutdown it is handed back unstarted
    /// (the attempt is not counted). Queues under a cluster-wide
    /// [`max_running`](Self::max_running) cap, a queue
    /// [`rate_limit`](Self::rate_limit) or [`fair`](Self::fair) claiming
    /// never prefetch (a buffered task counts as running), nor do queues
    /// under a [`per_key_max_running`](Self::per_key_max_running) cap.
    /// Queues limited by a [`per_key_rate_limit`](Self::per_key_rate_limit)
    /// only prefetch with a hold: a buffered task's start is logged in its key's rate log at
    /// the claim plus 250 ms, and a task not started within 250 ms of
    /// its claim's send is handed back unstarted, so the rate holds for
    /// the handlers' real starts. Default: an adaptive buffer of at most
    /// 512, on PostgreSQL and MySQL 2,048 for a queue with no limit per key
    /// ([`prefetch_up_to`](Self::prefetch_up_to), [`prefetch_tasks_of`](Self::prefetch_tasks_of)).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(Prefetch::Fixed(n));
        self
    }

    /// Like [`prefetch`](Self::prefetch), but the buffer adapts to the
    /// queue's pace: it holds what the queue started in the last
    /// [`prefetch_horizon`](Self::prefetch_horizon) (100 ms; 300 ms on
    /// MySQL) at its recent rate, at most `max`
    /// tasks. Short tasks arriving in bulk get large claims (few round
    /// trips and commits per task), while a queue of long handlers
    /// buffers next to nothing, so its tasks are not held back from idle
    /// workers elsewhere. After an idle spell the first claims are for the
    /// free slots only, and the buffer grows within a few claims.
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// let cfg = WorkerConfig::new().queue("q", 24).prefetch_up_to(256);
    /// assert_eq!((cfg.prefetch_tasks(), cfg.prefetch_adaptive()), (256, true));
    /// ```
    pub fn prefetch_up_to(mut self, max: usize) -> Self {
        self.prefetch = Some(Prefetch::UpTo(max));
        self
    }

    /// Fill the pipeline knobs left unset with the defaults, the same on
    /// every store but one (`kind`, a [`Backend::kind`](crate::store::Backend::kind)
    /// name): slots free as handlers return, 2 result batches in flight,
    /// and an adaptive prefetch buffer of at most 512 tasks (on
    /// PostgreSQL and MySQL 2,048 for a queue with no limit per key, where
    /// each claim costs a commit and more; [`prefetch_tasks_of`](Self::prefetch_tasks_of),
    /// [`prefetch_up_to`](Self::prefetch_up_to)) holding
    /// [`PREFETCH_HORIZON`] of work — on PostgreSQL and MySQL
    /// [`SERVER_SQL_PREFETCH_HORIZON`], as each claim there costs a walk
    /// over the entries of tasks claimed lately and the rows other claims
    /// hold.
    ///
    /// Measured side by side (docs/BENCHMARKS.md 4k), 100k no-op tasks, 4
    /// workers × 24: the three together against none took the queue 1.3–1.5×
    /// as fast on Redis, 1.6–1.8× on SQLite, 2.4–2.6× on MySQL, and on
    /// PostgreSQL 1.6× with the buffer alone and 1.6× again once results
    /// could queue up as far as the buffer reaches. Each claim and each
    /// result batch is a commit (or a script call), and bulk work wants few,
    /// large ones. The buffer sizes itself to 100 ms of work (300 ms on
    /// PostgreSQL and MySQL), so long handlers buffer next to nothing.
    ///
    /// [`Worker::run`](super::Worker::run) does this with its store; knobs
    /// set explicitly are kept.
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// let pg = WorkerConfig::new().queue("q", 8).with_store_defaults("postgres");
    /// assert_eq!((pg.free_slot_on_return_on(), pg.result_batches(), pg.prefetch_tasks()), (true, 2, 512));
    /// assert!(pg.prefetch_adaptive());
    /// assert_eq!(pg.prefetch_tasks_of("q"), 2048);
    /// let lite = WorkerConfig::new().queue("q", 8).prefetch(4).with_store_defaults("sqlite");
    /// assert_eq!((lite.free_slot_on_return_on(), lite.result_batches(), lite.prefetch_tasks()), (true, 2, 4));
    /// assert!(!lite.prefetch_adaptive());
    /// ```
    pub fn with_store_defaults(mut self, kind: &str) -> Self {
        self.prefetch_horizon
            .get_or_insert(if matches!(kind, "postgres" | "mysql") {
                SERVER_SQL_PREFETCH_HORIZON
            } else {
                PREFETCH_HORIZON
            });
        self.free_slot_on_return.get_or_insert(true);
        self.result_batches_in_flight.get_or_insert(2);
        if self.prefetch.is_none() && matches!(kind, "postgres" | "mysql") {
            self.plain_prefetch = Some(PLAIN_SERVER_SQL_PREFETCH);
        }
        self.prefetch
            .get_or_insert(Prefetch::UpTo(DEFAULT_PREFETCH));
        self
    }

    /// Whether slots free as handlers return (unset, before
    /// [`with_store_defaults`](Self::with_store_defaults), counts as false; see
    /// [`with_store_defaults`](Self::with_store_defaults)).
    pub fn free_slot_on_return_on(&self) -> bool {
        self.free_slot_on_return.unwrap_or(false)
    }

    /// How many result batches are written at once (unset counts as 1).
    pub fn result_batches(&self) -> usize {
        self.result_batches_in_flight.unwrap_or(1)
    }

    /// How many claimed tasks a queue holds beyond its running ones (unset
    /// counts as 0; see [`prefetch`](Self::prefetch)); for an adaptive
    /// buffer, its bound.
    pub fn prefetch_tasks(&self) -> usize {
        match self.prefetch {
            None => 0,
            Some(Prefetch::Fixed(n) | Prefetch::UpTo(n)) => n,
        }
    }

    /// The prefetch bound of `queue`: [`prefetch_tasks`](Self::prefetch_tasks),
    /// or, left to the store's defaults on PostgreSQL and MySQL, 2,048
    /// for a queue with no [cap](Self::per_key_max_running) or
    /// [rate](Self::per_key_rate_limit) per key.
    ///
    /// ```
    /// use baton::queue::{RateLimit, WorkerConfig};
    /// let pg = WorkerConfig::new()
    ///     .queue("plain", 8)
    ///     .queue("keyed", 8)
    ///     .per_key_rate_limit("keyed", "100/1s".parse::<RateLimit>()?)
    ///     .with_store_defaults("postgres");
    /// assert_eq!((pg.prefetch_tasks_of("plain"), pg.prefetch_tasks_of("keyed")), (2048, 512));
    /// let chosen = WorkerConfig::new().queue("plain", 8).prefetch_up_to(100);
    /// assert_eq!(chosen.with_store_defaults("postgres").prefetch_tasks_of("plain"), 100);
    /// # Ok::<(), baton::InvalidInput>(())
    /// ```
    pub fn prefetch_tasks_of(&self, queue: &str) -> usize {
        let keyed = self.per_key_max_running_of(queue).is_some()
            || self.per_key_rate_limit_of(queue).is_some();
        match self.plain_prefetch {
            Some(n) if !keyed => n,
            _ => self.prefetch_tasks(),
        }
    }

    /// Whether the prefetch buffer adapts to the queue's pace
    /// ([`prefetch_up_to`](Self::prefetch_up_to)).
    pub fn prefetch_adaptive(&self) -> bool {
        matches!(self.prefetch, Some(Prefetch::UpTo(_)))
    }

    /// How much work an adaptive prefetch buffer holds, at its queue's
    /// recent rate: [`PREFETCH_HORIZON`], or the store's own after
    /// [`with_store_defaults`](Self::with_store_defaults) (PostgreSQL and
    /// MySQL: [`SERVER_SQL_PREFETCH_HORIZON`]).
    ///
    /// ```
    /// use baton::queue::{WorkerConfig, PREFETCH_HORIZON, SERVER_SQL_PREFETCH_HORIZON};
    /// let cfg = WorkerConfig::new().queue("q", 8);
    /// assert_eq!(cfg.clone().prefetch_horizon(), PREFETCH_HORIZON);
    /// assert_eq!(cfg.clone().with_store_defaults("sqlite").prefetch_horizon(), PREFETCH_HORIZON);
    /// assert_eq!(cfg.clone().with_store_defaults("postgres").prefetch_horizon(), SERVER_SQL_PREFETCH_HORIZON);
    /// assert_eq!(cfg.with_store_defaults("mysql").prefetch_horizon(), SERVER_SQL_PREFETCH_HORIZON);
    /// ```
    pub fn prefetch_horizon(&self) -> Duration {
        self.prefetch_horizon.unwrap_or(PREFETCH_HORIZON)
    }

    /// The queues served and their concurrency, in the order named.
    pub fn queues(&self) -> &[(String, usize)] {
        &self.queues
    }

    /// The lease length.
    pub fn lease_duration(&self) -> Duration {
        self.lease
    }

    /// The cluster-wide cap on `queue`'s running tasks, if any.
    pub fn max_running_of(&self, queue: &str) -> Option<u32> {
        self.max_running.get(queue).copied()
    }

    /// The cluster-wide cap on the running tasks of each concurrency key
    /// of `queue`, if any ([`per_key_max_running`](Self::per_key_max_running)).
    pub fn per_key_max_running_of(&self, queue: &str) -> Option<u32> {
        self.per_key_max_running.get(queue).copied()
    }

    /// Whether `queue`'s claims are fair across concurrency keys
    /// ([`fair`](Self::fair)).
    pub fn fair_of(&self, queue: &str) -> bool {
        self.fair.contains(queue)
    }

    /// The rate limit of `queue`, if any: the shared limit's name (`None`:
    /// the queue's own) and the limit.
    pub fn rate_limit_of(&self, queue: &str) -> Option<(Option<&str>, RateLimit)> {
        self.rates.get(queue).map(|r| (r.name.as_deref(), r.limit))
    }

    /// The rate each concurrency key of `queue` is held to, if any
    /// ([`per_key_rate_limit`](Self::per_key_rate_limit)).
    pub fn per_key_rate_limit_of(&self, queue: &str) -> Option<RateLimit> {
        self.per_key_rates.get(queue).copied()
    }

    /// Whether claims of `queue` are capped (whole queue or per key),
    /// rated or fair, so that a buffered task would hold a running place,
    /// have been counted as started too early, or wait ahead of other
    /// keys' tasks.
    pub(super) fn capped(&self, queue: &str) -> bool {
        self.max_running.contains_key(queue)
            || self.per_key_max_running.contains_key(queue)
            || self.rates.contains_key(queue)
            || self.per_key_rates.contains_key(queue)
            || self.fair.contains(queue)
    }

    /// Whether `queue` prefetches with a hold, each buffered task started
    /// within `store::BUFFER_HOLD` of its claim or handed back: limited by
    /// a rate per key only (the store logs a buffered task's start at the
    /// claim plus the hold), or by a cap per key only where the store's
    /// claim grants a buffer only among keys with places to spare
    /// (`spare_places`: `Backend::key_capped_claims_spare_places`; a
    /// buffered task holds its key's place, at most for the hold). No
    /// cluster-wide cap, queue rate or fair claiming. Elsewhere a buffer
    /// under a cap per key took the few places from other workers' free
    /// slots (SQLite: cap ÷ off fell from ~45 % to ~13–25 %,
    /// docs/BENCHMARKS.md session 24).
    pub(super) fn prefetch_held(&self, queue: &str, spare_places: bool) -> bool {
        let rate = self.per_key_rates.contains_key(queue);
        let cap = self.per_key_max_running.contains_key(queue);
        (rate != cap && (rate || spare_places))
            && !self.max_running.contains_key(queue)
            && !self.rates.contains_key(queue)
            && !self.fair.contains(queue)
    }

    /// Check every field (queues, concurrency, caps, lease, intervals);
    /// [`Worker::new`](super::Worker::new) does this. A cap
    /// ([`max_running`](Self::max_running)) on a queue the worker does not
    /// serve is refused (field `max_running`).
    ///
    /// ```
    /// use baton::queue::WorkerConfig;
    /// let e = WorkerConfig::new().queue("default", 2).max_running("exports", 1).validate().unwrap_err();
    /// assert_eq!(e.field, "max_running");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.queues.is_empty() {
            return Err(InvalidInput::new(
                "queues",
                "name at least one queue to work on",
            ));
        }
        for (q, c) in &self.queues {
            crate::names::validate_name("queue", q)?;
            if *c == 0 {
                return Err(InvalidInput::new(
                    "concurrency",
                    format!("queue {q:?}: must be at least 1"),
                ));
            }
        }
        for (field, caps) in [
            ("max_running", &self.max_running),
            ("per_key_max_running", &self.per_key_max_running),
        ] {
            for (q, m) in caps {
                if !self.queues.iter().any(|(served, _)| served == q) {
                    return Err(InvalidInput::new(
                        field,
                        format!(
                            "queue {q:?}: this worker does not serve it; serve it with \
                             .queue({q:?}, n) or drop the cap"
                        ),
                    ));
                }
                if *m == 0 {
                    return Err(InvalidInput::new(
                        field,
                        format!("queue {q:?}: must be at least 1 (or no cap at all)"),
                    ));
                }
            }
        }
        if let Some(q) = self
            .fair
            .iter()
            .find(|q| !self.queues.iter().any(|(served, _)| served == *q))
        {
            return Err(InvalidInput::new(
                "fair",
                format!(
                    "queue {q:?}: this worker does not serve it; serve it with \
                     .queue({q:?}, n) or drop the fair setting"
                ),
            ));
        }
        let mut shared: BTreeMap<&str, RateLimit> = BTreeMap::new();
        for (q, r) in &self.rates {
            if !self.queues.iter().any(|(served, _)| served == q) {
                return Err(InvalidInput::new(
                    "rate",
                    format!(
                        "queue {q:?}: this worker does not serve it; serve it with \
                         .queue({q:?}, n) or drop the rate limit"
                    ),
                ));
            }
            if let Some(name) = &r.name {
                crate::names::validate_name("rate limit name", name)?;
                if let Some(other) = shared.insert(name, r.limit).filter(|o| *o != r.limit) {
                    return Err(InvalidInput::new(
                        "rate",
                        format!(
                            "the shared limit {name:?} is declared as both {other} and {}; \
                             declare one limit per name",
                            r.limit
                        ),
                    ));
                }
            }
        }
        for q in self.per_key_rates.keys() {
            if !self.queues.iter().any(|(served, _)| served == q) {
                return Err(InvalidInput::new(
                    "per_key_rate",
                    format!(
                        "queue {q:?}: this worker does not serve it; serve it with \
                         .queue({q:?}, n) or drop the rate per key"
                    ),
                ));
            }
            if self.fair.contains(q) {
                return Err(InvalidInput::new(
                    "per_key_rate",
                    format!(
                        "queue {q:?}: a rate per concurrency key cannot be combined with \
                         fair claiming yet; drop one of the two"
                    ),
                ));
            }
        }
        if self.lease < MIN_LEASE {
            return Err(InvalidInput::new(
                "lease",
                "must be at least 30ms (e.g. 30s)",
            ));
        }
        if self.prefetch_tasks() > MAX_PREFETCH {
            return Err(InvalidInput::new(
                "prefetch",
                format!("must be at most {MAX_PREFETCH} (e.g. the queue's concurrency)"),
            ));
        }
        if self.result_batches_in_flight == Some(0) {
            return Err(InvalidInput::new(
                "result_batches_in_flight",
                "must be at least 1 (e.g. 2)",
            ));
        }
        if self.poll_interval.is_some_and(|p| p.is_zero()) {
            return Err(InvalidInput::new("poll_interval", "must be greater than 0"));
        }
        if self.rescue_interval.is_some_and(|r| r.is_zero()) {
            return Err(InvalidInput::new(
                "rescue_interval",
                "must be greater than 0 (e.g. 5s)",
            ));
        }
        Ok(())
    }
}
