//! `baton enqueue`, `baton work` and `baton tasks`, as a user runs them:
//! real processes on every backend, including a worker killed with -9.

use crate::common;

use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, wait_for, Env, Kind};

per_backend! {
    two_hundred_tasks_survive_a_kill_9,
    repeated_key_gives_one_id,
    unique_scope_flags_scope_the_key,
    unique_hold_until_failed_keeps_a_succeeded_key,
    fails_twice_then_succeeds_on_attempt_3,
    always_failing_ends_failed_with_stderr,
    delay_is_not_started_early,
    sigterm_hands_running_tasks_back,
    frozen_worker_cannot_finish_its_rescued_task,
    max_running_caps_two_worker_processes,
    paused_queue_is_left_alone_by_a_worker_until_resumed,
    resume_from_another_process_starts_idle_workers_within_the_bound,
}

fn enqueue(e: &Env, extra: &[&str], cmd: &[&str]) -> i64 {
    let mut args = vec!["enqueue"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let out = e.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().parse().expect("enqueue prints the id")
}

/// `tasks stats --json` (an array, as `/stats`) keyed by queue.
fn stats(e: &Env) -> serde_json::Value {
    let out = e.run(&["tasks", "stats", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let by_queue: serde_json::Map<String, serde_json::Value> = v
        .as_array()
        .expect("an array")
        .iter()
        .map(|q| (q["queue"].as_str().unwrap().to_string(), q.clone()))
        .collect();
    serde_json::Value::Object(by_queue)
}

fn show(e: &Env, id: i64) -> serde_json::Value {
    let out = e.run(&["tasks", "show", &id.to_string(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn worker(e: &Env, extra: &[&str]) -> std::process::Child {
    let mut args = vec![
        "work",
        "--lease",
        "2s",
        "--poll",
        "200ms",
        "--shutdown-grace",
        "500ms",
        "--grace",
        "500ms",
    ];
    args.extend_from_slice(extra);
    e.spawn_logged(&args)
}

fn wait_state(e: &Env, id: i64, state: &str, secs: u64) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    wait_for(secs, &format!("task {id} to be {state}"), || {
        last = show(e, id);
        last["state"] == state
    });
    last
}

async fn two_hundred_tasks_survive_a_kill_9(e: Env) {
    // Batch-enqueue through the library for speed; the commands are real.
    let q = baton::queue::Queue::new(e.ts.store.clone());
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            baton::queue::TaskBuilder::new("command", serde_json::json!({"argv": ["sh", "-c", format!("sleep 0.{}; echo $BATON_TASK_ID >> done-ids", i % 10)]}))
        })
        .collect();
    q.enqueue_many(tasks).await.unwrap();
    let mut w1 = worker(&e, &["--concurrency", "4"]);
    let mut w2 = worker(&e, &["--concurrency", "4"]);
    let mut w3 = worker(&e, &["--concurrency", "4"]);
    // Kill one worker -9 while it is mid-task (it holds running tasks).
    wait_for(20, "some progress", || {
        common::read(&e.path("done-ids")).lines().count() >= 30
    });
    let mine = format!(":{}:", w2.id());
    let running = baton::store::TaskFilter {
        state: Some(baton::store::TaskState::Running),
        limit: 1000,
        ..Default::default()
    };
    let mut held: Vec<i64> = Vec::new();
    wait_for(20, "the victim to hold a task", || {
        held = futures_lite_block(q.tasks(&running))
            .into_iter()
            .filter(|t| t.worker.as_deref().is_some_and(|w| w.contains(&mine)))
            .map(|t| t.id)
            .collect();
        !held.is_empty()
    });
    signal(&w2, libc::SIGKILL);
    w2.wait().unwrap();
    let t0 = Instant::now();
    // Its tasks complete elsewhere within lease (2 s) + one rescue interval
    // (5 polls of 200 ms) + their run time, with a margin for a busy machine.
    wait_for(20, "the killed worker's tasks to succeed elsewhere", || {
        held.iter().all(|id| show(&e, *id)["state"] == "succeeded")
    });
    let resumed = t0.elapsed();
    assert!(
        resumed < Duration::from_secs(8),
        "the killed worker's tasks took {resumed:?} to finish elsewhere"
    );
    // (One may have finished in the moment before the kill.)
    let mut rescued = 0;
    for id in &held {
        let t = show(&e, *id);
        if t["attempt"] == 2 {
            assert_eq!(t["errors"][0]["error"], "lease expired", "{t}");
            rescued += 1;
        } else {
            assert_eq!(t["attempt"], 1, "{t}");
        }
    }
    assert!(
        rescued > 0,
        "at least one task was taken from the killed worker"
    );
    wait_for(60, "all 200 tasks to succeed", || {
        stats(&e)["default"]["succeeded"] == 200
    });
    eprintln!(
        "{:?}: killed worker's {} task(s) done elsewhere after {resumed:?}; all drained after {:?}",
        e.ts.kind,
        held.len(),
        t0.elapsed()
    );
    let s = stats(&e);
    assert_eq!(s["default"]["failed"], 0);
    assert_eq!(s["default"]["pending"], 0);
    assert_eq!(s["default"]["running"], 0);
    for w in [&mut w1, &mut w3] {
        signal(w, libc::SIGTERM);
        assert_eq!(
            w.wait().unwrap().code(),
            Some(143),
            "workers exit cleanly on SIGTERM, with 128 + SIGTERM"
        );
    }
}

async fn repeated_key_gives_one_id(e: Env) {
    let a = enqueue(&e, &["--key", "report-7"], &["true"]);
    let b = enqueue(&e, &["--key", "report-7"], &["true"]);
    assert_eq!(a, b);
    let out = e.run(&["enqueue", "--key", "report-7", "--json", "--", "true"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["id"], a);
    assert_eq!(v["inserted"], false);
    assert_ne!(enqueue(&e, &["--key", "report-8"], &["true"]), a);
}

/// `--unique-key` with `--unique-scope` and `--unique-by-args`: each scope
/// is its own key, `tasks show` prints the caller's key and scope (not the
/// stored composite), and a scope across queues is refused on Redis with
/// exit 2 naming the field.
async fn unique_scope_flags_scope_the_key(e: Env) {
    let a = enqueue(&e, &["--unique-key", "k"], &["true"]);
    let scoped = ["--unique-key", "k", "--unique-scope", "queue"];
    let b = enqueue(&e, &scoped, &["true"]);
    assert_ne!(a, b, "a queue-scoped key is not the kind-in-queue one");
    assert_eq!(enqueue(&e, &scoped, &["true"]), b);
    let v = show(&e, a);
    assert_eq!(v["unique"]["key"], "k");
    assert_eq!(v["unique"]["scope"], "kind-in-queue");
    assert_eq!(show(&e, b)["unique"]["scope"], "queue");
    let out = e.run(&["tasks", "show", &a.to_string()]);
    let text = stdout(&out);
    assert!(text.contains("k [kind-in-queue]"), "{text}");
    assert!(!text.contains('\u{1f}'), "no raw separators: {text:?}");
    let list = stdout(&e.run(&["tasks", "list"]));
    assert!(
        list.contains("k [queue]") && !list.contains('\u{1f}'),
        "{list}"
    );

    let by_args = |cmd: &[&str]| enqueue(&e, &["--unique-by-args"], cmd);
    let x = by_args(&["echo", "hi"]);
    assert_eq!(by_args(&["echo", "hi"]), x, "the same command");
    assert_ne!(by_args(&["echo", "ho"]), x, "another command");

    let global = |queue: &str| {
        e.run(&[
            "enqueue",
            "--queue",
            queue,
            "--key",
            "g",
            "--unique-scope",
            "global",
            "--",
            "true",
        ])
    };
    let out = global("default");
    if matches!(e.ts.kind, Kind::Redis) {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("unique_scope") && err.contains("Redis") && err.contains("per queue"),
            "{err}"
        );
    } else {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let id: i64 = stdout(&out).trim().parse().unwrap();
        let again = stdout(&global("elsewhere")).trim().parse::<i64>().unwrap();
        assert_eq!(again, id, "global spans queues");
    }
}

/// `--unique-hold until-failed`: the key of a task that succeeded stays
/// taken (enqueueing it again answers that task), the key of one that
/// failed for good is free (a new task); a bad hold is refused with exit 2
/// naming the flag and the accepted values.
async fn unique_hold_until_failed_keeps_a_succeeded_key(e: Env) {
    let hold = |key: &'static str| {
        [
            "--key",
            key,
            "--unique-hold",
            "until-failed",
            "--max-attempts",
            "1",
        ]
    };
    let ok = enqueue(&e, &hold("uf-ok"), &["true"]);
    let bad = enqueue(&e, &hold("uf-bad"), &["false"]);
    let mut w = worker(&e, &[]);
    wait_state(&e, ok, "succeeded", 30);
    wait_state(&e, bad, "failed", 30);
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    assert_eq!(
        enqueue(&e, &hold("uf-ok"), &["true"]),
        ok,
        "succeeded: held"
    );
    let v = show(&e, ok);
    assert_eq!(v["unique_hold"], "until-failed", "{v}");
    assert_eq!(v["unique"]["hold"], "until-failed", "{v}");
    let text = stdout(&e.run(&["tasks", "show", &ok.to_string()]));
    assert!(
        text.contains("uf-ok [kind-in-queue] (until-failed)"),
        "{text}"
    );
    let out = e.run(&["enqueue", "--key", "uf-ok", "--json", "--", "true"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (v["id"].as_i64(), v["inserted"].as_bool()),
        (Some(ok), Some(false))
    );
    assert_ne!(
        enqueue(&e, &hold("uf-bad"), &["false"]),
        bad,
        "failed: freed"
    );
    // Without the hold, a succeeded task's key is free (the default).
    let plain = enqueue(&e, &["--key", "plain", "--max-attempts", "1"], &["true"]);
    let mut w = worker(&e, &[]);
    wait_state(&e, plain, "succeeded", 30);
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    assert_ne!(enqueue(&e, &["--key", "plain"], &["true"]), plain);
    let out = e.run(&[
        "enqueue",
        "--key",
        "k",
        "--unique-hold",
        "always",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--unique-hold") && err.contains("unfinished, until-failed or forever"),
        "{err}"
    );
}

async fn fails_twice_then_succeeds_on_attempt_3(e: Env) {
    let id = enqueue(
        &e,
        &["--max-attempts", "5"],
        &[
            "sh",
            "-c",
            "test \"$BATON_ATTEMPT\" -ge 3 || { echo attempt $BATON_ATTEMPT failed >&2; exit 1; }",
        ],
    );
    let mut w = worker(&e, &[]);
    let t = wait_state(&e, id, "succeeded", 30);
    assert_eq!(t["attempt"], 3);
    assert_eq!(t["errors"].as_array().unwrap().len(), 2);
    assert!(t["errors"][0]["error"]
        .as_str()
        .unwrap()
        .contains("attempt 1 failed"));
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
}

async fn always_failing_ends_failed_with_stderr(e: Env) {
    let id = enqueue(
        &e,
        &["--max-attempts", "2"],
        &[
            "sh",
            "-c",
            "seq 1 300 | sed 's/^/row /'; echo 'disk full on /exports' >&2; exit 4",
        ],
    );
    let mut w = worker(&e, &[]);
    let t = wait_state(&e, id, "failed", 30);
    assert_eq!(t["attempt"], 2);
    let err = t["last_error"].as_str().unwrap();
    // The stderr tail, then stdout's last 1,000 bytes (its end kept, its
    // start cut).
    let (head, out) = err
        .split_once("\nstdout: ")
        .unwrap_or_else(|| panic!("no stdout tail in {t}"));
    assert_eq!(head, "exit 4: disk full on /exports", "{err}");
    assert!(
        out.ends_with("row 300") && !out.contains("row 1\n"),
        "{err}"
    );
    assert!(out.len() <= 1000, "{}", out.len());
    // `tasks show` prints it with the attempt.
    let shown = stdout(&e.run(&["tasks", "show", &id.to_string()]));
    assert!(
        shown.contains("stdout: ") && shown.contains("row 300"),
        "{shown}"
    );
    // The dead letter can be retried.
    let out = e.run(&["tasks", "retry", &id.to_string()]);
    assert_eq!(out.status.code(), Some(0));
    let t = wait_state(&e, id, "failed", 30);
    assert_eq!(t["attempt"], 3);
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
    let out = e.run(&["tasks", "list", "--state", "failed"]);
    assert!(stdout(&out).contains(&id.to_string()));
}

async fn delay_is_not_started_early(e: Env) {
    let mut w = worker(&e, &[]);
    let t0 = Instant::now();
    let id = enqueue(
        &e,
        &["--delay", "2s"],
        &["sh", "-c", "date +%s%N > started-at"],
    );
    let t = wait_state(&e, id, "succeeded", 30);
    let started_ns: u128 = common::read(&e.path("started-at")).trim().parse().unwrap();
    let enq_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        - t0.elapsed().as_nanos();
    assert!(
        started_ns >= enq_ns + 1_900_000_000,
        "started {} ms after enqueue",
        (started_ns - enq_ns) / 1_000_000
    );
    assert_eq!(t["attempt"], 1);
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
}

async fn sigterm_hands_running_tasks_back(e: Env) {
    // `started-N` appears only after the resume check and the trap, so
    // writing `resume-ok` once it exists cannot let attempt 1 succeed.
    let id = enqueue(&e, &["--max-attempts", "1"], &["sh", "-c", "if [ -e resume-ok ]; then exit 0; fi; trap 'exit 1' TERM; touch started-$BATON_ATTEMPT; while true; do sleep 0.05; done"]);
    let mut w1 = worker(&e, &[]);
    wait_for(20, "the task to start", || e.path("started-1").exists());
    std::fs::write(e.path("resume-ok"), "").unwrap();
    let t0 = Instant::now();
    signal(&w1, libc::SIGTERM);
    assert_eq!(w1.wait().unwrap().code(), Some(143));
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "shutdown within the grace period"
    );
    let t = show(&e, id);
    assert_eq!(t["state"], "pending", "handed back");
    assert_eq!(t["attempt"], 0, "without burning its only attempt");
    let mut w2 = worker(&e, &[]);
    let t = wait_state(&e, id, "succeeded", 20);
    assert_eq!(t["attempt"], 1);
    signal(&w2, libc::SIGTERM);
    w2.wait().unwrap();
}

async fn frozen_worker_cannot_finish_its_rescued_task(e: Env) {
    let id = enqueue(
        &e,
        &["--max-attempts", "3"],
        &[
            "sh",
            "-c",
            "echo $BATON_ATTEMPT >> started; sleep 2; echo $BATON_ATTEMPT >> finished",
        ],
    );
    let w1 = e.spawn_logged(&["work", "--lease", "1s", "--poll", "200ms"]);
    wait_for(20, "attempt 1 to start", || {
        common::read(&e.path("started")).lines().count() == 1
    });
    // Freeze the worker (its command keeps running in its own process group).
    signal(&w1, libc::SIGSTOP);
    let mut w2 = e.spawn_logged(&["work", "--lease", "1s", "--poll", "200ms"]);
    let t = wait_state(&e, id, "succeeded", 30);
    assert_eq!(
        t["attempt"], 2,
        "rescued and run again by the live worker: {t}"
    );
    assert_eq!(t["errors"][0]["error"], "lease expired");
    // The frozen worker wakes up: its heartbeat is refused, its result too.
    signal(&w1, libc::SIGCONT);
    std::thread::sleep(std::time::Duration::from_millis(2_500));
    let after = show(&e, id);
    assert_eq!(after["state"], "succeeded");
    assert_eq!(
        after["attempt"], 2,
        "the late attempt-1 result changed nothing: {after}"
    );
    assert_eq!(after["finished_at"], t["finished_at"]);
    let mut w1 = w1;
    signal(&w1, libc::SIGTERM);
    w1.wait().unwrap();
    let log: String = std::fs::read_dir(e.dir.path())
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
        .map(|f| common::read(&f.path()))
        .collect();
    assert!(
        log.contains("lease lost") || log.contains("refused"),
        "the frozen worker learned it lost the claim:\n{log}"
    );
    signal(&w2, libc::SIGTERM);
    w2.wait().unwrap();
}

/// Run a future to completion from a synchronous `wait_for` closure.
fn futures_lite_block<T>(f: impl std::future::Future<Output = Result<T, baton::Error>>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f)).unwrap()
}

/// Two `baton work --concurrency 3 --max-running 2` processes: the
/// commands' own start/end times never show more than 2 running at once,
/// and 2 did run together.
async fn max_running_caps_two_worker_processes(e: Env) {
    const N: usize = 6;
    let script =
        "echo $(date +%s%N) > s-$BATON_TASK_ID; sleep 0.4; echo $(date +%s%N) > e-$BATON_TASK_ID";
    let ids: Vec<i64> = (0..N)
        .map(|_| enqueue(&e, &[], &["sh", "-c", script]))
        .collect();
    let cap = ["--concurrency", "3", "--max-running", "2"];
    let mut ws = [worker(&e, &cap), worker(&e, &cap)];
    for id in &ids {
        wait_state(&e, *id, "succeeded", 60);
    }
    for w in &mut ws {
        signal(w, libc::SIGTERM);
        w.wait().unwrap();
    }
    let t = |p: &str, id: i64| -> u128 {
        common::read(&e.path(&format!("{p}-{id}")))
            .trim()
            .parse()
            .unwrap()
    };
    // Sweep the start (+1) and end (-1) events in time order.
    let mut events: Vec<(u128, i32)> = ids
        .iter()
        .flat_map(|id| [(t("s", *id), 1), (t("e", *id), -1)])
        .collect();
    events.sort();
    let (mut now, mut peak) = (0, 0);
    for (_, d) in events {
        now += d;
        peak = peak.max(now);
    }
    assert_eq!(peak, 2, "never more than 2 at once, and 2 together");
}

/// `baton queues pause` stops a running worker process (another process
/// than the one pausing) from starting the queue's tasks; enqueue still
/// works; `tasks stats --json` shows the flag; `baton queues resume` lets
/// the worker run them. A bad name exits 2 naming the field.
async fn paused_queue_is_left_alone_by_a_worker_until_resumed(e: Env) {
    let out = e.run(&["queues", "pause", "default"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("paused"), "{}", stdout(&out));
    let mut w = worker(&e, &[]);
    let id = enqueue(&e, &[], &["true"]);
    std::thread::sleep(Duration::from_millis(1500)); // several polls
    assert_eq!(show(&e, id)["state"], "pending", "claimed while paused");
    assert_eq!(stats(&e)["default"]["paused"], true);
    let out = e.run(&["queues", "resume", "default"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    wait_state(&e, id, "succeeded", 30);
    assert_eq!(stats(&e)["default"]["paused"], false);
    let out = e.run(&["queues", "pause", "bad\u{1}name"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("QUEUE"), "{}", stderr(&out));
    signal(&w, libc::SIGTERM);
    w.wait().unwrap();
}

/// Idle workers (two processes) on a paused queue with pending tasks; `baton
/// queues resume` from a third process. The tasks start at once where the
/// store carries wake-ups across processes (PostgreSQL, Redis: the poll is
/// made 30 s so that a poll tick cannot pass for a wake-up), and within the
/// poll interval where it does not (SQLite, MySQL) — the bounds docs/GUIDE.md
/// ("Pausing a queue") gives. The slack covers starting the command on a
/// loaded machine.
async fn resume_from_another_process_starts_idle_workers_within_the_bound(e: Env) {
    let cross_process = matches!(e.ts.kind, Kind::Postgres | Kind::Redis);
    let poll = Duration::from_secs(if cross_process { 30 } else { 2 });
    let slack = Duration::from_secs(3);
    let bound = if cross_process { slack } else { poll + slack };
    let out = e.run(&["queues", "pause", "default"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let poll_arg = format!("{}s", poll.as_secs());
    let mut workers: Vec<_> = (0..2)
        .map(|_| {
            e.spawn_logged(&[
                "work",
                "--lease",
                "10s",
                "--poll",
                &poll_arg,
                "--shutdown-grace",
                "500ms",
                "--grace",
                "500ms",
            ])
        })
        .collect();
    let marks: Vec<_> = (0..4).map(|i| e.path(&format!("started-{i}"))).collect();
    let ids: Vec<i64> = marks
        .iter()
        .map(|m| enqueue(&e, &[], &["touch", m.to_str().unwrap()]))
        .collect();
    // Both workers up (subscribed to wake-ups before they say so), and each
    // has claimed the paused queue at least once since: its first tick, or
    // the wake-up the enqueues sent.
    wait_for(60, "both workers to start", || {
        (0..2).all(|n| read(&e.path(&format!("baton-{n}.log"))).contains("worker started"))
    });
    std::thread::sleep(Duration::from_millis(500));
    for &id in &ids {
        assert_eq!(show(&e, id)["state"], "pending", "claimed while paused");
    }
    let out = e.run(&["queues", "resume", "default"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let resumed = Instant::now();
    wait_for(bound.as_secs() + 60, "the resumed tasks to start", || {
        marks.iter().all(|m| m.exists())
    });
    let took = resumed.elapsed();
    assert!(
        took <= bound,
        "the resumed tasks started {took:?} after the resume returned (bound {bound:?}, poll {poll:?})"
    );
    for &id in &ids {
        wait_state(&e, id, "succeeded", 30);
    }
    for w in &workers {
        signal(w, libc::SIGTERM);
    }
    for w in &mut workers {
        w.wait().unwrap();
    }
}
