//! The test clock: shift a store's own clock instead of sleeping.
//!
//! The test kit builds `baton` with its feature `test-clock`, so every
//! backend adds an offset to its own now wherever it reads it (every SQL
//! statement and Lua script, `Store::now`): leases, `run_at`, rescues,
//! schedule slots, rate windows and lock expiries all see the shifted
//! time. The offset lives in the store under the test's own isolation, so
//! every process on that store sees it (a CLI test's `baton` children
//! too):
//!
//! | backend | where the offset (µs) is kept |
//! |---|---|
//! | SQLite | table `baton_test_clock` of the file (one per file) |
//! | PostgreSQL | table `"test_clock_<prefix>"` |
//! | MySQL | table `` `test_clock_<prefix>` `` |
//! | Redis | key `<prefix>{baton}:test_clock` (0 when missing) |
//!
//! The tables are created (offset 0) when a store connects; none is a
//! schema step, and none is dropped by `schema_remove`.
//!
//! ```ignore
//! let ts = baton_testkit::harness::connect(Kind::Sqlite).await.unwrap();
//! // A lease of 30 s, taken now, has lapsed a moment after this:
//! baton_testkit::clock::advance(&ts, Duration::from_secs(31)).await;
//! ```
//!
//! [`advance_to`] moves the clock to a given store time (a slot, a
//! `run_at`); a test that moves it often keeps a [`Mover`] (one
//! connection, kept open) instead of a connection per move.
//!
//! [`advance`] and [`set_offset`] also tell this process's
//! `baton::clock::StoreClock`s (schedulers, workers' timers) to recalibrate
//! at once; `baton` processes of their own follow at their next
//! recalibration.

use std::time::Duration;

use crate::harness::{Kind, TestStore};

/// Move the store's clock forward by `by` (for every process on it).
pub async fn advance(ts: &TestStore, by: Duration) {
    Mover::new(ts).await.advance(by).await;
}

/// Move the store's clock forward to `at` (by the store's own `now`),
/// unless it is there already: a test that waits for a slot or a `run_at`
/// to fall due.
pub async fn advance_to(ts: &TestStore, at: chrono::DateTime<chrono::Utc>) {
    let now = ts.store.now().await.unwrap();
    if let Ok(ahead) = (at - now).to_std() {
        advance(ts, ahead).await;
    }
}

/// Set the store's clock to its real time plus `offset_us` µs (negative:
/// behind).
pub async fn set_offset(ts: &TestStore, offset_us: i64) {
    Mover::new(ts).await.shift(offset_us, true).await;
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// A connection of its own to one store's clock, kept open: for a test
/// that moves the clock often, a few milliseconds at a time (each
/// [`advance`] opens a connection).
pub struct Mover {
    conn: Conn,
    /// The clock's table (SQL) or key (Redis).
    at: String,
}

enum Conn {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    Mysql(sqlx::MySqlPool),
    Redis(crate::cluster::RedisConn),
}

impl Mover {
    /// Connect to `ts`'s clock.
    pub async fn new(ts: &TestStore) -> Mover {
        let conn = match ts.kind {
            // The clock's moves need not be durable: no sync per move.
            Kind::Sqlite => Conn::Sqlite(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with(
                        ts.url
                            .parse::<sqlx::sqlite::SqliteConnectOptions>()
                            .unwrap()
                            .synchronous(sqlx::sqlite::SqliteSynchronous::Off),
                    )
                    .await
                    .unwrap(),
            ),
            // As baton connects (behind a pooler too: its own URL
            // parameters stripped).
            Kind::Postgres => Conn::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(baton::store::postgres::connect_options(&ts.url).unwrap())
                    .await
                    .unwrap(),
            ),
            Kind::Mysql => Conn::Mysql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect(&ts.url)
                    .await
                    .unwrap(),
            ),
            Kind::Redis => Conn::Redis(crate::cluster::connect(&ts.url).await),
        };
        let at = match ts.kind {
            Kind::Sqlite => "baton_test_clock".to_string(),
            Kind::Postgres => format!("\"test_clock_{}\"", ts.prefix),
            Kind::Mysql => format!("`test_clock_{}`", ts.prefix),
            Kind::Redis => format!("{}{{baton}}:test_clock", ts.prefix),
        };
        Mover { conn, at }
    }

    /// Move the store's clock forward by `by` (see [`advance`]).
    pub async fn advance(&mut self, by: Duration) {
        self.shift(micros(by), false).await;
    }

    /// Add `us` to the offset, or set it to `us` (`absolute`); then tell
    /// this process's `StoreClock`s.
    async fn shift(&mut self, us: i64, absolute: bool) {
        let value = if absolute {
            format!("{us}")
        } else {
            format!("offset_us + {us}")
        };
        let sql = format!("UPDATE {} SET offset_us = {value}", self.at);
        match &mut self.conn {
            Conn::Sqlite(p) => drop(sqlx::raw_sql(&sql).execute(&*p).await.unwrap()),
            // One transaction (a pooler keeps it on one server connection)
            // whose commit does not wait for the disk.
            Conn::Postgres(p) => drop(
                sqlx::raw_sql(&format!(
                    "BEGIN; SET LOCAL synchronous_commit = off; {sql}; COMMIT"
                ))
                .execute(&*p)
                .await
                .unwrap(),
            ),
            Conn::Mysql(p) => drop(sqlx::raw_sql(&sql).execute(&*p).await.unwrap()),
            Conn::Redis(c) => {
                let mut cmd = redis::cmd(if absolute { "SET" } else { "INCRBY" });
                cmd.arg(&self.at).arg(us);
                cmd.query_async::<()>(c).await.unwrap();
            }
        }
        baton::clock::test_jumps::jumped();
    }
}
