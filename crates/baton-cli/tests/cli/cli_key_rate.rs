//! Rates per concurrency key (issue 25 item 2) as a user runs them: `baton
//! work --per-key-rate N/PERIOD` and a config file's `[[queue]]
//! per_key_rate`.

use crate::common;

use std::collections::BTreeMap;
use std::time::Instant;

use baton::queue::{Queue, TaskBuilder};
use baton::store::{TaskFilter, TaskState};
use common::Env;

per_backend! {
    two_workers_keep_each_keys_rate_by_the_stores_clock,
}

/// Two keys of 8 `true` commands each and 4 without a key, two `baton
/// work` processes at 3/1s per key (one from `--per-key-rate`, one from
/// the config's `per_key_rate`), polling only every 30 s: every task
/// succeeds on its first attempt, by the store's `started_at` no key has 4
/// starts within one second, the keyless tasks are not held back, and the
/// workers claimed each key again when its rate allowed (not at a poll).
async fn two_workers_keep_each_keys_rate_by_the_stores_clock(e: Env) {
    let q = Queue::new(e.ts.store.clone());
    let cmd = || TaskBuilder::new("command", serde_json::json!({"argv": ["true"]}));
    let mut batch = Vec::new();
    for key in ["acme", "globex"] {
        batch.extend((0..8).map(|_| cmd().concurrency_key(key)));
    }
    batch.extend((0..4).map(|_| cmd()));
    let total = batch.len();
    q.enqueue_many(batch).await.unwrap();
    std::fs::write(
        e.path("baton.toml"),
        "[[queue]]\nname = \"default\"\nconcurrency = 4\nper_key_rate = \"3/1s\"\n",
    )
    .unwrap();
    let common_args = ["work", "--poll", "30s", "--shutdown-grace", "500ms"];
    let mut from_config = common_args.to_vec();
    from_config.extend(["--config", "baton.toml"]);
    let mut from_flags = common_args.to_vec();
    from_flags.extend(["--concurrency", "4", "--per-key-rate", "3/1s"]);
    let started = Instant::now();
    let mut workers = vec![e.spawn_logged(&from_config), e.spawn_logged(&from_flags)];
    let filter = TaskFilter {
        state: Some(TaskState::Succeeded),
        limit: 1000,
        ..TaskFilter::default()
    };
    while q.tasks(&filter).await.unwrap().len() < total {
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
    assert_eq!(done.len(), total);
    assert!(done.iter().all(|t| t.attempt == 1), "one attempt each");
    let mut by_key: BTreeMap<Option<String>, Vec<_>> = BTreeMap::new();
    for t in &done {
        by_key
            .entry(t.concurrency_key.clone())
            .or_default()
            .push(t.started_at.unwrap());
    }
    let first = by_key.values().flatten().min().copied().unwrap();
    for (key, starts) in &mut by_key {
        starts.sort();
        let Some(key) = key else {
            // Not held back by the keys' rate: all within the first second.
            let last = *starts.last().unwrap();
            assert!(
                last - first < chrono::Duration::seconds(1),
                "keyless tasks waited: {first} .. {last}"
            );
            continue;
        };
        for w in starts.windows(4) {
            assert!(
                w[3] - w[0] >= chrono::Duration::seconds(1),
                "key {key}: 4 starts within a second: {} .. {}",
                w[0],
                w[3]
            );
        }
    }
    // 8 starts of a key at 3/1s take at least 2 s, and the poll (30 s)
    // was never waited for.
    assert!(
        took.as_secs_f64() < 20.0,
        "the workers waited for a poll: {took:?}"
    );
}
