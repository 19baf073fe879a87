//! Issue #9's "Checked by", as one recorded run per store (30 s; run on
//! demand, it is `#[ignore]`d):
//!
//! ```sh
//! cargo test -p baton-cli --test cli -- cli_checked_by:: --ignored --test-threads=1
//! ```
//!
//! Three `baton serve` run a 1-second durable job (`misfire = "all"`) and a
//! 1-second lock-mode job (`at_least` unset) for 30 s: every slot of each
//! runs once, no gaps, no skipped slot, slot → start p99 under 100 ms.
//! `baton jobs` lists the lock-mode job with its last slot. Then every
//! instance is down for 5 s: each durable slot missed meanwhile runs once
//! when two come back.

use crate::common;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{read, signal, stderr, stdout, Env};

macro_rules! on_demand {
    ($($store:ident => $kind:ident),*) => {
        $(mod $store {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "30 s per store; run on demand with --ignored"]
            async fn checked_by_30s() {
                if let Some(e) = crate::common::Env::new(crate::common::Kind::$kind).await {
                    super::checked_by_30s(e).await
                }
            }
        })*
    };
}

on_demand!(sqlite => Sqlite, postgres => Postgres, redis => Redis, mysql => Mysql);

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 4
lease = "3s"

[[job]]
name = "tick"
every = "1s"
misfire = "all"
command = ["sh", "-c", "echo \"$BATON_SLOT $(date +%s.%N)\" >> durable"]

[[job]]
name = "daemon"
every = "1s"
mode = "lock"
at_most = "10s"
command = ["sh", "-c", "echo \"$BATON_SLOT $(date +%s.%N)\" >> locked"]
"#;

const RUN: Duration = Duration::from_secs(30);
const P99_BOUND_MS: f64 = 100.0;

fn serve(e: &Env, i: usize) -> Child {
    let log = std::fs::File::create(e.path(&format!("serve-{i}.log"))).unwrap();
    e.cmd(&["serve", "--config", "baton.toml", "--listen", "127.0.0.1:0"])
        .args(["--shutdown-grace", "1s"])
        .env("BATON_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn stop(kids: &mut Vec<Child>) {
    for k in kids.iter() {
        signal(k, libc::SIGTERM);
    }
    for mut k in kids.drain(..) {
        let st = k.wait().unwrap();
        assert!(
            st.success() || st.code() == Some(143) || st.code().is_none(),
            "serve exits cleanly: {st:?}"
        );
    }
}

/// slot → start times (host seconds; the store is on this host).
fn ledger(e: &Env, name: &str) -> BTreeMap<DateTime<Utc>, Vec<f64>> {
    let mut m: BTreeMap<DateTime<Utc>, Vec<f64>> = BTreeMap::new();
    for l in read(&e.path(name)).lines() {
        let (slot, at) = l.trim().split_once(' ').expect("slot and start");
        m.entry(slot.parse().expect("RFC 3339"))
            .or_default()
            .push(at.parse().expect("date +%s.%N"));
    }
    m
}

/// Every slot once, no gaps, never early; returns (slots, p50 ms, p99 ms).
fn check(name: &str, m: &BTreeMap<DateTime<Utc>, Vec<f64>>) -> (usize, f64, f64) {
    let slots: Vec<_> = m.keys().copied().collect();
    for w in slots.windows(2) {
        assert_eq!((w[1] - w[0]).num_seconds(), 1, "{name}: gap after {}", w[0]);
    }
    let mut late = Vec::new();
    for (slot, at) in m {
        assert_eq!(at.len(), 1, "{name}: slot {slot} ran {} times", at.len());
        let d = at[0] - slot.timestamp_micros() as f64 / 1e6;
        assert!(
            d > -0.005,
            "{name}: slot {slot} started {:.1} ms early",
            -d * 1e3
        );
        late.push(d * 1e3);
    }
    late.sort_by(f64::total_cmp);
    let pct = |p: f64| late[((late.len() as f64 * p).ceil() as usize).clamp(1, late.len()) - 1];
    (late.len(), pct(0.5), pct(0.99))
}

fn cancelled(e: &Env, job: &str) -> Vec<serde_json::Value> {
    let out = e.run(&[
        "tasks",
        "list",
        "--job",
        job,
        "--state",
        "cancelled",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str::<Vec<serde_json::Value>>(&stdout(&out)).unwrap()
}

async fn checked_by_30s(e: Env) {
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    let mut kids: Vec<Child> = (0..3).map(|i| serve(&e, i)).collect();
    std::thread::sleep(RUN);
    // `baton jobs` lists the lock-mode job with its last slot.
    let out = e.run(&["jobs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let jobs: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let daemon = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "daemon")
        .unwrap_or_else(|| panic!("the lock-mode job is listed: {jobs}"));
    assert!(daemon["last_slot"].is_string(), "{daemon}");
    stop(&mut kids);

    let (d, l) = (ledger(&e, "durable"), ledger(&e, "locked"));
    let (dn, d50, d99) = check("durable", &d);
    let (ln, l50, l99) = check("lock", &l);
    let store = format!("{:?}", e.ts.kind);
    eprintln!(
        "{store}: durable {dn} slots, slot -> start p50 {d50:.1} ms, p99 {d99:.1} ms; lock {ln} slots, p50 {l50:.1} ms, p99 {l99:.1} ms"
    );
    assert!(
        dn >= 27 && ln >= 27,
        "too few slots: {dn} durable, {ln} lock"
    );
    assert!(d99 < P99_BOUND_MS, "durable p99 {d99:.1} ms");
    assert!(l99 < P99_BOUND_MS, "lock p99 {l99:.1} ms");
    for job in ["tick", "daemon"] {
        let c = cancelled(&e, job);
        assert!(c.is_empty(), "{job}: skipped slots: {c:?}");
    }

    // All down for 5 s, then two back: every durable slot missed runs once.
    let last_before = *d.keys().last().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let back = Utc::now();
    let mut kids: Vec<Child> = (3..5).map(|i| serve(&e, i)).collect();
    std::thread::sleep(Duration::from_secs(5));
    stop(&mut kids);
    let d = ledger(&e, "durable");
    assert!(d.values().all(|v| v.len() == 1), "a slot ran twice: {d:?}");
    let mut t = last_before;
    let mut missed = 0;
    while t + chrono::Duration::seconds(2) <= back {
        t += chrono::Duration::seconds(1);
        assert!(d.contains_key(&t), "missed slot {t} did not run: {d:?}");
        missed += 1;
    }
    eprintln!("{store}: all down 5 s: {missed} missed slots, each ran once");
    assert!(missed >= 4, "{missed} missed slots");
}
