//! DESIGN.md C1, with real processes whose wall clocks are shifted by
//! libfaketime: every expiry is decided by the store's clock, so clients
//! 10 minutes fast and 10 minutes slow see the same leases.
//!
//! SQLite is not run here: its store clock *is* the host clock inside each
//! process, so shifting one process's clock shifts its store too. SQLite
//! serves one host, whose processes share one clock.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{stderr, Env, Kind, LIBFAKETIME};

fn faketime() -> Option<&'static str> {
    let present = std::path::Path::new(LIBFAKETIME).exists();
    common::have("faketime (apt-get install faketime)", present).then_some(LIBFAKETIME)
}

/// `baton ARGS` with its wall clock shifted by `offset` (e.g. `+10m`).
/// libfaketime is preloaded into baton itself (not a wrapper process), so
/// killing the child kills baton.
fn skewed_cmd(e: &Env, offset: &str, args: &[&str]) -> Command {
    let mut c = Command::new(common::BATON);
    c.args(args)
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("BATON_STORE", &e.ts.url)
        .env("BATON_PREFIX", &e.ts.prefix)
        .current_dir(e.dir.path());
    c
}

fn skewed(e: &Env, offset: &str, args: &[&str]) -> std::process::Output {
    skewed_cmd(e, offset, args).output().unwrap()
}

async fn skewed_clients_agree(kind: Kind) {
    let Some(_) = faketime() else { return };
    let Some(e) = Env::new(kind).await else {
        return;
    };
    let t0 = Instant::now();
    // 10 minutes fast: takes the lock and holds it 1.5 s (at_least).
    let out = skewed(
        &e,
        "+10m",
        &[
            "lock",
            "skew",
            "--at-most",
            "5s",
            "--at-least",
            "1500ms",
            "--",
            "sh",
            "-c",
            "date +%s > fast-clock",
        ],
    );
    // (the command inherits the preload, so `date` shows the shifted clock)
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let fast: i64 = common::read(&e.path("fast-clock")).trim().parse().unwrap();
    let real = chrono::Utc::now().timestamp();
    assert!(
        fast - real > 500,
        "the client's clock really was shifted ({fast} vs {real})"
    );
    // 10 minutes slow: sees it held, not expired 10 minutes ago or held for 20.
    let out = skewed(&e, "-10m", &["lock", "skew", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_millis(1_400),
        "checked within at_least"
    );
    std::thread::sleep(Duration::from_millis(1_700).saturating_sub(t0.elapsed()));
    let out = skewed(&e, "-10m", &["lock", "skew", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "free 1.5 s after the grant by the store's clock: {}",
        stderr(&out)
    );
    // A lease the slow client took lapses at_most after the grant for the fast one.
    let mut holder = skewed_cmd(
        &e,
        "-10m",
        &["lock", "skew2", "--at-most", "1s", "--", "sleep", "30"],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = skewed(&e, "+10m", &["lock", "skew2", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "kept alive by the slow client: {}",
        stderr(&out)
    );
    let _ = holder.kill();
    let _ = holder.wait();
    // Killed: its lease lapses about 1 s after its last extension.
    let t1 = Instant::now();
    loop {
        let out = skewed(&e, "+10m", &["lock", "skew2", "--", "true"]);
        if out.status.code() == Some(0) {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(4),
            "lapsed by store time, not 20 minutes off"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_skewed_clients_agree() {
    skewed_clients_agree(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_skewed_clients_agree() {
    skewed_clients_agree(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_skewed_clients_agree() {
    skewed_clients_agree(Kind::Mysql).await
}

/// Three `baton serve` instances, two of them with clocks 7 minutes off,
/// run a 1-second job: every slot once, no gaps, and the slots are the
/// store's (not 7 minutes early or late).
async fn skewed_schedulers_agree(kind: Kind) {
    let Some(_) = faketime() else { return };
    let Some(e) = Env::new(kind).await else {
        return;
    };
    std::fs::write(
        e.path("baton.toml"),
        r#"
[[queue]]
name = "default"
concurrency = 4
lease = "3s"
[[job]]
name = "tick"
every = "1s"
overlap = "allow"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#,
    )
    .unwrap();
    let mut kids = Vec::new();
    for offset in ["+7m", "-7m", "+0"] {
        let mut c = skewed_cmd(
            &e,
            offset,
            &["serve", "--config", "baton.toml", "--shutdown-grace", "1s"],
        );
        c.stderr(std::process::Stdio::null());
        kids.push(c.spawn().unwrap());
    }
    let t0 = chrono::Utc::now();
    std::thread::sleep(Duration::from_secs(7));
    for k in &kids {
        common::signal(k, libc::SIGTERM);
    }
    for mut k in kids {
        k.wait().unwrap();
    }
    let t1 = chrono::Utc::now();
    let mut slots: Vec<chrono::DateTime<chrono::Utc>> = common::read(&e.path("ledger"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    slots.sort();
    let n = slots.len();
    slots.dedup();
    assert_eq!(n, slots.len(), "a slot ran twice");
    assert!(slots.len() >= 5, "{slots:?}");
    for w in slots.windows(2) {
        assert_eq!((w[1] - w[0]).num_seconds(), 1, "gap: {} .. {}", w[0], w[1]);
    }
    for s in &slots {
        assert!(
            *s >= t0 - chrono::Duration::seconds(2) && *s <= t1,
            "slot {s} is not in store time ({t0}..{t1})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_skewed_schedulers_agree() {
    skewed_schedulers_agree(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_skewed_schedulers_agree() {
    skewed_schedulers_agree(Kind::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_skewed_schedulers_agree() {
    skewed_schedulers_agree(Kind::Mysql).await
}
