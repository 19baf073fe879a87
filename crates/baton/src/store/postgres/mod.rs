//! The PostgreSQL backend.
//!
//! Every operation is one SQL statement, or one short transaction holding row
//! locks, and every time comparison uses the server's `now()` (DESIGN.md C1).
//! Durations travel as milliseconds (`$n * interval '1 millisecond'`).
//!
//! Tables (all prefixed by [`StoreOptions::prefix`], default `baton_`):
//!
//! - `<p>meta`: the schema version.
//! - `<p>locks`: one row per lock name; never deleted, so tokens keep rising.
//! - `<p>tasks`: the queue. A partial index on the pending set
//!   `(queue, priority, run_at, id) WHERE state = 'pending'` serves the claim,
//!   which is an `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)`
//!   whose index walk has a literal `LIMIT` (the request's limit rounded up
//!   to a power of two, so each connection prepares a few claim statements
//!   once) and whose exact limit is a parameter above the row locks. The
//!   running set is indexed by `(queue) WHERE state = 'running'` (rescue and
//!   the capped claim; a heartbeat changes no indexed column, so it can be a
//!   HOT update); the table's fillfactor is 70 (schema 4). Every kind of finish of a batch is one
//!   statement.
//! - `<p>jobs`: one cursor row per schedule job.
//!
//! New pending work is announced with `pg_notify('<p>tasks', queue)` inside
//! the enqueueing transaction (`queue\n<µs>` for work due later: see
//! [`Wake`]); [`Backend::wake_subscribe`] listens on that channel
//! with a [`sqlx::postgres::PgListener`] that reconnects with backoff. Notifications are a
//! hint only; workers poll as well.
//!
//! [`enqueue_in`] lets users enqueue inside their own transaction (the
//! transactional outbox): the tasks and the notification appear at their
//! commit, or not at all.
//!
//! Files: `sql.rs` (every statement, formatted once per backend), `schema.rs`
//! (DDL, `UPGRADES`, migration), `outbox.rs` (the insert and [`enqueue_in`]),
//! `listener.rs` (`LISTEN` wake-ups), `rows.rs` (column decoding),
//! `backend.rs` (the [`Backend`] impl).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{ms, Backend, StoreOptions, Wake};
use crate::error::StoreError;

mod backend;
mod listener;
mod outbox;
mod rows;
mod schema;
mod sql;

pub use outbox::enqueue_in;
use sql::Sql;

/// The store's clock in microseconds since the epoch: the floor of every
/// fencing token.
const NOW_US: &str = "floor(extract(epoch FROM now()) * 1000000)::bigint";

/// The default table prefix.
const DEFAULT_PREFIX: &str = "baton_";

/// Durations are clamped to this (about 100 years) so `now() + d` never
/// leaves the timestamp range.
const MAX_MS: i64 = 100 * 366 * 24 * 3_600 * 1_000;

/// How long connecting (or waiting for a pooled connection) may take before
/// the store counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled connection idle at least this long is pinged before it is
/// handed out. Busier connections are not: sqlx's default pings on every
/// checkout, one extra round trip in front of every statement. A connection
/// that broke while busy fails its next statement once (the caller sees
/// [`StoreError::Unavailable`]) and is then dropped from the pool.
const IDLE_PING: Duration = Duration::from_secs(1);

/// A duration as clamped milliseconds for binding.
pub(super) fn dur(d: Duration) -> i64 {
    ms(d).min(MAX_MS)
}

/// Quoted, prefixed object names.
#[derive(Debug, Clone)]
struct Names {
    prefix: String,
    meta: String,
    locks: String,
    tasks: String,
    jobs: String,
    /// Per-queue flags (paused), schema 3.
    queues: String,
    /// Slot tombstones (a pruned slot's key, kept), schema 6.
    slots: String,
    /// The task id sequence, as a quoted identifier inside a string literal
    /// (for `nextval('…')`).
    seq_lit: String,
    /// The notification channel (a plain string, used with `pg_notify`).
    chan: String,
}

impl Names {
    fn new(prefix: Option<&str>) -> Names {
        let p = prefix.unwrap_or(DEFAULT_PREFIX).to_string();
        Names {
            meta: format!("\"{p}meta\""),
            locks: format!("\"{p}locks\""),
            tasks: format!("\"{p}tasks\""),
            jobs: format!("\"{p}jobs\""),
            queues: format!("\"{p}queues\""),
            slots: format!("\"{p}slots\""),
            seq_lit: format!("'\"{p}tasks_id_seq\"'"),
            chan: format!("{p}tasks"),
            prefix: p,
        }
    }
}

/// The PostgreSQL backend: a connection pool plus the lazily started
/// notification listener.
struct PgBackend {
    pool: PgPool,
    connect: PgConnectOptions,
    names: Arc<Names>,
    /// Every statement, formatted once for this prefix.
    sql: Arc<Sql>,
    wake: broadcast::Sender<Wake>,
    listener: OnceLock<()>,
    shutdown: CancellationToken,
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Connect to PostgreSQL and return the backend. The pool holds at most
/// `opts.max_connections` connections; an unreachable server fails within
/// `opts.connect_timeout` with [`StoreError::Unavailable`], and every session
/// runs with `statement_timeout` and `idle_in_transaction_session_timeout`
/// set to `opts.statement_timeout`. Migrations are not run here
/// (the caller runs [`Backend::migrate`] when `opts.migrate` is set).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    let statement_ms = opts.statement_timeout.as_millis().max(1);
    // Server-side bounds on every session: a statement, and a transaction
    // left idle by a client that went away, end after `statement_timeout`.
    let connect = PgConnectOptions::from_str(url)
        .map_err(|e| StoreError::Config(format!("store URL {:?}: {e}", super::redact(url))))?
        .options([
            ("statement_timeout", statement_ms),
            ("idle_in_transaction_session_timeout", statement_ms),
        ]);
    let pool = PgPoolOptions::new()
        .max_connections(opts.max_connections.max(1))
        .acquire_timeout(opts.connect_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_PING {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .connect_with(connect.clone())
        .await?;
    let (wake, _) = broadcast::channel(1024);
    let names = Names::new(opts.prefix.as_deref());
    Ok(Arc::new(PgBackend {
        pool,
        connect,
        sql: Arc::new(Sql::new(&names, opts.keep_succeeded)),
        names: Arc::new(names),
        wake,
        listener: OnceLock::new(),
        shutdown: CancellationToken::new(),
    }))
}

/// The backend on a pool the application already has (see
/// [`crate::Store::from_pg_pool`]). Sessions keep the pool's own settings:
/// baton's `statement_timeout` is not set on them (every call is still
/// bounded on the client). Wake-ups listen on a connection of their own,
/// opened with the pool's connect options.
pub(crate) fn from_pool(
    pool: PgPool,
    prefix: Option<&str>,
) -> Result<Arc<dyn Backend>, StoreError> {
    if let Some(p) = prefix {
        super::validate_prefix(p)?;
    }
    let connect = (*pool.connect_options()).clone();
    let (wake, _) = broadcast::channel(1024);
    let names = Names::new(prefix);
    Ok(Arc::new(PgBackend {
        pool,
        connect,
        sql: Arc::new(Sql::new(&names, true)),
        names: Arc::new(names),
        wake,
        listener: OnceLock::new(),
        shutdown: CancellationToken::new(),
    }))
}

/// The plan of the claim statement for `queue` and `limit`, as `EXPLAIN`
/// prints it, prepared and then explained under `plan_cache_mode =
/// force_generic_plan` (`generic`) or `force_custom_plan`; with `analyze`,
/// run too (`EXPLAIN (ANALYZE, BUFFERS)`). For tests and diagnostics (a
/// claim must stay an index walk); not a stable API. Runs in a transaction
/// that is rolled back.
#[doc(hidden)]
pub async fn explain_claim(
    conn: &mut PgConnection,
    prefix: Option<&str>,
    queue: &str,
    limit: u32,
    generic: bool,
    analyze: bool,
) -> Result<String, StoreError> {
    let mut tx = conn.begin().await?;
    let mode = if generic {
        "force_generic_plan"
    } else {
        "force_custom_plan"
    };
    sqlx::Executor::execute(
        &mut *tx,
        format!("SET LOCAL plan_cache_mode = {mode}").as_str(),
    )
    .await?;
    sqlx::Executor::execute(
        &mut *tx,
        format!(
            "PREPARE baton_explain_claim(text, text, int8, int8, int8) AS {}",
            Sql::new(&Names::new(prefix), true).claim(limit, false)
        )
        .as_str(),
    )
    .await?;
    let q = queue.replace('\'', "''");
    let rows: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN {} EXECUTE baton_explain_claim('{q}', 'explain', 1000, {limit}, 0)",
        if analyze { "(ANALYZE, BUFFERS)" } else { "" }
    ))
    .fetch_all(&mut *tx)
    .await?;
    sqlx::Executor::execute(&mut *tx, "DEALLOCATE baton_explain_claim").await?;
    tx.rollback().await?;
    Ok(rows.join("\n"))
}
