//! Debounce and throttle (issue 25 item 3) as a user runs them: `baton
//! enqueue --debounce` answers the same pending task with the new command,
//! `--throttle` refuses within the period after the key's last start
//! (exit 75, the instant it is accepted again), and bad periods are
//! refused naming the flag's field.

use crate::common;

use baton::queue::Queue;
use common::{signal, stderr, stdout, wait_for, Env};

per_backend! {
    enqueue_debounce_and_throttle,
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

async fn enqueue_debounce_and_throttle(e: Env) {
    // Debounce: the first enqueue inserts, the second changes that task.
    let db = |extra: &[&str], word: &str| {
        let mut a = vec![
            "enqueue",
            "--queue",
            "dq",
            "--key",
            "doc:7",
            "--debounce",
            "5s",
        ];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "echo", word]);
        e.run(&a)
    };
    let first = db(&["--json"], "v1");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let v = json(&first);
    assert_eq!(
        (v["inserted"].as_bool(), v["outcome"].as_str()),
        (Some(true), Some("inserted")),
        "{v}"
    );
    let id = v["id"].as_i64().unwrap();
    let second = db(&[], "v2");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(stdout(&second).trim(), id.to_string());
    let err = stderr(&second);
    assert!(
        err.contains("debounced") && err.contains(&format!("task {id}")) && err.contains("5s"),
        "{err}"
    );
    let q = Queue::new(e.ts.store.clone());
    let t = q.task(id).await.unwrap().unwrap();
    assert_eq!(
        t.payload["argv"],
        serde_json::json!(["echo", "v2"]),
        "{t:?}"
    );
    let third = db(&["--json"], "v3");
    let v = json(&third);
    assert_eq!(
        (v["id"].as_i64(), v["outcome"].as_str()),
        (Some(id), Some("debounced")),
        "{v}"
    );

    // Throttle: inserted, run once, then refused with exit 75 and `until`.
    let th = |extra: &[&str]| {
        let mut a = vec![
            "enqueue",
            "--queue",
            "tq",
            "--key",
            "digest",
            "--throttle",
            "1h",
        ];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "true"]);
        e.run(&a)
    };
    let out = th(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let tid: i64 = stdout(&out).trim().parse().unwrap();
    // A worker runs it (the key's start).
    let mut w = e.spawn_logged(&[
        "work",
        "--queue",
        "tq",
        "--poll",
        "200ms",
        "--shutdown-grace",
        "500ms",
        "--grace",
        "500ms",
    ]);
    wait_for(30, "the throttled key's task to succeed", || {
        let out = e.run(&["tasks", "show", &tid.to_string(), "--json"]);
        json(&out)["state"] == "succeeded"
    });
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    let out = th(&["--json"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "throttled is busy: {}",
        stderr(&out)
    );
    let v = json(&out);
    assert_eq!(
        (
            v["id"].as_i64(),
            v["inserted"].as_bool(),
            v["outcome"].as_str()
        ),
        (Some(tid), Some(false), Some("throttled")),
        "{v}"
    );
    let until: chrono::DateTime<chrono::Utc> = v["until"].as_str().unwrap().parse().unwrap();
    let started = q.task(tid).await.unwrap().unwrap().started_at.unwrap();
    let gap = until - started;
    assert!(
        gap > chrono::Duration::minutes(59) && gap <= chrono::Duration::hours(1),
        "{until} {started}"
    );
    let err = stderr(&out);
    assert!(
        err.contains("throttled") && err.contains("1h") && err.contains("accepted again"),
        "{err}"
    );

    // Bad input: exit 2 naming the field; nothing is enqueued.
    for (args, want) in [
        (vec!["--key", "k", "--debounce", "0s"], "debounce"),
        (vec!["--key", "k", "--debounce", "40d"], "debounce"),
        (vec!["--debounce", "5s"], "debounce"),
        (vec!["--key", "k", "--throttle", "0s"], "throttle"),
        (vec!["--throttle", "1h"], "throttle"),
        (
            vec!["--key", "k", "--debounce", "5s", "--delay", "1s"],
            "--debounce",
        ),
        (
            vec!["--key", "k", "--debounce", "5s", "--throttle", "1h"],
            "--debounce",
        ),
    ] {
        let mut a = vec!["enqueue", "--queue", "bad"];
        a.extend_from_slice(&args);
        a.extend_from_slice(&["--", "true"]);
        let out = e.run(&a);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
    }
}
