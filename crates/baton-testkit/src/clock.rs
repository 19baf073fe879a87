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
//! [`advance`] and [`set_offset`] also tell this process's
//! `baton::clock::StoreClock`s (schedulers, workers' timers) to recalibrate
//! at once; `baton` processes of their own follow at their next
//! recalibration.

use std::time::Duration;

use crate::harness::{exec_sql, Kind, TestStore};

/// Move the store's clock forward by `by` (for every process on it).
pub async fn advance(ts: &TestStore, by: Duration) {
    shift(ts, micros(by), false).await;
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
    shift(ts, offset_us, true).await;
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

async fn shift(ts: &TestStore, us: i64, absolute: bool) {
    let value = |col: &str| {
        if absolute {
            format!("{us}")
        } else {
            format!("{col} + {us}")
        }
    };
    let table = match ts.kind {
        Kind::Sqlite => "baton_test_clock".to_string(),
        Kind::Postgres => format!("\"test_clock_{}\"", ts.prefix),
        Kind::Mysql => format!("`test_clock_{}`", ts.prefix),
        Kind::Redis => String::new(),
    };
    match ts.kind {
        Kind::Sqlite | Kind::Postgres | Kind::Mysql => {
            let sql = format!("UPDATE {table} SET offset_us = {}", value("offset_us"));
            exec_sql(ts, &sql).await;
        }
        Kind::Redis => {
            let mut c = crate::cluster::connect(&ts.url).await;
            let key = format!("{}{{baton}}:test_clock", ts.prefix);
            let mut cmd = redis::cmd(if absolute { "SET" } else { "INCRBY" });
            cmd.arg(&key).arg(us);
            cmd.query_async::<()>(&mut c).await.unwrap();
        }
    }
    baton::clock::test_jumps::jumped();
}
