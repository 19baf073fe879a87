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
//!   which is an `UPDATE … WHERE ctid = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED))`
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
//! Behind a connection pooler (PgBouncer) the URL says so with
//! `pool_mode=session` or `pool_mode=transaction` (baton's own parameter,
//! stripped before connecting): no startup parameter a pooler refuses; in
//! session mode the timeouts are `SET` per session; in transaction mode
//! every statement runs unnamed in a transaction of its own whose `BEGIN`
//! carries `SET LOCAL` of the timeouts (`exec.rs`), and wake-ups `LISTEN`
//! on the direct connection `listen_host` / `listen_port` name, or workers
//! poll.
//!
//! Files: `sql.rs` (every statement, formatted once per backend), `schema.rs`
//! (DDL, `UPGRADES`, migration), `outbox.rs` (the insert and [`enqueue_in`]),
//! `listener.rs` (`LISTEN` wake-ups), `rows.rs` (column decoding),
//! `backend.rs` (the [`Backend`] impl), `exec.rs` (where a single statement
//! runs behind a transaction pooler).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{ms, Backend, StoreOptions, Wake};
use crate::error::StoreError;

mod advance;
mod array;
mod audit;
mod backend;
mod capped;
mod exec;
mod fair;
mod finish;
mod finish_claim;
mod finish_sql;
mod jobdefs;
mod key_rate;
mod key_rate_fn;
mod listener;
mod lock_history;
mod outbox;
mod queue_view;
mod rows;
mod schema;
mod sql;
mod statistics;
mod stats;

pub use outbox::enqueue_in;
use sql::Sql;
#[doc(hidden)]
pub use statistics::analyze_if_never_sql;

/// The store's clock in microseconds since the epoch: the floor of every
/// fencing token.
#[cfg(not(feature = "test-clock"))]
const NOW_US: &str = "floor(extract(epoch FROM now()) * 1000000)::bigint";

/// The default table prefix.
const DEFAULT_PREFIX: &str = "baton_";

/// Durations are clamped to this (about 100 years) so `now() + d` never
/// leaves the timestamp range.
pub(super) const MAX_MS: i64 = 100 * 366 * 24 * 3_600 * 1_000;

/// How long connecting (or waiting for a pooled connection) may take before
/// the store counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A duration as clamped milliseconds for binding.
pub(super) fn dur(d: Duration) -> i64 {
    ms(d).min(MAX_MS)
}

/// How baton reaches the server: directly, or through a connection pooler
/// such as PgBouncer, named by the URL parameter `pool_mode=session` or
/// `pool_mode=transaction` (PgBouncer's own terms; baton strips the
/// parameter before connecting).
///
/// - `Direct` (no parameter): the session's `statement_timeout` and
///   `idle_in_transaction_session_timeout` travel in the startup packet
///   (`options`), statements are prepared once per connection, wake-ups
///   `LISTEN` on a connection of their own.
/// - `Session`: the same, except that the timeouts are `SET` once the
///   session is open (a pooler refuses the `options` startup parameter).
/// - `Transaction`: every statement is sent unnamed (a named prepared
///   statement would outlive its transaction on a server connection that
///   other clients share next: "prepared statement "sqlx_s_1" already
///   exists"), no session state is set (each transaction of several
///   statements starts with `SET LOCAL` of both timeouts instead; a single
///   statement is bounded by the client's own per-call timeout), and
///   wake-ups `LISTEN` only on a direct connection given by `listen_host` /
///   `listen_port` (the same user and database), else workers poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PoolMode {
    Direct,
    Session,
    Transaction,
}

/// The URL without baton's own parameters (`pool_mode`, `listen_host`,
/// `listen_port`, `pool_size` / `pool_max_conns`), the pool mode, where a
/// direct `LISTEN` connection goes (host, port), if given, and the pool
/// size the URL names.
type SplitUrl = (String, PoolMode, ListenAt, Option<u32>);

/// Where a direct `LISTEN` connection goes behind a transaction pooler:
/// (host, port) replacing the URL's, when the URL names either.
type ListenAt = Option<(Option<String>, Option<u16>)>;

fn split_url(url: &str) -> Result<SplitUrl, StoreError> {
    let bad =
        |what: String| StoreError::Config(format!("store URL {:?}: {what}", super::redact(url)));
    let mut parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let mut mode = PoolMode::Direct;
    let (mut host, mut port) = (None, None);
    let mut size = None;
    let mut kept: Vec<(String, String)> = Vec::new();
    for (k, v) in parsed.query_pairs() {
        match &*k {
            "pool_mode" => {
                mode = match &*v {
                    "session" => PoolMode::Session,
                    "transaction" => PoolMode::Transaction,
                    other => {
                        return Err(bad(format!(
                            "pool_mode={other:?}: use pool_mode=transaction or pool_mode=session (as the pooler's pool_mode), or leave it out for a direct connection"
                        )))
                    }
                }
            }
            "listen_host" => host = Some(v.into_owned()),
            k if super::sizing::is_pool_size_key(k, true) => {
                size = Some(super::sizing::parse_pool_size(url, k, &v)?)
            }
            "listen_port" => {
                port = Some(v.parse::<u16>().map_err(|_| {
                    bad(format!("listen_port={v:?}: use a port number, e.g. listen_port=5432"))
                })?)
            }
            _ => kept.push((k.into_owned(), v.into_owned())),
        }
    }
    let listen = (host.is_some() || port.is_some()).then_some((host, port));
    if mode == PoolMode::Direct && listen.is_none() && size.is_none() {
        // Nothing of baton's: the URL goes to the driver as written.
        return Ok((url.to_string(), mode, None, None));
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    if listen.is_some() && mode != PoolMode::Transaction {
        return Err(bad(
            "listen_host/listen_port name a direct connection for LISTEN behind pool_mode=transaction; add pool_mode=transaction or drop them".into(),
        ));
    }
    Ok((parsed.to_string(), mode, listen, size))
}

/// A refusal by a pooler at startup, said as what it is.
fn pooler_refusal(url: &str, e: &sqlx::Error) -> Option<StoreError> {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if !lower.contains("unsupported startup parameter") {
        return None;
    }
    Some(StoreError::Config(format!(
        "store URL {:?}: the server is a connection pooler (PgBouncer) and refused a startup parameter (its words: {text}); add pool_mode=transaction (or pool_mode=session, as the pooler's pool_mode) to the URL",
        super::redact(url)
    )))
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
    /// Rate limits' start logs, schema 8.
    rates: String,
    /// The audit log, schema 13.
    audit: String,
    /// Start logs of the rates per concurrency key (`store::key_rate`),
    /// schema 15.
    key_rates: String,
    /// The throughput rollup, schema 15.
    rollup: String,
    /// Lock history, schema 16.
    lock_history: String,
    /// The task id sequence, as a quoted identifier inside a string literal
    /// (for `nextval('…')`).
    seq_lit: String,
    /// The notification channel (a plain string, used with `pg_notify`).
    chan: String,
    /// The store's clock: `now()`, plus the test clock's offset with the
    /// feature `test-clock` (see [`test_clock`]).
    now: String,
    /// [`Names::now`] in µs since the epoch: the floor of every fencing
    /// token.
    now_us: String,
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
            rates: format!("\"{p}rates\""),
            audit: format!("\"{p}audit\""),
            key_rates: format!("\"{p}key_rates\""),
            rollup: format!("\"{p}rollup\""),
            lock_history: format!("\"{p}lock_history\""),
            seq_lit: format!("'\"{p}tasks_id_seq\"'"),
            chan: format!("{p}tasks"),
            now: test_clock::now(&p),
            now_us: test_clock::now_us(&p),
            prefix: p,
        }
    }
}

/// The store's clock as SQL, chosen at compile time: `now()`, or with the
/// feature `test-clock` (tests only) `now()` plus the offset in the
/// prefix's one-row table `test_clock_<prefix>`, created on connect.
mod test_clock {
    #[cfg(not(feature = "test-clock"))]
    pub(super) fn now(_prefix: &str) -> String {
        "now()".into()
    }

    #[cfg(not(feature = "test-clock"))]
    pub(super) fn now_us(_prefix: &str) -> String {
        super::NOW_US.into()
    }

    #[cfg(feature = "test-clock")]
    pub(super) fn now(prefix: &str) -> String {
        format!(
            "(now() + (SELECT offset_us FROM \"test_clock_{prefix}\") * interval '1 microsecond')"
        )
    }

    #[cfg(feature = "test-clock")]
    pub(super) fn now_us(prefix: &str) -> String {
        format!(
            "floor(extract(epoch FROM {}) * 1000000)::bigint",
            now(prefix)
        )
    }

    /// Create the prefix's clock table with offset 0 unless it exists. A
    /// failure (a read-only server) is left to the first statement that
    /// reads the clock.
    #[cfg(feature = "test-clock")]
    pub(super) async fn create(pool: &sqlx::PgPool, prefix: &str) {
        // One row, keyed, so processes connecting at once cannot each add
        // one (the clock's subquery must see exactly one).
        let t = format!("\"test_clock_{prefix}\"");
        for sql in [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} \
                 (id int2 PRIMARY KEY CHECK (id = 1), offset_us int8 NOT NULL)"
            ),
            format!("INSERT INTO {t} (id, offset_us) VALUES (1, 0) ON CONFLICT DO NOTHING"),
        ] {
            if let Err(e) = sqlx::raw_sql(&sql).execute(pool).await {
                tracing::debug!(error = %e, "creating the test clock's table");
            }
        }
    }
}

/// The PostgreSQL backend: a connection pool plus the lazily started
/// notification listener.
struct PgBackend {
    pool: PgPool,
    /// The pool's shrinking policy (not on an application's own pool).
    _sized: Option<super::sizing::Sized<sqlx::Postgres>>,
    /// The connection's options; `LISTEN` uses them (or `listen`).
    connect: PgConnectOptions,
    /// Direct, or through a pooler in session or transaction mode.
    mode: PoolMode,
    /// Where `LISTEN` connects behind a transaction pooler (`None`: poll).
    listen: Option<PgConnectOptions>,
    /// Behind a transaction pooler: the `BEGIN` of every transaction, with
    /// `SET LOCAL` of the statement and idle-transaction timeouts (the
    /// session holds none there); each single statement gets one too.
    begin_sql: Option<String>,
    names: Arc<Names>,
    /// Every statement, formatted once for this prefix.
    sql: Arc<Sql>,
    wake: broadcast::Sender<Wake>,
    /// Set once the `LISTEN` session's task is started (the first
    /// `wake_subscribe`).
    listener: OnceLock<()>,
    shutdown: CancellationToken,
    /// Connections to drop after a read-only refusal (see
    /// `Backend::pool_recycle`); a pool the application owns keeps its
    /// connections.
    recycle: Arc<crate::store::Recycle>,
    /// When the tasks table's planner statistics were last checked
    /// (`statistics.rs`).
    stats: statistics::Statistics,
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The driver's connect options for a store URL as baton connects with
/// them (its own parameters `pool_mode`, `listen_host`, `listen_port`
/// stripped; behind a pooler no startup parameter it refuses; no session
/// timeouts), and the pool mode, direct `LISTEN` address and pool size
/// the URL names.
fn options_of(
    url: &str,
) -> Result<(PgConnectOptions, PoolMode, ListenAt, Option<u32>), StoreError> {
    let (plain_url, mode, listen_at, size) = split_url(url)?;
    let mut connect = PgConnectOptions::from_str(&plain_url)
        .map_err(|e| StoreError::Config(format!("store URL {:?}: {e}", super::redact(url))))?;
    if connect.get_application_name().is_none() {
        // Names every session in pg_stat_activity (and PgBouncer's SHOW
        // CLIENTS): which instance holds which connection. The node id
        // `host:pid` begins every worker id this process hands out (the
        // `worker` of its tasks in the admin API), so a task's worker
        // leads to its connections.
        connect = connect.application_name(&format!("baton {}", crate::node::node_id()));
    }
    if mode != PoolMode::Direct {
        // PgBouncer refuses startup parameters it does not track (sqlx
        // sends `extra_float_digits`; baton reads no float as text).
        connect = connect.extra_float_digits(None);
    }
    Ok((connect, mode, listen_at, size))
}

/// The driver's connect options for a store URL, as baton opens its
/// connections (see `pool_mode` in the module docs), without baton's
/// session timeouts. For tests and tools that reach the same server.
#[doc(hidden)]
pub fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    options_of(url).map(|(o, ..)| o)
}

/// Connect to PostgreSQL and return the backend. The pool holds at most
/// the URL's `pool_size` (or `pool_max_conns`) or else
/// `opts.max_connections` connections, opened as calls need them and
/// closed again when idle (`opts.idle_timeout`); an unreachable server fails within
/// `opts.connect_timeout` with [`StoreError::Unavailable`], and every session
/// runs with `statement_timeout` and `idle_in_transaction_session_timeout`
/// set to `opts.statement_timeout` (behind a pooler, as the module docs say). Migrations are not run here
/// (the caller runs [`Backend::migrate`] when `opts.migrate` is set).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    let statement_ms = opts.statement_timeout.as_millis().max(1);
    let (mut connect, mode, listen_at, url_size) = options_of(url)?;
    if mode == PoolMode::Direct {
        // Server-side bounds on every session: a statement, and a
        // transaction left idle by a client that went away, end after
        // `statement_timeout`.
        connect = connect.options([
            ("statement_timeout", statement_ms),
            ("idle_in_transaction_session_timeout", statement_ms),
        ]);
    }
    let listen = listen_at.map(|(host, port)| {
        let mut o = connect.clone();
        if let Some(h) = host {
            o = o.host(&h);
        }
        if let Some(p) = port {
            o = o.port(p);
        }
        o.options([
            ("statement_timeout", statement_ms),
            ("idle_in_transaction_session_timeout", statement_ms),
        ])
    });
    let session_set = format!(
        "SET statement_timeout = {statement_ms}; SET idle_in_transaction_session_timeout = {statement_ms}"
    );
    let recycle = Arc::new(crate::store::Recycle::default());
    let (pool_opts, sized) =
        super::sizing::pool_options::<sqlx::Postgres>(opts, url_size, recycle.clone());
    let pool = pool_opts
        .after_connect(move |conn, _| {
            let set = session_set.clone();
            Box::pin(async move {
                if mode == PoolMode::Session {
                    sqlx::Executor::execute(conn, sqlx::raw_sql(&set)).await?;
                }
                Ok(())
            })
        })
        .connect_with(connect.clone())
        .await
        .map_err(|e| pooler_refusal(url, &e).unwrap_or_else(|| e.into()))?;
    sized.attach(&pool);
    let (wake, _) = broadcast::channel(1024);
    let names = Names::new(opts.prefix.as_deref());
    #[cfg(feature = "test-clock")]
    test_clock::create(&pool, &names.prefix).await;
    let mut sql = Sql::new(&names, opts.keep_succeeded);
    sql.insert.persistent = mode != PoolMode::Transaction;
    Ok(Arc::new(PgBackend {
        pool,
        _sized: Some(sized),
        connect,
        mode,
        listen,
        begin_sql: (mode == PoolMode::Transaction).then(|| format!(
            "BEGIN; SET LOCAL statement_timeout = {statement_ms}; SET LOCAL idle_in_transaction_session_timeout = {statement_ms}"
        )),
        sql: Arc::new(sql),
        names: Arc::new(names),
        wake,
        listener: OnceLock::new(),
        shutdown: CancellationToken::new(),
        recycle,
        stats: Default::default(),
    }))
}

impl PgBackend {
    /// A statement, prepared once per connection or (behind a
    /// transaction pooler) sent unnamed.
    fn q<'q>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(sql).persistent(self.mode != PoolMode::Transaction)
    }

    /// As [`PgBackend::q`], for one column of one type.
    fn qs<'q, O>(
        &self,
        sql: &'q str,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_scalar(sql).persistent(self.mode != PoolMode::Transaction)
    }

    /// Open a transaction; behind a transaction pooler it starts with
    /// `SET LOCAL` of the statement and idle-transaction timeouts (the
    /// session carries none there), in the same round trip as `BEGIN`.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        Ok(match &self.begin_sql {
            Some(begin) => self.pool.begin_with(begin.clone()).await?,
            None => self.pool.begin().await?,
        })
    }

    /// Where a single statement runs (see [`exec`]).
    fn exec(&self) -> exec::Exec<'_> {
        exec::Exec {
            pool: &self.pool,
            begin: self.begin_sql.as_deref(),
        }
    }
}

/// The backend on a pool the application already has (see
/// [`crate::Store::from_pg_pool`]). Sessions keep the pool's own settings:
/// baton's `statement_timeout` is not set on them (every call is still
/// bounded on the client). Wake-ups listen on a connection of their own,
/// opened with the pool's connect options.
/// Create the test clock's table for a pool the application gave (feature
/// `test-clock`; [`connect`] does it for its own pool).
#[cfg(feature = "test-clock")]
pub(crate) async fn create_test_clock(pool: &PgPool, prefix: Option<&str>) {
    test_clock::create(pool, &Names::new(prefix).prefix).await;
}

pub(crate) fn from_pool(
    pool: PgPool,
    opts: &crate::StoreOptions,
) -> Result<Arc<dyn Backend>, StoreError> {
    let prefix = opts.prefix.as_deref();
    if let Some(p) = prefix {
        super::validate_prefix(p)?;
    }
    let connect = (*pool.connect_options()).clone();
    let (wake, _) = broadcast::channel(1024);
    let names = Names::new(prefix);
    Ok(Arc::new(PgBackend {
        pool,
        _sized: None,
        connect,
        mode: PoolMode::Direct,
        listen: None,
        begin_sql: None,
        sql: Arc::new(Sql::new(&names, opts.keep_succeeded)),
        names: Arc::new(names),
        wake,
        listener: OnceLock::new(),
        shutdown: CancellationToken::new(),
        recycle: Arc::new(crate::store::Recycle::default()),
        stats: Default::default(),
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
            Sql::new(&Names::new(prefix), true).claim(limit)
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
