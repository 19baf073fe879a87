//! The third seed, scaled down: long export tasks on a durable queue instead
//! of Kafka. Three workers ("servers") take 2 tasks at a time, heartbeat
//! their leases, retry a failure up to 3 attempts, and when one server
//! crashes mid-export, its tasks are rescued and finished elsewhere within
//! seconds — not after a 5-minute `max.poll.interval.ms` rebalance, and
//! never twice at once.
//!
//! ```text
//! cargo run -p baton --example long_export                       # embedded SQLite
//! cargo run -p baton --example long_export -- postgres://postgres@127.0.0.1:5432/test
//! cargo run -p baton --example long_export -- redis://127.0.0.1:6379
//! ```

use std::time::Duration;

use baton::queue::{Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{TaskFilter, TaskState};
use baton::{Store, StoreOptions};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// One "30-minute" export, scaled to 3 seconds in 10 steps.
const STEPS: u32 = 10;
const STEP: Duration = Duration::from_millis(300);

fn worker(store: Store, name: &'static str) -> Result<Worker, baton::Error> {
    let cfg = WorkerConfig::default()
        .queue("excel", 2)
        .lease(Duration::from_millis(1_500))
        .poll_interval(Duration::from_millis(500));
    let mut w = Worker::new(store, cfg)?;
    w.handle("excel-export", move |ctx| async move {
        let t = ctx.task();
        println!(
            "  [{name}] export {} started (attempt {}/{})",
            t.payload["request"], t.attempt, t.max_attempts
        );
        for step in 1..=STEPS {
            tokio::select! {
                _ = tokio::time::sleep(STEP) => {}
                _ = ctx.stopped() => return Err(TaskError::retry("stopped")),
            }
            // Progress is visible in `baton tasks show ID`.
            // A store failure (or a lost lease) is retried: `?` says so.
            ctx.progress(json!({ "rows_done": step * 1000 })).await?;
        }
        if t.payload["request"] == 1 && t.attempt == 1 {
            return Err(TaskError::retry("external API timed out"));
        }
        println!("  [{name}] export {} done", t.payload["request"]);
        Ok(())
    });
    Ok(w)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite://long_export.db".into());
    let opts = || StoreOptions {
        prefix: Some("long_export_".into()),
        ..Default::default()
    };
    let store = Store::connect_with(&url, opts()).await?;
    let queue = Queue::new(store.clone());
    queue.prune(Duration::ZERO).await?;

    // Six requests; the unique key makes a double-click enqueue nothing new.
    for request in 1..=6 {
        for _click in 0..2 {
            queue
                .enqueue(
                    TaskBuilder::new("excel-export", json!({ "request": request }))
                        .queue("excel")
                        .unique_key(format!("excel-download-{request}"))
                        .max_attempts(3),
                )
                .await?;
        }
    }
    println!("6 exports queued (12 clicks); 3 servers with 2 slots each");

    // Server A runs in its own runtime so it can "crash" like kill -9.
    let crash_rt = tokio::runtime::Runtime::new()?;
    let a = worker(Store::connect_with(&url, opts()).await?, "server-a")?;
    let _a = crash_rt.spawn(a.run(CancellationToken::new()));
    let stop = CancellationToken::new();
    let b = tokio::spawn(
        worker(Store::connect_with(&url, opts()).await?, "server-b")?.run(stop.clone()),
    );
    let c = tokio::spawn(
        worker(Store::connect_with(&url, opts()).await?, "server-c")?.run(stop.clone()),
    );

    tokio::time::sleep(Duration::from_millis(1_200)).await;
    println!("!! server-a crashes mid-export (no shutdown, no hand-back)");
    crash_rt.shutdown_background();

    loop {
        let st = queue.stats().await?;
        let s = st
            .iter()
            .find(|s| s.queue == "excel")
            .cloned()
            .unwrap_or_default();
        if s.succeeded + s.failed == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    b.await??;
    c.await??;

    println!("\nresult:");
    let filter = TaskFilter {
        queue: Some("excel".into()),
        ..Default::default()
    };
    for t in queue.tasks(&filter).await?.iter().rev() {
        let history: Vec<_> = t
            .errors
            .iter()
            .map(|e| format!("attempt {}: {}", e.attempt, e.error))
            .collect();
        println!(
            "  export {} {} after {} attempt(s) {:?}",
            t.payload["request"], t.state, t.attempt, history
        );
        assert_eq!(t.state, TaskState::Succeeded);
    }
    Ok(())
}
