//! After a store outage the latest due slot runs (issue #9): three `baton
//! serve` run an `every = "1s"` durable job with `misfire = "latest"` on a
//! private store that the test makes unavailable for ~4 s — a private
//! `redis-server` killed and restarted (AOF) on the same port, a private
//! `postgres` stopped (`-m immediate`) and started, a SQLite file held by
//! another connection's `BEGIN EXCLUSIVE`. Then:
//!
//! - the first slot run after the outage was the latest due slot when it
//!   started (one slot of tolerance), not one the plan had before the
//!   outage;
//! - no slot ran twice;
//! - every slot between the first and the last run that did not run has a
//!   record saying why (a cancelled task whose reason covers it: the misfire
//!   policy's skip record, or overlap's);
//! - from the first run after the outage on, no slot is missing.

use crate::common;

use baton_testkit as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use common::{read, signal, wait_for, Env, Kind};

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 2
lease = "3s"

[[job]]
name = "tick"
every = "1s"
misfire = "latest"
command = ["sh", "-c", "echo \"$BATON_SLOT $(date +%s.%N)\" >> ledger"]
"#;

/// How long the store is unavailable (plus a PostgreSQL start's own time).
const OUTAGE: Duration = Duration::from_secs(4);

fn host_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn serve(dir: &Path, url: &str, prefix: &str, i: usize) -> Child {
    let log = std::fs::File::create(dir.join(format!("serve-{i}.log"))).unwrap();
    Command::new(common::BATON)
        .args(["serve", "--config", "baton.toml", "--listen", "127.0.0.1:0"])
        .args(["--shutdown-grace", "1s"])
        .env("BATON_STORE", url)
        .env("BATON_PREFIX", prefix)
        .env("BATON_LOG", "info")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// slot → start times (host seconds), from the ledger.
fn ledger(dir: &Path) -> BTreeMap<DateTime<Utc>, Vec<f64>> {
    let mut m: BTreeMap<DateTime<Utc>, Vec<f64>> = BTreeMap::new();
    for l in read(&dir.join("ledger")).lines() {
        let (slot, at) = l.trim().split_once(' ').expect("slot and start");
        m.entry(slot.parse().expect("BATON_SLOT is RFC 3339"))
            .or_default()
            .push(at.parse().expect("date +%s.%N"));
    }
    m
}

fn secs(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

fn text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Run the scenario: `outage` makes the store unavailable and returns when
/// it is back.
fn scenario(dir: &Path, url: &str, prefix: &str, outage: impl FnOnce()) {
    std::fs::write(dir.join("baton.toml"), CONFIG).unwrap();
    let mut kids: Vec<Child> = (0..3).map(|i| serve(dir, url, prefix, i)).collect();
    let logs = || {
        (0..3)
            .map(|i| {
                let p = dir.join(format!("serve-{i}.log"));
                format!("---- serve-{i}.log\n{}", read(&p))
            })
            .collect::<String>()
    };
    wait_for(30, "three runs before the outage", || {
        ledger(dir).len() >= 3
    });
    // Go dark 400 ms after a slot: its run is done and recorded, the next
    // slot's advance is still ahead.
    let t = host_now();
    let wait = (t.floor() + 1.4 - t) % 1.0;
    std::thread::sleep(Duration::from_secs_f64(wait));
    let down_at = host_now();
    outage();
    let up_at = host_now();
    eprintln!("store down for {:.2} s", up_at - down_at);
    // Back: wait for the schedule to resume, then a few more slots.
    wait_for(30, "a run after the outage", || {
        ledger(dir)
            .values()
            .any(|at| at.iter().any(|a| *a > down_at))
    });
    std::thread::sleep(Duration::from_secs(5));
    for k in &kids {
        signal(k, libc::SIGTERM);
    }
    for k in &mut kids {
        let _ = k.wait();
    }
    let m = ledger(dir);
    let report = format!("ledger: {m:?}\n{}", logs());

    // No slot ran twice.
    for (slot, at) in &m {
        assert_eq!(at.len(), 1, "slot {slot} ran {} times\n{report}", at.len());
    }
    // The first run after the outage was the latest due slot (one slot of
    // tolerance) when it started.
    let (first_slot, first_at) = m
        .iter()
        .map(|(s, at)| (*s, at[0]))
        .find(|(_, at)| *at > down_at)
        .unwrap();
    let latest_due = first_at.floor();
    eprintln!(
        "first run after the outage: slot {} started {:.3} s after it, {:.3} s after the store was back",
        text(first_slot),
        first_at - secs(first_slot),
        first_at - up_at
    );
    assert!(
        secs(first_slot) >= latest_due - 1.0,
        "after the outage slot {} ran first, at {first_at:.3}, when the latest due slot was {latest_due}\n{report}",
        text(first_slot)
    );
    assert!(
        secs(first_slot) >= up_at.floor() - 1.0,
        "after the outage slot {} ran first; the store was back at {up_at:.3}\n{report}",
        text(first_slot)
    );
    // From then on, every slot ran (the last one or two may still be
    // pending when the instances stop). One exception: when the store came
    // back just before a slot, the catch-up run (the latest due slot) can
    // still be running at the next slot, which `overlap = skip` then
    // skips, with a record (checked below).
    let after: Vec<_> = m.keys().filter(|s| **s >= first_slot).copied().collect();
    assert!(after.len() >= 3, "too few runs after the outage\n{report}");
    let catch_up_overlapped = first_at >= secs(first_slot) + 0.5;
    let steady = if catch_up_overlapped && (after[1] - after[0]).num_seconds() == 2 {
        &after[1..]
    } else {
        &after[..]
    };
    for w in steady.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "gap after the outage between {} and {}\n{report}",
            text(w[0]),
            text(w[1])
        );
    }
    // Every slot that did not run, between the first run and the last, has
    // a record saying why.
    let out = Command::new(common::BATON)
        .args([
            "tasks", "list", "--job", "tick", "--limit", "1000", "--json",
        ])
        .env("BATON_STORE", url)
        .env("BATON_PREFIX", prefix)
        .env("BATON_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let tasks: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut why: BTreeMap<DateTime<Utc>, String> = BTreeMap::new();
    for t in &tasks {
        if t["state"] != "cancelled" {
            continue;
        }
        let slot: DateTime<Utc> = t["slot"].as_str().unwrap().parse().unwrap();
        let reason = t["last_error"].as_str().unwrap_or_default().to_string();
        assert!(!reason.is_empty(), "a cancelled slot without a reason: {t}");
        // "... N missed slot(s) (A to B)" covers A..=B.
        let range = reason
            .rsplit_once(" (")
            .and_then(|(_, r)| r.strip_suffix(')'))
            .and_then(|r| r.split_once(" to "))
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let (a, b): (DateTime<Utc>, DateTime<Utc>) = range.unwrap_or((slot, slot));
        let mut s = a;
        while s <= b {
            why.insert(s, reason.clone());
            s += chrono::Duration::seconds(1);
        }
    }
    let (first, last) = (*m.keys().next().unwrap(), *m.keys().last().unwrap());
    let mut s = first;
    let mut not_run = 0;
    while s <= last {
        if !m.contains_key(&s) {
            not_run += 1;
            assert!(
                why.contains_key(&s),
                "slot {} neither ran nor has a record saying why; tasks: {}\n{report}",
                text(s),
                serde_json::to_string(&tasks).unwrap()
            );
        } else {
            assert!(
                !why.contains_key(&s),
                "slot {} ran and is recorded skipped\n{report}",
                text(s)
            );
        }
        s += chrono::Duration::seconds(1);
    }
    assert!(
        not_run >= 2,
        "the outage cost no slot ({not_run}): was the store down?\n{report}"
    );
}

/// Redis: the private server is killed and restarted with its AOF on the
/// same port.
#[test]
fn redis_restart_latest_due_slot_runs() {
    let Some(mut srv) = support::Private::new(support::Kind::Redis) else {
        return;
    };
    srv.start();
    let dir = tempfile::tempdir().unwrap();
    let url = srv.url();
    scenario(dir.path(), &url, "o:", || {
        srv.stop();
        std::thread::sleep(OUTAGE);
        srv.start();
    });
}

/// PostgreSQL: the private server is stopped (`-m immediate`) and started.
#[test]
fn postgres_restart_latest_due_slot_runs() {
    let Some(mut srv) = support::Private::new(support::Kind::Postgres) else {
        return;
    };
    srv.start();
    let dir = tempfile::tempdir().unwrap();
    let url = srv.url();
    scenario(dir.path(), &url, "o_", || {
        srv.stop();
        std::thread::sleep(OUTAGE);
        srv.start();
    });
}

/// SQLite: another connection holds `BEGIN EXCLUSIVE` on the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_latest_due_slot_runs() {
    use sqlx::{ConnectOptions, Connection};
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let url = e.ts.url.clone();
    let prefix = e.ts.prefix.clone();
    let rt = tokio::runtime::Handle::current();
    let dir = e.dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        scenario(&dir, &url, &prefix, || {
            rt.block_on(async {
                let opts: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
                let mut c = opts
                    .busy_timeout(Duration::from_secs(10))
                    .connect()
                    .await
                    .unwrap();
                sqlx::query("BEGIN EXCLUSIVE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                tokio::time::sleep(OUTAGE).await;
                sqlx::query("COMMIT").execute(&mut c).await.unwrap();
                c.close().await.unwrap();
            })
        })
    })
    .await
    .unwrap();
}
