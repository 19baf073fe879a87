//! `baton lock` and `baton locks`, as a user runs them: real processes on
//! every backend.

use crate::common;

use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, wait_for, Env};

per_backend! {
    eight_processes_never_overlap,
    busy_exits_75_and_names_the_holder,
    exit_code_and_environment_pass_through,
    at_least_holds_off_a_second_caller,
    lost_lease_stops_the_command,
    signals_are_forwarded,
    locks_lists_records,
}

const LEDGER_CMD: &str = r#"echo "$BATON_FENCING_TOKEN $(date +%s%N) start" >> ledger; sleep 0.05; echo "$BATON_FENCING_TOKEN $(date +%s%N) end" >> ledger"#;

async fn eight_processes_never_overlap(e: Env) {
    let mut kids = Vec::new();
    for _ in 0..8 {
        let mut c = e.cmd(&[]);
        c.args([
            "lock",
            "ledger",
            "--wait",
            "60s",
            "--at-most",
            "10s",
            "--",
            "sh",
            "-c",
            LEDGER_CMD,
        ]);
        let script = format!("for i in 1 2 3 4 5; do {} || exit 1; done", shell_words(&c));
        kids.push(
            std::process::Command::new("sh")
                .args(["-c", &script])
                .envs(
                    c.get_envs()
                        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
                )
                .current_dir(e.dir.path())
                .spawn()
                .unwrap(),
        );
    }
    for mut k in kids {
        assert!(
            k.wait().unwrap().success(),
            "every round got the lock and ran"
        );
    }
    let text = read(&e.path("ledger"));
    let mut spans: std::collections::BTreeMap<u64, (u128, u128)> = Default::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (tok, t, what) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        let tok: u64 = tok.parse().unwrap();
        let t: u128 = t.parse().unwrap();
        let s = spans.entry(tok).or_insert((0, 0));
        if what == "start" {
            s.0 = t
        } else {
            s.1 = t
        }
    }
    assert_eq!(spans.len(), 40, "40 runs, 40 distinct tokens");
    let mut by_start: Vec<_> = spans.iter().map(|(tok, (s, e))| (*s, *e, *tok)).collect();
    by_start.sort();
    for w in by_start.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "overlap: token {} ran until {} but token {} started at {}",
            w[0].2,
            w[0].1,
            w[1].2,
            w[1].0
        );
        assert!(
            w[0].2 < w[1].2,
            "tokens must rise in run order: {} then {}",
            w[0].2,
            w[1].2
        );
    }
}

fn shell_words(c: &std::process::Command) -> String {
    let mut parts = vec![c.get_program().to_string_lossy().into_owned()];
    parts.extend(c.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts
        .iter()
        .map(|p| format!("'{}'", p.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn busy_exits_75_and_names_the_holder(e: Env) {
    let mut holder = e.spawn(&["lock", "busy", "--", "sh", "-c", "touch started; sleep 3"]);
    wait_for(10, "the holder to start", || e.path("started").exists());
    let t0 = Instant::now();
    let out = e.run(&["lock", "busy", "--", "touch", "should-not-run"]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "no --wait: gives up at once"
    );
    let err = stderr(&out);
    assert!(
        err.contains("held by") && err.contains(":") && err.contains("until"),
        "{err}"
    );
    assert!(!e.path("should-not-run").exists());
    // --wait that runs out: also 75.
    let out = e.run(&[
        "lock",
        "busy",
        "--wait",
        "300ms",
        "--",
        "touch",
        "should-not-run",
    ]);
    assert_eq!(out.status.code(), Some(75));
    // --wait long enough: runs once the holder is done.
    let out = e.run(&[
        "lock",
        "busy",
        "--wait",
        "20s",
        "--",
        "touch",
        "ran-after-wait",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(e.path("ran-after-wait").exists());
    assert!(holder.wait().unwrap().success());
}

async fn exit_code_and_environment_pass_through(e: Env) {
    let out = e.run(&[
        "lock",
        "codes",
        "--at-most",
        "PT15M",
        "--at-least",
        "PT0S",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    let out = e.run(&[
        "lock",
        "codes",
        "--",
        "sh",
        "-c",
        "echo \"$BATON_LOCK_NAME $BATON_FENCING_TOKEN\"",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let s = stdout(&out);
    let mut f = s.split_whitespace();
    assert_eq!(f.next(), Some("codes"));
    assert!(f.next().unwrap().parse::<u64>().unwrap() > 0);
    let out = e.run(&["lock", "codes", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "a signal death maps to 128+N"
    );
    let out = e.run(&["lock", "codes", "--", "no-such-program-x7"]);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no-such-program-x7"),
        "{}",
        stderr(&out)
    );
    std::fs::write(e.path("not-exec"), "#!/bin/sh\n").unwrap(); // mode 0644
    let out = e.run(&["lock", "codes", "--", "./not-exec"]);
    assert_eq!(
        out.status.code(),
        Some(126),
        "not executable: {}",
        stderr(&out)
    );
}

async fn at_least_holds_off_a_second_caller(e: Env) {
    let out = e.run(&[
        "lock",
        "least",
        "--at-most",
        "PT15M",
        "--at-least",
        "2s",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = e.run(&["lock", "least", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "held until granted_at + at_least"
    );
    std::thread::sleep(Duration::from_millis(2_200));
    let out = e.run(&["lock", "least", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "free after at_least: {}",
        stderr(&out)
    );
}

async fn lost_lease_stops_the_command(e: Env) {
    let mut c = e.spawn(&[
        "lock",
        "lost",
        "--at-most",
        "1s",
        "--grace",
        "300ms",
        "--",
        "sh",
        "-c",
        "trap 'echo term > got-term; exit 0' TERM; touch started; while true; do sleep 0.05; done",
    ]);
    wait_for(10, "the command to start", || e.path("started").exists());
    // An operator force-releases the lease and another holder takes it.
    let b = e.ts.store.backend();
    let info = b.lock_get("lost").await.unwrap().unwrap();
    assert!(b
        .lock_release(&baton::store::LockRelease {
            name: "lost",
            token: info.token,
            at_least: Duration::ZERO,
            record: false,
        })
        .await
        .unwrap());
    let locker = baton::lock::Locker::new(e.ts.store.clone());
    let thief = locker
        .try_lock(
            "lost",
            &baton::lock::LockOptions::new(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "baton must stop the command when the lease is lost"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(70));
    assert!(
        !e.path("got-term").exists(),
        "a refused extension means someone else may hold it: SIGKILL at once, no SIGTERM and grace"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("lost"), "{err}");
    thief.release().await.unwrap();
}

async fn signals_are_forwarded(e: Env) {
    let c = e.spawn(&[
        "lock",
        "sig",
        "--",
        "sh",
        "-c",
        "trap 'echo term > got-term; exit 3' TERM; touch started; while true; do sleep 0.05; done",
    ]);
    wait_for(10, "the command to start", || e.path("started").exists());
    signal(&c, libc::SIGTERM);
    let out = c.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "baton exits with the command's code"
    );
    assert_eq!(read(&e.path("got-term")).trim(), "term");
    // The lock was released: the next caller gets it.
    assert_eq!(e.run(&["lock", "sig", "--", "true"]).status.code(), Some(0));
}

async fn locks_lists_records(e: Env) {
    assert_eq!(
        e.run(&[
            "lock",
            "listed",
            "--at-least",
            "1m",
            "--at-most",
            "2m",
            "--",
            "true"
        ])
        .status
        .code(),
        Some(0)
    );
    let out = e.run(&["locks", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = &v.as_array().unwrap()[0];
    assert_eq!(row["name"], "listed");
    assert_eq!(row["state"], "held");
    assert!(row["holder"].as_str().unwrap().contains(':'));
    assert!(row["token"].as_u64().unwrap() > 0);
    let out = e.run(&["locks"]);
    assert!(stdout(&out).contains("listed"));
}

/// Bad input: a one-line error naming the problem, exit 2, nothing run.
#[test]
fn bad_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("b.db").display());
    let long = "n".repeat(256);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["lock", "", "--", "true"], "lock name"),
        (vec!["lock", &long, "--", "true"], "255"),
        (vec!["lock", "a\nb", "--", "true"], "control"),
        (
            vec![
                "lock",
                "x",
                "--at-most",
                "1m",
                "--at-least",
                "2m",
                "--",
                "true",
            ],
            "--at-least",
        ),
        (
            vec!["lock", "x", "--at-most", "0s", "--", "true"],
            "--at-most",
        ),
        (vec!["lock", "x", "--at-most", "15x", "--", "true"], "PT15M"),
        (
            vec![
                "lock",
                "x",
                "--at-most",
                "5s",
                "--grace",
                "5s",
                "--",
                "true",
            ],
            "--grace: 5s is not shorter than --at-most 5s",
        ),
        (
            vec!["lock", "x", "--store", "mongodb://x", "--", "true"],
            "unknown scheme",
        ),
        (vec!["lock", "x"], "required"),
        (
            vec!["enqueue", "--priority", "1000", "--", "true"],
            "priority",
        ),
        (
            vec!["enqueue", "--max-attempts", "0", "--", "true"],
            "max_attempts",
        ),
        (
            vec!["enqueue", "--at", "tomorrow", "--", "true"],
            "RFC 3339",
        ),
    ];
    for (args, needle) in cases {
        let out = std::process::Command::new(common::BATON)
            .args(&args)
            .env("BATON_STORE", &store)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: {err:?} should mention {needle:?}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // An unreachable store is not a usage error: exit 1, one line.
    let out = std::process::Command::new(common::BATON)
        .args([
            "lock",
            "x",
            "--store",
            "postgres://postgres@127.0.0.1:1/none",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
}
