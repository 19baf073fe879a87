//! The first hour with `baton`: what a new user sees. Output that a closed
//! pipe ends quietly, aligned tables with millisecond timestamps on every
//! store, bounded inputs refused with the bound, connection failures that
//! say why, documented exit codes, completions and the man page, and
//! progress lines on a terminal only.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{stderr, stdout, wait_for, Env, Kind};

per_backend! {
    tables_align_and_timestamps_have_milliseconds,
    migrate_says_created_then_up_to_date,
    migrate_remove_needs_yes_and_removes_everything,
    missing_things_exit_66,
    duplicate_key_says_nothing_was_inserted,
    lock_wait_says_what_it_waits_for,
}

async fn sqlite() -> Env {
    Env::new(Kind::Sqlite)
        .await
        .expect("sqlite is always there")
}

fn enqueue(e: &Env, extra: &[&str], cmd: &[&str]) -> (i64, String) {
    let mut args = vec!["enqueue"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let out = e.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().parse().expect("enqueue prints the id");
    (id, stderr(&out))
}

/// `2026-01-31T06:00:00.123Z`: RFC 3339, UTC, exactly milliseconds.
fn is_ms_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() == 24
        && b[19] == b'.'
        && b[20..23].iter().all(u8::is_ascii_digit)
        && s.ends_with('Z')
        && chrono::DateTime::parse_from_rfc3339(s).is_ok()
}

async fn tables_align_and_timestamps_have_milliseconds(e: Env) {
    enqueue(&e, &[], &["true"]);
    enqueue(
        &e,
        &["--queue", "a-much-longer-queue-name", "--delay", "1h"],
        &["sh", "-c", "echo hi"],
    );
    let out = e.run(&["tasks", "list"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    // Every column starts where its header starts.
    for header in ["STATE", "QUEUE", "RUN_AT", "COMMAND/KIND"] {
        let col = lines[0].find(header).unwrap();
        for l in &lines[1..] {
            assert!(
                col == 0 || l.as_bytes()[col - 1] == b' ',
                "{header} at {col}: {text}"
            );
            assert_ne!(l.as_bytes()[col], b' ', "{header} at {col}: {text}");
        }
    }
    let run_at = lines[0].find("RUN_AT").unwrap();
    for l in &lines[1..] {
        assert!(is_ms_timestamp(&l[run_at..run_at + 24]), "{l}");
    }
    // JSON: the same form on every store.
    let out = e.run(&["tasks", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    for t in v.as_array().unwrap() {
        for key in ["created_at", "run_at"] {
            let s = t[key].as_str().unwrap();
            assert!(is_ms_timestamp(s), "{key} {s}");
        }
    }
    // `tasks show`: the fields' values start in one column.
    let id = v[0]["id"].as_i64().unwrap().to_string();
    let out = e.run(&["tasks", "show", &id]);
    let text = stdout(&out);
    let starts: Vec<usize> = text
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("  ") && l.contains(": "))
        .map(|l| {
            let colon = l.find(':').unwrap();
            colon + 1 + l[colon + 1..].len() - l[colon + 1..].trim_start().len()
        })
        .collect();
    assert!(starts.len() >= 6, "{text}");
    assert!(starts.iter().all(|s| *s == starts[0]), "{text}");
    assert!(text.contains(".000Z") || text.lines().any(|l| l.ends_with('Z')));
    // `tasks stats --json`: an array, one object per queue (as /stats).
    let out = e.run(&["tasks", "stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let queues: Vec<&str> = v
        .as_array()
        .expect("an array")
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(queues, ["a-much-longer-queue-name", "default"], "{v}");
    // `locks`: table and JSON with millisecond times.
    let out = e.run(&["lock", "tbl", "--at-least", "1m", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = e.run(&["locks", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(is_ms_timestamp(v[0]["lock_until"].as_str().unwrap()), "{v}");
    let text = stdout(&e.run(&["locks"]));
    let col = text.lines().next().unwrap().find("LOCK_UNTIL").unwrap();
    let row = text.lines().nth(1).unwrap();
    assert!(is_ms_timestamp(&row[col..col + 24]), "{text}");
}

async fn migrate_says_created_then_up_to_date(e: Env) {
    let prefix = format!("{}_m", e.ts.prefix);
    let out = e.run(&["migrate", "--prefix", &prefix]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("created the baton schema"),
        "{}",
        stdout(&out)
    );
    if e.ts.kind == Kind::Redis {
        // Redis keeps no tables: a prefix with no data reads as new.
        let out = e.run(&["enqueue", "--prefix", &prefix, "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = e.run(&["migrate", "--prefix", &prefix]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("schema already up to date"),
        "{}",
        stdout(&out)
    );
}

/// `baton migrate --remove` says what it would delete and changes nothing
/// without `--yes`; with it the prefix's schema and data are gone (the next
/// `migrate` creates it anew, empty).
async fn migrate_remove_needs_yes_and_removes_everything(e: Env) {
    let prefix = format!("{}_r", e.ts.prefix);
    let out = e.run(&["enqueue", "--prefix", &prefix, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = e.run(&["migrate", "--prefix", &prefix, "--remove"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--yes") && stderr(&out).contains("every task"),
        "{}",
        stderr(&out)
    );
    let tasks = |e: &Env| {
        let text = stdout(&e.run(&["tasks", "list", "--prefix", &prefix, "--json"]));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_array().map(Vec::len)
    };
    assert_eq!(tasks(&e), Some(1));
    let out = e.run(&["migrate", "--prefix", &prefix, "--remove", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("removed the baton schema"),
        "{}",
        stdout(&out)
    );
    let out = e.run(&["migrate", "--prefix", &prefix]);
    assert!(
        stdout(&out).starts_with("created the baton schema"),
        "{}",
        stdout(&out)
    );
    assert_eq!(tasks(&e), Some(0));
}

/// GUIDE.md "Exit codes": 66 when the task or job named does not exist.
async fn missing_things_exit_66(e: Env) {
    for args in [
        &["tasks", "cancel", "999"][..],
        &["tasks", "show", "999"],
        &["tasks", "retry", "999"],
        &["jobs", "pause", "no-such-job"],
        &["jobs", "resume", "no-such-job"],
    ] {
        let out = e.run(args);
        assert_eq!(out.status.code(), Some(66), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("no "), "{args:?}: {}", stderr(&out));
    }
    // A task that exists but cannot be retried is a state conflict (65).
    let (id, _) = enqueue(&e, &["--delay", "1h"], &["true"]);
    let out = e.run(&["tasks", "retry", &id.to_string()]);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(stderr(&out).contains("is pending"), "{}", stderr(&out));
}

async fn duplicate_key_says_nothing_was_inserted(e: Env) {
    let (a, err) = enqueue(&e, &["--key", "once"], &["true"]);
    assert!(!err.contains("nothing was inserted"), "{err}");
    let (b, err) = enqueue(&e, &["--key", "once"], &["true"]);
    assert_eq!(a, b);
    assert!(
        err.contains("nothing was inserted") && err.contains(&format!("task {a}")),
        "{err}"
    );
}

async fn lock_wait_says_what_it_waits_for(e: Env) {
    // The holder's command says when it holds the lock, then holds it until
    // told to let go, 6 s later (a fixed-length hold raced the polling on
    // a loaded host).
    let mut holder = e.spawn(&[
        "lock",
        "w",
        "--at-most",
        "30s",
        "--",
        "sh",
        "-c",
        "touch held; while [ ! -e release ]; do sleep 0.05; done",
    ]);
    wait_for(20, "the lock to be held", || e.path("held").exists());
    assert!(stdout(&e.run(&["locks", "--json"])).contains("\"held\""));
    let release = e.path("release");
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(6));
        std::fs::write(release, "").unwrap();
    });
    let t0 = Instant::now();
    let out = e.run(&["lock", "w", "--wait", "40s", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("lock \"w\" is held by") && err.contains("waiting up to 40s"),
        "{err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(35));
    holder.wait().unwrap();
}

/// Every read command, its stdout closed before it writes: exit 0, no
/// panic, nothing on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_quietly() {
    let e = sqlite().await;
    // Task ids are floored at the store clock in µs (DESIGN I1): show the
    // one enqueue printed.
    let (id, _) = enqueue(&e, &[], &["true"]);
    let id = id.to_string();
    for args in [
        &["tasks", "list"][..],
        &["tasks", "list", "--json"],
        &["tasks", "show", &id],
        &["tasks", "stats"],
        &["tasks", "stats", "--json"],
        &["locks"],
        &["jobs"],
        &["completions", "bash"],
        &["man"],
    ] {
        let mut child = e
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before baton writes
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

/// A worker whose stderr was closed keeps working (its notes are dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_closed_stderr_keeps_working() {
    let e = sqlite().await;
    let (id, _) = enqueue(&e, &[], &["true"]);
    let mut w = e
        .cmd(&["work", "--poll", "200ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(w.stderr.take());
    wait_for(30, "the task to succeed", || {
        let out = e.run(&["tasks", "show", &id.to_string(), "--json"]);
        stdout(&out).contains("\"succeeded\"")
    });
    assert!(w.try_wait().unwrap().is_none(), "the worker still runs");
    common::signal(&w, libc::SIGTERM);
    assert_eq!(w.wait().unwrap().code(), Some(143));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounds_are_refused_with_the_bound() {
    let e = sqlite().await;
    let huge = "x".repeat(100_000);
    for (args, want) in [
        (vec!["work", "--concurrency", "10001"], "1 to 10000"),
        (vec!["work", "--concurrency", "0"], "1 to 10000"),
        (vec!["tasks", "list", "--limit", "0"], "1..=10000"),
        (vec!["tasks", "list", "--limit", "10001"], "1..=10000"),
        (
            vec!["enqueue", "--delay", "3651d", "--", "true"],
            "10 years",
        ),
        (
            vec!["lock", "x", "--at-most", "3651d", "--", "true"],
            "10 years",
        ),
        (vec!["tasks", "list", "--prefix", &huge], "at most 32"),
        (vec!["tasks", "list", "--queue", &huge], "at most 255"),
        (vec!["lock", &huge, "--", "true"], "at most 255"),
        (vec!["jobs", "pause", &huge], "at most 255"),
    ] {
        let out = e.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{:?}: {err}", &args[..2]);
        assert!(err.contains(want), "{:?}: {err}", &args[..2]);
        assert!(
            err.len() < 1_000,
            "{:?}: the input is echoed: {err}",
            &args[..2]
        );
    }
    // The bounds themselves are accepted.
    let out = e.run(&["tasks", "list", "--limit", "10000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = e.run(&["enqueue", "--delay", "3650d", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_config_is_refused() {
    let e = sqlite().await;
    std::fs::write(e.path("empty.toml"), "# nothing yet\n").unwrap();
    let out = e.run(&["serve", "--config", "empty.toml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no [[job]] and no [[queue]]"),
        "{}",
        stderr(&out)
    );
}

/// A refused connection, a directory given as a SQLite file, a missing
/// parent directory: one line saying so, with the URL's password hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_say_why() {
    let e = sqlite().await;
    let dir = e.path("");
    let dir = dir.to_str().unwrap().trim_end_matches('/');
    let missing = format!("sqlite://{dir}/no/such/dir/x.db");
    let as_dir = format!("sqlite://{dir}");
    for (url, want) in [
        ("postgres://postgres:secret@127.0.0.1:1/test", "refused"),
        ("redis://:secret@127.0.0.1:1", "refused"),
        (as_dir.as_str(), "is a directory"),
        (missing.as_str(), "does not exist"),
    ] {
        let t0 = Instant::now();
        let out = e.run(&["tasks", "list", "--store", url]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{url}: {err}");
        assert!(err.contains(want), "{url}: {err}");
        assert!(!err.contains("secret"), "{url}: the password shows: {err}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_and_man_page_print() {
    let e = sqlite().await;
    for (shell, want) in [
        ("bash", "complete -F _baton"),
        ("zsh", "#compdef baton"),
        ("fish", "complete -c baton"),
    ] {
        let out = e.run(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let s = stdout(&out);
        assert!(s.contains(want), "{shell}: {}", &s[..s.len().min(300)]);
        assert!(s.contains("enqueue") && s.contains("store"), "{shell}");
    }
    let out = e.run(&["man"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let s = stdout(&out);
    assert!(s.contains(".TH baton"), "{}", &s[..s.len().min(300)]);
    assert!(s.contains("migrate"), "subcommands listed");
}

/// Logs on a stderr that is not a terminal carry no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_have_no_colour_codes() {
    let e = sqlite().await;
    let out = e
        .cmd(&["lock", "plain", "--", "true"])
        .env("BATON_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("lock acquired"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI codes in {err:?}");
}

/// Progress on long work only on a terminal: `migrate`, `tasks prune` and
/// `lock --wait` draw a running line on stderr (erased when done) under a
/// pseudo-terminal (`script` from util-linux), and write none of it, nor
/// any escape code, to a pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_only_on_a_terminal() {
    if !common::have(
        "script (util-linux)",
        std::path::Path::new("/usr/bin/script").exists(),
    ) {
        return;
    }
    let e = sqlite().await;
    let opts = baton::lock::LockOptions::new(Duration::from_secs(600));
    let _held = baton::lock::Locker::new(e.ts.store.clone())
        .try_lock("held", &opts)
        .await
        .unwrap()
        .expect("the lock is free");
    let cases: [(&[&str], &str); 3] = [
        (&["migrate"], "baton: migrating the schema on sqlite://"),
        (
            &["tasks", "prune"],
            "baton: pruning finished tasks older than 7d",
        ),
        (
            &["lock", "held", "--wait", "1s", "--", "true"],
            "baton: waiting for lock \"held\"",
        ),
    ];
    for (args, want) in cases {
        // A pipe: none of it.
        let out = e.run(args);
        let err = stderr(&out);
        assert!(
            !err.contains(want) && !err.contains('\u{1b}') && !err.contains('\r'),
            "baton {args:?} with stderr on a pipe: {err:?}"
        );
        // A terminal: the line, then the erase.
        let line: Vec<String> = std::iter::once(common::BATON)
            .chain(args.iter().copied())
            .map(|a| format!("'{a}'"))
            .collect();
        let out = std::process::Command::new("script")
            .args(["-qec", &line.join(" "), "/dev/null"])
            .env("BATON_STORE", &e.ts.url)
            .env("BATON_PREFIX", &e.ts.prefix)
            .env("BATON_LOG", "warn")
            .current_dir(e.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("script runs");
        let tty = stdout(&out);
        assert!(
            tty.contains(&format!("\r\u{1b}[K{want}"))
                && tty.contains(" … ")
                && tty.contains("s\r\u{1b}[K"),
            "baton {args:?} on a terminal: {tty:?}"
        );
    }
}
