//! The transactional outbox on [`Queue`]: enqueue inside the application's
//! own database transaction, so the change and its task commit together or
//! not at all.
//!
//! (The module is private; its items are re-exported from [`crate::queue`]
//! and documented on [`Queue::enqueue_in`].)

use std::future::Future;
use std::pin::Pin;

use super::{Queue, TaskArgs, TaskBuilder};
use crate::error::{Error, InvalidInput, StoreError};
use crate::store::{Enqueued, NewTask};

/// The future an [`OutboxConnection`] returns.
pub type InsertFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Enqueued>, StoreError>> + Send + 'a>>;

mod sealed {
    pub trait Sealed {}
}

/// A connection of the application's that tasks can be enqueued on, inside
/// its transaction: `sqlx`'s connection, pooled connection and transaction
/// types for PostgreSQL, SQLite and MySQL (as the crate's features enable
/// them). Sealed: baton implements it for exactly those.
pub trait OutboxConnection: sealed::Sealed + Send {
    /// The store kind this connection's database is (`"postgres"`,
    /// `"sqlite"`, `"mysql"`), matched against the queue's store.
    fn store_kind(&self) -> &'static str;

    /// Insert `tasks` with the tables named by `prefix`, on this connection.
    #[doc(hidden)]
    fn insert<'a>(&'a mut self, prefix: Option<&'a str>, tasks: &'a [NewTask]) -> InsertFuture<'a>;
}

/// Implement [`OutboxConnection`] for one type, reaching its bare
/// connection with `$bare`.
macro_rules! outbox_impl {
    ($feature:literal, $ty:ty, $kind:literal, $insert:path, |$c:ident| $bare:expr) => {
        #[cfg(feature = $feature)]
        impl sealed::Sealed for $ty {}
        #[cfg(feature = $feature)]
        impl OutboxConnection for $ty {
            fn store_kind(&self) -> &'static str {
                $kind
            }
            fn insert<'a>(
                &'a mut self,
                prefix: Option<&'a str>,
                tasks: &'a [NewTask],
            ) -> InsertFuture<'a> {
                let $c = self;
                Box::pin($insert($bare, prefix, tasks))
            }
        }
    };
}

/// Implement [`OutboxConnection`] for a database's connection, pooled
/// connection and transaction, all through its bare connection.
macro_rules! outbox_connection {
    ($feature:literal, $db:ty, $conn:ty, $kind:literal, $insert:path) => {
        outbox_impl!($feature, $conn, $kind, $insert, |c| c);
        outbox_impl!(
            $feature,
            sqlx::pool::PoolConnection<$db>,
            $kind,
            $insert,
            |c| &mut **c
        );
        outbox_impl!($feature, sqlx::Transaction<'_, $db>, $kind, $insert, |c| {
            &mut **c
        });
    };
}

outbox_connection!(
    "postgres",
    sqlx::Postgres,
    sqlx::PgConnection,
    "postgres",
    crate::store::postgres::enqueue_in
);
outbox_connection!(
    "sqlite",
    sqlx::Sqlite,
    sqlx::SqliteConnection,
    "sqlite",
    crate::store::sqlite::enqueue_in
);
outbox_connection!(
    "mysql",
    sqlx::MySql,
    sqlx::MySqlConnection,
    "mysql",
    crate::store::mysql::enqueue_in
);

impl Queue {
    /// Enqueue one task on `conn`, inside the application's transaction:
    /// it becomes visible at the commit and vanishes with a rollback.
    /// Validated before anything is written; with a unique key that is
    /// taken, returns the existing task (`inserted == false`).
    ///
    /// [`Queue::enqueue_in`], [`Queue::enqueue_many_in`] and
    /// [`Queue::insert_in`] take the application's connection — a
    /// `sqlx::Transaction`, a pooled connection or a bare connection of the
    /// same database as the queue's store — and know the store's table prefix,
    /// so the call names nothing but the task. The connection types are
    /// [`OutboxConnection`]; the `sqlx` they come from is re-exported as
    /// [`baton::sqlx`](crate::sqlx), so the application needs no `sqlx`
    /// dependency of its own (nor one that must match baton's version).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// use baton::queue::{Queue, TaskBuilder};
    /// use baton::sqlx;
    ///
    /// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app")
    ///     .await
    ///     .map_err(baton::StoreError::from)?;
    /// let queue = Queue::new(baton::Store::from_pg_pool(pool.clone(), baton::StoreOptions::default()).await?);
    ///
    /// let mut tx = pool.begin().await.map_err(baton::StoreError::from)?;
    /// sqlx::query("UPDATE orders SET state = 'paid' WHERE id = 7")
    ///     .execute(&mut *tx)
    ///     .await
    ///     .map_err(baton::StoreError::from)?;
    /// let receipt = TaskBuilder::new("receipt", serde_json::json!({"order": 7}));
    /// let enqueued = queue.enqueue_in(&mut tx, receipt).await?;
    /// tx.commit().await.map_err(baton::StoreError::from)?; // the order and its task, or neither
    /// # let _ = enqueued; Ok(()) }
    /// ```
    ///
    /// Per store: on PostgreSQL the workers are woken at the commit (the
    /// notification is part of the transaction); on SQLite (begin with
    /// `BEGIN IMMEDIATE`: a deferred transaction that reads first may fail to
    /// become a writer) and MySQL (run it at `READ COMMITTED`, as baton's own
    /// sessions do, so a unique key's holder committed meanwhile is found)
    /// nothing is notified, and workers find the task at their next poll.
    /// Redis has no transactions with an application's data: a Redis store
    /// refuses these calls.
    ///
    /// Fails with [`Error::Invalid`] naming `connection` when `conn` is not
    /// a connection to the queue's store kind (a PostgreSQL transaction on
    /// a queue whose store is SQLite, or any on Redis).
    pub async fn enqueue_in<C>(&self, conn: &mut C, task: TaskBuilder) -> Result<Enqueued, Error>
    where
        C: OutboxConnection + ?Sized,
    {
        let mut out = self.enqueue_many_in(conn, vec![task]).await?;
        out.pop()
            .ok_or_else(|| Error::Store(StoreError::Corrupt("enqueue returned nothing".into())))
    }

    /// Enqueue many tasks on `conn` in order, inside the application's
    /// transaction (see [`Queue::enqueue_in`]). Every task is validated
    /// before anything is written.
    pub async fn enqueue_many_in<C>(
        &self,
        conn: &mut C,
        tasks: Vec<TaskBuilder>,
    ) -> Result<Vec<Enqueued>, Error>
    where
        C: OutboxConnection + ?Sized,
    {
        let kind = self.store().kind();
        if conn.store_kind() != kind {
            return Err(InvalidInput::new(
                "connection",
                format!(
                    "a {} connection, but this queue's store is {kind}; enqueue in a \
                     transaction of the store's own database{}",
                    conn.store_kind(),
                    if kind == "redis" {
                        " (Redis has no transaction with the application's data: use Queue::enqueue after the commit)"
                    } else {
                        ""
                    }
                ),
            )
            .into());
        }
        let built = self.prepare(tasks, true)?;
        Ok(conn.insert(self.store().prefix(), &built).await?)
    }

    /// Enqueue one typed task with its kind's default options on `conn`,
    /// inside the application's transaction (see [`Queue::enqueue_in`]).
    pub async fn insert_in<C, A>(&self, conn: &mut C, args: &A) -> Result<Enqueued, Error>
    where
        C: OutboxConnection + ?Sized,
        A: TaskArgs,
    {
        self.enqueue_in(conn, TaskBuilder::from_args(args)?).await
    }
}
