//! [`Store`]s on sqlx pools the application already has, so that its own
//! queries and baton share connections, and a task can be enqueued inside
//! the application's transaction (`Queue::enqueue_in`).

#[cfg(feature = "mysql")]
use sqlx::MySqlPool;
#[cfg(feature = "postgres")]
use sqlx::PgPool;
#[cfg(feature = "sqlite")]
use sqlx::SqlitePool;
use std::sync::Arc;

use super::{Backend, Bounded, Store, StoreOptions};
use crate::error::StoreError;

/// `SCHEME://USER@HOST:PORT/DATABASE` of a pool's connect options, for
/// messages (no password).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! redacted_url {
    ($scheme:literal, $pool:expr) => {{
        let o = $pool.connect_options();
        format!(
            concat!($scheme, "://{}@{}:{}/{}"),
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or("")
        )
    }};
}

impl Store {
    /// A store on an existing PostgreSQL pool, created or upgraded as
    /// [`Store::connect_with`] does with `opts` (see [the options a pool
    /// honours](#options-on-a-pool)). The pool's sessions keep their own
    /// settings. Enqueue inside a transaction of the same pool with
    /// [`Queue::enqueue_in`](crate::queue::Queue::enqueue_in).
    ///
    /// # Options on a pool
    ///
    /// Of [`StoreOptions`], a store on a pool honours `prefix`, `migrate`,
    /// `keep_succeeded` (PostgreSQL only) and the call bound
    /// (`connect_timeout + statement_timeout + 1 s`, on the client: the
    /// pool's sessions are not given a `statement_timeout`). The pool's
    /// own shape is the application's: `max_connections` and
    /// `idle_timeout` are not used.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = baton::Store::from_pg_pool(pool.clone(), baton::StoreOptions::default()).await?;
    ///
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7").execute(&mut *tx).await?;
    /// let queue = baton::queue::Queue::new(store);
    /// let task = baton::queue::TaskBuilder::new("receipt", serde_json::json!({"order": 7}));
    /// queue.enqueue_in(&mut tx, task).await?;
    /// tx.commit().await?; // the order and its task, or neither
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn from_pg_pool(pool: PgPool, opts: StoreOptions) -> Result<Store, StoreError> {
        let url = redacted_url!("postgres", pool);
        opts.check(true, "a PostgreSQL pool")?;
        #[cfg(feature = "test-clock")]
        super::postgres::create_test_clock(&pool, opts.prefix.as_deref()).await;
        let backend = super::postgres::from_pool(pool, &opts)?;
        Store::wrap(backend, url, &opts).await
    }

    /// A store on an existing SQLite pool, created or upgraded as
    /// [`Store::connect_with`] does with `opts` (the options a pool
    /// honours are [`Store::from_pg_pool`]'s, without `keep_succeeded`);
    /// see [`SqliteBackend::from_pool`](crate::store::sqlite::SqliteBackend::from_pool)
    /// for the pool's settings. Enqueue inside a transaction of the same
    /// pool with [`Queue::enqueue_in`](crate::queue::Queue::enqueue_in).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool};
    /// let opts = SqliteConnectOptions::new()
    ///     .filename("app.db")
    ///     .create_if_missing(true)
    ///     .journal_mode(SqliteJournalMode::Wal);
    /// let pool = SqlitePool::connect_with(opts).await?;
    /// let store = baton::Store::from_sqlite_pool(pool.clone(), baton::StoreOptions::default()).await?;
    /// # drop(store); Ok(()) }
    /// ```
    #[cfg(feature = "sqlite")]
    pub async fn from_sqlite_pool(
        pool: SqlitePool,
        opts: StoreOptions,
    ) -> Result<Store, StoreError> {
        let url = format!(
            "sqlite://{}",
            pool.connect_options().get_filename().display()
        );
        opts.check(false, "an SQLite pool")?;
        #[cfg(feature = "test-clock")]
        super::sqlite::create_test_clock(&pool).await;
        let backend = super::sqlite::SqliteBackend::from_pool(pool, opts.prefix.as_deref())?;
        Store::wrap(Arc::new(backend), url, &opts).await
    }

    /// A store on an existing MySQL or MariaDB pool, created or upgraded as
    /// [`Store::connect_with`] does with `opts` (the options a pool
    /// honours are [`Store::from_pg_pool`]'s, without `keep_succeeded`).
    /// The pool's sessions keep their own settings (baton sets no session
    /// variables; every call is bounded on the client), and each of baton's
    /// own transactions runs at `READ COMMITTED` whatever the sessions'
    /// default (but a claim into a backlog, uncapped or under a cap per
    /// key, at `REPEATABLE READ`: docs/BENCHMARKS.md sessions 41 and 42).
    /// Enqueue inside a transaction of the same pool with
    /// [`Queue::enqueue_in`](crate::queue::Queue::enqueue_in); MySQL has
    /// no notifications, so workers find such tasks at their next poll.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1/app").await?;
    /// let store = baton::Store::from_mysql_pool(pool.clone(), baton::StoreOptions::default()).await?;
    ///
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7").execute(&mut *tx).await?;
    /// let queue = baton::queue::Queue::new(store);
    /// let task = baton::queue::TaskBuilder::new("receipt", serde_json::json!({"order": 7}));
    /// queue.enqueue_in(&mut tx, task).await?;
    /// tx.commit().await?; // the order and its task, or neither
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    pub async fn from_mysql_pool(pool: MySqlPool, opts: StoreOptions) -> Result<Store, StoreError> {
        let url = redacted_url!("mysql", pool);
        opts.check(false, "a MySQL pool")?;
        #[cfg(feature = "test-clock")]
        super::mysql::create_test_clock(
            &pool,
            opts.prefix
                .as_deref()
                .unwrap_or(super::mysql::DEFAULT_PREFIX),
        )
        .await;
        let backend = super::mysql::from_pool(pool, opts.prefix.as_deref())?;
        Store::wrap(backend, url, &opts).await
    }

    /// Bound every call as [`Store::connect_with`] does, then migrate and
    /// read the store's identity.
    async fn wrap(
        backend: Arc<dyn Backend>,
        url: String,
        opts: &StoreOptions,
    ) -> Result<Store, StoreError> {
        let writes = Arc::new(super::WriteWatch::default());
        let backend: Arc<dyn Backend> = Arc::new(Bounded {
            inner: backend,
            limit: opts.call_deadline(),
            writes: writes.clone(),
        });
        if opts.migrate {
            backend.migrate().await?;
        }
        let store = Store::on(backend, &url, writes).with_prefix(opts.prefix.as_deref());
        // The identity seen at connect (see `Store::check_identity`).
        if let Err(e) = store.check_identity().await {
            tracing::debug!(error = %crate::error::chain(&e), "could not read the store's identity at connect");
        }
        Ok(store)
    }
}
