//! [`StoreOptions`]: how a store is connected (pool, timeouts, prefix).

use std::time::Duration;

use crate::error::StoreError;

/// Options for [`Store::connect_with`](super::Store::connect_with).
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Prefix for table names (SQL) or keys (Redis). Default `baton_` for
    /// SQL tables and empty for Redis keys (so locks live at
    /// `{baton}:lock:<name>`, in baton's own namespace like every other key).
    pub prefix: Option<String>,
    /// Maximum connections in the pool (SQL backends; default 16). A
    /// PostgreSQL or MySQL URL's `pool_size=N` (PostgreSQL also
    /// `pool_max_conns=N`, pgxpool's name) wins over it. The pool opens
    /// connections as calls need them and closes them again when idle
    /// (see [`StoreOptions::idle_timeout`]).
    pub max_connections: u32,
    /// How long the pool of a server store (PostgreSQL, MySQL) keeps a
    /// connection that no load needed (default 10 s): a connection is
    /// closed once the pool has held more connections than were in use at
    /// once for one to two of these, down to one; an unused pool closes
    /// its last after twice this.
    pub idle_timeout: Duration,
    /// Run migrations on connect (default true).
    pub migrate: bool,
    /// How long connecting, or waiting for a pooled connection, may take
    /// (default 5 s). PostgreSQL: connect and pool-acquire timeout; Redis:
    /// connection timeout.
    pub connect_timeout: Duration,
    /// How long one store call may take (default 30 s). PostgreSQL:
    /// `statement_timeout` and `idle_in_transaction_session_timeout` on every
    /// connection; Redis: the response timeout; SQLite: the busy timeout.
    /// Every call is also bounded on the client, at `connect_timeout +
    /// statement_timeout + 1 s`, so a connection that went dark (no reply,
    /// no close) still ends in [`StoreError::Unavailable`] saying it timed
    /// out. Workers and lock keep-alives bound their calls further by the
    /// lease at stake.
    pub statement_timeout: Duration,
    /// Keep succeeded tasks until the workers' retention prunes them
    /// (default true). False (PostgreSQL only): a success deletes the task
    /// in its finish (still fenced by the claim token), which writes far
    /// less than keeping it, when the history is not wanted. Tasks with a
    /// unique key or a schedule job are kept either way: they hold their key
    /// and the job's run history.
    pub keep_succeeded: bool,
    /// Record every lock release in the lock history (default true):
    /// who held which lock, with which token, from when until when, kept a
    /// day (`Locker::history`, `baton serve`'s `/api/v1/locks/history`
    /// and dashboard). A store URL's `lock_history=on` (or `off`) wins
    /// over it, so every process that takes locks can be told alike. The
    /// record is written by the release's own statement (SQLite,
    /// PostgreSQL), script (Redis) or round trip (MySQL), and a tight lock
    /// loop runs about as fast with it as without (0.97–1.02 of it on the
    /// four stores, docs/BENCHMARKS.md), so it is on unless turned off.
    pub lock_history: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            prefix: None,
            max_connections: 16,
            idle_timeout: Duration::from_secs(10),
            migrate: true,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            keep_succeeded: true,
            lock_history: true,
        }
    }
}

impl StoreOptions {
    /// The default options with tables (SQL) or keys (Redis) named by
    /// `prefix`.
    ///
    /// ```
    /// let opts = baton::StoreOptions::prefixed("app_");
    /// assert_eq!(opts.prefix.as_deref(), Some("app_"));
    /// ```
    pub fn prefixed(prefix: impl Into<String>) -> StoreOptions {
        StoreOptions {
            prefix: Some(prefix.into()),
            ..StoreOptions::default()
        }
    }

    /// Check the options for a store at `place` (its URL or pool, for the
    /// message): the prefix, the timeouts, and `keep_succeeded = false`
    /// only where the backend has it (`keep_succeeded_ok`).
    pub(super) fn check(&self, keep_succeeded_ok: bool, place: &str) -> Result<(), StoreError> {
        if let Some(p) = &self.prefix {
            super::validate_prefix(p)?;
        }
        self.validate()?;
        if !self.keep_succeeded && !keep_succeeded_ok {
            return Err(StoreError::Config(format!(
                "keep_succeeded = false: supported on PostgreSQL only ({place}); \
                 keep it true and let the retention prune succeeded tasks"
            )));
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), StoreError> {
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("statement_timeout", self.statement_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if d < Duration::from_millis(10) || d > Duration::from_secs(24 * 3600) {
                return Err(StoreError::Config(format!(
                    "{field}: {} is out of range; use 10ms to 24h (e.g. 5s, 30s)",
                    crate::format_duration(d)
                )));
            }
        }
        Ok(())
    }

    /// The client-side bound on one store call.
    pub(super) fn call_deadline(&self) -> Duration {
        self.connect_timeout + self.statement_timeout + Duration::from_secs(1)
    }
}

/// The URL parameter that turns the lock history on or off
/// ([`StoreOptions::lock_history`]).
pub const LOCK_HISTORY_PARAM: &str = "lock_history";

/// `url` without its `lock_history=on|off` parameter, and the value it
/// gave (a bad value is [`StoreError::Config`] naming the parameter).
///
/// ```
/// use baton::store::take_lock_history_param;
/// let (url, on) = take_lock_history_param("sqlite://b.db?lock_history=on").unwrap();
/// assert_eq!((url.as_str(), on), ("sqlite://b.db", Some(true)));
/// let (url, on) = take_lock_history_param("postgres://h/db?pool_size=4&lock_history=off").unwrap();
/// assert_eq!((url.as_str(), on), ("postgres://h/db?pool_size=4", Some(false)));
/// assert_eq!(take_lock_history_param("redis://h").unwrap().1, None);
/// assert!(take_lock_history_param("redis://h?lock_history=maybe").is_err());
/// ```
pub fn take_lock_history_param(url: &str) -> Result<(String, Option<bool>), StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let mut found = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((LOCK_HISTORY_PARAM, v)) => {
                found = Some(match v {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => {
                        return Err(StoreError::Config(format!(
                            "store URL {:?}: {LOCK_HISTORY_PARAM}={v:?}: use on or off",
                            super::redact(url)
                        )))
                    }
                })
            }
            _ => kept.push(pair),
        }
    }
    Ok(match kept.is_empty() {
        true => (base.to_string(), found),
        false => (format!("{base}?{}", kept.join("&")), found),
    })
}
