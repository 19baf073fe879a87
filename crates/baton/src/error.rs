//! Error types of the library.

/// An error from a store operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or the connection broke. Retryable.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered with an error (a query or script failed).
    #[error("store error: {0}")]
    Backend(String),
    /// The URL or options are wrong.
    #[error("{0}")]
    Config(String),
    /// A stored value could not be read back.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// The request conflicts with the stored state (e.g. a unique key).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The driver (sqlx, redis) failed; its error is kept whole as the
    /// [`source`](std::error::Error::source) and is not repeated in this
    /// error's own message, so `{:#}` and error chains ([`chain`]) show the
    /// cause once. Reads `store unavailable` when `retryable` (the store
    /// could not be reached, the connection broke, a call timed out: what
    /// [`StoreError::Unavailable`] means), else `store error` (what
    /// [`StoreError::Backend`] means), then `: context` when there is some.
    #[error("{}", driver_text(*.retryable, .context))]
    Driver {
        /// Whether retrying later can succeed.
        retryable: bool,
        /// What the driver's error means here, in words (may be empty);
        /// never the driver's own text, which is the source.
        context: String,
        /// The driver's own error.
        #[source]
        source: DriverError,
    },
    /// The store refuses writes: a read-only server (a standby or a
    /// demoted primary behind the URL, PostgreSQL
    /// `default_transaction_read_only`, MySQL/MariaDB `read_only`, a Redis
    /// replica's `READONLY` or a master's `NOREPLICAS`). Retryable: writes
    /// work again once the URL reaches a writable server (Redis finds it
    /// again through the sentinels, or by reconnecting). The driver's
    /// error is the source.
    #[error("store is read-only (it refuses writes): {context}")]
    ReadOnly {
        /// What refused, in words.
        context: String,
        /// The driver's own error.
        #[source]
        source: DriverError,
    },
}

/// A driver's error, boxed, as kept by [`StoreError::Driver`].
pub type DriverError = Box<dyn std::error::Error + Send + Sync + 'static>;

fn driver_text(retryable: bool, context: &str) -> String {
    let kind = if retryable {
        "store unavailable"
    } else {
        "store error"
    };
    if context.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {context}")
    }
}

/// An error and its sources on one line, `outer: cause: root`, each text
/// once (a cause whose text the line already holds is skipped). For logs:
/// `tracing::warn!(error = %baton::error::chain(&e), …)`.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

/// How a MySQL/MariaDB deadlock victim's error begins (InnoDB rolled its
/// whole transaction back; see [`StoreError::is_deadlock_victim`]).
#[cfg(feature = "mysql")]
const DEADLOCK_VICTIM: &str = "deadlock victim (the transaction was rolled back)";

impl StoreError {
    /// Whether InnoDB chose this call's transaction as a deadlock's victim
    /// and rolled it back whole, so running the transaction again is the
    /// same as running it once.
    #[cfg(feature = "mysql")]
    pub(crate) fn is_deadlock_victim(&self) -> bool {
        matches!(self, StoreError::Unavailable(m) if m.starts_with(DEADLOCK_VICTIM))
    }

    /// Whether retrying the operation later can succeed (the store was down
    /// or the connection broke).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_)
                | StoreError::ReadOnly { .. }
                | StoreError::Driver {
                    retryable: true,
                    ..
                }
        )
    }

    /// Whether the store refused a write because it is read-only (see
    /// [`StoreError::ReadOnly`]).
    pub fn is_read_only(&self) -> bool {
        matches!(self, StoreError::ReadOnly { .. })
    }

    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    fn read_only(
        context: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::ReadOnly {
            context: context.to_string(),
            source: Box::new(source),
        }
    }

    /// A driver failure kept as the source: retryable (`store unavailable`)
    /// or not (`store error`), `context` (may be empty) after it.
    fn driver(
        retryable: bool,
        context: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> StoreError {
        StoreError::Driver {
            retryable,
            context: context.to_string(),
            source: Box::new(source),
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let retryable = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(db) => {
                // SQLITE_BUSY / SQLITE_LOCKED, PG admin shutdown / cannot connect now.
                // MySQL / MariaDB: lock wait timeout, deadlock victim,
                // MariaDB max_statement_time, MySQL max_execution_time;
                // too many connections, server shutting down, connection
                // killed.
                #[cfg(feature = "mysql")]
                if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    // Read-only: ER_OPTION_PREVENTS_STATEMENT (1290) names
                    // the option (`--read-only`, `--super-read-only`; other
                    // options use the code too), a READ ONLY transaction
                    // (1792), MySQL's read-only mode (1836), InnoDB's
                    // (1874).
                    let text = my.message().to_ascii_lowercase();
                    let named = text.contains("read-only") || text.contains("read_only");
                    if matches!(my.number(), 1792 | 1836 | 1874) || (my.number() == 1290 && named) {
                        return StoreError::read_only(
                            "the server runs read-only (a replica, or `read_only` set)",
                            e,
                        );
                    }
                    match my.number() {
                        1205 | 1969 | 3024 => {
                            return StoreError::Unavailable(format!(
                                "timed out (the store's lock wait or statement limit): {e}"
                            ))
                        }
                        1213 => return StoreError::Unavailable(format!("{DEADLOCK_VICTIM}: {e}")),
                        1040 | 1053 | 1927 => return StoreError::Unavailable(e.to_string()),
                        _ => {}
                    }
                }
                let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                // PG read_only_sql_transaction: a hot standby, a demoted
                // primary, `default_transaction_read_only = on`.
                if code == "25006" {
                    return StoreError::read_only(
                        "the server takes no writes (a standby, or default_transaction_read_only)",
                        e,
                    );
                }
                // SQLITE_READONLY and its extended codes: a file or
                // directory this process may not write.
                #[cfg(feature = "sqlite")]
                if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                    && code.parse::<i32>().is_ok_and(|c| c & 0xff == 8)
                {
                    return StoreError::read_only("the database file cannot be written", e);
                }
                // PG query_canceled (statement_timeout) and an idle
                // transaction ended by idle_in_transaction_session_timeout.
                if matches!(code.as_str(), "57014" | "25P03") {
                    let context = "timed out (the store's statement timeout)";
                    return StoreError::driver(true, context, e);
                }
                let unavailable = matches!(
                    code.as_str(),
                    "5" | "6" | "517" | "57P01" | "57P02" | "57P03" | "53300"
                ) || code.starts_with("08");
                if !unavailable && db.is_unique_violation() {
                    // An outcome callers match on, not a failure.
                    return StoreError::Conflict(e.to_string());
                }
                unavailable
            }
            // The URL or options: the user's input, said in full.
            sqlx::Error::Configuration(_) => return StoreError::Config(e.to_string()),
            _ => false,
        };
        StoreError::driver(retryable, "", e)
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            return StoreError::driver(true, "timed out waiting for redis", e);
        }
        match e.kind() {
            // A single-node client redirected by a cluster node: the URL's
            // fault, not an outage.
            redis::ErrorKind::Moved | redis::ErrorKind::Ask => {
                return StoreError::driver(
                    false,
                    "the Redis server is a cluster node and redirected the command to another \
                     node; use redis+cluster://HOST:PORT[,HOST:PORT…] (rediss+cluster:// for TLS)",
                    e,
                )
            }
            redis::ErrorKind::ClusterDown => {
                return StoreError::driver(true, "the Redis Cluster is down", e)
            }
            redis::ErrorKind::CrossSlot => {
                return StoreError::driver(
                    false,
                    "redis cluster: one command or script touched keys of several slots",
                    e,
                )
            }
            _ => {}
        }
        if e.kind() == redis::ErrorKind::ReadOnly {
            // A replica's `READONLY` reply, or the connection's own finding
            // that the server (or the master the sentinels name) is one.
            let context = e.detail().unwrap_or("a replica").trim().to_string();
            return StoreError::ReadOnly {
                context,
                source: Box::new(e),
            };
        }
        if let (redis::ErrorKind::IoError, Some(detail)) = (e.kind(), e.detail()) {
            // Not an io error of the socket (those carry no detail) but one
            // the connection made up ("no sentinel named the master …",
            // "connect timed out …"): its words alone, without the driver's
            // "desc - IoError:" framing.
            return StoreError::Unavailable(detail.to_string());
        }
        if e.code() == Some("NOREPLICAS") {
            // A master that refuses writes while too few replicas are in
            // sync (`min-replicas-to-write`): a write now would not be kept
            // by a failover.
            let context = format!(
                "the master has fewer replicas in sync than its min-replicas-to-write ({})",
                e.detail().unwrap_or_default().trim()
            );
            return StoreError::ReadOnly {
                context,
                source: Box::new(e),
            };
        }
        let retryable = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                redis::ErrorKind::BusyLoadingError | redis::ErrorKind::TryAgain
            );
        StoreError::driver(retryable, "", e)
    }
}

/// Invalid input: names the field and the accepted form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidInput {
    /// The field or argument at fault, e.g. `lock name` or `at_least`.
    pub field: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

impl InvalidInput {
    /// Build one.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        InvalidInput {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// The library's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input; nothing was written.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lock is held by someone else (and any wait ran out).
    #[error("lock {name:?} is held by {holder} until {until} (token {token})")]
    Busy {
        /// Lock name.
        name: String,
        /// Current holder.
        holder: String,
        /// Lease end in store time.
        until: chrono::DateTime<chrono::Utc>,
        /// Current holder's token.
        token: u64,
    },
    /// The lease was lost (lapsed, taken over, or could not be extended).
    #[error("lease on {0:?} lost")]
    LeaseLost(String),
    /// A handler's error, outside a worker (a handler run by
    /// [`crate::testing::perform`], a payload decoded with
    /// [`TaskContext::args`](crate::queue::TaskContext::args)).
    #[error(transparent)]
    Task(#[from] crate::queue::TaskError),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    #[cfg(all(feature = "sqlite", feature = "redis"))]
    fn a_driver_error_is_kept_as_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let e = StoreError::from(sqlx::Error::Io(io));
        assert!(e.is_retryable());
        // The message says what it means, without the driver's text ...
        assert_eq!(e.to_string(), "store unavailable");
        // ... which the chain adds once.
        assert_eq!(
            chain(&e),
            "store unavailable: error communicating with database: refused here"
        );
        // The driver's text is the source's alone (sqlx's own Io error
        // repeats its io cause; `chain` and the CLI's error line drop that).
        let source_text = e.source().map(|s| s.to_string()).unwrap_or_default();
        assert!(!e.to_string().contains(&source_text), "{e}");
        // ... and the cause is there to walk to.
        let source = e.source().expect("the sqlx error is the source");
        assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
        assert!(
            source
                .source()
                .is_some_and(|s| s.to_string() == "refused here"),
            "the chain goes on to the io error"
        );

        let e = StoreError::from(sqlx::Error::RowNotFound);
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "store error");
        assert!(e.source().is_some());

        let e = StoreError::from(redis::RedisError::from((
            redis::ErrorKind::IoError,
            "connection gone",
        )));
        assert!(e.is_retryable());
        assert_eq!(e.to_string(), "store unavailable");
        let source = e.source().expect("the redis error is the source");
        assert!(source.downcast_ref::<redis::RedisError>().is_some());
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_timeout_says_so_and_keeps_the_cause_once() {
        let e = StoreError::from(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "slow",
        )));
        assert!(e.is_retryable());
        assert_eq!(
            e.to_string(),
            "store unavailable: timed out waiting for redis"
        );
        assert_eq!(chain(&e).matches("slow").count(), 1, "{}", chain(&e));
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_replica_is_read_only_and_retryable() {
        let readonly = redis::RedisError::from((
            redis::ErrorKind::ReadOnly,
            "redis",
            "You can't write against a read only replica.".to_string(),
        ));
        let e = StoreError::from(readonly);
        assert!(matches!(e, StoreError::ReadOnly { .. }), "{e:?}");
        assert!(e.is_retryable());
        assert_eq!(
            e.to_string(),
            "store is read-only (it refuses writes): You can't write against a read only replica."
        );
        let made_up = redis::RedisError::from((
            redis::ErrorKind::IoError,
            "redis",
            "no sentinel named the master \"m\"".to_string(),
        ));
        let e = StoreError::from(made_up);
        assert!(e.is_retryable());
        assert_eq!(
            e.to_string(),
            "store unavailable: no sentinel named the master \"m\""
        );
    }

    #[test]
    #[cfg(feature = "sqlite")]
    fn outcomes_callers_match_on_stay_plain() {
        let e = StoreError::from(sqlx::Error::Configuration("bad option".into()));
        assert!(matches!(e, StoreError::Config(_)), "{e:?}");
    }
}
