//! Process trees: a command that is a wrapper (its work runs in a
//! grandchild) is stopped as a whole — on a signal to baton, on `kill -9`
//! of baton, on a lost lease — and `baton lock` stops its command before
//! the lease can lapse when the store goes dark.

use crate::common;

use baton_testkit as support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{read, signal, stderr, wait_for, Env, Kind};

per_backend! {
    work_kill_9_stops_the_whole_tree,
    work_sigterm_stops_the_whole_tree,
    work_lost_lease_stops_the_whole_tree,
}

/// A wrapper whose grandchild writes its pid to `gc.pid` and appends to
/// `F` every 100 ms; the wrapper itself waits for it.
const WRAPPER: &str =
    r#"(exec sh -c 'echo $$ > gc.pid; while :; do echo tick >> F; sleep 0.1; done') ; :"#;

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks the pid.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    // A zombie has stopped running; it only waits to be reaped.
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
}

/// Wait until the wrapper's grandchild runs and writes; its pid.
fn grandchild(dir: &Path) -> i32 {
    let pid_file = dir.join("gc.pid");
    wait_for(20, "the grandchild to start", || {
        read(&pid_file).trim().parse::<i32>().is_ok() && read(&dir.join("F")).len() > 10
    });
    let pid: i32 = read(&pid_file).trim().parse().unwrap();
    assert!(alive(pid), "the grandchild runs");
    pid
}

/// The grandchild is gone within `secs`, and `F` stops growing.
fn assert_tree_gone(dir: &Path, pid: i32, secs: f64, what: &str) {
    let t0 = Instant::now();
    while alive(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs_f64(secs),
            "{what}: the grandchild {pid} still runs {secs} s later"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = read(&dir.join("F")).len();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        read(&dir.join("F")).len(),
        before,
        "{what}: nothing writes to F any more"
    );
}

fn lock_wrapper(e: &Env, name: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["lock", name, "--grace", "2s"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", WRAPPER]);
    e.spawn_logged(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_sigterm_stops_the_whole_tree() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let mut c = lock_wrapper(&e, "tree-term", &[]);
    let gc = grandchild(e.dir.path());
    signal(&c, libc::SIGTERM);
    assert_tree_gone(e.dir.path(), gc, 3.0, "SIGTERM to baton lock");
    let st = c.wait().unwrap();
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "the wrapper's status");
    // Released: the next caller gets the lock at once.
    assert_eq!(
        e.run(&["lock", "tree-term", "--", "true"]).status.code(),
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_kill_9_stops_the_whole_tree() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let mut c = lock_wrapper(&e, "tree-kill", &[]);
    let gc = grandchild(e.dir.path());
    c.kill().unwrap();
    c.wait().unwrap();
    assert_tree_gone(e.dir.path(), gc, 3.0, "kill -9 of baton lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_lost_lease_kills_the_whole_tree_at_once() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let mut c = lock_wrapper(&e, "tree-lost", &["--at-most", "3s"]);
    let gc = grandchild(e.dir.path());
    // The lease is force-released and another holder takes it: the next
    // extension is refused.
    let b = e.ts.store.backend();
    let info = b.lock_get("tree-lost").await.unwrap().unwrap();
    assert!(b
        .lock_release(&baton::store::LockRelease {
            name: "tree-lost",
            token: info.token,
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    let locker = baton::lock::Locker::new(e.ts.store.clone());
    let thief = locker
        .try_lock(
            "tree-lost",
            &baton::lock::LockOptions::new(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .unwrap();
    // Refused means someone else may hold it: SIGKILL at once, not after
    // the 2 s grace (the keep-alive notices within 1 s).
    assert_tree_gone(e.dir.path(), gc, 3.0, "a refused extension");
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "baton lock exits");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.code(), Some(70));
    thief.release().await.unwrap();
}

/// The store goes dark (a private redis-server gets SIGSTOP): the command
/// gets SIGTERM `--grace` before the lease could lapse, is gone before the
/// lapse, and a second `baton lock --wait` runs only after it.
#[test]
fn lock_stops_the_command_before_the_lease_can_lapse() {
    let Some(mut srv) = support::Private::new(support::Kind::Redis) else {
        return;
    };
    srv.start();
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let baton = |args: &[&str]| {
        let mut c = Command::new(common::BATON);
        c.args(args)
            .env("BATON_STORE", srv.url())
            .env("BATON_LOG", "warn")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    };
    let mut a = baton(&[
        "lock", "dark", "--at-most", "3s", "--grace", "2s", "--", "sh", "-c",
        r#"trap 'echo a-term $(date +%s%N) >> ledger; sleep 1.5; echo a-end $(date +%s%N) >> ledger; exit 0' TERM; echo a-start $(date +%s%N) >> ledger; while :; do sleep 0.1; done"#,
    ])
    .spawn()
    .unwrap();
    wait_for(20, "the first command to start", || {
        read(&ledger).contains("a-start")
    });
    std::thread::sleep(Duration::from_secs(1)); // a few extensions
    let pid = srv.redis_pid().unwrap() as i32;
    let now_ns = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    let dark = now_ns();
    // SAFETY: signals to the private server we started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Past any lapse of the first lease (its last extension was sent
    // before `dark`), bring the store back and ask for the lock again.
    std::thread::sleep(Duration::from_millis(3_300));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let b = baton(&[
        "lock",
        "dark",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        "echo b-start $(date +%s%N) >> ledger",
    ])
    .output()
    .unwrap();
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = a.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the first baton lock exits"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(70), "stopped for the lease: {err}");
    let text = read(&ledger);
    let at = |what: &str| -> u128 {
        text.lines()
            .find_map(|l| l.strip_prefix(what)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what} in the ledger:\n{text}\n{err}"))
    };
    let lapse_bound = dark + 3_000_000_000;
    assert!(at("a-term ") > dark, "no SIGTERM while the store answered");
    assert!(
        at("a-end ") < lapse_bound,
        "the command must be done before the lease could lapse: it ended {} ms after the store went dark (at_most 3 s)\n{err}",
        (at("a-end ") - dark) / 1_000_000
    );
    assert!(
        at("b-start ") > at("a-end "),
        "overlap: the second holder started {} ms before the first command ended",
        (at("a-end ") - at("b-start ")) / 1_000_000
    );
}

/// `sh -c 'sleep 15 & echo hi'`: the task ends when sh exits, not when the
/// background `sleep` closes stderr, and the `sleep` is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_background_child_does_not_keep_a_task_running() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let out = e.run(&[
        "enqueue",
        "--",
        "sh",
        "-c",
        "sleep 15 & echo $! > bg.pid; echo hi",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = common::stdout(&out).trim().to_string();
    let mut w = e.spawn_logged(&["work", "--poll", "200ms", "--grace", "1s"]);
    let t0 = Instant::now();
    wait_for(20, "the task to succeed", || {
        let o = e.run(&["tasks", "show", &id, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        v["state"] == "succeeded"
    });
    let took = t0.elapsed();
    let bg: i32 = read(&e.path("bg.pid")).trim().parse().unwrap();
    assert!(!alive(bg), "the background sleep is gone");
    signal(&w, libc::SIGTERM);
    let _ = w.wait();
    assert!(
        took < Duration::from_secs(6),
        "the task took {took:?}: it waited for the background child"
    );
}

/// `kill -9` of `baton work` running the wrapper: no process of its tree
/// remains.
async fn work_kill_9_stops_the_whole_tree(e: Env) {
    let out = e.run(&["enqueue", "--", "sh", "-c", WRAPPER]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut w = e.spawn_logged(&["work", "--poll", "200ms", "--grace", "1s"]);
    let gc = grandchild(e.dir.path());
    w.kill().unwrap();
    w.wait().unwrap();
    assert_tree_gone(e.dir.path(), gc, 3.0, "kill -9 of baton work");
}

/// SIGTERM to `baton work` running the wrapper: after the shutdown grace
/// the command's whole tree is stopped and the task handed back.
async fn work_sigterm_stops_the_whole_tree(e: Env) {
    let out = e.run(&["enqueue", "--", "sh", "-c", WRAPPER]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = common::stdout(&out).trim().to_string();
    let mut w = e.spawn_logged(&[
        "work",
        "--poll",
        "200ms",
        "--shutdown-grace",
        "500ms",
        "--grace",
        "1s",
    ]);
    let gc = grandchild(e.dir.path());
    signal(&w, libc::SIGTERM);
    assert_tree_gone(e.dir.path(), gc, 4.0, "SIGTERM to baton work");
    let st = w.wait().unwrap();
    assert_eq!(st.code(), Some(128 + libc::SIGTERM), "baton work's status");
    let o = e.run(&["tasks", "show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(v["state"], "pending", "handed back: {v}");
}

/// The wrapper writes per attempt: `gc<ATTEMPT>.pid`, `F<ATTEMPT>`.
const WRAPPER_PER_ATTEMPT: &str = r#"(exec sh -c 'echo $$ > gc$BATON_ATTEMPT.pid; while :; do echo tick >> F$BATON_ATTEMPT; sleep 0.1; done') ; :"#;

/// A worker frozen past its lease (SIGSTOP) whose task is rescued meanwhile:
/// attempt 1's whole tree was killed by its supervisor at the lease's
/// bound (the dead man's switch), and once the worker runs again its claim
/// is lost and nothing of the tree comes back (attempt 2 may start; it
/// writes files of its own).
async fn work_lost_lease_stops_the_whole_tree(e: Env) {
    let out = e.run(&["enqueue", "--", "sh", "-c", WRAPPER_PER_ATTEMPT]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut w = e.spawn_logged(&["work", "--poll", "200ms", "--lease", "2s", "--grace", "1s"]);
    let dir = e.dir.path();
    wait_for(20, "attempt 1's grandchild to start", || {
        read(&dir.join("gc1.pid")).trim().parse::<i32>().is_ok() && read(&dir.join("F1")).len() > 10
    });
    let gc: i32 = read(&dir.join("gc1.pid")).trim().parse().unwrap();
    signal(&w, libc::SIGSTOP);
    // Past the lease, then rescued by "another instance" (this test).
    std::thread::sleep(Duration::from_millis(2_600));
    let r = e.ts.store.backend().task_rescue_many().await.unwrap();
    assert_eq!(r.requeued, 1, "the frozen worker's task is rescued");
    // Its supervisor's own deadline (the attempt's lease bound less the
    // stop margin) has killed it meanwhile: it never ran past the lease.
    assert!(
        !alive(gc),
        "attempt 1's tree is gone while its worker is frozen, before the rescue"
    );
    signal(&w, libc::SIGCONT);
    let t0 = Instant::now();
    while alive(gc) {
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "attempt 1's grandchild {gc} still runs 3 s after its worker resumed with a lost lease"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = read(&dir.join("F1")).len();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        read(&dir.join("F1")).len(),
        before,
        "nothing writes F1 any more"
    );
    signal(&w, libc::SIGKILL);
    let _ = w.wait();
}

/// A command that ignores SIGTERM: a second SIGTERM to `baton lock` kills
/// its tree, releases the lock and exits 128+15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_second_sigterm_kills_the_tree_and_releases() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let mut c = e.spawn_logged(&[
        "lock",
        "tree-twice",
        "--grace",
        "20s",
        "--",
        "sh",
        "-c",
        &format!("trap '' TERM; {WRAPPER}"),
    ]);
    let gc = grandchild(e.dir.path());
    signal(&c, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(gc), "the tree ignores SIGTERM");
    signal(&c, libc::SIGTERM);
    assert_tree_gone(e.dir.path(), gc, 3.0, "a second SIGTERM to baton lock");
    assert_eq!(c.wait().unwrap().code(), Some(128 + libc::SIGTERM));
    assert_eq!(
        e.run(&["lock", "tree-twice", "--", "true"]).status.code(),
        Some(0),
        "released"
    );
}

/// The process group of `pid` (from `/proc/PID/stat`).
fn pgrp_of(pid: i32) -> i64 {
    let stat = read(Path::new(&format!("/proc/{pid}/stat")));
    let after = stat.rsplit(')').next().unwrap_or("");
    after
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .expect("a pgrp in /proc/PID/stat")
}

/// Under `baton chaos` (an instance, `baton chaos __instance -- work`, with
/// `BATON_CHAOS_HISTORY` set), a worker that stops a
/// task's command — here one that ignores SIGTERM, so SIGKILL after the
/// grace, stopped because the task was cancelled — appends one `killed`
/// record for the attempt and its process group, and only once no process
/// of that group is alive (issue #15: the checker orders by it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_records_killed_once_the_group_is_gone() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let hist = e.path("history.jsonl");
    std::fs::write(&hist, "").unwrap();
    let out = e.run(&[
        "enqueue",
        "--",
        "sh",
        "-c",
        "trap '' TERM; echo $$ > gc.pid; while :; do echo tick >> F; sleep 0.1; done",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = common::stdout(&out).trim().to_string();
    let log = std::fs::File::create(e.path("baton-work.log")).unwrap();
    let mut w = e
        // A chaos run's instance: only these install the stop hook.
        .cmd(&[
            "chaos",
            "__instance",
            "--",
            "work",
            "--poll",
            "200ms",
            "--lease",
            "3s",
            "--grace",
            "1s",
        ])
        .env("BATON_CHAOS_HISTORY", &hist)
        .env("BATON_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let gc = grandchild(e.dir.path());
    let group = pgrp_of(gc);
    let out = e.run(&["tasks", "cancel", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let t0 = Instant::now();
    let line = loop {
        if let Some(l) = read(&hist).lines().find(|l| l.contains("\"killed\"")) {
            break l.to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no killed record 20 s after the cancel"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        !alive(gc),
        "the command {gc} was still alive when its death was recorded"
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "recorded {:?} after the cancel: before the 1 s grace was over",
        t0.elapsed()
    );
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["task"].to_string(), id, "{line}");
    assert_eq!(v["attempt"], 1, "{line}");
    assert_eq!(v["group"], group, "{line}");
    assert_tree_gone(e.dir.path(), gc, 1.0, "after the killed record");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        read(&hist).lines().count(),
        1,
        "one record: {}",
        read(&hist)
    );
    signal(&w, libc::SIGKILL);
    let _ = w.wait();
}

/// A supervisor started after its first deadline (baton froze between
/// deciding to run a command and starting it, so the lease may be gone)
/// does not start the command at all; one started before it does. The
/// deadline is the supervisor's own argument, so no later freeze of baton
/// can leave the command unbounded.
#[test]
fn supervisor_past_its_first_deadline_does_not_start_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let run = |stop_by: &str, file: &str| {
        // The lifeline is the supervisor's stdin: a pipe this test holds
        // open until the supervisor exits (EOF would mean "baton died").
        let mut child = Command::new(common::BATON)
            .args(["__supervise", "0", "1000", "--stop-by", stop_by, "--"])
            .args(["sh", "-c", &format!("touch {file}")])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lifeline = child.stdin.take();
        let status = child.wait().unwrap();
        drop(lifeline);
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    };
    // 1 ns after boot: long past.
    let late = run("1", "late");
    assert_eq!(late.0.code(), Some(125), "{late:?}");
    assert!(late.1.contains("not starting it"), "{late:?}");
    assert!(!dir.path().join("late").exists(), "the command ran");
    // Far ahead: the command runs.
    let early = run("9000000000000000000", "early");
    assert_eq!(early.0.code(), Some(0), "{early:?}");
    assert!(dir.path().join("early").exists(), "the command did not run");
}
