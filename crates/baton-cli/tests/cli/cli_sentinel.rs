//! `baton work --store redis+sentinel://…` on a private master, replica and
//! three sentinels (`baton_testkit::sentinel`), through a forced failover
//! and a time with no writable master:
//!
//! - tasks enqueued (by `baton enqueue`, through the sentinels too) before
//!   and after `SENTINEL FAILOVER` each run once, the ones after within a
//!   bound of the sentinels naming the new master;
//! - `/readyz` answers 200 on either master, 503 with the reason while no
//!   writable master is reached (the sentinels stopped, the master demoted
//!   by `REPLICAOF`), and 200 again once there is one — by itself.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::sentinel::{cli, SentinelSet};
use common::{read, stderr, BATON};
use serde_json::Value;

fn baton(url: &str, dir: &std::path::Path, args: &[&str]) -> Command {
    let mut c = Command::new(BATON);
    c.args(args)
        .env("BATON_STORE", url)
        .env("BATON_PREFIX", "clisentinel_")
        .env("BATON_LOG", "warn")
        .current_dir(dir);
    c
}

/// Enqueue a task appending `n` to `ran`, retried while no master takes it.
fn enqueue(url: &str, dir: &std::path::Path, n: usize) {
    let ran = dir.join("ran");
    let script = format!("echo {n} >> {}", ran.display());
    let t0 = Instant::now();
    loop {
        let out = baton(url, dir, &["enqueue", "--", "sh", "-c", &script])
            .output()
            .expect("baton runs");
        if out.status.success() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "enqueue {n}: {}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The numbers the tasks wrote, sorted.
fn ran(dir: &std::path::Path) -> Vec<usize> {
    let mut v: Vec<usize> = std::fs::read_to_string(dir.join("ran"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// `/readyz`: the status and the body as JSON.
fn readyz(addr: &str) -> (u16, Value) {
    common::call(addr, "GET", "/readyz", None, None)
}

/// Wait until `/readyz` answers `code`; the body then. On a timeout the
/// panic shows the last answer and the end of `baton work`'s log.
fn readyz_becomes(addr: &str, code: u16, secs: u64, log: &std::path::Path) -> Value {
    let t0 = Instant::now();
    loop {
        let (c, body) = readyz(addr);
        if c == code {
            return body;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let text = read(log);
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "/readyz still {c} {body}, not {code}, after {secs} s; the log ends:\n{}",
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn baton_work_follows_a_sentinel_failover() {
    let Some(mut set) = SentinelSet::start() else {
        return;
    };
    let url = set.url();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("work.log");
    let mut work = baton(
        &url,
        d,
        &["work", "--listen", "127.0.0.1:0", "--poll", "200ms"],
    )
    .env("BATON_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let addr = common::admin_addr(20, || read(&log));
    readyz_becomes(&addr, 200, 20, &log);
    for n in 0..3 {
        enqueue(&url, d, n);
    }
    common::wait_for(20, "the first tasks to run", || ran(d).len() == 3);

    // A forced failover: the old master is demoted, the replica promoted.
    let old = set.start_failover();
    let new = set.wait_new_master(old);
    let named = Instant::now();
    for n in 3..6 {
        enqueue(&url, d, n);
    }
    common::wait_for(20, "the tasks after the failover to run", || {
        ran(d).len() == 6
    });
    let followed = named.elapsed();
    eprintln!("cli sentinel: tasks enqueued after the failover ran within {followed:?}");
    assert!(
        followed < Duration::from_secs(15),
        "baton work followed the failover in {followed:?}"
    );
    readyz_becomes(&addr, 200, 20, &log);

    // No writable master: the sentinels gone, the master demoted.
    set.stop_sentinels();
    assert_eq!(cli(new, &["REPLICAOF", "127.0.0.1", "1"]), "OK");
    let body = readyz_becomes(&addr, 503, 20, &log);
    eprintln!("cli sentinel: unready: {body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("store")),
        "{body}"
    );
    // A master again: ready by itself, and work runs.
    assert_eq!(cli(new, &["REPLICAOF", "NO", "ONE"]), "OK");
    set.start_sentinels();
    readyz_becomes(&addr, 200, 30, &log);
    enqueue(&url, d, 6);
    common::wait_for(20, "a task after the outage to run", || ran(d).len() == 7);
    assert_eq!(ran(d), (0..7).collect::<Vec<_>>(), "every task ran once");
    // Backing off, not spinning: a handful of claim warnings, not one a tick.
    let text = read(&log);
    let claim_failures = text.matches("claim failed").count();
    assert!(
        claim_failures < 40,
        "{claim_failures} claim failures logged"
    );
    let _ = work.kill();
    let _ = work.wait();
}
