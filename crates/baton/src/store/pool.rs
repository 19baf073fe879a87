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
    /// A store on an existing PostgreSQL pool, with tables named by
    /// `prefix` (`None`: `baton_`), created or upgraded as
    /// [`Store::connect`] does. The pool's sessions keep their own
    /// settings; every call is bounded on the client as with
    /// [`StoreOptions::default`]. Enqueue inside a transaction of the same
    /// pool with [`Queue::enqueue_in`](crate::queue::Queue::enqueue_in).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
    /// let store = baton::Store::from_pg_pool(pool.clone(), None).await?;
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
    pub async fn from_pg_pool(pool: PgPool, prefix: Option<&str>) -> Result<Store, StoreError> {
        let url = redacted_url!("postgres", pool);
        Store::wrap(super::postgres::from_pool(pool, prefix)?, url, prefix).await
    }

    /// A store on an existing SQLite pool, with tables named by `prefix`
    /// (`None`: `baton_`), created or upgraded as [`Store::connect`] does;
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
    /// let store = baton::Store::from_sqlite_pool(pool.clone(), None).await?;
    /// # drop(store); Ok(()) }
    /// ```
    #[cfg(feature = "sqlite")]
    pub async fn from_sqlite_pool(
        pool: SqlitePool,
        prefix: Option<&str>,
    ) -> Result<Store, StoreError> {
        let url = format!(
            "sqlite://{}",
            pool.connect_options().get_filename().display()
        );
        let backend = super::sqlite::SqliteBackend::from_pool(pool, prefix)?;
        Store::wrap(Arc::new(backend), url, prefix).await
    }

    /// A store on an existing MySQL or MariaDB pool, with tables named by
    /// `prefix` (`None`: `baton_`), created or upgraded as
    /// [`Store::connect`] does. The pool's sessions keep their own
    /// settings (baton sets no session variables; every call is bounded on
    /// the client as with [`StoreOptions::default`]), and each of baton's
    /// own transactions runs at `READ COMMITTED` whatever the sessions'
    /// default. Enqueue inside a transaction of the same pool with
    /// [`Queue::enqueue_in`](crate::queue::Queue::enqueue_in); MySQL has
    /// no notifications, so workers find such tasks at their next poll.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1/app").await?;
    /// let store = baton::Store::from_mysql_pool(pool.clone(), None).await?;
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
    pub async fn from_mysql_pool(
        pool: MySqlPool,
        prefix: Option<&str>,
    ) -> Result<Store, StoreError> {
        let url = redacted_url!("mysql", pool);
        Store::wrap(super::mysql::from_pool(pool, prefix)?, url, prefix).await
    }

    /// Bound every call as [`Store::connect_with`] does, then migrate and
    /// read the store's identity.
    async fn wrap(
        backend: Arc<dyn Backend>,
        url: String,
        prefix: Option<&str>,
    ) -> Result<Store, StoreError> {
        let writes = Arc::new(super::WriteWatch::default());
        let backend: Arc<dyn Backend> = Arc::new(Bounded {
            inner: backend,
            limit: StoreOptions::default().call_deadline(),
            writes: writes.clone(),
        });
        backend.migrate().await?;
        let store = Store::on(backend, &url, writes).with_prefix(prefix);
        // The identity seen at connect (see `Store::check_identity`).
        if let Err(e) = store.check_identity().await {
            tracing::debug!(error = %crate::error::chain(&e), "could not read the store's identity at connect");
        }
        Ok(store)
    }
}
