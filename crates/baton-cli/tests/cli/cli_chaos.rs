//! `baton chaos` end to end: a safe workload under faults on each store
//! exits 0 with zero violations and a faults table; the `--unsafe`
//! workload (no fencing, no lock, tasks run twice, keys not unique, no
//! per-key cap or rate limit at the workers) must make the checker report
//! violations and exit non-zero. A short keyed, rated run per store shows
//! the per-key cap (T5) and the rate limit (T6) hold under the faults.

use crate::common;

use common::{stdout, BATON};
use std::process::{Command, Output};

fn chaos(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BATON)
        .arg("chaos")
        .args(args)
        .arg("--dir")
        .arg(dir.path())
        .env("BATON_LOG", "warn")
        .output()
        .expect("baton chaos runs");
    eprintln!("{}\n{}", stdout(&out), common::stderr(&out));
    out
}

/// The VIOLATIONS count of an invariant's row in the table.
fn violations(out: &str, inv: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(inv)).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {inv} row in:\n{out}"))
}

fn assert_clean(out: &Output, faults: &[&str]) {
    assert_clean_with_runs(out, faults, 2)
}

/// [`assert_clean`], with each job whose runs outlast their interval run
/// at least `runs` times. The 8-second keyed runs below check T5/T6/T8 and
/// ask one run (under their faults a 1-run `chaos-cancel` came in ~1 of 4
/// runs, before and after session 29's change alike); the longer runs
/// (here and CI's 60-second chaos step) hold S2 to two.
fn assert_clean_with_runs(out: &Output, faults: &[&str], runs: u64) {
    let text = stdout(out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "violations or an error:\n{text}"
    );
    for inv in ["L1", "L2", "T1", "T2", "T3", "T4", "S1", "S2"] {
        assert_eq!(violations(&text, inv), 0, "{inv}:\n{text}");
    }
    // The jobs whose runs outlast their interval ran (S2 had runs to hold
    // apart: buffer_one waits for the running one, cancel_other stops it).
    for job in ["chaos-buffer", "chaos-cancel"] {
        let n = op(&text, &format!("S2: runs of {job}"));
        assert!(n >= runs, "{job} ran {n} times:\n{text}");
    }
    assert!(text.contains("TOTAL VIOLATIONS 0"), "{text}");
    for f in faults {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(f)),
            "no {f} fault in the table:\n{text}"
        );
    }
    // The workload did run: every kind of effect is in the table.
    for e in [
        "effects: lock",
        "effects: task",
        "effects: job",
        "effects: lockjob",
    ] {
        assert!(text.contains(e), "no {e:?}:\n{text}");
    }
}

#[test]
fn sqlite_safe_workload_has_no_violations() {
    let out = chaos(&["--private", "sqlite", "--duration", "20s", "--seed", "1"]);
    assert_clean(&out, &["kill-9", "pause"]);
}

/// The per-key cap, rate limit and rate per key of the keyed runs below.
const LIMITS: [&str; 8] = [
    "--keys",
    "3",
    "--per-key-max-running",
    "1",
    "--rate",
    "4/1s",
    "--per-key-rate",
    "2/1s",
];

/// A keyed, rated run is clean, and the cap and limits were reached (the
/// most of one key running at once is the cap; some period held the
/// limit's 4 starts, and one key's 2), so the checks had something to
/// check.
fn assert_clean_keyed(out: &Output, faults: &[&str]) {
    assert_clean_with_runs(out, faults, 1);
    let text = stdout(out);
    for inv in ["T5", "T6", "T8"] {
        assert_eq!(violations(&text, inv), 0, "{inv}:\n{text}");
    }
    assert_eq!(op(&text, "T5: most of one key running"), 1, "{text}");
    assert_eq!(op(&text, "T6: most starts in one period"), 4, "{text}");
    assert_eq!(
        op(&text, "T8: most starts of one key in one period"),
        2,
        "{text}"
    );
}

/// The count of an OPERATIONS line.
fn op(out: &str, what: &str) -> u64 {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(what)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {what:?} line in:\n{out}"))
}

#[test]
fn sqlite_keyed_rated_workload_has_no_violations() {
    let mut args = vec!["--private", "sqlite", "--duration", "8s", "--seed", "5"];
    args.extend(LIMITS);
    let out = chaos(&args);
    assert_clean_keyed(&out, &["kill-9"]);
}

/// A keyed, rated run on the shared server of `kind`, under a prefix of
/// its own, through the fault proxy.
fn shared_keyed_rated_run(kind: common::Kind, seed: &str) {
    if let Some(out) = shared_keyed_run(kind, seed, &LIMITS) {
        assert_clean_keyed(&out, &[]);
    }
}

/// A keyed run with `limits` on the shared server of `kind`, under a
/// prefix of its own, through the fault proxy (`None`: no server).
fn shared_keyed_run(kind: common::Kind, seed: &str, limits: &[&str]) -> Option<Output> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ts = rt.block_on(common::harness::connect(kind))?;
    let mut args = vec![
        "--store",
        &ts.url,
        "--prefix",
        &ts.prefix,
        "--duration",
        "8s",
        "--seed",
        seed,
        "--faults",
        "kill-9,pause,cut,dark,latency",
    ];
    args.extend(limits);
    Some(chaos(&args))
}

#[test]
fn postgres_keyed_rated_workload_has_no_violations() {
    shared_keyed_rated_run(common::Kind::Postgres, "6");
}

/// A rate per key alone: PostgreSQL's claims then take each walked key's
/// own lock instead of the queue's (DESIGN T6, "PostgreSQL's turn is per
/// key"), so that path runs under the faults too (a claimer killed, paused
/// or cut while it holds key locks): clean, with one key's 2 starts in a
/// period reached. The race the key locks close needs claims of one key
/// at the same instant, which this slow workload seldom makes (without the
/// locks it still passed 2 of 2); `key_rate_holds_in_every_window_under_16_racing_claimers`
/// catches that.
#[test]
fn postgres_key_rate_alone_workload_has_no_violations() {
    let limits = ["--keys", "3", "--per-key-rate", "2/1s"];
    let Some(out) = shared_keyed_run(common::Kind::Postgres, "9", &limits) else {
        return;
    };
    assert_clean_with_runs(&out, &[], 1);
    let text = stdout(&out);
    assert_eq!(violations(&text, "T8"), 0, "{text}");
    assert_eq!(
        op(&text, "T8: most starts of one key in one period"),
        2,
        "{text}"
    );
}

#[test]
fn redis_keyed_rated_workload_has_no_violations() {
    shared_keyed_rated_run(common::Kind::Redis, "7");
}

#[test]
fn mysql_keyed_rated_workload_has_no_violations() {
    shared_keyed_rated_run(common::Kind::Mysql, "8");
}

#[test]
fn bad_limit_flags_exit_2_naming_the_flag() {
    for (args, flag) in [
        (&["--rate", "0/1s"][..], "--rate"),
        (&["--rate", "fast"][..], "--rate"),
        (&["--keys", "0"][..], "--keys"),
        (
            &["--keys", "2", "--per-key-max-running", "0"][..],
            "--per-key-max-running",
        ),
        (&["--per-key-max-running", "1"][..], "--keys"),
        (&["--per-key-rate", "2/1s"][..], "--keys"),
        (
            &["--keys", "2", "--per-key-rate", "0/1s"][..],
            "--per-key-rate",
        ),
    ] {
        let out = Command::new(BATON)
            .arg("chaos")
            .args(["--private", "sqlite"])
            .args(args)
            .output()
            .unwrap();
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

#[test]
fn sqlite_unsafe_workload_is_caught() {
    // The workers run without the per-key cap and rate limit; the checker
    // still holds the run to them.
    let mut args = vec![
        "--private",
        "sqlite",
        "--duration",
        "10s",
        "--seed",
        "1",
        "--unsafe",
    ];
    args.extend(LIMITS);
    let out = chaos(&args);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("VIOLATIONS FOUND"), "{text}");
    // Each hole the unsafe workload opens is seen by its own check.
    for inv in ["L1", "L2", "T2", "T4", "T5", "T6", "T8", "S1", "S2"] {
        assert!(violations(&text, inv) > 0, "{inv} not caught:\n{text}");
    }
}

#[test]
fn postgres_safe_workload_has_no_violations() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The shared server, under a prefix of the test's own.
    let Some(ts) = rt.block_on(common::harness::connect(common::Kind::Postgres)) else {
        return;
    };
    let out = chaos(&[
        "--store",
        &ts.url,
        "--prefix",
        &ts.prefix,
        "--duration",
        "20s",
        "--seed",
        "2",
        // Fixed, so the seeded schedule does not depend on whether
        // libfaketime is installed (skew is dropped without it).
        "--faults",
        "kill-9,pause,cut,dark,latency",
    ]);
    assert_clean(&out, &["kill-9", "pause"]);
}

#[test]
fn redis_private_safe_workload_has_no_violations() {
    if !common::have("redis-server", which("redis-server")) {
        return;
    }
    let out = chaos(&[
        "--private",
        "redis",
        "--duration",
        "20s",
        "--seed",
        "3",
        "--faults",
        "kill-9,pause,cut,dark,latency,restart",
    ]);
    assert_clean(&out, &["kill-9", "pause"]);
}

#[test]
fn mysql_private_safe_workload_has_no_violations() {
    // A private `mariadbd` of the run's own, so `restart` can crash it.
    if !common::have("mariadbd", which("mariadbd") || which("/usr/sbin/mariadbd")) {
        return;
    }
    let out = chaos(&[
        "--private",
        "mysql",
        "--duration",
        "30s",
        "--seed",
        "4",
        // Three kinds, so that one round (each kind once) fits in the run
        // even on a loaded machine; the proxy's faults are in CI's
        // 60-second run (scripts/chaos-ci.sh).
        "--faults",
        "kill-9,pause,restart",
    ]);
    assert_clean(&out, &["kill-9", "pause", "restart"]);
}

fn which(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .is_ok_and(|o| o.status.success())
}
