//! What `baton work` logs, as an operator reads it: at the default level
//! (no `BATON_LOG`), one `task started` and one `task ended` line per
//! attempt with the task's id, queue, kind, attempt, outcome, duration and
//! the command's exit code; `--log-format json` makes every line a JSON
//! object; and stderr that is not a terminal gets no ANSI codes. SQLite.

use crate::common;

use common::{signal, stderr, stdout, wait_for, Env};

/// Enqueue a command that exits 3 (one attempt) and one that succeeds,
/// run a worker with `format` until both ended, and return its stderr and
/// the two task ids.
async fn run_worker(format: Option<&str>) -> Option<(String, i64, i64)> {
    let e = Env::new(common::Kind::Sqlite).await?;
    let enqueue = |args: &[&str]| -> i64 {
        let out = e.run(args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out).trim().parse().expect("an id")
    };
    // It writes to both streams: a line each, a line split by a pause, and
    // an unterminated last line.
    let bad = enqueue(&[
        "enqueue",
        "--max-attempts",
        "1",
        "--",
        "sh",
        "-c",
        "echo out-line; printf 'err-' >&2; sleep 0.2; echo line >&2; printf 'no newline' >&2; exit 3",
    ]);
    let ok = enqueue(&["enqueue", "--", "true"]);
    let log = e.path("work.log");
    let mut cmd = e.cmd(&["work", "--poll", "100ms", "--shutdown-grace", "1s"]);
    // stdout and stderr into one file, as a container runtime collects
    // them.
    let file = std::fs::File::create(&log).unwrap();
    cmd.env_remove("BATON_LOG")
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    match format {
        Some(f) => cmd.env("BATON_LOG_FORMAT", f),
        None => cmd.env_remove("BATON_LOG_FORMAT"),
    };
    let mut kid = cmd.spawn().expect("baton work starts");
    wait_for(20, "both tasks to end", || {
        common::read(&log).matches("task ended").count() >= 2
    });
    signal(&kid, libc::SIGTERM);
    let _ = kid.wait();
    Some((common::read(&log), bad, ok))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_have_a_line_per_task_start_and_end() {
    let Some((log, bad, ok)) = run_worker(None).await else {
        return;
    };
    assert!(!log.contains('\x1b'), "ANSI codes on a pipe:\n{log}");
    let line = |id: i64, msg: &str| -> String {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(msg) && l.contains(&format!("task={id} ")))
            .collect();
        assert_eq!(lines.len(), 1, "one {msg:?} line for task {id}:\n{log}");
        lines[0].to_string()
    };
    let start = line(ok, "task started");
    for f in ["queue=default", "kind=command", "attempt=1", "worker="] {
        assert!(start.contains(f), "{f} in {start}");
    }
    let end = line(ok, "task ended");
    for f in ["outcome=\"succeeded\"", "exit_code=0", "duration_ms="] {
        assert!(end.contains(f), "{f} in {end}");
    }
    assert!(end.contains(" INFO "), "{end}");
    let end = line(bad, "task ended");
    for f in [
        "outcome=\"failed\"",
        "exit_code=3",
        "error=\"exit 3: err-line\\nno newline\\nstdout: out-line\"",
    ] {
        assert!(end.contains(f), "{f} in {end}");
    }
    assert!(end.contains(" WARN "), "{end}");
    // The command's own output passes through as it is.
    assert!(log.lines().any(|l| l == "out-line"), "{log}");
    assert!(log.lines().any(|l| l == "err-line"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let Some((log, bad, ok)) = run_worker(Some("json")).await else {
        return;
    };
    assert!(!log.contains('\x1b'), "ANSI codes in JSON:\n{log}");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ended = |id: i64| -> &serde_json::Value {
        let found: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l["message"] == "task ended" && l["task"] == id)
            .collect();
        assert_eq!(found.len(), 1, "task {id}: {lines:?}");
        found[0]
    };
    let e = ended(ok);
    assert_eq!(e["outcome"], "succeeded", "{e}");
    assert_eq!(e["queue"], "default", "{e}");
    assert_eq!(e["kind"], "command", "{e}");
    assert_eq!(e["attempt"], 1, "{e}");
    assert_eq!(e["exit_code"], 0, "{e}");
    assert!(e["duration_ms"].is_u64(), "{e}");
    // The worker's identity (host:pid:…), as the task's record names it.
    assert!(e["worker"].as_str().is_some_and(|w| w.contains(':')), "{e}");
    let e = ended(bad);
    assert_eq!(e["outcome"], "failed", "{e}");
    assert_eq!(e["exit_code"], 3, "{e}");
    assert_eq!(e["level"], "WARN", "{e}");
    assert!(
        lines
            .iter()
            .any(|l| l["message"] == "task started" && l["task"] == ok),
        "{lines:?}"
    );
    // The command's output, both streams, a log event per line in the
    // task's span (a line split across writes is one line).
    let output: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["target"] == "baton::command")
        .map(|l| {
            assert_eq!(l["span"]["id"], bad, "{l}");
            assert_eq!(l["level"], "INFO", "{l}");
            (
                l["stream"].as_str().unwrap_or("?"),
                l["message"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    let mut sorted = output.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("stderr", "err-line"),
            ("stderr", "no newline"),
            ("stdout", "out-line")
        ],
        "{output:?}"
    );
}

/// Run `baton serve --config baton.toml` with JSON logs at info, its
/// stdout and stderr into one file (as a container runtime collects them),
/// until `done` holds for that file's text; stop it and return the text.
fn serve_json_until(e: &Env, what: &str, done: impl Fn(&str) -> bool) -> String {
    let log = e.path("serve.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut kid = e
        .cmd(&["serve", "--config", "baton.toml", "--shutdown-grace", "1s"])
        .env("BATON_LOG", "info")
        .env("BATON_LOG_FORMAT", "json")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("baton serve starts");
    wait_for(20, what, || done(&common::read(&log)));
    signal(&kid, libc::SIGTERM);
    let _ = kid.wait();
    common::read(&log)
}

/// A slot in a log line is written as every command prints a time (RFC
/// 3339, UTC, milliseconds, `Z`; `baton::format_time`), never chrono's
/// `2026-01-31 06:00:00 UTC`, and names the same instant the command got
/// in `BATON_SLOT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_slots_are_rfc3339_milliseconds() {
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    std::fs::write(
        e.path("baton.toml"),
        r#"
[[queue]]
name = "default"

[[job]]
name = "tick"
every = "1s"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
"#,
    )
    .unwrap();
    let text = serve_json_until(&e, "a slot enqueued and run", |log| {
        log.contains("slot enqueued") && !common::read(&e.path("ledger")).trim().is_empty()
    });
    let slots: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["message"] == "slot enqueued")
        .map(|l| l["slot"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!slots.is_empty(), "{text}");
    for s in &slots {
        let t = chrono::DateTime::parse_from_rfc3339(s)
            .unwrap_or_else(|e| panic!("slot {s:?} is not RFC 3339 ({e}):\n{text}"));
        assert_eq!(
            s,
            &baton::format_time(t.with_timezone(&chrono::Utc)),
            "{text}"
        );
    }
    let ran: Vec<chrono::DateTime<chrono::Utc>> = common::read(&e.path("ledger"))
        .lines()
        .map(|l| l.parse().expect("BATON_SLOT is RFC 3339"))
        .collect();
    let logged: Vec<chrono::DateTime<chrono::Utc>> =
        slots.iter().map(|s| s.parse().unwrap()).collect();
    assert!(
        ran.iter().any(|t| logged.contains(t)),
        "a run's BATON_SLOT is among the logged slots: {ran:?} vs {logged:?}"
    );
}

/// A lock-mode run logs one `run ended` line, as a task logs `task
/// ended`: job, slot, the record's task id, outcome, duration and the
/// command's exit code (a failure at `warn` with its error); the
/// command's output lines are JSON too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_mode_runs_log_outcome_duration_and_exit_code() {
    let Some(e) = Env::new(common::Kind::Sqlite).await else {
        return;
    };
    std::fs::write(
        e.path("baton.toml"),
        r#"
[[job]]
name = "sync"
every = "1s"
mode = "lock"
at_most = "30s"
command = ["sh", "-c", "echo syncing; exit 4"]
"#,
    )
    .unwrap();
    let text = serve_json_until(&e, "a lock-mode run to end", |log| {
        log.contains("run ended")
    });
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let ended = lines
        .iter()
        .find(|l| l["message"] == "run ended")
        .expect("a run ended line");
    assert_eq!(ended["job"], "sync", "{ended}");
    assert_eq!(ended["outcome"], "failed", "{ended}");
    assert_eq!(ended["exit_code"], 4, "{ended}");
    assert_eq!(ended["level"], "WARN", "{ended}");
    assert!(ended["duration_ms"].is_u64(), "{ended}");
    assert!(ended["task"].is_i64(), "{ended}");
    assert!(
        ended["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("exit 4")),
        "{ended}"
    );
    let slot = ended["slot"].as_str().unwrap_or_default();
    assert!(
        chrono::DateTime::parse_from_rfc3339(slot).is_ok(),
        "{ended}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["target"] == "baton::command" && l["message"] == "syncing"),
        "{text}"
    );
}
