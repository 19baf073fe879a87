//! Rate limits (issue 25 item 2) as a user runs them: `baton work --rate
//! N/PERIOD` and a config file's `[[queue]] rate`.

use crate::common;

use std::time::Instant;

use baton::queue::{Queue, TaskBuilder};
use baton::store::{TaskFilter, TaskState};
use common::Env;

per_backend! {
    two_workers_keep_the_rate_by_the_stores_clock,
}

const TASKS: usize = 25;

/// 25 `true` commands, two `baton work` processes at 10/1s (one from
/// `--rate`, one from the config's `rate`): every task succeeds on its
/// first attempt, and by the store's `started_at` no 1-second window holds
/// more than 10 starts.
async fn two_workers_keep_the_rate_by_the_stores_clock(e: Env) {
    let q = Queue::new(e.ts.store.clone());
    let batch = (0..TASKS)
        .map(|_| TaskBuilder::new("command", serde_json::json!({"argv": ["true"]})))
        .collect();
    q.enqueue_many(batch).await.unwrap();
    std::fs::write(
        e.path("baton.toml"),
        "[[queue]]\nname = \"default\"\nconcurrency = 4\nrate = \"10/1s\"\n",
    )
    .unwrap();
    let common_args = ["work", "--poll", "30s", "--shutdown-grace", "500ms"];
    let mut from_config = common_args.to_vec();
    from_config.extend(["--config", "baton.toml"]);
    let mut from_flags = common_args.to_vec();
    from_flags.extend(["--concurrency", "4", "--rate", "10/1s"]);
    let started = Instant::now();
    let mut workers = vec![e.spawn_logged(&from_config), e.spawn_logged(&from_flags)];
    let filter = TaskFilter {
        state: Some(TaskState::Succeeded),
        limit: 1000,
        ..TaskFilter::default()
    };
    while q.tasks(&filter).await.unwrap().len() < TASKS {
        assert!(
            started.elapsed().as_secs() < 60,
            "not every task succeeded in 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    for w in &mut workers {
        common::signal(w, libc::SIGTERM);
        w.wait().unwrap();
    }
    let done = q.tasks(&filter).await.unwrap();
    assert_eq!(done.len(), TASKS);
    assert!(done.iter().all(|t| t.attempt == 1), "one attempt each");
    let mut starts: Vec<_> = done.iter().map(|t| t.started_at.unwrap()).collect();
    starts.sort();
    for w in starts.windows(11) {
        assert!(
            w[10] - w[0] >= chrono::Duration::seconds(1),
            "11 starts within a second: {} .. {}",
            w[0],
            w[10]
        );
    }
    // 25 starts at 10/1s take at least 2 s, and the poll (30 s) was
    // never waited for.
    assert!(
        took.as_secs_f64() < 20.0,
        "the workers waited for a poll: {took:?}"
    );
}
