//! `baton serve`, `baton trigger` and `baton jobs`, as processes: several
//! instances on one store run each slot once, with no gaps, through kills
//! and skewed clocks.

use crate::common;
use baton_testkit::certs;

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, Env};

per_backend! {
    five_instances_run_each_slot_once,
    all_instances_down_then_catch_up_all,
    instances_killed_at_random_still_once_per_slot,
    lock_mode_job_runs_once_per_slot_with_at_least,
    trigger_twice_runs_once,
    admin_endpoints_and_prometheus_metrics,
    lock_mode_without_at_least_once_per_slot_never_early,
    misfire_all_with_default_overlap_runs_every_missed_slot,
    lock_mode_job_is_listed_and_pausable,
    trigger_slots_are_the_schedules,
    trigger_answers_say_what_became_of_the_slot,
    backfill_runs_each_past_slot_once_and_leaves_those_that_ran,
}

const TICK: &str = r#"
[[queue]]
name = "default"
concurrency = 4
lease = "3s"

[[job]]
name = "tick"
every = "1s"
overlap = "allow"
misfire = "all"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;

pub(crate) fn serve(e: &Env, config: &str, extra_env: &[(&str, &str)]) -> Child {
    // Written whole and renamed into place: an instance starting while the
    // next one is spawned must never read a half-written (empty) file.
    let tmp = e.path(&format!("baton.toml.{}", fastrand::u64(..)));
    std::fs::write(&tmp, config).unwrap();
    std::fs::rename(&tmp, e.path("baton.toml")).unwrap();
    let mut c = e.cmd(&[
        "serve",
        "--config",
        "baton.toml",
        "--listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        "1s",
    ]);
    let n = std::fs::read_dir(e.dir.path())
        .map(|d| d.count())
        .unwrap_or(0);
    let log = std::fs::File::create(e.path(&format!("serve-{n}.log"))).unwrap();
    c.env("BATON_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

pub(crate) fn stop(mut kids: Vec<Child>) {
    for k in &kids {
        signal(k, libc::SIGTERM);
    }
    for k in &mut kids {
        let st = k.wait().unwrap();
        assert!(
            // 143: shut down by the SIGTERM; 0: had already ended.
            st.success() || st.code() == Some(143) || st.code().is_none(),
            "serve exits cleanly: {st:?}"
        );
    }
}

/// slot → runs, from the ledger.
fn ledger(e: &Env) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for l in read(&e.path("ledger")).lines() {
        *m.entry(l.trim().to_string()).or_default() += 1;
    }
    m
}

fn assert_once_no_gaps(m: &BTreeMap<String, usize>, min: usize) {
    assert!(m.len() >= min, "only {} slots ran: {m:?}", m.len());
    let slots: Vec<chrono::DateTime<chrono::Utc>> = m
        .keys()
        .map(|s| s.parse().expect("BATON_SLOT is RFC 3339"))
        .collect();
    for (s, n) in m {
        assert_eq!(*n, 1, "slot {s} ran {n} times");
    }
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "gap between {} and {}",
            w[0],
            w[1]
        );
    }
}

async fn five_instances_run_each_slot_once(e: Env) {
    let kids: Vec<_> = (0..5).map(|_| serve(&e, TICK, &[])).collect();
    std::thread::sleep(Duration::from_secs(30));
    stop(kids);
    std::thread::sleep(Duration::from_millis(300));
    let m = ledger(&e);
    assert_once_no_gaps(&m, 25);
    // `baton jobs` shows the job, its last slot and its last run.
    let out = e.run(&["jobs", "--json", "--config", "baton.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["name"], "tick");
    assert!(v[0]["next_fire"].is_string());
    assert!(v[0]["last_run"]["state"].is_string());
}

async fn instances_killed_at_random_still_once_per_slot(e: Env) {
    let mut kids: Vec<_> = (0..4).map(|_| serve(&e, TICK, &[])).collect();
    let t0 = Instant::now();
    let mut rng = fastrand::Rng::with_seed(7);
    while t0.elapsed() < Duration::from_secs(9) {
        std::thread::sleep(Duration::from_millis(700 + rng.u64(0..800)));
        let i = rng.usize(0..kids.len());
        signal(&kids[i], libc::SIGKILL);
        kids[i].wait().unwrap();
        kids[i] = serve(&e, TICK, &[]);
    }
    stop(kids);
    // A survivor runs on; the job is paused cluster-wide so it drains what
    // is queued, and killed workers' tasks are rescued after their 3 s
    // lease (at the survivor's first rescue, a few seconds after it
    // starts): wait until no run is left unfinished.
    let survivor = vec![serve(&e, TICK, &[])];
    std::thread::sleep(Duration::from_secs(2));
    let out = e.run(&["jobs", "pause", "tick"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let unfinished = || -> usize {
        ["running", "pending"]
            .iter()
            .map(|st| {
                let out = e.run(&[
                    "tasks", "list", "--job", "tick", "--state", st, "--limit", "1000", "--json",
                ]);
                serde_json::from_str::<serde_json::Value>(&stdout(&out))
                    .ok()
                    .and_then(|v| v.as_array().map(Vec::len))
                    .unwrap_or(usize::MAX)
            })
            .sum()
    };
    common::wait_for(30, "the survivor to finish every unfinished run", || {
        unfinished() == 0
    });
    stop(survivor);
    let m = ledger(&e);
    // A killed worker's command may have written its line and died before
    // recording success: then the rescue runs that slot again (at least
    // once). Every slot must be there, none twice from the scheduler.
    let tasks = e.run(&[
        "tasks", "list", "--job", "tick", "--limit", "1000", "--json",
    ]);
    let list: serde_json::Value = serde_json::from_str(&stdout(&tasks)).unwrap();
    let mut per_slot: BTreeMap<String, usize> = BTreeMap::new();
    for t in list.as_array().unwrap() {
        *per_slot
            .entry(t["slot"].as_str().unwrap().to_string())
            .or_default() += 1;
        assert_eq!(t["state"], "succeeded", "every slot's task finished: {t}");
    }
    assert!(
        per_slot.values().all(|n| *n == 1),
        "one task per slot: {per_slot:?}"
    );
    let slots: Vec<chrono::DateTime<chrono::Utc>> =
        per_slot.keys().map(|s| s.parse().unwrap()).collect();
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            1,
            "no gap: {} .. {}",
            w[0],
            w[1]
        );
    }
    assert!(slots.len() >= 10);
    assert_eq!(m.len(), slots.len(), "every slot's command ran");
}

/// `at_least` equal to the interval (the seed's `every = 30s`, `at_least =
/// PT30S`, scaled down): it counts from the slot, so the lock is free
/// exactly when the next slot is due and no slot is skipped as "lock held".
async fn lock_mode_job_runs_once_per_slot_with_at_least(e: Env) {
    let cfg = r#"
[[job]]
name = "daemon-runner"
every = "1s"
mode = "lock"
at_most = "PT15M"
at_least = "PT1S"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger; echo $BATON_FENCING_TOKEN >> tokens"]
"#;
    let kids: Vec<_> = (0..3).map(|_| serve(&e, cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(6));
    stop(kids);
    let m = ledger(&e);
    assert_once_no_gaps(&m, 4);
    // No slot was recorded as skipped for the lock (its own lease).
    let out = e.run(&["tasks", "list", "--job", "daemon-runner", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let skipped: Vec<_> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "cancelled")
        .collect();
    assert!(skipped.is_empty(), "slots skipped: {skipped:?}");
    let tokens: Vec<u64> = read(&e.path("tokens"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens rise: {tokens:?}"
    );
    // The lock is held for at_least after the last run.
    let out = e.run(&["locks", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["name"], "daemon-runner");
}

const BATCH: &str = r#"
[[queue]]
name = "default"
concurrency = 2
lease = "3s"
[[job]]
name = "batch"
cron = "0 */6 * * *"
tz = "Asia/Seoul"
max_attempts = 3
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;

async fn trigger_twice_runs_once(e: Env) {
    std::fs::write(e.path("baton.toml"), BATCH).unwrap();
    // 18:00 KST and 12:00 KST: slots of "0 */6 * * *" in Asia/Seoul.
    let slot = "2026-01-01T09:00:00Z";
    let a = e.run(&["trigger", "batch", "--config", "baton.toml", "--slot", slot]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let b = e.run(&[
        "trigger",
        "batch",
        "--config",
        "baton.toml",
        "--slot",
        "2026-01-01T18:00:00+09:00",
    ]);
    assert_eq!(
        stdout(&a),
        stdout(&b),
        "the same (job, slot) gives the same run"
    );
    let c = e.run(&[
        "trigger",
        "batch",
        "--config",
        "baton.toml",
        "--slot",
        "2026-01-01T03:00:00Z",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&c)).unwrap();
    assert_eq!(v["inserted"], true, "{}", stderr(&c));
    let kids = vec![serve(&e, BATCH, &[])];
    common::wait_for(20, "both triggered runs", || ledger(&e).len() == 2);
    // Triggering again after the run finished still does not run it twice
    // (now without --config: the store knows the job).
    let d = e.run(&["trigger", "batch", "--any-slot", "--slot", slot]);
    assert_eq!(stdout(&d), stdout(&a), "{}", stderr(&d));
    std::thread::sleep(Duration::from_millis(1_500));
    stop(kids);
    let m = ledger(&e);
    // BATON_SLOT in the one form of every time baton writes.
    assert_eq!(m.get("2026-01-01T09:00:00.000Z"), Some(&1), "{m:?}");
    assert_eq!(m.get("2026-01-01T03:00:00.000Z"), Some(&1), "{m:?}");
    assert_eq!(m.len(), 2);
    // Without --slot or --config: a usage error.
    let out = e.run(&["trigger", "batch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--slot"));
}

/// `--slot` is normalised to the schedule's precision and must be a slot
/// of the job (unless --any-slot); unknown jobs are refused with or
/// without --config; `enqueue --key` refuses the scheduler's key form.
async fn trigger_slots_are_the_schedules(e: Env) {
    std::fs::write(e.path("baton.toml"), BATCH).unwrap();
    let trig = |extra: &[&str]| {
        let mut args = vec!["trigger", "batch", "--config", "baton.toml", "--json"];
        args.extend_from_slice(extra);
        e.run(&args)
    };
    let a = trig(&["--slot", "2026-01-01T09:00:00Z"]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    // One microsecond off: the same slot, the same task.
    let b = trig(&["--slot", "2026-01-01T09:00:00.000001Z"]);
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    let (va, vb): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&stdout(&a)).unwrap(),
        serde_json::from_str(&stdout(&b)).unwrap(),
    );
    assert_eq!(va["id"], vb["id"], "a slot 1 µs off is the same slot");
    assert_eq!(vb["inserted"], false);
    assert_eq!(vb["slot"], "2026-01-01T09:00:00.000Z");
    // Not a slot of the job: refused, naming the field and the next slot.
    let c = trig(&["--slot", "2026-01-01T10:00:00Z"]);
    assert_eq!(c.status.code(), Some(2), "{}", stdout(&c));
    assert!(
        stderr(&c).contains("--slot") && stderr(&c).contains("--any-slot"),
        "{}",
        stderr(&c)
    );
    // ...unless --any-slot.
    let d = trig(&["--slot", "2026-01-01T10:00:00Z", "--any-slot"]);
    assert_eq!(d.status.code(), Some(0), "{}", stderr(&d));
    // An unknown job: refused with --config ...
    let u = e.run(&[
        "trigger",
        "nope",
        "--config",
        "baton.toml",
        "--slot",
        "2026-01-01T09:00:00Z",
    ]);
    assert_eq!(u.status.code(), Some(2), "{}", stdout(&u));
    // ... and without (the store has never seen it).
    let u = e.run(&[
        "trigger",
        "nope",
        "--any-slot",
        "--slot",
        "2026-01-01T09:00:00Z",
    ]);
    assert_eq!(u.status.code(), Some(2), "{}", stdout(&u));
    assert!(stderr(&u).contains("not a job"), "{}", stderr(&u));
    // The scheduler's key form is reserved.
    let k = e.run(&[
        "enqueue",
        "--key",
        "batch|2026-01-01T15:00:00Z",
        "--",
        "true",
    ]);
    assert_eq!(k.status.code(), Some(2), "{}", stdout(&k));
    assert!(stderr(&k).contains("reserved"), "{}", stderr(&k));
    let tasks = e.run(&["tasks", "list", "--job", "batch", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&tasks)).unwrap();
    assert_eq!(v.as_array().map(|a| a.len()), Some(2), "{v}");
}

/// Lock mode with `at_least` unset: three instances, a 1-second job; every
/// slot runs at most once and never before its slot (by the host clock,
/// which is also the loopback store's).
async fn lock_mode_without_at_least_once_per_slot_never_early(e: Env) {
    let cfg = r#"
[[job]]
name = "daemon"
every = "1s"
mode = "lock"
at_most = "10s"
command = ["sh", "-c", "echo $BATON_SLOT $(date +%s.%N) >> runs"]
"#;
    let kids: Vec<_> = (0..3).map(|_| serve(&e, cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(10));
    stop(kids);
    let mut per_slot: BTreeMap<String, usize> = BTreeMap::new();
    for l in read(&e.path("runs")).lines() {
        let (slot, started) = l.split_once(' ').expect("slot and start time");
        let t: chrono::DateTime<chrono::Utc> = slot.parse().expect("RFC 3339");
        let started: f64 = started.trim().parse().expect("seconds");
        let slot_s = t.timestamp() as f64 + f64::from(t.timestamp_subsec_nanos()) / 1e9;
        assert!(started >= slot_s, "slot {slot} started early, at {started}");
        *per_slot.entry(slot.to_string()).or_default() += 1;
    }
    assert!(per_slot.len() >= 6, "too few runs: {per_slot:?}");
    assert!(
        per_slot.values().all(|n| *n == 1),
        "a slot ran twice: {per_slot:?}"
    );
}

/// `misfire = "all"` with the default overlap ("skip"): after every
/// instance was down for ~5 s, each missed slot runs once.
async fn misfire_all_with_default_overlap_runs_every_missed_slot(e: Env) {
    let cfg = r#"
[[queue]]
name = "default"
concurrency = 4
lease = "3s"

[[job]]
name = "tick"
every = "1s"
misfire = "all"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;
    let kids: Vec<_> = (0..3).map(|_| serve(&e, cfg, &[])).collect();
    common::wait_for(20, "two runs", || ledger(&e).len() >= 2);
    // Stop right after a run, so no slot's task is left pending.
    let n = ledger(&e).len();
    common::wait_for(10, "the next run", || ledger(&e).len() > n);
    stop(kids);
    let last_before: chrono::DateTime<chrono::Utc> =
        ledger(&e).keys().last().unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let back = chrono::Utc::now();
    let kids: Vec<_> = (0..2).map(|_| serve(&e, cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(4));
    stop(kids);
    let m = ledger(&e);
    assert!(m.values().all(|n| *n == 1), "a slot ran twice: {m:?}");
    // Every slot missed while all were down (those due a second before the
    // restart; the one due as they start is a regular slot that overlap =
    // forbid may skip while the catch-up runs) ran exactly once.
    let mut t = last_before;
    let mut missed = 0;
    while t + chrono::Duration::seconds(2) <= back {
        t += chrono::Duration::seconds(1);
        let key = t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        assert_eq!(m.get(&key), Some(&1), "missed slot {key}: {m:?}");
        missed += 1;
    }
    assert!(missed >= 4, "{missed} missed slots: {m:?}");
    // None of them was recorded as skipped.
    let out = e.run(&[
        "tasks",
        "list",
        "--job",
        "tick",
        "--state",
        "cancelled",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for c in v.as_array().unwrap() {
        let slot: chrono::DateTime<chrono::Utc> = c["slot"].as_str().unwrap().parse().unwrap();
        assert!(slot > t, "missed slot {slot} recorded skipped: {c}");
    }
}

/// A lock-mode job is listed by `baton jobs` without --config, with its
/// last slot and last run, and `baton jobs pause` stops it everywhere.
async fn lock_mode_job_is_listed_and_pausable(e: Env) {
    let cfg = r#"
[[job]]
name = "daemon"
every = "1s"
mode = "lock"
at_most = "10s"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;
    let kids: Vec<_> = (0..2).map(|_| serve(&e, cfg, &[])).collect();
    common::wait_for(20, "three runs", || ledger(&e).len() >= 3);
    let out = e.run(&["jobs", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["name"], "daemon", "{v}");
    assert!(v[0]["last_slot"].is_string(), "{v}");
    assert!(v[0]["last_run"]["slot"].is_string(), "{v}");
    assert!(v[0]["last_run"]["state"].is_string(), "{v}");
    // Next fire (with --config) is shown.
    let out = e.run(&["jobs", "--json", "--config", "baton.toml"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(v[0]["next_fire"].is_string(), "{v}");
    let p = e.run(&["jobs", "pause", "daemon"]);
    assert_eq!(p.status.code(), Some(0), "{}", stderr(&p));
    // Let a run in flight finish, then nothing more runs while paused.
    std::thread::sleep(Duration::from_millis(1_500));
    let n = ledger(&e).len();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ledger(&e).len(), n, "no run while paused");
    let r = e.run(&["jobs", "resume", "daemon"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    common::wait_for(10, "a run after resume", || ledger(&e).len() > n);
    stop(kids);
    let out = e.run(&[
        "tasks",
        "list",
        "--job",
        "daemon",
        "--state",
        "succeeded",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(v.as_array().is_some_and(|a| a.len() >= 3), "{v}");
}

async fn all_instances_down_then_catch_up_all(e: Env) {
    let kids: Vec<_> = (0..3).map(|_| serve(&e, TICK, &[])).collect();
    std::thread::sleep(Duration::from_secs(3));
    stop(kids);
    let before = ledger(&e).len();
    // Every instance is down for 4 s; then two come back with misfire = "all".
    std::thread::sleep(Duration::from_secs(4));
    let kids: Vec<_> = (0..2).map(|_| serve(&e, TICK, &[])).collect();
    std::thread::sleep(Duration::from_secs(3));
    stop(kids);
    let m = ledger(&e);
    assert!(m.len() >= before + 6, "the missed slots ran too: {m:?}");
    assert_once_no_gaps(&m, 8);
}

/// A durable job whose action is an HTTP request: each slot is one POST
/// carrying the job and slot in headers; a 2xx answer is success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_job_posts_once_per_slot() {
    use std::io::{BufRead, BufReader, Write};
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut r = BufReader::new(stream);
            let mut slot = String::new();
            let mut token = String::from("-");
            let mut first = String::new();
            r.read_line(&mut first).unwrap_or(0);
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) <= 2 {
                    break;
                }
                if let Some(v) = h.strip_prefix("Baton-Slot: ") {
                    slot = v.trim().to_string();
                }
                if let Some(v) = h.strip_prefix("Baton-Fencing-Token: ") {
                    token = v.trim().to_string();
                }
            }
            s2.lock()
                .unwrap()
                .push(format!("{} {token} {slot}", first.trim()));
            let _ = r
                .get_mut()
                .write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let cfg = format!(
        r#"
[[job]]
name = "hook"
every = "1s"
overlap = "allow"
http = {{ method = "POST", url = "http://127.0.0.1:{port}/run", headers = {{ Authorization = "Bearer x" }}, body = "{{}}" }}
"#
    );
    let kids: Vec<_> = (0..2).map(|_| serve(&e, &cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(4));
    stop(kids);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 3, "{seen:?}");
    let mut slots: Vec<&str> = seen.iter().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert!(
        seen.iter().all(|l| l.starts_with("POST /run HTTP/1.1")),
        "{seen:?}"
    );
    // Each request carries its claim's fencing token.
    assert!(
        seen.iter().all(|l| l
            .split(' ')
            .nth(3)
            .and_then(|t| t.parse::<u64>().ok())
            .is_some_and(|t| t > 0)),
        "a Baton-Fencing-Token on every request: {seen:?}"
    );
    let n = slots.len();
    slots.sort();
    slots.dedup();
    assert_eq!(n, slots.len(), "each slot posted once: {seen:?}");
    let out = e.run(&["tasks", "stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let default = v
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "default");
    assert_eq!(default.unwrap()["failed"], 0, "{v}");
}

/// GET `path` from the admin listener of a `serve` started in `e`;
/// returns (status, content type, body).
fn admin_get(e: &Env, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let addr = loop {
        let found = std::fs::read_dir(e.dir.path())
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().starts_with("serve-"))
            .find_map(|f| {
                let log = std::fs::read_to_string(f.path()).unwrap_or_default();
                log.lines()
                    .find_map(|l| l.split("admin on http://").nth(1))
                    .map(|a| a.trim().to_string())
            });
        if let Some(a) = found {
            break a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no admin address logged"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    // HTTP/1.1 keeps the connection open unless the client says otherwise;
    // OpenMetrics is asked for as Prometheus does.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(": ")?;
            name.eq_ignore_ascii_case("content-type").then_some(value)
        })
        .unwrap_or_default()
        .to_string();
    (status, ctype, body.to_string())
}

/// `serve --listen`: /health, /jobs, /stats as JSON and /metrics in
/// Prometheus' text format, all read from the store.
async fn admin_endpoints_and_prometheus_metrics(e: Env) {
    let out = e.run(&["lock", "metrics-lock", "--at-least", "30s", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let kid = serve(&e, TICK, &[]);
    // Wait for a succeeded slot.
    let t0 = Instant::now();
    while ledger(&e).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(15), "no slot ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));

    let (code, ctype, body) = admin_get(&e, "/health");
    assert_eq!((code, ctype.as_str()), (200, "application/json"), "{body}");
    let (code, _, body) = admin_get(&e, "/jobs");
    assert_eq!(code, 200);
    let jobs: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jobs[0]["name"], "tick", "{body}");
    let (code, _, body) = admin_get(&e, "/stats");
    assert_eq!(code, 200);
    assert!(body.contains("\"queue\":\"default\""), "{body}");
    let (code, _, _) = admin_get(&e, "/nope");
    assert_eq!(code, 404);

    let out = e.run(&["queues", "pause", "held"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, ctype, m) = admin_get(&e, "/metrics?debug=1");
    stop(vec![kid]);
    assert_eq!(code, 200, "{m}");
    assert!(
        ctype.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ctype}"
    );
    assert_parses_as_openmetrics(&m);
    let value = |series: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {series} in:\n{m}"))
            .parse()
            .unwrap()
    };
    assert!(m.contains("# TYPE baton_tasks gauge"), "{m}");
    assert!(value(r#"baton_tasks{queue="default",state="succeeded"}"#) >= 1.0);
    assert_eq!(value(r#"baton_tasks{queue="default",state="failed"}"#), 0.0);
    assert_eq!(value(r#"baton_job_paused{job="tick"}"#), 0.0);
    assert_eq!(value(r#"baton_queue_paused{queue="held"}"#), 1.0);
    assert_eq!(value(r#"baton_queue_paused{queue="default"}"#), 0.0);
    let slot = value(r#"baton_job_last_slot_timestamp_seconds{job="tick"}"#);
    let now = value("baton_store_time_seconds");
    assert!(slot > now - 30.0 && slot <= now, "slot {slot}, now {now}");
    assert_eq!(value(r#"baton_lock_held{name="metrics-lock"}"#), 1.0);
    assert!(value(r#"baton_lock_fencing_token{name="metrics-lock"}"#) >= 1.0);
    // This process's own workers ran the slots it scraped above.
    assert!(m.contains("# TYPE baton_worker_attempts counter"), "{m}");
    assert!(value(r#"baton_worker_attempts_total{queue="default",outcome="succeeded"}"#) >= 1.0);
    assert_eq!(
        value(r#"baton_worker_attempts_total{queue="default",outcome="lost"}"#),
        0.0
    );
    assert!(value(r#"baton_worker_busy_seconds_total{queue="default"}"#) > 0.0);
    value(r#"baton_worker_running{queue="default"}"#);
    // Histograms with counts: every ended attempt's duration, the claims,
    // and the slot lag of the scheduled runs (all of them here).
    let runs = value(r#"baton_worker_run_duration_seconds_count{queue="default"}"#);
    assert!(runs >= 1.0, "{m}");
    assert_eq!(
        value(r#"baton_worker_run_duration_seconds_bucket{le="+Inf",queue="default"}"#),
        runs
    );
    assert!(value(r#"baton_worker_claim_duration_seconds_count{queue="default"}"#) >= 1.0);
    assert!(value(r#"baton_worker_slot_lag_seconds_count{queue="default"}"#) >= 1.0);
    assert!(value(r#"baton_worker_slot_lag_seconds_sum{queue="default"}"#) >= 0.0);
    assert_eq!(
        value(r#"baton_worker_lease_losses_total{queue="default"}"#),
        0.0
    );
    assert_eq!(value("baton_worker_heartbeat_failures_total"), 0.0);
    assert_eq!(
        value(r#"baton_worker_store_errors_total{operation="task_claim"}"#),
        0.0
    );
}

/// Every line of `m` is a `# HELP`/`# TYPE`/`# UNIT` comment or a sample
/// `name{label="value",…} number`, each sample belongs to the family of
/// the `# TYPE` line before it, and the text ends with `# EOF`.
fn assert_parses_as_openmetrics(m: &str) {
    let mut family = String::new();
    let mut lines = m.lines().peekable();
    while let Some(l) = lines.next() {
        if l == "# EOF" {
            assert!(lines.peek().is_none(), "text after # EOF:\n{m}");
            return;
        }
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(["gauge", "counter", "histogram"].contains(&kind), "{l}");
            family = name.to_string();
            continue;
        }
        if l.starts_with("# HELP ") || l.starts_with("# UNIT ") {
            continue;
        }
        let (series, value) = l
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {l}"));
        value
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("not a number in {l:?}"));
        let name = series.split('{').next().unwrap_or_default();
        assert!(
            !family.is_empty() && name.starts_with(family.as_str()),
            "sample {l:?} outside its family {family:?}"
        );
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{l}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{l}");
                for pair in labels[1..labels.len() - 1].split("\",") {
                    let (k, v) = pair
                        .split_once("=\"")
                        .unwrap_or_else(|| panic!("bad label in {l}"));
                    assert!(!k.is_empty(), "{l}");
                    let _ = v;
                }
            }
        }
    }
    panic!("no # EOF at the end:\n{m}");
}

/// An `https://` job action verifies the server: trusted through
/// `SSL_CERT_FILE` it succeeds; with only another CA trusted, the attempt
/// fails and says why. The server is `openssl s_server -www`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_job_verifies_the_server() {
    use std::process::{Command, Stdio};
    if !common::have(
        "openssl",
        Command::new("openssl").arg("version").output().is_ok(),
    ) {
        return;
    }
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    let tls = e.path("tls");
    std::fs::create_dir_all(&tls).unwrap();
    certs::make(&tls);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept", &port.to_string()])
        .arg("-cert")
        .arg(tls.join("server.pem"))
        .arg("-key")
        .arg(tls.join("server.key"))
        .stdin(Stdio::piped()) // s_server stops when its stdin closes
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "s_server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each phase on a queue of its own: the second instance must not claim
    // a slot the first enqueued ahead (its lead) before it stopped — it has
    // no handler for the first job.
    let job = |name: &str| {
        format!(
            r#"
[[queue]]
name = "{name}"

[[job]]
name = "{name}"
queue = "{name}"
every = "1s"
overlap = "allow"
max_attempts = 1
http = {{ method = "GET", url = "https://localhost:{port}/" }}
"#
        )
    };
    let ca = tls.join("ca.pem").display().to_string();
    let kid = serve(&e, &job("trusted"), &[("SSL_CERT_FILE", ca.as_str())]);
    std::thread::sleep(Duration::from_secs(3));
    stop(vec![kid]);
    let other = tls.join("other-ca.pem").display().to_string();
    let kid = serve(&e, &job("untrusted"), &[("SSL_CERT_FILE", other.as_str())]);
    std::thread::sleep(Duration::from_secs(3));
    stop(vec![kid]);
    let _ = server.kill();
    let _ = server.wait();

    let list = |job: &str, state: &str| -> Vec<serde_json::Value> {
        let out = e.run(&["tasks", "list", "--job", job, "--state", state, "--json"]);
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    assert!(
        !list("trusted", "succeeded").is_empty(),
        "no https call succeeded"
    );
    assert!(
        list("trusted", "failed").is_empty(),
        "{:?}",
        list("trusted", "failed")
    );
    assert!(
        list("untrusted", "succeeded").is_empty(),
        "an untrusted server was accepted"
    );
    let failed = list("untrusted", "failed");
    assert!(!failed.is_empty(), "the untrusted calls did not fail");
    let err = failed[0]["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        err.contains("certificate"),
        "the failure should say why: {err}"
    );
}

/// All instances down for 10 minutes, then back with `misfire = "all"`:
/// every missed slot runs once. On SQLite the store's clock is the host's,
/// so the instances that come back run with libfaketime 10 minutes ahead —
/// to the scheduler that is exactly 10 minutes of downtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ten_minutes_down_then_catch_up_all() {
    const LIBFAKETIME: &str = common::LIBFAKETIME;
    if !common::have("faketime", std::path::Path::new(LIBFAKETIME).exists()) {
        return;
    }
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    let cfg = r#"
[[queue]]
name = "default"
concurrency = 8
lease = "5s"
[[job]]
name = "ten"
every = "10s"
overlap = "allow"
misfire = "all"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;
    // Up long enough to register the job (its cursor starts at "now").
    let kids: Vec<_> = (0..2).map(|_| serve(&e, cfg, &[])).collect();
    std::thread::sleep(Duration::from_secs(2));
    stop(kids);
    let first = ledger(&e).len();
    let shifted = [
        ("LD_PRELOAD", LIBFAKETIME),
        ("FAKETIME", "+10m"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let kids: Vec<_> = (0..3).map(|_| serve(&e, cfg, &shifted)).collect();
    common::wait_for(60, "the missed slots", || ledger(&e).len() >= first + 60);
    std::thread::sleep(Duration::from_secs(2));
    stop(kids);
    let m = ledger(&e);
    assert!(m.values().all(|n| *n == 1), "each missed slot once: {m:?}");
    let slots: Vec<chrono::DateTime<chrono::Utc>> = m.keys().map(|s| s.parse().unwrap()).collect();
    for w in slots.windows(2) {
        assert_eq!(
            (w[1] - w[0]).num_seconds(),
            10,
            "no gap: {} .. {}",
            w[0],
            w[1]
        );
    }
    assert!(
        (60..=63).contains(&slots.len()),
        "10 minutes of 10 s slots: {}",
        slots.len()
    );
}

/// Workers apart from schedulers: `baton work --config` runs a job's
/// triggered run without any `baton serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_with_config_runs_job_tasks() {
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    std::fs::write(
        e.path("baton.toml"),
        "[[job]]\nname = \"report\"\ncron = \"0 6 * * *\"\ntz = \"Asia/Seoul\"\ncommand = [\"sh\", \"-c\", \"echo $BATON_JOB $BATON_SLOT >> ledger\"]\n",
    )
    .unwrap();
    let out = e.run(&["trigger", "report", "--config", "baton.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut w = e.spawn_logged(&["work", "--config", "baton.toml", "--poll", "200ms"]);
    common::wait_for(20, "the job's run", || !read(&e.path("ledger")).is_empty());
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    let line = read(&e.path("ledger"));
    let mut f = line.split_whitespace();
    assert_eq!(f.next(), Some("report"));
    let slot: chrono::DateTime<chrono::Utc> = f.next().unwrap().parse().unwrap();
    assert_eq!(
        slot.format("%H:%M").to_string(),
        "21:00",
        "06:00 in Seoul is 21:00 UTC: {line}"
    );
}

const TICK_WORK: &str = r#"
[[queue]]
name = "work"
concurrency = 2
lease = "3s"

[[job]]
name = "tick"
every = "1s"
queue = "work"
misfire = "latest"
overlap = "allow"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#;

/// A trigger says what became of the slot (succeeded, skipped and why,
/// pending; pruned, from its tombstone), runs a skipped slot only when
/// asked and only once, never runs a pruned slot again, and without
/// --config puts the run on the job's queue as the store recorded it
/// (refusing a different --queue).
async fn trigger_answers_say_what_became_of_the_slot(e: Env) {
    // Run the job a little, stop for a few slots, run it again: the
    // restart's misfire = "latest" records the missed slots as skipped.
    let kids = vec![serve(&e, TICK_WORK, &[])];
    common::wait_for(20, "a first run", || !ledger(&e).is_empty());
    stop(kids);
    std::thread::sleep(Duration::from_millis(3_500));
    let kids = vec![serve(&e, TICK_WORK, &[])];
    let tasks = || {
        let out = e.run(&[
            "tasks", "list", "--job", "tick", "--json", "--limit", "1000",
        ]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v.as_array().cloned().unwrap_or_default()
    };
    let find = |state: &str| {
        tasks().into_iter().find(|t| {
            t["state"] == state
                && (state != "cancelled"
                    || t["last_error"]
                        .as_str()
                        .is_some_and(|r| r.starts_with("skipped")))
        })
    };
    common::wait_for(20, "a skipped slot", || find("cancelled").is_some());
    stop(kids);
    let ok = find("succeeded").expect("a slot that ran");
    let skip = find("cancelled").expect("a skipped slot");
    // `tasks show` says why (the reason no attempt made).
    let shown = e.run(&["tasks", "show", &skip["id"].to_string()]);
    assert!(
        stdout(&shown).contains("last error:") && stdout(&shown).contains("skipped by misfire"),
        "{}",
        stdout(&shown)
    );
    assert_eq!(ok["queue"], "work");
    let (ok_slot, skip_slot) = (
        ok["slot"].as_str().unwrap().to_string(),
        skip["slot"].as_str().unwrap().to_string(),
    );
    let trig = |slot: &str, extra: &[&str]| {
        let mut args = vec!["trigger", "tick", "--any-slot", "--slot", slot];
        args.extend_from_slice(extra);
        e.run(&args)
    };
    let json = |o: &std::process::Output| -> serde_json::Value {
        assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
        serde_json::from_str(&stdout(o)).unwrap()
    };

    // A slot that ran: said so, nothing enqueued.
    let v = json(&trig(&ok_slot, &["--json"]));
    assert_eq!(
        (v["id"].clone(), v["inserted"].clone(), v["outcome"].clone()),
        (ok["id"].clone(), false.into(), "succeeded".into()),
        "{v}"
    );
    let t = trig(&ok_slot, &[]);
    assert!(
        stderr(&t).contains("already ran: succeeded"),
        "{}",
        stderr(&t)
    );

    // A skipped slot: said so, with the reason, and not run...
    let v = json(&trig(&skip_slot, &["--json"]));
    assert_eq!(v["outcome"], "skipped", "{v}");
    assert_eq!(v["id"], skip["id"]);
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .starts_with("skipped by misfire"),
        "{v}"
    );
    let t = trig(&skip_slot, &[]);
    assert!(
        stderr(&t).contains("was skipped, not run") && stderr(&t).contains("--run-skipped"),
        "{}",
        stderr(&t)
    );
    // ... unless asked, once: the second ask answers with the run it made.
    let v = json(&trig(&skip_slot, &["--json", "--run-skipped"]));
    assert_eq!(
        (v["id"].clone(), v["outcome"].clone(), v["rerun"].clone()),
        (skip["id"].clone(), "pending".into(), true.into()),
        "{v}"
    );
    let v = json(&trig(&skip_slot, &["--json", "--run-skipped"]));
    assert_eq!(
        (v["id"].clone(), v["outcome"].clone(), v["rerun"].clone()),
        (skip["id"].clone(), "pending".into(), false.into()),
        "{v}"
    );

    // A new slot without --config goes to the job's queue, as the store
    // recorded it; a different --queue is refused, naming both.
    let fresh = "2030-01-01T00:00:00Z";
    let bad = trig(fresh, &["--queue", "default"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stdout(&bad));
    assert!(
        stderr(&bad).contains("\"work\"") && stderr(&bad).contains("\"default\""),
        "{}",
        stderr(&bad)
    );
    let v = json(&trig(fresh, &["--json", "--queue", "work"]));
    assert_eq!(
        (v["inserted"].clone(), v["outcome"].clone()),
        (true.into(), "pending".into())
    );
    let new = tasks()
        .into_iter()
        .find(|t| t["id"] == v["id"])
        .expect("the new run");
    assert_eq!(new["queue"], "work", "{new}");

    // Pruned: the slot that ran is refused again, its outcome kept.
    std::thread::sleep(Duration::from_millis(50));
    let p = e.run(&["tasks", "prune", "--older-than", "1ms"]);
    assert_eq!(p.status.code(), Some(0), "{}", stderr(&p));
    assert!(
        !tasks().iter().any(|t| t["id"] == ok["id"]),
        "the run was pruned"
    );
    let v = json(&trig(&ok_slot, &["--json"]));
    assert_eq!(
        (
            v["id"].clone(),
            v["inserted"].clone(),
            v["outcome"].clone(),
            v["pruned"].clone()
        ),
        (
            ok["id"].clone(),
            false.into(),
            "succeeded".into(),
            true.into()
        ),
        "{v}"
    );
    let t = trig(&ok_slot, &[]);
    assert!(
        stderr(&t).contains("already ran: succeeded") && stderr(&t).contains("pruned"),
        "{}",
        stderr(&t)
    );
    assert!(
        !tasks().iter().any(|t| t["slot"] == ok_slot.as_str()),
        "a pruned slot was enqueued again"
    );
}

/// `baton jobs next JOB -n N`: the next fire times in the job's zone, a
/// daylight saving change shown (offset and abbreviation), the wall-clock
/// time a spring-forward skips run once right after the gap (03:00); an
/// interval job in UTC; a job not
/// in the config file is bad input naming `JOB`.
#[test]
fn jobs_next_prints_fire_times_in_the_jobs_zone() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("baton.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"sqlite://{}/s.db\"\n\
             [[job]]\nname = \"nightly\"\ncron = \"30 2 * * *\"\ntz = \"America/Los_Angeles\"\ncommand = [\"true\"]\n\
             [[job]]\nname = \"tick\"\nevery = \"90s\"\ncommand = [\"true\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(common::BATON)
            .args(args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap()
    };
    // A year of nights crosses both changes of the zone's offset.
    let out = run(&["jobs", "next", "nightly", "-n", "366", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let next = v["next"].as_array().unwrap();
    assert_eq!(next.len(), 366);
    let zones: std::collections::BTreeSet<&str> =
        next.iter().map(|f| f["zone"].as_str().unwrap()).collect();
    assert_eq!(zones, ["PDT", "PST"].into(), "{v}");
    let mut after_gap = Vec::new();
    for f in next {
        let local = f["local"].as_str().unwrap();
        if local.contains("T03:00:00") {
            after_gap.push(local);
        } else {
            assert!(local.contains("T02:30:00-0"), "{local}");
        }
        let dst = f["dst"].as_bool().unwrap();
        assert_eq!(dst, local.ends_with("-07:00"), "{f}");
        assert_eq!(dst, f["zone"] == "PDT", "{f}");
    }
    // The spring-forward night (02:00 → 03:00) has no 02:30: it fires
    // once at 03:00 PDT; every night once, none skipped.
    assert_eq!(after_gap.len(), 1, "{after_gap:?}");
    assert!(after_gap[0].ends_with("-07:00"), "{after_gap:?}");
    let days: std::collections::BTreeSet<&str> = next
        .iter()
        .map(|f| &f["local"].as_str().unwrap()[..10])
        .collect();
    assert_eq!(days.len(), 366);
    let first = chrono::NaiveDate::parse_from_str(days.first().unwrap(), "%Y-%m-%d").unwrap();
    let last = chrono::NaiveDate::parse_from_str(days.last().unwrap(), "%Y-%m-%d").unwrap();
    assert_eq!((last - first).num_days(), 365, "{first} .. {last}");

    let out = run(&["jobs", "next", "tick", "-n", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("tick: every 1m30s"), "{text}");
    assert_eq!(text.matches(" UTC ").count(), 3, "{text}");

    let out = run(&["jobs", "next", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("JOB: \"nope\" is not a job"),
        "{}",
        stderr(&out)
    );
}

/// `baton jobs backfill`: 20 past slots of a 1-second job, some of which
/// a `baton serve` ran: a dry run says which would run and enqueues
/// nothing; the backfill enqueues exactly the others (the ones that ran
/// are left alone and reported), a worker runs each once, and a second
/// backfill enqueues nothing. A range over `--max` is refused whole.
async fn backfill_runs_each_past_slot_once_and_leaves_those_that_ran(e: Env) {
    let kids = vec![serve(&e, TICK_WORK, &[])];
    common::wait_for(20, "two scheduled runs", || ledger(&e).len() >= 2);
    stop(kids);
    let ran: Vec<chrono::DateTime<chrono::Utc>> =
        ledger(&e).keys().map(|s| s.parse().unwrap()).collect();
    let first = ran[0];
    let from = first - chrono::Duration::seconds(15);
    let to = from + chrono::Duration::seconds(19);
    // The range must be past: wait until its end is.
    while chrono::Utc::now() <= to + chrono::Duration::milliseconds(200) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let in_range: Vec<_> = ran.iter().filter(|s| **s >= from && **s <= to).collect();
    let ts =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (from_s, to_s) = (ts(from), ts(to));
    let run_backfill = |extra: &[&str]| {
        let mut args = vec![
            "jobs",
            "backfill",
            "tick",
            "--config",
            "baton.toml",
            "--from",
            &from_s,
            "--to",
            &to_s,
        ];
        args.extend_from_slice(extra);
        e.run(&args)
    };
    let backfill = |extra: &[&str]| {
        let mut args = vec!["--json"];
        args.extend_from_slice(extra);
        let o = run_backfill(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()
    };
    let task_count = || {
        let out = e.run(&[
            "tasks", "list", "--job", "tick", "--json", "--limit", "1000",
        ]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v.as_array().map_or(0, |a| a.len())
    };
    let before = task_count();

    // Too many slots for --max: refused whole, naming the flag.
    let o = run_backfill(&["--max", "19"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--max"), "{}", stderr(&o));
    assert_eq!(
        task_count(),
        before,
        "a refused backfill enqueued something"
    );

    // A dry run: 20 slots, those that ran left alone, nothing enqueued.
    let dry = backfill(&["--dry-run"]);
    assert_eq!(dry["slots"], 20, "{dry}");
    assert_eq!(dry["would_enqueue"], 20 - in_range.len(), "{dry}");
    assert_eq!(dry["left_alone"], in_range.len(), "{dry}");
    assert_eq!(task_count(), before, "a dry run enqueued something");

    // The backfill: exactly the slots without a run.
    let v = backfill(&[]);
    assert_eq!(v["enqueued"], 20 - in_range.len(), "{v}");
    for r in v["runs"].as_array().unwrap() {
        let slot: chrono::DateTime<chrono::Utc> = r["slot"].as_str().unwrap().parse().unwrap();
        let had_run = in_range.contains(&&slot);
        assert_eq!(r["inserted"], !had_run, "{r}");
        if had_run {
            assert_eq!(r["outcome"], "succeeded", "{r}");
        }
    }
    let mut worker = e.spawn(&["work", "--config", "baton.toml"]);
    let want = |m: &BTreeMap<String, usize>| {
        m.keys()
            .filter(|s| {
                let t: chrono::DateTime<chrono::Utc> = s.parse().unwrap();
                t >= from && t <= to
            })
            .count()
    };
    common::wait_for(60, "every backfilled slot to run", || {
        want(&ledger(&e)) == 20
    });
    // Again: nothing new.
    let again = backfill(&[]);
    assert_eq!(again["enqueued"], 0, "{again}");
    assert_eq!(again["left_alone"], 20, "{again}");
    std::thread::sleep(Duration::from_millis(1_500));
    signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
    let m = ledger(&e);
    for (slot, n) in &m {
        assert_eq!(*n, 1, "slot {slot} ran {n} times: {m:?}");
    }
    assert_eq!(want(&m), 20, "{m:?}");
}
