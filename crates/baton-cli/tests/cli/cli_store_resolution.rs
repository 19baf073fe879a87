//! Every command resolves its store one documented way: `--store`, then
//! `BATON_STORE`, then the config file's `store`, then `sqlite://baton.db`
//! (the prefix likewise). These run the real binary with the store named
//! only in the config file, so a command that ignored the file would use a
//! `baton.db` in its working directory, where nothing else looks.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{read, signal, stderr, stdout, wait_for, Env, BATON};

per_backend! {
    trigger_jobs_and_enqueue_use_the_configs_store,
    work_with_a_config_serves_its_queues,
}

/// A config naming the test's store, with a declared queue and a durable
/// job on it.
fn config(e: &Env) -> String {
    format!(
        r#"
store = "{url}"
prefix = "{prefix}"

[[queue]]
name = "exports"
concurrency = 1
lease = "5s"

[[job]]
name = "batch-6h"
cron = "0 */6 * * *"
tz = "Asia/Seoul"
queue = "exports"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#,
        url = e.ts.url,
        prefix = e.ts.prefix
    )
}

/// `baton ARGS` with no store in the environment: only `--config` names it.
fn bare(e: &Env, args: &[&str]) -> Command {
    let mut c = Command::new(BATON);
    c.args(args)
        .env_remove("BATON_STORE")
        .env_remove("BATON_PREFIX")
        .env_remove("BATON_CONFIG")
        .env("BATON_LOG", "warn")
        .current_dir(e.dir.path());
    c
}

fn ok(mut c: impl std::borrow::BorrowMut<Command>) -> String {
    let c = c.borrow_mut();
    let out = c.output().expect("baton runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{c:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// The GUIDE's seed-001 command, `baton trigger batch-6h --config
/// baton.toml --slot 2026-01-01T06:00:00+09:00`: its output (the task id).
fn trigger_seed_001(e: &Env) -> String {
    let slot = "2026-01-01T06:00:00+09:00";
    ok(bare(
        e,
        &[
            "trigger",
            "batch-6h",
            "--config",
            "baton.toml",
            "--slot",
            slot,
        ],
    ))
}

async fn trigger_jobs_and_enqueue_use_the_configs_store(e: Env) {
    std::fs::write(e.path("baton.toml"), config(&e)).unwrap();
    let id = trigger_seed_001(&e);
    let id: i64 = id.trim().parse().expect("a task id");
    // It is in the config's store, on the job's queue.
    let t = e.ts.store.backend().task_get(id).await.unwrap();
    let t = t.expect("the triggered run is in the config's store");
    assert_eq!(t.job.as_deref(), Some("batch-6h"));
    assert_eq!(t.queue, "exports");
    // `serve` registers the job in the config's store.
    let mut serve = bare(&e, &["serve", "--config", "baton.toml"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut known = false;
    for _ in 0..200 {
        let jobs = e.ts.store.backend().job_list().await.unwrap();
        if jobs.iter().any(|j| j.name == "batch-6h") {
            known = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&serve, libc::SIGTERM);
    common::wait_or_kill(&mut serve, Duration::from_secs(10));
    let _ = serve.wait();
    assert!(
        known,
        "serve --config registered the job in the config's store"
    );
    // The config resolves for every command: pause through it, read back.
    ok(bare(
        &e,
        &["jobs", "--config", "baton.toml", "pause", "batch-6h"],
    ));
    let jobs = e.ts.store.backend().job_list().await.unwrap();
    assert!(
        jobs.iter().any(|j| j.name == "batch-6h" && j.paused),
        "paused in the config's store: {jobs:?}"
    );
    ok(bare(
        &e,
        &["jobs", "--config", "baton.toml", "resume", "batch-6h"],
    ));
    let id2 = ok(bare(
        &e,
        &["enqueue", "--config", "baton.toml", "--", "true"],
    ));
    let id2: i64 = id2.trim().parse().expect("a task id");
    assert!(e.ts.store.backend().task_get(id2).await.unwrap().is_some());
    // BATON_CONFIG names the file as well as --config does.
    let listed = ok(bare(&e, &["tasks", "list", "--json"]).env("BATON_CONFIG", "baton.toml"));
    assert!(listed.contains("batch-6h"), "{listed}");
    // Nothing fell back to the default store in the working directory.
    assert!(
        !e.path("baton.db").exists(),
        "a command used sqlite://baton.db instead of the config's store"
    );
    // --store still wins over the file (here: a store that does not exist).
    let out = bare(
        &e,
        &[
            "tasks",
            "list",
            "--config",
            "baton.toml",
            "--store",
            "sqlite://other.db",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("batch-6h"), "{}", stdout(&out));
}

async fn work_with_a_config_serves_its_queues(e: Env) {
    std::fs::write(e.path("baton.toml"), config(&e)).unwrap();
    trigger_seed_001(&e);
    let mut w = bare(&e, &["work", "--config", "baton.toml"])
        .env("BATON_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The durable job's run on the declared queue runs.
    let ledger = e.path("ledger");
    wait_for(20, "the job's run on queue exports", || {
        read(&ledger).contains("2025-12-31T21:00:00.000Z")
    });
    signal(&w, libc::SIGTERM);
    let out = tokio::task::spawn_blocking(move || {
        common::wait_or_kill(&mut w, Duration::from_secs(15));
        w.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let log = stderr(&out);
    // The start line names the store and the queue with its settings.
    let shown = baton::store::redact(&e.ts.url);
    assert!(log.contains(&shown), "start line names the store: {log}");
    assert!(
        log.contains("exports (concurrency 1, lease 5s)"),
        "start line names the config's queue: {log}"
    );
    assert!(!e.path("baton.db").exists());
}
