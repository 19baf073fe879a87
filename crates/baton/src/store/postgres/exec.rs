//! Where a single statement runs: on the pool as it is, or, behind a
//! transaction pooler, inside a transaction of its own.
//!
//! Behind PgBouncer in transaction mode a server connection belongs to a
//! client only while a transaction is open. sqlx sends a statement in two
//! flights (Parse/Describe/Sync, then Bind/Execute/Sync): outside a
//! transaction the pooler may hand the second flight to another server
//! connection, where the statement does not exist ("unnamed prepared
//! statement does not exist"). In a transaction both flights reach the same
//! server connection, and the transaction's `BEGIN` carries the `SET LOCAL`
//! timeouts the session cannot hold there. That costs two round trips
//! (BEGIN, COMMIT) per statement; see docs/BENCHMARKS.md.
//!
//! On a direct connection a statement runs on a connection of the pool,
//! which goes back before the call returns when the pool has no other
//! idle one (sqlx returns a connection in a task of its own, after a
//! ping: a call right after another would otherwise find none idle and
//! open one more, so a process making one call at a time held two or
//! three connections).

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Describe, Either, Execute, Executor, PgPool, Postgres};

/// The pool, and the `BEGIN …` that opens each statement's own transaction
/// behind a transaction pooler (`None`: statements run as they are).
#[derive(Debug, Clone, Copy)]
pub(super) struct Exec<'c> {
    pub(super) pool: &'c PgPool,
    pub(super) begin: Option<&'c str>,
}

impl<'c> Executor<'c> for Exec<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.pool;
        let begin = self.begin.map(str::to_string);
        futures_util::stream::once(async move {
            let Some(begin) = begin else {
                let mut conn = pool.acquire().await?;
                let items = (&mut *conn).fetch_many(query).try_collect().await;
                settle(pool, conn).await;
                return items;
            };
            let mut tx = pool.begin_with(begin).await?;
            let items: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(items)
        })
        .flat_map(|r| match r {
            Ok(items) => futures_util::stream::iter(items.into_iter().map(Ok)).left_stream(),
            Err(e) => futures_util::stream::once(async move { Err(e) }).right_stream(),
        })
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let pool = self.pool;
        let Some(begin) = self.begin else {
            return Box::pin(async move {
                let mut conn = pool.acquire().await?;
                let row = (&mut *conn).fetch_optional(query).await;
                settle(pool, conn).await;
                row
            });
        };
        let begin = begin.to_string();
        Box::pin(async move {
            let mut tx = pool.begin_with(begin).await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.pool.describe(sql)
    }
}

/// Give a connection back; when the pool has no other idle one, or this
/// is the only one in use, wait until it is back (see the module docs).
/// The first: the next call reuses it rather than open another. The
/// second: a call right after this one would otherwise take another idle
/// connection while this one is still on its way back, two in use at once
/// to the pool's count, which then keeps both as its recent peak and never
/// shrinks back to one (an idle `baton serve` held three connections).
async fn settle(pool: &PgPool, mut conn: sqlx::pool::PoolConnection<Postgres>) {
    // sqlx's idle count is read apart from the size, and can pass it (or
    // wrap) for a moment while connections come and go.
    let (idle, size) = (pool.num_idle(), pool.size() as usize);
    if idle == 0 || (idle < size && idle + 1 == size) {
        conn.return_to_pool().await;
    }
}
