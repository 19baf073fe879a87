//! The apalis-mysql side of scripts/bench.sh (the 200k × (4 × 24) queue
//! throughput shape), driven like the Node peers in scripts/peers/:
//!
//! - `apalis-mysql-peer migrate`: create apalis' tables (its own migrations,
//!   with MySQL 8's collation name swapped for one MariaDB knows).
//! - `apalis-mysql-peer insert N`: push N tasks into queue `bench` with
//!   `push_stream` (apalis' bulk path: one transaction, one `INSERT` per task).
//! - `apalis-mysql-peer work`: one worker with 24 concurrent tasks; prints
//!   `ready`, waits for the file `$GO_FILE`, runs until SIGTERM.
//!
//! `MYSQL` is the database URL (a database of its own: apalis' table is
//! called `jobs`). Settings: `APALIS_BUFFER` tasks fetched per poll
//! (default 100; apalis' default is 10), `APALIS_POLL_MS` idle poll interval
//! (default 10; apalis' default is 100 with backoff), `APALIS_CONCURRENCY`
//! (default 24). A fetch that returns tasks is followed by the next at once.
//!
//! A worker whose run ends on a database error (InnoDB picks deadlock
//! victims among apalis' fetches at REPEATABLE READ, and apalis ends the
//! run on the first error) is started again under a new name, as a
//! supervisor would; the tasks the old one had fetched are re-enqueued by
//! apalis' orphan check after `APALIS_ORPHAN_S` seconds (default 10;
//! apalis' default is 300). Each restart is logged to stderr.
//! `APALIS_READ_COMMITTED=1` runs apalis' sessions at READ COMMITTED (the
//! isolation level baton uses) instead of the server's default.

use std::time::Duration;

use apalis::prelude::*;
use apalis_core::backend::poll_strategy::{IntervalStrategy, StrategyBuilder};
use apalis_mysql::{Config, MySqlStorage};
use futures::stream;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn noop(_id: u64) -> Result<(), BoxDynError> {
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("MYSQL").map_err(|_| "set MYSQL to the database URL")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let read_committed = std::env::var("APALIS_READ_COMMITTED").is_ok_and(|v| v == "1");
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if read_committed {
                    sqlx::Executor::execute(
                        conn,
                        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                    )
                    .await?;
                }
                Ok(())
            })
        })
        .connect(&url)
        .await?;
    let config = Config::new("bench")
        .set_reenqueue_orphaned_after(Duration::from_secs(env_num("APALIS_ORPHAN_S", 10)))
        .set_buffer_size(env_num("APALIS_BUFFER", 100) as usize)
        .with_poll_interval(
            StrategyBuilder::new()
                .apply(IntervalStrategy::new(Duration::from_millis(env_num(
                    "APALIS_POLL_MS",
                    10,
                ))))
                .build(),
        );
    match mode {
        "migrate" => {
            // apalis' own migrations, in order. They name MySQL 8's default
            // collation `utf8mb4_0900_ai_ci`, which MariaDB (before 11.4)
            // does not know, so it is swapped for `utf8mb4_unicode_ci`;
            // nothing else changes. (`MySqlStorage::setup` runs them as
            // they are and fails on MariaDB with error 1273.)
            for m in MySqlStorage::migrations().iter() {
                let sql = m.sql.replace("utf8mb4_0900_ai_ci", "utf8mb4_unicode_ci");
                sqlx::raw_sql(&sql).execute(&pool).await?;
            }
        }
        "insert" => {
            let n: u64 = args.get(1).and_then(|v| v.parse().ok()).ok_or("insert N")?;
            let mut backend: MySqlStorage<u64, _, _> = MySqlStorage::new_with_config(&pool, &config);
            let chunk = 10_000;
            let mut i = 0;
            while i < n {
                let end = (i + chunk).min(n);
                backend.push_stream(stream::iter(i..end)).await?;
                i = end;
            }
        }
        "work" => {
            println!("ready");
            if let Ok(go) = std::env::var("GO_FILE") {
                while !std::path::Path::new(&go).exists() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            let mut restarts = 0u32;
            loop {
                let backend: MySqlStorage<u64, _, _> = MySqlStorage::new_with_config(&pool, &config);
                let name = format!("bench-{}-{restarts}", std::process::id());
                let worker = WorkerBuilder::new(name)
                    .backend(backend)
                    .concurrency(env_num("APALIS_CONCURRENCY", 24) as usize)
                    .build(noop);
                tokio::select! {
                    r = worker.run() => {
                        restarts += 1;
                        eprintln!("apalis worker {} stopped ({r:?}); restart {restarts}", std::process::id());
                    }
                    _ = term.recv() => break,
                }
            }
            eprintln!("apalis worker {}: {restarts} restarts", std::process::id());
        }
        _ => return Err("usage: apalis-mysql-peer migrate | insert N | work".into()),
    }
    Ok(())
}
