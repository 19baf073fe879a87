//! The SQLite backend: baton's embedded store for a single host.
//!
//! One database file holds four tables (names prefixed, default `baton_`):
//! `locks`, `tasks`, `jobs` and `queues` (paused flags, schema 3), plus a `meta` table recording the schema
//! version. The file runs in WAL mode with `synchronous=NORMAL` and a busy
//! timeout, so many processes on the same host can share it.
//!
//! Every operation is one `INSERT/UPDATE … RETURNING` statement or one short
//! `BEGIN IMMEDIATE` transaction (never a deferred transaction that reads
//! then writes: that can fail with `SQLITE_BUSY_SNAPSHOT` whatever the busy
//! timeout). Every "now" is computed inside the statement with
//! `unixepoch('subsec')` (the host clock, which is the store clock for an
//! embedded file), and every timestamp is stored as INTEGER milliseconds
//! since the Unix epoch.
//!
//! SQLite has no cross-process notification: [`Backend::wake_subscribe`] is an
//! in-process broadcast shared by every handle on the same file and prefix in
//! this process (work due later is announced with its `run_at`). Workers in
//! other processes find new work by polling.
//!
//! [`enqueue_in`] lets applications enqueue tasks inside their own
//! transaction (the transactional outbox pattern).
//!
//! Files: `sql.rs` (every statement, formatted once per handle), `schema.rs`
//! (DDL, `UPGRADES`, migration), `outbox.rs` (the insert and [`enqueue_in`]),
//! `rows.rs` (column decoding), `backend.rs` (the [`Backend`] impl).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::broadcast;

use super::{from_ms, Backend, StoreOptions, Wake};
use crate::error::StoreError;

mod advance;
mod audit;
mod backend;
mod fair;
mod finish;
mod jobdefs;
mod key_rate;
mod lock_history;
mod outbox;
mod queue_view;
mod rows;
mod schema;
mod sql;
mod stats;
mod step;

pub use outbox::enqueue_in;
use sql::Sql;

/// The store's clock in milliseconds since the epoch, evaluated by SQLite.
#[cfg(not(feature = "test-clock"))]
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
/// The store's clock in milliseconds since the epoch, evaluated by SQLite,
/// plus the test clock's offset (feature `test-clock`: one per database
/// file, in [`TEST_CLOCK`]).
#[cfg(feature = "test-clock")]
const NOW: &str = "(CAST(unixepoch('subsec') * 1000 AS INTEGER) \
    + (SELECT offset_us FROM baton_test_clock) / 1000)";

/// The store's clock in microseconds since the epoch (millisecond
/// resolution): the floor of every fencing token.
#[cfg(not(feature = "test-clock"))]
const NOW_US: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000";
/// [`NOW`] in microseconds (feature `test-clock`).
#[cfg(feature = "test-clock")]
const NOW_US: &str = "(CAST(unixepoch('subsec') * 1000 AS INTEGER) \
    + (SELECT offset_us FROM baton_test_clock) / 1000) * 1000";

/// The test clock's table (feature `test-clock`): one row, the offset in
/// µs every [`NOW`] adds. Created on connect, not a schema step; one per
/// database file (the file is the store), outside every prefix.
#[cfg(feature = "test-clock")]
const TEST_CLOCK: &str =
    "CREATE TABLE IF NOT EXISTS baton_test_clock (offset_us INTEGER NOT NULL); \
    INSERT INTO baton_test_clock (offset_us) \
    SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM baton_test_clock)";

/// Create the test clock's table with offset 0 unless it exists (feature
/// `test-clock`). A failure (a read-only file) is left to the first
/// statement that reads the clock.
#[cfg(feature = "test-clock")]
pub(crate) async fn create_test_clock(pool: &SqlitePool) {
    if let Err(e) = sqlx::raw_sql(TEST_CLOCK).execute(pool).await {
        tracing::debug!(error = %e, "creating the test clock's table");
    }
}

/// Quoted table names for one prefix.
#[derive(Debug, Clone)]
struct Tables {
    prefix: String,
    locks: String,
    tasks: String,
    jobs: String,
    queues: String,
    meta: String,
    slots: String,
    rates: String,
    audit: String,
    /// Start logs of the rates per concurrency key (`store::key_rate`).
    key_rates: String,
    rollup: String,
    lock_history: String,
}

impl Tables {
    fn new(prefix: Option<&str>) -> Result<Tables, StoreError> {
        let prefix = prefix.unwrap_or("baton_");
        super::validate_prefix(prefix)?;
        let q = |name: &str| format!("\"{prefix}{name}\"");
        Ok(Tables {
            prefix: prefix.to_string(),
            locks: q("locks"),
            tasks: q("tasks"),
            jobs: q("jobs"),
            queues: q("queues"),
            meta: q("meta"),
            slots: q("slots"),
            rates: q("rates"),
            audit: q("audit"),
            key_rates: q("key_rates"),
            rollup: q("rollup"),
            lock_history: q("lock_history"),
        })
    }

    /// A quoted index name (index names share one namespace per database).
    fn index(&self, name: &str) -> String {
        format!("\"{}{name}\"", self.prefix)
    }
}

/// The wake-up channel shared by every handle on the same database file
/// and prefix in this process.
fn wake_for(path: &Path, prefix: &str) -> broadcast::Sender<Wake> {
    crate::store::wake::channel(format!("{}\0{prefix}", path.display()))
}

/// Connections that write, per database file in this process: one.
/// SQLite runs one writer at a time, and writers that meet in its busy
/// handler sleep in steps of 1, 2, 5, 10, 15, 20, 25 … up to 100 ms,
/// retrying while the lock is free between another connection's
/// transactions: a writer of a busy file starves there, for up to ~180 ms
/// (with two writer connections, a 50,000-task drain made 237 such sleeps;
/// 17 reached 25 ms). Writers of one process wait for each other in the
/// pool instead, woken as soon as the connection is back, for up to the
/// statement timeout as in the busy handler (docs/BENCHMARKS.md session
/// 36). Writers of other processes still meet in the busy handler.
const WRITERS: u32 = 1;

/// One writer pool and one reader pool per database file in this process,
/// shared by every handle on it. Weak, so a file's pools close with its
/// last handle.
type Pools = Mutex<HashMap<PathBuf, (std::sync::Weak<SqlitePool>, std::sync::Weak<SqlitePool>)>>;

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn live_pools(key: &Path) -> Option<(Arc<SqlitePool>, Arc<SqlitePool>)> {
    let map = pools().lock().unwrap_or_else(|p| p.into_inner());
    let (w, r) = map.get(key)?;
    let (w, r) = (w.upgrade()?, r.upgrade()?);
    (!w.is_closed() && !r.is_closed()).then_some((w, r))
}

/// The SQLite backend. Build it with [`connect`].
pub struct SqliteBackend {
    /// Every statement that writes (and every transaction).
    pool: Arc<SqlitePool>,
    /// Pure reads (listings, stats, the clock): they never wait behind
    /// writers for a connection.
    reader: Arc<SqlitePool>,
    t: Tables,
    /// Every statement, formatted once for this prefix.
    sql: Arc<Sql>,
    /// Wake-ups, shared with every handle on this file and prefix.
    wake: broadcast::Sender<Wake>,
}

impl std::fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("prefix", &self.t.prefix)
            .finish()
    }
}

/// The canonical path of an existing file (or its absolute path).
fn canonical_of(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// The path of an in-memory database (`sqlite::memory:`).
const MEMORY: &str = ":memory:";

/// The file path of a `sqlite://PATH` or `sqlite:PATH` URL (`:memory:`
/// for `sqlite::memory:` and `sqlite://:memory:`).
fn parse_url(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::Config(format!("store URL {url:?}: expected sqlite://PATH")))?;
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() {
        return Err(StoreError::Config(format!(
            "store URL {url:?}: no file path; use sqlite://PATH (e.g. sqlite://baton.db)"
        )));
    }
    if path.starts_with("file:") {
        return Err(StoreError::Config(format!(
            "store URL {url:?}: SQLite URI filenames are not supported; use a file path, or \
             sqlite::memory: for a private in-memory database"
        )));
    }
    Ok(PathBuf::from(path))
}

/// Connect to the SQLite file named by `url` (`sqlite://PATH` or
/// `sqlite:PATH`), creating it if absent, and return the backend.
///
/// The file is opened in WAL mode with `synchronous=NORMAL` and a busy
/// timeout of `opts.statement_timeout` (how long a connection waits for
/// another writer before failing with `SQLITE_BUSY`, mapped to the retryable
/// [`StoreError::Unavailable`]), through a pool of `opts.max_connections` connections. Migrations
/// are not run here; [`Backend::migrate`] does that (and
/// [`crate::Store::connect_with`] calls it unless `opts.migrate` is false).
pub async fn connect(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Backend>, StoreError> {
    Ok(Arc::new(SqliteBackend::connect(url, opts).await?))
}

impl SqliteBackend {
    /// Connect without boxing (see [`connect`]).
    pub async fn connect(url: &str, opts: &StoreOptions) -> Result<SqliteBackend, StoreError> {
        let t = Tables::new(opts.prefix.as_deref())?;
        let path = parse_url(url)?;
        if path == Path::new(MEMORY) {
            return SqliteBackend::in_memory(t, opts).await;
        }
        let key = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
        if let Some((pool, reader)) = live_pools(&key) {
            let wake = wake_for(&canonical_of(&path), &t.prefix);
            return Ok(SqliteBackend {
                pool,
                reader,
                sql: Arc::new(Sql::new(&t)),
                t,
                wake,
            });
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.statement_timeout)
            .foreign_keys(false);
        let pool = Arc::new(
            SqlitePoolOptions::new()
                .max_connections(WRITERS.min(opts.max_connections.max(1)))
                .acquire_timeout(opts.statement_timeout)
                .test_before_acquire(false)
                .connect_with(options.clone())
                .await?,
        );
        let reader = Arc::new(
            SqlitePoolOptions::new()
                .max_connections(opts.max_connections.max(1))
                .test_before_acquire(false)
                .connect_with(options)
                .await?,
        );
        #[cfg(feature = "test-clock")]
        create_test_clock(&pool).await;
        pools()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (Arc::downgrade(&pool), Arc::downgrade(&reader)));
        // The file exists now; key the shared state by its canonical path so
        // that `./a.db` and `/abs/a.db` share one wake-up channel.
        let wake = wake_for(&canonical_of(&path), &t.prefix);
        Ok(SqliteBackend {
            pool,
            reader,
            sql: Arc::new(Sql::new(&t)),
            t,
            wake,
        })
    }

    /// A private in-memory database (`sqlite::memory:` or
    /// `sqlite://:memory:`), for tests: one connection, kept open as long
    /// as the store (its database goes with it), so every handle of this
    /// store sees the same tables and another `connect` gets a database
    /// of its own. Its wake-up channel is its own too.
    async fn in_memory(t: Tables, opts: &StoreOptions) -> Result<SqliteBackend, StoreError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let options = SqliteConnectOptions::new()
            .filename(MEMORY)
            .journal_mode(SqliteJournalMode::Memory)
            .busy_timeout(opts.statement_timeout)
            .foreign_keys(false);
        // One connection that never idles out nor is recycled: the
        // database lives exactly as long as it.
        let pool = Arc::new(
            SqlitePoolOptions::new()
                .min_connections(1)
                .max_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .test_before_acquire(false)
                .connect_with(options)
                .await?,
        );
        #[cfg(feature = "test-clock")]
        create_test_clock(&pool).await;
        let key = format!("{MEMORY}#{}#{n}", std::process::id());
        Ok(SqliteBackend {
            reader: pool.clone(),
            pool,
            sql: Arc::new(Sql::new(&t)),
            wake: wake_for(Path::new(&key), &t.prefix),
            t,
        })
    }

    /// The backend on a pool the application already has (see
    /// [`crate::Store::from_sqlite_pool`]): baton's reads and writes go
    /// through it, wake-ups are shared with every other handle on the same
    /// file and prefix in this process. Open the pool in WAL mode with a
    /// busy timeout (as [`connect`] does) when several connections or
    /// processes share the file; baton's own writes wait in the pool, so
    /// keep its other transactions short.
    pub fn from_pool(pool: SqlitePool, prefix: Option<&str>) -> Result<SqliteBackend, StoreError> {
        let t = Tables::new(prefix)?;
        let path = pool.connect_options().get_filename().to_path_buf();
        let wake = wake_for(&canonical_of(&path), &t.prefix);
        let pool = Arc::new(pool);
        Ok(SqliteBackend {
            reader: pool.clone(),
            pool,
            sql: Arc::new(Sql::new(&t)),
            t,
            wake,
        })
    }

    /// The writer pool (one connection per file and process), for
    /// applications that want to run their own transactions with
    /// [`enqueue_in`]. Keep such transactions short: baton's own writes in
    /// this process wait for this connection, and a write through the
    /// store made while the same task holds such a transaction waits for
    /// it too (up to the statement timeout, then fails retryably): inside
    /// it, enqueue with [`enqueue_in`] on the transaction.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn wake<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let mut seen = HashSet::new();
        for q in queues {
            if seen.insert(q) {
                // No receivers is fine: the wake-up is only a hint.
                let _ = self.wake.send(Wake::now(q));
            }
        }
    }

    /// Announce work due later: per queue, the earliest `run_at` (ms).
    fn wake_later<'a>(&self, items: impl IntoIterator<Item = (&'a str, i64)>) {
        let mut first: HashMap<&str, i64> = HashMap::new();
        for (q, at) in items {
            let e = first.entry(q).or_insert(at);
            *e = (*e).min(at);
        }
        for (q, at) in first {
            if let Ok(due) = from_ms(at) {
                let _ = self.wake.send(Wake {
                    queue: q.to_string(),
                    due: Some(due),
                });
            }
        }
    }

    async fn immediate(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }
}

#[cfg(test)]
mod url_props {
    use proptest::prelude::*;

    proptest! {
        /// Any text after the scheme: a path, or a config error naming the
        /// accepted form; never a panic.
        #[test]
        fn parse_url_never_panics(rest in any::<String>(), colon in any::<bool>()) {
            let url = if colon { format!("sqlite:{rest}") } else { format!("sqlite://{rest}") };
            match super::parse_url(&url) {
                Ok(p) => prop_assert!(!p.as_os_str().is_empty()),
                Err(crate::StoreError::Config(m)) => prop_assert!(m.contains("sqlite://") || m.contains("file path"), "{m}"),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }

        /// The query is not part of the path.
        #[test]
        fn the_query_is_cut(path in "[a-z/._-]{1,30}", query in "[a-z=&]{0,20}") {
            prop_assume!(path != ":memory:");
            let p = super::parse_url(&format!("sqlite://{path}?{query}")).unwrap();
            prop_assert_eq!(p, std::path::PathBuf::from(path));
        }
    }
}
