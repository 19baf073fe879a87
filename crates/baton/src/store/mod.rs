//! The store seam: the one place that knows SQL or Redis.
//!
//! Everything above this module (keep-alive loops, worker pools, backoff,
//! cron arithmetic, shutdown) is written once against [`Backend`]. Each
//! backend implements every operation natively and atomically — one SQL
//! statement (or one short `BEGIN IMMEDIATE` transaction on SQLite) or one Lua
//! script per call — and makes every time comparison with the store's own
//! clock (DESIGN.md C1). A backend is done when the shared conformance suite
//! in `crates/baton/tests/` passes on it.
//!
//! [`Store::connect`] picks the backend from the URL scheme:
//! `sqlite://PATH`, `postgres://…` / `postgresql://…`, `mysql://…` /
//! `mariadb://…`, `redis://…` / `rediss://…`, and Redis through Sentinel,
//! `redis+sentinel://…` / `rediss+sentinel://…`.
//!
//! Here: the trait, [`Store`] and [`StoreOptions`]. The values crossing the
//! seam ([`Task`], [`Claim`], [`TaskInfo`], [`NewTask`], …) are in
//! `types.rs`, re-exported here; row decoding shared by the SQL backends is
//! in `sql_row.rs`. Each backend is a folder split by concern (connection,
//! `schema.rs` with its `UPGRADES`, statement text or Lua scripts built
//! once, the thin `Backend` impl in `backend.rs`, wake-ups); `docs/STORE.md`
//! has the contract and a checklist for adding one.

use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub(crate) mod audit;
mod bounded;
mod claim_types;
pub(crate) mod fair;
mod finish_claim;
mod identity;
mod inspect;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod job_advance;
pub mod jobdefs;
// Its shared enqueue (`enqueue_keyed`, `KeySeen`, the plan) serves the
// SQL backends; Redis decides in its script.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code)
)]
mod key_policy;
// Its plan (`pick`, `logs_after`) serves SQLite and MySQL; PostgreSQL
// runs the same rules in its function (`postgres/key_rate_fn.rs`).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
pub(crate) mod key_rate;
pub mod lock_history;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod lock_history_sql;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
mod migrate;
#[cfg(feature = "mysql")]
pub mod mysql;
mod options;
mod overlap;
mod params;
mod pause_note;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod pool;
#[cfg(feature = "postgres")]
pub mod postgres;
mod queue_view;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod rate;
#[cfg(feature = "redis")]
pub mod redis;
mod seam;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod sizing;
mod slot_key;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod sql_row;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod state;
pub mod stats;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod stats_sql;
pub(crate) mod task_search;
mod types;
mod unique_key;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod wake;
mod wakeup;
mod writable;

pub use audit::{AuditAppend, AuditPage, AuditRecord, MAX_AUDIT_FIELD};
pub use bounded::bounded;
use bounded::Bounded;
#[cfg(feature = "mysql")]
pub(crate) use claim_types::key_capped_take;
pub(crate) use claim_types::key_rate_fair_refused;
pub(crate) use claim_types::BUFFER_HOLD;
pub use claim_types::{
    KeyRate, QueueRateRef, RatedClaim, TaskClaim, TaskClaimKeyRated, TaskClaimRated,
};
pub use finish_claim::{finish_ahead, finish_then_claim, FinishedAndClaimed, TaskFinishAndClaim};
pub use identity::{IdentityWatch, IDENTITY_CHECK};
pub use jobdefs::{
    DefinitionSource, JobDef, JobDefDelete, JobDefPut, JobDefWrite, MAX_JOBDEF_BYTES,
};
pub(crate) use key_policy::check_key_policy;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use key_policy::{enqueue_keyed, KeySeen, KeyTx};
pub use key_policy::{EnqueueOutcome, Enqueued, KeyPolicy, MAX_DEBOUNCE, MAX_THROTTLE};
pub use lock_history::{
    LockHistoryQuery, LockRecord, LOCK_HISTORY_PER_LOCK, LOCK_HISTORY_RETENTION,
};
pub use options::{take_lock_history_param, StoreOptions, LOCK_HISTORY_PARAM};
pub use overlap::*;
pub use params::*;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use pause_note::{mark_paused, QueueRow};
pub use pause_note::{PauseChange, PauseNote, MAX_PAUSE_BY_LEN, MAX_PAUSE_NOTE_LEN};
pub(crate) use queue_view::{merge_limits, put_starts};
pub use queue_view::{
    DeclaredLimits, KeyLoad, KeyRateState, QueueDeclare, QueueKeys, QueueKeysQuery, QueueLimits,
    KEYS_SCAN_MAX, MAX_KEYS_PAGE,
};
pub use seam::{seam_types, Backend};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use sizing::{url_pool_size, MAX_POOL_SIZE, POOL_SIZE_PARAM};
pub use slot_key::{is_slot_key, slot_key};
pub use state::{Transition, TRANSITIONS};
pub use stats::{StatsCounts, StatsQuery, StatsRow, STATS_RESOLUTIONS};
pub use task_search::MAX_SEARCH_TEXT;
pub use types::*;
pub use unique_key::{
    args_hash, canonical_json, UniqueHold, UniqueKey, UniqueOpts, UniquePeriod, UniqueScope,
    MAX_STORED_KEY_LEN,
};
pub(crate) use unique_key::{compose_unique_key, validate_stored_unique_key};
pub use wakeup::Wake;
pub(crate) use writable::warn_unless_read_only;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use writable::Recycle;
pub use writable::WriteWatch;

/// The default store URL: an embedded SQLite file in the working directory.
pub const DEFAULT_STORE_URL: &str = "sqlite://baton.db";

/// How far (in µs) a SQL store's task id counter may be behind the
/// store's clock before [`Backend::task_id_floor`] raises it to the clock:
/// a millisecond (a floor is then a no-op right after another). Ids rise
/// slower than the clock (under one per µs), so the ids other connections
/// take while a floor reads and writes the counter stay below the clock
/// the floor writes.
pub const ID_FLOOR_SLACK_US: i64 = 1_000;

/// A connected store: a cheap, cloneable handle to one backend.
///
/// ```no_run
/// # async fn demo() -> Result<(), baton::Error> {
/// let store = baton::Store::connect("sqlite://baton.db").await?;
/// println!("store time is {}", store.now().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    url: Arc<str>,
    /// The identity seen at connect, checked again by the upkeep (shared
    /// by every clone).
    identity: Arc<IdentityWatch>,
    /// Whether the store refuses writes (shared with the [`Bounded`]
    /// wrapper, which marks it from every call's error).
    writes: Arc<WriteWatch>,
    /// Background store calls made through this store and its clones (a
    /// worker's rescue, prune and clock readings, a scheduler's clock
    /// readings and identity checks): an idle worker skips a poll for
    /// each, so a process stays at one store call per poll interval.
    upkeep: Arc<std::sync::atomic::AtomicUsize>,
    /// The table or key prefix it was opened with (`None`: the default),
    /// for the outbox calls on the application's own connection.
    prefix: Option<Arc<str>>,
    /// Whether its lock releases are recorded in the lock history
    /// ([`StoreOptions::lock_history`]).
    lock_history: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend.kind())
            .field("url", &redact(&self.url))
            .finish()
    }
}

impl Store {
    /// Connect with default options, creating or migrating the schema.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Store::connect_with(url, StoreOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &str, mut opts: StoreOptions) -> Result<Store, StoreError> {
        let (url, history) = take_lock_history_param(url)?;
        let url = url.as_str();
        if let Some(on) = history {
            opts.lock_history = on;
        }
        let scheme = match url.split_once("://") {
            Some((s, _)) => s,
            // `sqlite:PATH` (no slashes) is accepted too.
            None if url.starts_with("sqlite:") => "sqlite",
            None => "",
        };
        opts.check(
            matches!(scheme, "postgres" | "postgresql"),
            &format!("store URL {:?}", redact(url)),
        )?;
        let backend: Arc<dyn Backend> = match scheme {
            #[cfg(feature = "sqlite")]
            "sqlite" => sqlite::connect(url, &opts).await?,
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => postgres::connect(url, &opts).await?,
            #[cfg(feature = "redis")]
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
            | "rediss+sentinel" => {
                redis::connect(url, &opts).await?
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => mysql::connect(url, &opts).await?,
            // A guard, not patterns: with every backend on these would be
            // unreachable patterns.
            s if KNOWN_SCHEMES.contains(&s) => return Err(disabled_backend(url, scheme)),
            _ => {
                return Err(StoreError::Config(format!(
                    "store URL {:?}: unknown scheme; use sqlite://PATH, postgres://…, mysql://…, redis://…, redis+sentinel://… or redis+cluster://…",
                    redact(url)
                )))
            }
        };
        let writes = Arc::new(WriteWatch::default());
        let backend: Arc<dyn Backend> = Arc::new(Bounded {
            inner: backend,
            limit: opts.call_deadline(),
            writes: writes.clone(),
        });
        if opts.migrate {
            backend.migrate().await?;
        }
        let mut store = Store::on(backend, url, writes).with_prefix(opts.prefix.as_deref());
        store.lock_history = opts.lock_history;
        // The identity seen at connect. A read that fails here (a store
        // not migrated, a moment's outage) only leaves it to the first
        // check that succeeds.
        if let Err(e) = store.check_identity().await {
            tracing::debug!(error = %crate::error::chain(&e), "could not read the store's identity at connect");
        }
        Ok(store)
    }

    /// Wrap a backend built by hand (for new backends and tests). Its
    /// identity is read by the first [`Store::check_identity`].
    pub fn from_backend(backend: Arc<dyn Backend>, url: &str) -> Store {
        Store::on(backend, url, Arc::new(WriteWatch::default()))
    }

    /// A store on `backend`, sharing `writes` with its [`Bounded`] wrapper.
    fn on(backend: Arc<dyn Backend>, url: &str, writes: Arc<WriteWatch>) -> Store {
        Store {
            backend,
            url: url.into(),
            identity: Arc::new(IdentityWatch::default()),
            writes,
            upkeep: Arc::default(),
            prefix: None,
            lock_history: false,
        }
    }

    /// The same store, recording the prefix its backend was opened with.
    pub(crate) fn with_prefix(mut self, prefix: Option<&str>) -> Store {
        self.prefix = prefix.map(Arc::from);
        self
    }

    /// Whether lock releases through this store are recorded in the lock
    /// history ([`StoreOptions::lock_history`], the URL's `lock_history`).
    pub fn lock_history(&self) -> bool {
        self.lock_history
    }

    /// The table or key prefix the store was opened with (`None`: the
    /// default, `baton_` for the SQL stores).
    pub fn prefix(&self) -> Option<&str> {
        self.prefix.as_deref()
    }

    /// Why the store refuses writes, while it does: the first read-only
    /// refusal a call met since the store last took writes (see
    /// [`WriteWatch`]). `/readyz` fails while it is set.
    pub fn read_only(&self) -> Option<String> {
        self.writes.read_only()
    }

    /// Probe whether the store takes writes ([`Backend::store_write_probe`]):
    /// a refusal marks it read-only (logged once), a probe that works
    /// clears the mark (logged once). The answer is
    /// [`Store::read_only`] after the probe; an error only when the probe
    /// failed otherwise (the store did not answer).
    pub async fn check_writable(&self) -> Result<Option<String>, StoreError> {
        match self.backend.store_write_probe().await {
            Ok(()) => self.writes.accepted(self.backend.kind()),
            Err(e) if e.is_read_only() => self.writes.refused(self.backend.kind(), &e),
            Err(e) => return Err(e),
        }
        Ok(self.read_only())
    }

    /// Count `n` background calls (see `Store::upkeep_calls`).
    pub(crate) fn note_upkeep(&self, n: usize) {
        self.upkeep
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Background store calls counted so far through this store and its
    /// clones; an idle worker's poll ticker skips a poll for each.
    pub(crate) fn upkeep_calls(&self) -> usize {
        self.upkeep.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Read the store's identity and task id counter again and compare
    /// them with what this process saw before (see [`IdentityWatch`]). A
    /// change — another identity, none, or a counter below the highest
    /// seen — is logged once as an error naming what was lost, counted,
    /// and kept (see [`Store::identity_lost`]); the answer is that reason
    /// when this check found it.
    ///
    /// The first check (at connect) and the first after each change also
    /// floor the task id counter at the store's clock in µs
    /// ([`Backend::task_id_floor`]), after the read, so a counter set back
    /// is seen before it is raised. A floor that fails (a read-only store,
    /// a user without the right) is logged and tried again at the next
    /// check.
    pub async fn check_identity(&self) -> Result<Option<String>, StoreError> {
        let read = self.backend.store_identity().await?;
        let reason = self.identity.observe(self.backend.kind(), &read);
        if self.identity.floor_due() {
            match self.backend.task_id_floor().await {
                Ok(()) => self.identity.floored(),
                Err(e) => self.identity.floor_failed(self.backend.kind(), &e),
            }
        }
        Ok(reason)
    }

    /// Why this process no longer trusts the store it connected to: the
    /// first identity change a check found (the store lost its data, or
    /// went back in time), until the process restarts. `None` while the
    /// store is the one it was.
    pub fn identity_lost(&self) -> Option<String> {
        self.identity.lost()
    }

    /// The identity watch of this store (shared by every clone): the
    /// identity seen, the changes counted.
    pub fn identity(&self) -> &IdentityWatch {
        &self.identity
    }

    /// The backend, for the layers above and for tests.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The backend, shared: one reference count where a [`Store`] clone
    /// takes six (a worker's attempt keeps it for its progress reports).
    pub(crate) fn backend_shared(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    /// The URL, with any password hidden.
    pub fn url(&self) -> String {
        redact(&self.url)
    }

    /// The store's clock.
    pub async fn now(&self) -> Result<DateTime<Utc>, StoreError> {
        self.backend.now().await
    }

    /// End attempts ([`Backend::task_finish_many`]), one answer per item,
    /// in order, each exactly the answer it would get alone — also when
    /// the batch names a task twice (e.g. a lost claim's finish and its
    /// next claim's): such a batch goes as runs of distinct tasks, one
    /// after another.
    pub async fn task_finish_many(
        &self,
        items: &[(Claim, Finish)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        let mut start = 0;
        while start < items.len() {
            let mut seen = crate::fast_hash::set_with_capacity(items.len() - start);
            let end = start
                + items[start..]
                    .iter()
                    .take_while(|(c, _)| seen.insert(c.id))
                    .count();
            out.extend(self.backend.task_finish_many(&items[start..end]).await?);
            start = end;
        }
        Ok(out)
    }
}

/// Every URL scheme of a backend, built into this binary or not.
const KNOWN_SCHEMES: &[&str] = &[
    "sqlite",
    "postgres",
    "postgresql",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "mysql",
    "mariadb",
];

/// The error for a URL whose backend this build leaves out: names the
/// cargo feature that brings it in.
fn disabled_backend(url: &str, scheme: &str) -> StoreError {
    let feature = match scheme {
        "postgresql" => "postgres",
        "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel" => {
            "redis"
        }
        "mariadb" => "mysql",
        s => s,
    };
    StoreError::Config(format!(
        "store URL {:?}: this build of baton has no {feature} backend; enable the cargo \
         feature `{feature}` of the `baton` crate (e.g. `features = [\"{feature}\"]`)",
        redact(url)
    ))
}

/// Check a table/key prefix: at most 32 ASCII letters, digits, `_`, `:`
/// or `-` (what every backend accepts in its table and key names).
///
/// ```
/// assert!(baton::store::validate_prefix("app1:").is_ok());
/// assert!(baton::store::validate_prefix("bad prefix").is_err());
/// ```
pub fn validate_prefix(p: &str) -> Result<(), StoreError> {
    if p.len() > 32
        || !p
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '-')
    {
        // A long prefix is not echoed whole (it may be 100 KB of junk).
        let shown = if p.len() > 40 {
            format!("of {} bytes", p.len())
        } else {
            format!("{p:?}")
        };
        return Err(StoreError::Config(format!(
            "prefix {shown}: use at most 32 ASCII letters, digits, '_', ':' or '-'"
        )));
    }
    Ok(())
}

/// [`Backend::job_get`] by filtering [`Backend::job_list`], for backends
/// whose jobs are few or spread (Redis: over the queues' shards).
pub async fn job_from_list(b: &dyn Backend, job: &str) -> Result<Option<JobState>, StoreError> {
    Ok(b.job_list().await?.into_iter().find(|j| j.name == job))
}

/// Hide the passwords in a URL for messages: the one in the user info,
/// and a `sentinel_password=` query parameter (Redis Sentinel).
pub fn redact(url: &str) -> String {
    let url = redact_query(url, "sentinel_password=");
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.split_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    url
}

/// `url` with the value of every query parameter `key` (`name=`) shown as `***`.
fn redact_query(url: &str, key: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let parts: Vec<String> = query
        .split('&')
        .map(|p| match p.strip_prefix(key) {
            Some(_) => format!("{key}***"),
            None => p.to_string(),
        })
        .collect();
    format!("{head}?{}", parts.join("&"))
}

/// Whether pruning `t` leaves a tombstone: a schedule slot's task (a job,
/// a forever unique key).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn tombstoned_kind(t: &NewTask) -> bool {
    t.unique_hold == UniqueHold::Forever && t.job.is_some() && t.unique_key.is_some()
}

/// Duration to whole milliseconds as i64, saturating.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds since the epoch to a timestamp.
pub(crate) fn from_ms(ms: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {ms} ms out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_left_out_backend_is_named_with_its_feature() {
        for (url, feature) in [
            ("rediss://:secret@cache:6380", "redis"),
            ("redis+sentinel://:secret@s1,s2/mymaster", "redis"),
            (
                "rediss+sentinel://s1/mymaster?sentinel_password=secret",
                "redis",
            ),
            ("postgresql://u:pw@db/app", "postgres"),
            ("mariadb://root@db/app", "mysql"),
            ("sqlite://app.db", "sqlite"),
        ] {
            let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or_default();
            assert!(KNOWN_SCHEMES.contains(&scheme), "{scheme}");
            let msg = disabled_backend(url, scheme).to_string();
            assert!(msg.contains(&format!("cargo feature `{feature}`")), "{msg}");
            assert!(
                !msg.contains("secret") && !msg.contains("pw@"),
                "redacted: {msg}"
            );
        }
    }
}
