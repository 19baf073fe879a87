//! The MySQL / MariaDB backend (`mysql://…`, `mariadb://…`): MySQL 8.0+ or
//! MariaDB 10.6+, InnoDB.
//!
//! MySQL has no `UPDATE … RETURNING` and no partial indexes, so where the
//! PostgreSQL backend writes one statement this one runs one short
//! transaction that locks the rows it decides on (`SELECT … FOR UPDATE`,
//! `SKIP LOCKED` for claims and rescue), changes them, and reads them back.
//! A lock grant and an extension are such a transaction written as one
//! multi-statement batch (`START TRANSACTION; …; COMMIT` with the values as
//! literals), so they cost one round trip and one commit.
//! Every session runs at `READ COMMITTED` (no gap locks, so `SKIP LOCKED`
//! claimers and inserters do not block each other, and every statement
//! sees the latest commits; one exception: an uncapped claim into a
//! backlog, `claim::Backlog`), with `time_zone = '+00:00'`, and every "now"
//! is `UTC_TIMESTAMP(6)` inside the statement (DESIGN.md C1), so the
//! session time zone never matters. Times are `DATETIME(6)` in UTC.
//!
//! Tables (all prefixed by [`StoreOptions::prefix`], default `baton_`):
//!
//! - `<p>meta`: the schema version.
//! - `<p>locks`: one row per lock name; never deleted, so tokens keep rising.
//! - `<p>tasks`: the queue. The claim walks the index
//!   `(queue, state, priority, run_at, id)`; a unique key is taken through a
//!   stored generated column `live_key` (the key while it is taken, else
//!   NULL) with a unique index, which stands in for PostgreSQL's partial
//!   unique index. `enqueue_mark` (schema 3) lets a multi-row insert read
//!   back its rows' ids without assuming they are consecutive.
//! - `<p>jobs`: one cursor row per schedule job.
//! - `<p>queues`: one row per capped or paused queue. Claimers of a capped
//!   queue lock its row so that they count its running tasks in turn
//!   (`max_running`); `paused` (schema 4) stops every claim on the queue.
//!
//! Names, queues, kinds, jobs and unique keys are `VARBINARY`: compared byte
//! for byte, with no case folding and no trailing-space padding.
//!
//! MySQL has no LISTEN/NOTIFY: [`Backend::wake_subscribe`] is an in-process
//! broadcast shared by every handle on the same server, database and prefix
//! in this process (as SQLite's). Workers in other processes find new work
//! by polling (at most one claim per second per idle worker).
//!
//! Durability: grants, extensions, claims and finishes are reported after
//! their `COMMIT` returns, so they are durable as far as the server makes a
//! commit durable (`innodb_flush_log_at_trx_commit = 1`, and `sync_binlog
//! = 1` where the binary log is on; [`Backend::warnings`] says when not).
//! A release need not be durable, but MySQL has no per-transaction switch
//! for it, so it commits like the rest.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::{Executor, MySqlConnection};
use tokio::sync::broadcast;

use super::{ms, Backend, StoreOptions, Wake};
use crate::error::StoreError;

mod admin;
mod advance;
mod audit;
mod backend;
mod claim;
mod fair;
mod finish_ok;
mod jobdefs;
mod jobs;
mod key_policy;
mod key_rate;
mod keyed;
mod lock_history;
mod locks;
mod queue_view;
mod rows;
mod schema;
mod stats;
mod tasks;

pub use tasks::enqueue_in;

/// The default table prefix.
pub(crate) const DEFAULT_PREFIX: &str = "baton_";

/// Durations are clamped to this (about 100 years) so `now + d` stays in
/// the `DATETIME` range.
const MAX_MS: i64 = 100 * 366 * 24 * 3_600 * 1_000;

/// The store's clock as SQL, chosen at compile time: `UTC_TIMESTAMP(6)`,
/// or with the feature `test-clock` (tests only) plus the offset in the
/// prefix's one-row table `test_clock_<prefix>`, created on connect.
#[cfg(not(feature = "test-clock"))]
fn now_sql(_prefix: &str) -> String {
    "UTC_TIMESTAMP(6)".into()
}

/// The store's clock as SQL, plus the test clock's offset (see above).
#[cfg(feature = "test-clock")]
fn now_sql(prefix: &str) -> String {
    format!(
        "(UTC_TIMESTAMP(6) + INTERVAL (SELECT offset_us FROM `test_clock_{prefix}`) MICROSECOND)"
    )
}

/// Create the prefix's clock table with offset 0 unless it exists
/// (feature `test-clock`). A failure (a read-only server) is left to the
/// first statement that reads the clock.
#[cfg(feature = "test-clock")]
pub(crate) async fn create_test_clock(pool: &MySqlPool, prefix: &str) {
    // One row, keyed, so processes connecting at once cannot each add one
    // (the clock's subquery must see exactly one).
    let t = format!("`test_clock_{prefix}`");
    for sql in [
        format!(
            "CREATE TABLE IF NOT EXISTS {t} \
             (id TINYINT NOT NULL PRIMARY KEY, offset_us BIGINT NOT NULL)"
        ),
        format!("INSERT IGNORE INTO {t} (id, offset_us) VALUES (1, 0)"),
    ] {
        if let Err(e) = sqlx::raw_sql(&sql).execute(pool).await {
            tracing::debug!(error = %e, "creating the test clock's table");
        }
    }
}

/// A duration as clamped microseconds for `INTERVAL ? MICROSECOND`.
/// The SQL for the instant `t` (an SQL `DATETIME(6)` expression) in
/// microseconds since the epoch.
fn micros_of(t: &str) -> String {
    format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {t})")
}

fn us(d: Duration) -> i64 {
    ms(d).min(MAX_MS) * 1000
}

/// Quoted, prefixed table names.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    meta: String,
    locks: String,
    tasks: String,
    jobs: String,
    queues: String,
    /// Slot tombstones, schema 6.
    slots: String,
    /// Rate limits' start logs, schema 8.
    rates: String,
    /// The audit log, schema 12.
    audit: String,
    /// Start logs of the rates per concurrency key (`store::key_rate`),
    /// schema 14.
    key_rates: String,
    /// The throughput rollup, schema 14.
    rollup: String,
    /// Lock history, schema 15.
    lock_history: String,
    /// The store's clock (see [`now_sql`]).
    now: String,
    /// [`Names::now`] in µs since the epoch, independent of the session
    /// time zone: the floor of every fencing and claim token.
    now_us: String,
    /// `SELECT` [`Names::now`].
    now_select: String,
    /// The SQL that appends `{attempt, at, error, worker, started_at}`
    /// (error text bound to the one `?`) to `errors`, with the times as
    /// RFC 3339 UTC.
    append_error: String,
}

impl Names {
    fn new(prefix: Option<&str>) -> Names {
        let p = prefix.unwrap_or(DEFAULT_PREFIX).to_string();
        let now = now_sql(&p);
        Names {
            meta: format!("`{p}meta`"),
            locks: format!("`{p}locks`"),
            tasks: format!("`{p}tasks`"),
            jobs: format!("`{p}jobs`"),
            queues: format!("`{p}queues`"),
            slots: format!("`{p}slots`"),
            rates: format!("`{p}rates`"),
            audit: format!("`{p}audit`"),
            key_rates: format!("`{p}key_rates`"),
            rollup: format!("`{p}rollup`"),
            lock_history: format!("`{p}lock_history`"),
            now_us: micros_of(&now),
            now_select: format!("SELECT {now}"),
            append_error: format!(
                "JSON_ARRAY_APPEND(errors, '$', JSON_OBJECT('attempt', \
                 attempt, 'at', DATE_FORMAT({now}, '%Y-%m-%dT%H:%i:%s.%fZ'), 'error', ?, \
                 'worker', worker, 'started_at', \
                 DATE_FORMAT(started_at, '%Y-%m-%dT%H:%i:%s.%fZ')))"
            ),
            now,
            prefix: p,
        }
    }
}

/// The MySQL / MariaDB backend. Build it with [`connect`].
pub(crate) struct MyBackend {
    pool: MySqlPool,
    /// The pool's shrinking policy (not on an application's own pool).
    _sized: Option<super::sizing::Sized<sqlx::MySql>>,
    names: Arc<Names>,
    wake: broadcast::Sender<Wake>,
    /// Connections to drop after a read-only refusal (see
    /// `Backend::pool_recycle`); a pool the application owns keeps its
    /// connections.
    recycle: Arc<crate::store::Recycle>,
    /// The fair claim procedure was created (or found) by this handle
    /// (see `fair::ready`); cleared when a `CALL` finds it missing.
    fair_ready: Arc<std::sync::atomic::AtomicBool>,
    /// The queues whose last claim by this handle (uncapped, or under a
    /// cap per key) walked as far as it asked (a backlog beyond it): their
    /// next such claim runs at `REPEATABLE READ` (see `claim::Backlog`).
    backlog: Arc<claim::Backlog>,
}

/// Connect to MySQL or MariaDB and return the backend. The URL is
/// `mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (`mariadb://` is the
/// same). The pool holds at most the URL's `pool_size` or else
/// `opts.max_connections` connections, opened as calls need them and
/// closed again when idle (`opts.idle_timeout`); an
/// unreachable server fails within `opts.connect_timeout` with
/// [`StoreError::Unavailable`]. Every session runs at `READ COMMITTED`
/// (claims into a backlog ask for `REPEATABLE READ`, `claim::BEGIN_IN_BACKLOG`),
/// with `time_zone = '+00:00'`, `innodb_lock_wait_timeout` and the
/// statement limit (`max_statement_time` on MariaDB, `max_execution_time`
/// for SELECTs on MySQL) from `opts.statement_timeout`.
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    let bad = |e: &dyn std::fmt::Display| {
        StoreError::Config(format!(
            "store URL {:?}: {e}; use mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
            super::redact(url)
        ))
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
    let db = parsed.path().trim_start_matches('/').to_string();
    if db.is_empty() {
        return Err(bad(&"no database named"));
    }
    let my_url = match url.split_once("://") {
        Some(("mariadb", rest)) => format!("mysql://{rest}"),
        _ => url.to_string(),
    };
    let connect = MySqlConnectOptions::from_str(&my_url)
        .map_err(|e| bad(&e))?
        .timezone(Some("+00:00".to_string()));
    let timeout = opts.statement_timeout;
    let recycle = Arc::new(crate::store::Recycle::default());
    let (pool_opts, sized) = super::sizing::pool_options::<sqlx::MySql>(
        opts,
        super::sizing::url_pool_size(url)?,
        recycle.clone(),
    );
    let pool = pool_opts
        .after_connect(move |conn, _| Box::pin(async move { session_setup(conn, timeout).await }))
        .connect_with(connect)
        .await?;
    sized.attach(&pool);
    let mut backend = MyBackend::on_pool(pool, opts.prefix.as_deref());
    #[cfg(feature = "test-clock")]
    create_test_clock(&backend.pool, &backend.names.prefix).await;
    backend.recycle = recycle;
    backend._sized = Some(sized);
    Ok(Arc::new(backend))
}

/// The backend on a pool the application already has (see
/// [`crate::Store::from_mysql_pool`]). Sessions keep the pool's own
/// settings: baton sets no session variables on them (its calls are
/// bounded on the client instead), and each of its transactions runs at
/// `READ COMMITTED` whatever the session's default (see
/// [`MyBackend::begin`]; the one exception is `claim::BEGIN_IN_BACKLOG`).
pub(crate) fn from_pool(
    pool: MySqlPool,
    prefix: Option<&str>,
) -> Result<Arc<dyn Backend>, StoreError> {
    if let Some(p) = prefix {
        super::validate_prefix(p)?;
    }
    Ok(Arc::new(MyBackend::on_pool(pool, prefix)))
}

/// How baton's transactions start (all but `claim::BEGIN_IN_BACKLOG`'s),
/// in one round trip:
/// `READ COMMITTED` whatever the session's default (an application's own
/// pool, see [`crate::Store::from_mysql_pool`]), then the transaction.
pub(crate) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// Per-session settings: `READ COMMITTED`, the lock-wait and statement
/// limits.
async fn session_setup(conn: &mut MySqlConnection, timeout: Duration) -> Result<(), sqlx::Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    let limit = if version.contains("MariaDB") {
        format!("max_statement_time = {:.3}", timeout.as_secs_f64())
    } else {
        format!("max_execution_time = {}", timeout.as_millis().max(1))
    };
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    conn.execute(
        format!(
            "SET SESSION innodb_lock_wait_timeout = {}, SESSION {limit}",
            timeout.as_secs().max(1)
        )
        .as_str(),
    )
    .await?;
    Ok(())
}

impl MyBackend {
    /// The backend on `pool`, with tables named by `prefix`; its wake-ups
    /// are shared with every handle on the same server, database and
    /// prefix in this process.
    fn on_pool(pool: MySqlPool, prefix: Option<&str>) -> MyBackend {
        let names = Names::new(prefix);
        let key = {
            let o = pool.connect_options();
            format!(
                "{}:{}/{}|{}",
                o.get_host(),
                o.get_port(),
                o.get_database().unwrap_or(""),
                names.prefix
            )
        };
        MyBackend {
            pool,
            _sized: None,
            wake: crate::store::wake::channel(key),
            names: Arc::new(names),
            recycle: Arc::new(crate::store::Recycle::default()),
            fair_ready: Arc::default(),
            backlog: Arc::default(),
        }
    }

    /// Begin one of baton's transactions at `READ COMMITTED`: on baton's
    /// own pool that is already the sessions' level; on an application's
    /// pool ([`from_pool`]) it must be asked for, as `SET TRANSACTION`
    /// (which sets the level of the next transaction only) sent together
    /// with `START TRANSACTION`, in the same round trip.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::MySql>, sqlx::Error> {
        self.pool.begin_with(BEGIN).await
    }

    /// Announce work: `None` due now, `Some(at)` due later. Only a hint.
    fn announce(&self, wakes: Vec<Wake>) {
        for w in wakes {
            // No receivers is fine: nobody is waiting right now.
            let _ = self.wake.send(w);
        }
    }
}

/// `?, ?, …` with `n` placeholders.
fn marks(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// A string or bytes as a hexadecimal literal (`X'…'`) for SQL sent as
/// text: exact for any bytes, and nothing in it can end the literal.
fn hex_lit(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2 + 3);
    s.push_str("X'");
    for byte in b {
        // Writing to a String cannot fail.
        let _ = write!(s, "{byte:02X}");
    }
    s.push('\'');
    s
}

/// Text for a utf8mb4 column, as a literal (see [`hex_lit`]).
fn text_lit(t: &str) -> String {
    format!("CONVERT({} USING utf8mb4)", hex_lit(t.as_bytes()))
}

impl MyBackend {
    /// Run `sql`, several statements in one round trip (the text protocol;
    /// sqlx connects with `CLIENT_MULTI_STATEMENTS`), and return the rows
    /// of its result sets. `sql` is one transaction, `START TRANSACTION;
    /// …; COMMIT`, with every value written as a literal ([`hex_lit`] for
    /// text, numbers formatted): a grant or an extension is then one round
    /// trip instead of five (`BEGIN`, lock, write, read back, `COMMIT`).
    ///
    /// The server stops at the first failing statement, which may leave
    /// the transaction open: it is rolled back before the connection goes
    /// back to the pool, and a connection that cannot roll back is closed.
    async fn batch(&self, sql: &str) -> Result<Vec<MySqlRow>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        batch_on(&mut conn, sql).await
    }
}

/// [`MyBackend::batch`] on a connection the caller holds, for a
/// transaction that spans several batches (its last one ends it, or the
/// caller rolls back).
async fn batch_on(
    conn: &mut sqlx::pool::PoolConnection<sqlx::MySql>,
    sql: &str,
) -> Result<Vec<MySqlRow>, StoreError> {
    // Through `Executor`'s boxed futures: `RawSql::fetch_all`'s own
    // future is not `Send` for every lifetime, which `async_trait` needs.
    let result = (&mut **conn).fetch_all(sqlx::raw_sql(sql)).await;
    match result {
        Ok(rows) => Ok(rows),
        Err(e) => {
            if (&mut **conn).execute("ROLLBACK").await.is_err() {
                conn.close_on_drop();
            }
            Err(e.into())
        }
    }
}

/// How many times a transaction runs again after InnoDB chose it as a
/// deadlock's victim.
const DEADLOCK_RETRIES: u32 = 3;

/// Run `op` (one transaction) again, at most [`DEADLOCK_RETRIES`] times,
/// while InnoDB chooses it as a deadlock's victim: the transaction was
/// rolled back whole, so running it again is running it once. Claims lock
/// the queue's candidates, a limit's row and the rows they update while
/// finishes lock the rows they end, and racing prunes lock ranges and
/// insert into them; under contention InnoDB's next-key and
/// secondary-index locks can make a cycle (seen with six claimers racing
/// under one rate limit on a loaded machine), and a worker would
/// otherwise log a failed claim and wait its backoff.
pub(super) async fn again_if_deadlocked<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut left = DEADLOCK_RETRIES;
    loop {
        match op().await {
            Err(e) if left > 0 && e.is_deadlock_victim() => {
                left -= 1;
                tracing::debug!(error = %e, "chosen as a deadlock's victim; running the transaction again");
                tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(1..=10))).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use sqlx::Executor;

    use super::again_if_deadlocked;
    use crate::error::StoreError;

    /// A transaction InnoDB chooses as a deadlock's victim runs again
    /// (and only then returns): provoked for real on the test server, the
    /// op's first run updates one row and then another that a heavier
    /// transaction holds while it waits for the first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadlocks_victim_runs_again() {
        let Some(ts) = baton_testkit::harness::connect(baton_testkit::harness::Kind::Mysql).await
        else {
            return;
        };
        let pool = sqlx::MySqlPool::connect(&ts.url).await.unwrap();
        let t = format!("`{}deadlock`", ts.prefix);
        pool.execute(
            format!(
                "CREATE TABLE {t} (id INT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB; \
                 INSERT INTO {t} VALUES (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)"
            )
            .as_str(),
        )
        .await
        .unwrap();
        let runs = AtomicU32::new(0);
        let answer = again_if_deadlocked(|| {
            let (pool, t, runs) = (pool.clone(), t.clone(), &runs);
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let mut tx = pool.begin().await?;
                sqlx::query(&format!("UPDATE {t} SET v = v + 1 WHERE id = 1"))
                    .execute(&mut *tx)
                    .await?;
                if run == 1 {
                    // The other transaction: heavier (five rows changed
                    // against one), so InnoDB rolls this one back.
                    let mut other = pool.begin().await?;
                    sqlx::query(&format!("UPDATE {t} SET v = v + 1 WHERE id >= 2"))
                        .execute(&mut *other)
                        .await?;
                    let t2 = t.clone();
                    let waiter = tokio::spawn(async move {
                        sqlx::query(&format!("UPDATE {t2} SET v = v + 1 WHERE id = 1"))
                            .execute(&mut *other)
                            .await?;
                        other.commit().await
                    });
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let r = sqlx::query(&format!("UPDATE {t} SET v = v + 1 WHERE id = 2"))
                        .execute(&mut *tx)
                        .await;
                    drop(tx);
                    waiter.await.unwrap()?;
                    r?;
                    return Err(StoreError::Backend(
                        "the first run was not a deadlock's victim".into(),
                    ));
                }
                tx.commit().await?;
                Ok::<u32, StoreError>(run)
            }
        })
        .await;
        assert_eq!(
            answer.map_err(|e| e.to_string()),
            Ok(2),
            "the victim's run failed, then ran again"
        );
        // The victim's first run left nothing: row 1 has the other
        // transaction's update and the second run's.
        let v: i32 = sqlx::query_scalar(&format!("SELECT v FROM {t} WHERE id = 1"))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(v, 2);
        pool.execute(format!("DROP TABLE {t}").as_str())
            .await
            .unwrap();
    }
}
