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
}

impl StoreError {
    /// Whether retrying the operation later can succeed (the store was down
    /// or the connection broke).
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(ref db) => {
                // SQLITE_BUSY / SQLITE_LOCKED, PG admin shutdown / cannot connect now.
                // MySQL / MariaDB: lock wait timeout, deadlock victim,
                // MariaDB max_statement_time, MySQL max_execution_time;
                // too many connections, server shutting down, connection
                // killed.
                if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    match my.number() {
                        1205 | 1969 | 3024 => {
                            return StoreError::Unavailable(format!(
                                "timed out (the store's lock wait or statement limit): {e}"
                            ))
                        }
                        1213 | 1040 | 1053 | 1927 => return StoreError::Unavailable(e.to_string()),
                        _ => {}
                    }
                }
                let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                // PG query_canceled (statement_timeout) and an idle
                // transaction ended by idle_in_transaction_session_timeout.
                if matches!(code.as_str(), "57014" | "25P03") {
                    return StoreError::Unavailable(format!(
                        "timed out (the store's statement timeout): {e}"
                    ));
                }
                if matches!(
                    code.as_str(),
                    "5" | "6" | "517" | "57P01" | "57P02" | "57P03" | "53300"
                ) || code.starts_with("08")
                {
                    StoreError::Unavailable(e.to_string())
                } else if db.is_unique_violation() {
                    StoreError::Conflict(e.to_string())
                } else {
                    StoreError::Backend(e.to_string())
                }
            }
            sqlx::Error::Configuration(_) => StoreError::Config(e.to_string()),
            other => StoreError::Backend(other.to_string()),
        }
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            return StoreError::Unavailable(format!("timed out waiting for redis: {e}"));
        }
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || matches!(
                e.kind(),
                redis::ErrorKind::BusyLoadingError | redis::ErrorKind::TryAgain
            )
        {
            StoreError::Unavailable(e.to_string())
        } else {
            StoreError::Backend(e.to_string())
        }
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
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
