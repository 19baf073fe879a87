//! Edges a user meets on the second day, as processes: a state conflict
//! has its own exit code, a lock-mode run's record is not retried through
//! the queue, the probes answer while idle sockets hold the admin server,
//! and a Redis database the server lacks is bad input, not "wrong
//! protocol".

use crate::common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{signal, stderr, stdout, wait_for, Env, Kind};

per_backend! {
    state_conflicts_exit_65,
    a_lock_mode_run_is_not_retried_through_the_queue,
    tasks_delete_by_id_and_in_bulk,
    tasks_search_by_key_text_and_time,
}

/// The exit code of a request the task's state does not allow.
const EXIT_CONFLICT: i32 = 65;

async fn state_conflicts_exit_65(e: Env) {
    let out = e.run(&["enqueue", "--delay", "1h", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    // Retrying a pending task: not failed or cancelled.
    let out = e.run(&["tasks", "retry", &id]);
    assert_eq!(out.status.code(), Some(EXIT_CONFLICT), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only a failed or cancelled task can be retried"),
        "{}",
        stderr(&out)
    );
    let out = e.run(&["tasks", "cancel", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Cancelling it again: already finished, as the API's 409.
    let out = e.run(&["tasks", "cancel", &id]);
    assert_eq!(out.status.code(), Some(EXIT_CONFLICT), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already finished"),
        "{}",
        stderr(&out)
    );
    // A task that does not exist is still 66.
    let out = e.run(&["tasks", "cancel", "999999999"]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
}

/// `baton tasks delete`: by id (a pending task goes, a running one is
/// refused with 65, a missing one is 66), or the finished tasks a filter
/// matches — counted without `--yes`, deleted with it; a filter on an
/// unfinished state, or ids with a filter, is bad input (2).
async fn tasks_delete_by_id_and_in_bulk(e: Env) {
    let enqueue = |queue: &str| -> String {
        let out = e.run(&["enqueue", "--queue", queue, "--delay", "1h", "--", "true"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let id = enqueue("default");
    let out = e.run(&["tasks", "delete", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), format!("task {id} deleted"));
    let out = e.run(&["tasks", "show", &id]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    let out = e.run(&["tasks", "delete", &id]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));

    let bulk: Vec<String> = (0..3).map(|_| enqueue("bulk")).collect();
    let kept = enqueue("bulk");
    for id in &bulk {
        let out = e.run(&["tasks", "cancel", id]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = e.run(&["tasks", "delete", "--queue", "bulk"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("3 finished tasks match"),
        "{}",
        stdout(&out)
    );
    let out = e.run(&["tasks", "show", &bulk[0]]);
    assert_eq!(out.status.code(), Some(0), "a count deleted nothing");
    let out = e.run(&["tasks", "delete", "--queue", "bulk", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "deleted 3 finished tasks");
    for id in &bulk {
        assert_eq!(e.run(&["tasks", "show", id]).status.code(), Some(66));
    }
    assert_eq!(e.run(&["tasks", "show", &kept]).status.code(), Some(0));

    for bad in [
        &["tasks", "delete"][..],
        &["tasks", "delete", "--state", "pending"],
        &["tasks", "delete", &kept, "--queue", "bulk"],
    ] {
        let out = e.run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
    }
}

/// `baton tasks list` and `tasks delete` search: by unique or
/// concurrency key, payload text (literally) and enqueue time; a bulk
/// delete takes only what the search matches; bad terms are exit 2,
/// naming the flag.
async fn tasks_search_by_key_text_and_time(e: Env) {
    let enqueue = |extra: &[&str], argv: &[&str]| -> i64 {
        let mut args = vec!["enqueue", "--delay", "1h"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(argv);
        let out = e.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out).trim().parse().unwrap()
    };
    let alice = enqueue(
        &["--unique-key", "order:7"],
        &["notify", "alice@example.com"],
    );
    let bob = enqueue(
        &["--concurrency-key", "customer:42"],
        &["notify", "bob@example.com"],
    );
    let list = |terms: &[&str]| -> Vec<i64> {
        let mut args = vec!["tasks", "list", "--json"];
        args.extend_from_slice(terms);
        let out = e.run(&args);
        assert_eq!(out.status.code(), Some(0), "{terms:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(list(&["--text", "alice@"]), [alice]);
    assert_eq!(list(&["--key", "order:7"]), [alice]);
    assert_eq!(list(&["--key", "customer:42"]), [bob]);
    assert_eq!(list(&["--kind", "command", "--since", "1h"]), [bob, alice]);
    assert_eq!(list(&["--until", "1h"]), Vec::<i64>::new());
    assert_eq!(list(&["--text", "carol"]), Vec::<i64>::new());

    for id in [alice, bob] {
        let out = e.run(&["tasks", "cancel", &id.to_string()]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = e.run(&["tasks", "delete", "--text", "alice", "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "deleted 1 finished tasks");
    assert_eq!(list(&[]), [bob]);
    // The CLI's changes are in the audit log, newest first, from the cli.
    let out = e.run(&["audit", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let seen: Vec<(String, String, String)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap().to_string();
            assert_eq!(f("source"), "cli", "{r}");
            (f("action"), f("target"), f("outcome"))
        })
        .collect();
    let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
    assert_eq!(
        seen,
        [
            s("tasks delete (bulk)", "text=alice", "deleted 1"),
            s("tasks cancel", &format!("id={bob}"), "cancelled"),
            s("tasks cancel", &format!("id={alice}"), "cancelled"),
        ]
    );

    for (bad, flag) in [
        (&["tasks", "list", "--since", "yesterday"][..], "--since"),
        (
            &["tasks", "list", "--since", "1h", "--until", "2h"],
            "--since",
        ),
        (&["tasks", "list", "--text", ""], "text"),
    ] {
        let out = e.run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(flag), "{bad:?}: {}", stderr(&out));
    }
}

async fn a_lock_mode_run_is_not_retried_through_the_queue(e: Env) {
    std::fs::write(
        e.path("baton.toml"),
        r#"
[[job]]
name = "daemon-runner"
every = "1s"
mode = "lock"
at_most = "10s"
command = ["sh", "-c", "exit 3"]
"#,
    )
    .unwrap();
    let mut serve = e.spawn_logged(&["serve", "--config", "baton.toml"]);
    // A failed run's record: exactly what an operator would try to retry.
    let mut id = None;
    wait_for(20, "a failed lock-mode run", || {
        let out = e.run(&[
            "tasks",
            "list",
            "--job",
            "daemon-runner",
            "--state",
            "failed",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        id = v[0]["id"].as_i64();
        id.is_some()
    });
    signal(&serve, libc::SIGTERM);
    let _ = serve.wait();
    let id = id.unwrap().to_string();
    let out = e.run(&["tasks", "retry", &id]);
    assert_eq!(out.status.code(), Some(EXIT_CONFLICT), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("record of a lock-mode run"),
        "{}",
        stderr(&out)
    );
    // And it stayed as it was.
    let out = e.run(&["tasks", "show", &id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["state"], "failed", "{v}");
}

/// `GET path` on a fresh connection; the status line and how long it took.
fn probe(addr: &str, path: &str) -> (String, Duration) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    let line = String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    (line, t.elapsed())
}

/// 300 connections that never send a request (more than the server's
/// 256 connection slots) do not keep `/livez` and `/readyz` waiting: the
/// oldest request-less one is closed to make room. Before, a probe waited
/// for the 10 s header timeout of the sockets ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_while_half_open_sockets_hold_the_server() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let mut work = e.spawn_logged(&["work", "--listen", "127.0.0.1:0"]);
    let addr = common::admin_addr(20, || e.logs());
    let held: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for path in ["/livez", "/readyz", "/livez"] {
        let (line, took) = probe(&addr, path);
        assert!(line.contains(" 200 "), "{path}: {line:?}");
        assert!(
            took < Duration::from_secs(2),
            "{path} took {took:?} behind 300 half-open sockets"
        );
    }
    // A request head over the documented 64 KiB is refused, not buffered.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let big = "a".repeat(112 * 1024);
    let _ = write!(s, "GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    drop(held);
    signal(&work, libc::SIGTERM);
    let _ = work.wait();
}

/// `redis://host/99` on a server with 16 databases: bad input (exit 2)
/// naming the database, not "wrong protocol".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_database_the_server_lacks_is_bad_input() {
    let Some(e) = Env::new(Kind::Redis).await else {
        return;
    };
    let base = e.ts.url.split('?').next().unwrap().trim_end_matches('/');
    let base = match base.rsplit_once('/') {
        Some((head, db)) if db.chars().all(|c| c.is_ascii_digit()) && head.contains("://") => {
            head.to_string()
        }
        _ => base.to_string(),
    };
    let url = format!("{base}/99");
    let out = e.run(&["tasks", "list", "--store", &url]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("has no database \"99\""), "{err}");
    assert!(!err.contains("wrong protocol"), "{err}");
}
