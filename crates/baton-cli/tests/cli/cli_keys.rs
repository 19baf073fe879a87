//! Per-key concurrency (issue 25 item 1) as a user runs it: `baton enqueue
//! --concurrency-key`, and `baton work` processes capped per key by the
//! flag `--per-key-max-running` or a config file's `per_key_max_running`.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use baton::queue::{Queue, TaskBuilder};
use baton::store::{TaskFilter, TaskState};
use common::{stderr, stdout, wait_for, Env};

per_backend! {
    three_workers_never_run_more_than_the_cap_of_one_key,
    fair_work_runs_a_small_key_past_a_backlog,
}

/// `baton work --fair` (issue 25 item 4): 200 tasks of one key enqueued
/// first, then 3 of another; one worker with 2 slots runs the 3 small ones
/// among the first dozen tasks it starts (in plain order they would come
/// last); on every store.
async fn fair_work_runs_a_small_key_past_a_backlog(e: Env) {
    let args = [
        "work",
        "--fair",
        "--concurrency",
        "2",
        "--poll",
        "200ms",
        "--shutdown-grace",
        "500ms",
        "--grace",
        "500ms",
    ];
    let ledger = e.path("ledger");
    let script = format!("echo \"$0\" >> {}", ledger.display());
    let q = Queue::new(e.ts.store.clone());
    let task = |key: &str| {
        TaskBuilder::new(
            "command",
            serde_json::json!({"argv": ["sh", "-c", &script, key]}),
        )
        .concurrency_key(key)
    };
    q.enqueue_many((0..200).map(|_| task("big")).collect())
        .await
        .unwrap();
    q.enqueue_many((0..3).map(|_| task("small")).collect())
        .await
        .unwrap();
    let mut w = e.spawn_logged(&args);
    let lines = || ledger_lines(&ledger);
    wait_for(60, "the small key's tasks to run", || {
        lines().iter().filter(|l| *l == "small").count() == 3
    });
    common::signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    let lines = lines();
    let last_small = lines.iter().rposition(|l| l == "small").unwrap();
    assert!(
        last_small < 12,
        "the small key's 3 tasks among the first 12 started: {lines:?}"
    );
}

/// The lines the commands appended to the ledger so far.
fn ledger_lines(ledger: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

const KEYS: usize = 20;
const PER_KEY: usize = 10;
const CAP: usize = 2;

/// The check, scaled: 3 `baton work` processes × 8 slots, 20 keys
/// × 10 tasks with a cap of 2 per key (one worker takes the cap from a
/// config file's `[[queue]]`, two from `--per-key-max-running`). Each
/// command appends `key start end id` (its own clock readings, inside the
/// store's running time) to a ledger: sweeping those intervals, no key
/// ever has more than 2 running at once, the cap is reached, and every
/// task ran exactly once and succeeded. The tasks are enqueued key after
/// key, so that claim order keeps running into saturated keys.
async fn three_workers_never_run_more_than_the_cap_of_one_key(e: Env) {
    let ledger = e.path("ledger");
    let script = format!(
        "s=$(date +%s%N); sleep 0.3; echo \"$0 $s $(date +%s%N) $BATON_TASK_ID\" >> {}",
        ledger.display()
    );
    // One task per key through the CLI flag, the rest in one batch.
    let mut key_of: HashMap<i64, String> = HashMap::new();
    for k in 0..KEYS {
        let key = format!("customer:{k}");
        let out = e.run(&[
            "enqueue",
            "--concurrency-key",
            &key,
            "--",
            "sh",
            "-c",
            &script,
            &key,
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let id: i64 = stdout(&out).trim().parse().expect("enqueue prints the id");
        key_of.insert(id, key);
    }
    let q = Queue::new(e.ts.store.clone());
    let mut batch = Vec::new();
    let mut keys = Vec::new();
    for k in 0..KEYS {
        for _ in 1..PER_KEY {
            let key = format!("customer:{k}");
            batch.push(
                TaskBuilder::new(
                    "command",
                    serde_json::json!({"argv": ["sh", "-c", &script, &key]}),
                )
                .concurrency_key(&key),
            );
            keys.push(key);
        }
    }
    let ids = q.enqueue_many(batch).await.unwrap();
    for (id, key) in ids.iter().zip(keys) {
        key_of.insert(id.id, key);
    }
    let total = key_of.len();
    assert_eq!(total, KEYS * PER_KEY);
    // `tasks show` and `tasks list` display the key.
    let (first, first_key) = key_of.iter().min_by_key(|(id, _)| **id).unwrap();
    let out = stdout(&e.run(&["tasks", "show", &first.to_string()]));
    assert!(
        out.lines()
            .any(|l| l.contains("concurrency key") && l.contains(first_key.as_str())),
        "{out}"
    );
    let out = stdout(&e.run(&["tasks", "list", "--limit", "1000"]));
    assert!(out.lines().next().unwrap().contains("CONC_KEY"), "{out}");
    assert!(
        out.lines().any(
            |l| l.split_whitespace().next() == Some(first.to_string().as_str())
                && l.split_whitespace().any(|w| w == first_key)
        ),
        "{out}"
    );
    std::fs::write(
        e.path("baton.toml"),
        "[[queue]]\nname = \"default\"\nconcurrency = 8\nlease = \"10s\"\nper_key_max_running = 2\n",
    )
    .unwrap();
    let common_args = [
        "work",
        "--poll",
        "500ms",
        "--shutdown-grace",
        "500ms",
        "--grace",
        "500ms",
    ];
    let started = Instant::now();
    let mut from_config = common_args.to_vec();
    from_config.extend(["--config", "baton.toml"]);
    let mut from_flags = common_args.to_vec();
    from_flags.extend([
        "--concurrency",
        "8",
        "--lease",
        "10s",
        "--per-key-max-running",
        "2",
    ]);
    let mut workers = vec![
        e.spawn_logged(&from_config),
        e.spawn_logged(&from_flags),
        e.spawn_logged(&from_flags),
    ];
    let lines = || ledger_lines(&ledger);
    // Item 5: the workers declared the cap, `baton queues` shows it, and
    // `baton queues keys` shows the keys' load under it.
    wait_for(30, "`baton queues` to show the declared cap", || {
        stdout(&e.run(&["queues"]))
            .lines()
            .any(|l| l.starts_with("default") && l.contains("per key 2"))
    });
    let out = e.run(&["queues", "keys", "default", "--limit", "50", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let load: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(load["per_key_max_running"], 2, "{load}");
    let keys = load["keys"].as_array().unwrap();
    assert!(!keys.is_empty(), "{load}");
    assert!(
        keys.iter()
            .all(|k| k["running"].as_u64() <= Some(CAP as u64)
                && k["key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("customer:"))),
        "{load}"
    );
    let out = stdout(&e.run(&["queues", "keys", "default"]));
    assert!(out.lines().next().unwrap().starts_with("KEY"), "{out}");
    assert!(out.contains("(per-key cap 2)"), "{out}");
    wait_for(90, "every task to run", || lines().len() >= total);
    let took = started.elapsed();
    // A task run twice would add a line a little later.
    std::thread::sleep(Duration::from_millis(500));
    for w in &mut workers {
        common::signal(w, libc::SIGTERM);
        w.wait().unwrap();
    }
    let lines = lines();
    // Every task exactly once, under its own key.
    let mut runs: HashMap<i64, usize> = HashMap::new();
    let mut events: HashMap<String, Vec<(u128, i32)>> = HashMap::new();
    for l in &lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 4, "ledger line {l:?}");
        let id: i64 = f[3].parse().unwrap();
        assert_eq!(key_of.get(&id).map(String::as_str), Some(f[0]), "{l:?}");
        *runs.entry(id).or_default() += 1;
        let ev = events.entry(f[0].to_string()).or_default();
        ev.push((f[1].parse().unwrap(), 1));
        ev.push((f[2].parse().unwrap(), -1));
    }
    assert_eq!(runs.len(), total, "every task ran");
    assert!(
        runs.values().all(|n| *n == 1),
        "a task ran twice: {:?}",
        runs.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    // Per key, sweep the start (+1) and end (-1) events in time order (an
    // end before a start at the same instant).
    let mut peaks: HashMap<String, i32> = HashMap::new();
    for (k, mut ev) in events {
        ev.sort();
        let (mut now, mut peak) = (0, 0);
        for (_, d) in ev {
            now += d;
            peak = peak.max(now);
        }
        peaks.insert(k, peak);
    }
    let over: Vec<_> = peaks.iter().filter(|(_, p)| **p > CAP as i32).collect();
    assert!(
        over.is_empty(),
        "more than {CAP} running of a key: {over:?}"
    );
    assert!(
        peaks.values().any(|p| *p == CAP as i32),
        "the cap was never reached: {peaks:?}"
    );
    let done = q
        .tasks(&TaskFilter {
            state: Some(TaskState::Succeeded),
            limit: 1000,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(done.len(), total, "every task succeeded");
    assert!(
        done.iter()
            .all(|t| t.attempt == 1 && t.concurrency_key == key_of.get(&t.id).cloned()),
        "one attempt each, the key kept"
    );
    eprintln!("{total} tasks in {took:?}");
}
