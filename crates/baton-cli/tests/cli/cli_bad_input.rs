//! The bad-input catalogue: every case runs the real `baton` binary with
//! one malformed input (a CLI flag, a config file, a cron expression, a
//! duration, a name, a payload size or a store URL) and expects its exit
//! code and a one-line error naming the field and the accepted form. Each
//! refused case must leave the store as it was: the tasks, locks and jobs
//! are counted before and after, on every backend.
//!
//! The HTTP admin API has its own catalogue (`*_http_catalogue`): each
//! malformed request to `baton serve --listen` must get its status code and
//! a one-line JSON error naming the field and the accepted form, and leave
//! the store as it was.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton::queue::Queue;
use baton::store::TaskFilter;
use common::{harness, Kind, BATON};

/// One malformed input and the error it must get.
struct Case {
    /// What is wrong (for the failure message).
    what: &'static str,
    /// `baton` arguments; `{cfg}` is the path of a file holding `config`.
    args: Vec<String>,
    /// The config file's text, for `{cfg}`.
    config: Option<String>,
    /// The exit code: 2 for bad input, 66 for a name that does not exist,
    /// 1 for an environment fault (a missing directory).
    code: i32,
    /// Substrings of the error line: the field and the accepted form.
    want: Vec<&'static str>,
}

fn case(what: &'static str, args: &[&str], code: i32, want: &[&'static str]) -> Case {
    Case {
        what,
        args: args.iter().map(|s| s.to_string()).collect(),
        config: None,
        code,
        want: want.to_vec(),
    }
}

/// `baton serve --config FILE` with `toml` in FILE.
fn config(what: &'static str, toml: &str, want: &[&'static str]) -> Case {
    Case {
        what,
        args: vec!["serve".into(), "--config".into(), "{cfg}".into()],
        config: Some(toml.to_string()),
        code: 2,
        want: want.to_vec(),
    }
}

/// A config file with one job whose schedule lines are `schedule`.
fn job(schedule: &str) -> String {
    format!("[[job]]\nname = \"a\"\n{schedule}\ncommand = [\"true\"]\n")
}

const OK_JOB: &str = "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = [\"true\"]\n";
const DURATION_FORM: &str = "use a number with a unit (500ms, 30s, 15m, 1h30m, 2d)";
const CRON_FORM: &str = "use 5 fields (minute hour day-of-month month day-of-week";

fn catalogue() -> Vec<Case> {
    let n300 = "n".repeat(300);
    let k2000 = "k".repeat(2000);
    let p40 = "p".repeat(40);
    let big = format!(
        "[[job]]\nname = \"big\"\nevery = \"1m\"\ncommand = [\"sh\", \"-c\", \"{}\"]\n",
        "x".repeat(baton::queue::MAX_PAYLOAD_BYTES + 1)
    );
    let mut v = vec![
        // --- CLI flags: names ---
        case(
            "empty queue name",
            &["enqueue", "--queue", "", "--", "true"],
            2,
            &["queue: is empty", "1 to 255 bytes"],
        ),
        case(
            "queue control char",
            &["enqueue", "--queue", "q\u{1}", "--", "true"],
            2,
            &["queue: contains the control character", "printable text"],
        ),
        case(
            "empty lock name",
            &["lock", "", "--", "true"],
            2,
            &["lock name: is empty", "1 to 255 bytes"],
        ),
        case(
            "lock name newline",
            &["lock", "a\nb", "--", "true"],
            2,
            &[
                "lock name: contains the control character",
                "printable text",
            ],
        ),
        case(
            "empty work queue",
            &["work", "--queue", ""],
            2,
            &["queue: is empty", "1 to 255 bytes"],
        ),
        // --- CLI flags: keys and numbers ---
        case(
            "empty key",
            &["enqueue", "--key", "", "--", "true"],
            2,
            &["unique key: is 0 bytes", "use 1 to 1024 bytes"],
        ),
        case(
            "key with a control character",
            &["enqueue", "--unique-key", "a\u{1f}b", "--", "true"],
            2,
            &["unique key:", "control character"],
        ),
        case(
            "unknown unique scope",
            &["enqueue", "--key", "k", "--unique-scope", "store", "--", "true"],
            2,
            &["--unique-scope", "use kind-in-queue, queue, kind or global"],
        ),
        case(
            "unique hold without a key",
            &["enqueue", "--unique-hold", "until-failed", "--", "true"],
            2,
            &["--unique-hold: applies to a unique key", "--key"],
        ),
        case(
            "unique hold and --key-forever",
            &["enqueue", "--key", "k", "--key-forever", "--unique-hold", "forever", "--", "true"],
            2,
            &["--key-forever", "--unique-hold", "cannot be used with"],
        ),
        case(
            "unique scope without a key",
            &["enqueue", "--unique-scope", "queue", "--", "true"],
            2,
            &["--unique-scope: applies to a unique key", "--key"],
        ),
        case(
            "unique period under a second",
            &["enqueue", "--unique-period", "10ms", "--", "true"],
            2,
            &["unique_period:", "use 1s to 10 years"],
        ),
        case(
            "empty concurrency key",
            &["enqueue", "--concurrency-key", "", "--", "true"],
            2,
            &["concurrency_key: is 0 bytes", "use 1 to 255 bytes"],
        ),
        case(
            "concurrency key with a control character",
            &["enqueue", "--concurrency-key", "a\u{1}b", "--", "true"],
            2,
            &["concurrency_key:", "control character"],
        ),
        case(
            "zero per-key cap",
            &["work", "--per-key-max-running", "0"],
            2,
            &["--per-key-max-running", "0 is not in 1.."],
        ),
        case(
            "zero rate",
            &["work", "--rate", "0/1m"],
            2,
            &["--rate", "\"0/1m\"", "out of range", "STARTS/PERIOD"],
        ),
        case(
            "rate period of zero",
            &["work", "--rate", "10/0s"],
            2,
            &["--rate", "period must be at least 1ms", "STARTS/PERIOD"],
        ),
        case(
            "zero per-key rate",
            &["work", "--per-key-rate", "0/1m"],
            2,
            &["--per-key-rate", "\"0/1m\"", "out of range", "STARTS/PERIOD"],
        ),
        case(
            "per-key rate period of zero",
            &["work", "--per-key-rate", "10/0s"],
            2,
            &["--per-key-rate", "period must be at least 1ms"],
        ),
        case(
            "malformed rate",
            &["work", "--rate", "10 per minute"],
            2,
            &["--rate", "is not a rate", "e.g. 100/1m"],
        ),
        case(
            "slot-shaped key",
            &["enqueue", "--key", "job|2026-01-01T00:00:00Z", "--", "true"],
            2,
            &["unique key", "reserved for scheduled slots"],
        ),
        case(
            "priority too high",
            &["enqueue", "--priority", "101", "--", "true"],
            2,
            &["--priority", "whole number from -100 to 100"],
        ),
        case(
            "priority not a number",
            &["enqueue", "--priority", "abc", "--", "true"],
            2,
            &["--priority", "whole number from -100 to 100"],
        ),
        case(
            "zero attempts",
            &["enqueue", "--max-attempts", "0", "--", "true"],
            2,
            &["max_attempts: 0 is out of range", "use 1 to 10000"],
        ),
        case(
            "attempts overflow",
            &["enqueue", "--max-attempts", "99999999999", "--", "true"],
            2,
            &["--max-attempts", "whole number from 1 to 10000"],
        ),
        case(
            "zero concurrency",
            &["work", "--concurrency", "0"],
            2,
            &["--concurrency", "whole number from 1 to 10000"],
        ),
        case(
            "task id not a number",
            &["tasks", "show", "abc"],
            2,
            &["<ID>", "is not a task id", "e.g. 42"],
        ),
        case(
            "task id zero",
            &["tasks", "cancel", "0"],
            2,
            &["<ID>", "is not a task id"],
        ),
        case(
            "unknown task",
            &["tasks", "show", "999999"],
            66,
            &["no task 999999"],
        ),
        case(
            "unknown state",
            &["tasks", "list", "--state", "bogus"],
            2,
            &[
                "--state",
                "use pending, running, succeeded, failed or cancelled",
            ],
        ),
        case(
            "zero limit",
            &["tasks", "list", "--limit", "0"],
            2,
            &["--limit", "1..=10000"],
        ),
        case(
            "unknown job to pause",
            &["jobs", "pause", "nosuch"],
            66,
            &["no job \"nosuch\""],
        ),
        // --- CLI flags: durations and times ---
        case(
            "duration without unit",
            &["enqueue", "--delay", "5x", "--", "true"],
            2,
            &["--delay", "\"5x\" is not a duration", DURATION_FORM],
        ),
        case(
            "empty duration",
            &["enqueue", "--delay", "", "--", "true"],
            2,
            &["--delay", "is not a duration", DURATION_FORM],
        ),
        case(
            "duration too long",
            &["enqueue", "--delay", "99999d", "--", "true"],
            2,
            &["--delay", "at most 10 years"],
        ),
        case(
            "unknown unit",
            &["enqueue", "--timeout", "1y", "--", "true"],
            2,
            &["--timeout", "is not a duration", DURATION_FORM],
        ),
        case(
            "zero timeout",
            &["enqueue", "--timeout", "0s", "--", "true"],
            2,
            &["timeout: must be greater than 0"],
        ),
        case(
            "bad month",
            &["enqueue", "--at", "2026-13-01", "--", "true"],
            2,
            &["--at", "is not an RFC 3339 time like 2026-01-31T06:00:00Z"],
        ),
        case(
            "time without zone",
            &["enqueue", "--at", "2026-01-01T00:00:00", "--", "true"],
            2,
            &["--at", "RFC 3339"],
        ),
        case(
            "zero at-most",
            &["lock", "x", "--at-most", "0s", "--", "true"],
            2,
            &["--at-most: must be greater than 0"],
        ),
        case(
            "grace not under at-most",
            &[
                "lock",
                "x",
                "--at-most",
                "5s",
                "--grace",
                "10s",
                "--",
                "true",
            ],
            2,
            &["--grace", "give a --grace shorter than --at-most"],
        ),
        case(
            "wait not a duration",
            &["lock", "x", "--wait", "xyz", "--", "true"],
            2,
            &["--wait", "is not a duration"],
        ),
        case(
            "zero lease",
            &["work", "--lease", "0s"],
            2,
            &["--lease", "too short for a lease; use at least 30ms"],
        ),
        case(
            "lease under the minimum",
            &["work", "--lease", "10ms"],
            2,
            &["--lease", "use at least 30ms"],
        ),
        case(
            "zero poll",
            &["work", "--poll", "0s"],
            2,
            &["--poll", "use at least 10ms"],
        ),
        case(
            "poll of 1ms",
            &["work", "--poll", "1ms"],
            2,
            &["--poll", "use at least 10ms"],
        ),
        case(
            "at-most under a second",
            &["lock", "x", "--at-most", "1ms", "--", "true"],
            2,
            &["--at-most", "too short for a lease; use at least 1s"],
        ),
        case(
            "empty command",
            &["enqueue", "--", ""],
            2,
            &["COMMAND", "names no program"],
        ),
        // --- CLI flags: other commands ---
        case(
            "listen not an address",
            &["serve", "--config", "{cfg}", "--listen", "notanaddress"],
            2,
            &["--listen", "use HOST:PORT, e.g. 127.0.0.1:9090"],
        ),
        case(
            "listen IPv6 without brackets",
            &["serve", "--config", "{cfg}", "--listen", "::1:80"],
            2,
            &["--listen", "in brackets, e.g. [::1]:9090"],
        ),
        case(
            "missing config file",
            &["serve", "--config", "/nonexistent/baton.toml"],
            2,
            &["config: /nonexistent/baton.toml: cannot read"],
        ),
        case(
            "trigger unknown job",
            &["trigger", "nosuch", "--config", "{cfg}"],
            2,
            &["JOB: \"nosuch\" is not a job in"],
        ),
        case(
            "trigger slot not a time",
            &["trigger", "a", "--config", "{cfg}", "--slot", "bogus"],
            2,
            &["--slot", "RFC 3339"],
        ),
        case(
            "trigger off-schedule slot",
            &[
                "trigger",
                "a",
                "--config",
                "{cfg}",
                "--slot",
                "2026-01-01T00:00:30Z",
            ],
            2,
            &["--slot", "is not a slot of job \"a\"", "--any-slot"],
        ),
        case(
            "chaos without a store",
            &["chaos"],
            2,
            &[
                "--store: is missing",
                "--private sqlite|postgres|redis|mysql",
            ],
        ),
        case(
            "chaos unknown private store",
            &["chaos", "--private", "oracle"],
            2,
            &["--private", "use sqlite, postgres, redis, redis-sentinel or mysql"],
        ),
        case(
            "chaos unknown fault",
            &["chaos", "--private", "sqlite", "--faults", "bogus"],
            2,
            &[
                "--faults",
                "kill-9, pause, cut, dark, latency, restart, skew",
            ],
        ),
        // --- store URLs and prefixes ---
        case(
            "unknown scheme",
            &["enqueue", "--store", "ftp://x", "--", "true"],
            2,
            &["store URL \"ftp://x\": unknown scheme", "sqlite://PATH"],
        ),
        case(
            "empty store URL",
            &["enqueue", "--store", "", "--", "true"],
            2,
            &["store URL \"\": unknown scheme", "sqlite://PATH"],
        ),
        case(
            "sqlite without a path",
            &["enqueue", "--store", "sqlite://", "--", "true"],
            2,
            &["no file path", "sqlite://PATH"],
        ),
        case(
            "redis without a host",
            &["enqueue", "--store", "redis://", "--", "true"],
            2,
            &["no host", "redis://HOST[:PORT][/DB]"],
        ),
        case(
            "redis bad port",
            &[
                "enqueue",
                "--store",
                "redis://127.0.0.1:notaport",
                "--",
                "true",
            ],
            2,
            &["redis URL", "invalid port"],
        ),
        case(
            "sqlite directory missing",
            &[
                "enqueue",
                "--store",
                "sqlite:///nonexistent-dir/b.db",
                "--",
                "true",
            ],
            1,
            &["the directory /nonexistent-dir does not exist; create it first"],
        ),
        case(
            "prefix with a space",
            &["enqueue", "--prefix", "bad prefix", "--", "true"],
            2,
            &["prefix \"bad prefix\"", "at most 32 ASCII letters, digits"],
        ),
        // --- config files ---
        config("not TOML", "this is not toml\n", &["line 1, column 6"]),
        config(
            "queue lease of 10ms",
            "[[queue]]\nname = \"q\"\nlease = \"10ms\"\n",
            &["queue \"q\": lease:", "use at least 30ms"],
        ),
        config(
            "NUL byte in a command",
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = [\"echo\", \"a\\u0000b\"]\n",
            &["job \"a\": command:", "element 1 contains a NUL byte"],
        ),
        config(
            "lock job at_most of 1ms",
            "[[job]]\nname = \"a\"\nevery = \"1m\"\nmode = \"lock\"\nat_most = \"1ms\"\ncommand = [\"true\"]\n",
            &["job \"a\": at_most:", "use at least 1s"],
        ),
        config(
            "empty admin token",
            &format!("{OK_JOB}[admin]\ntoken = \"\"\n"),
            &["[admin]: token: is empty", "leave the key out"],
        ),
        config(
            "unknown key",
            "bogus_key = 1\n",
            &[
                "line 1, column 1",
                "unknown field `bogus_key`",
                "expected one of",
            ],
        ),
        config(
            "unknown mode",
            &format!("{OK_JOB}mode = \"sometimes\"\n"),
            &[
                "line 5, column 8",
                "unknown variant `sometimes`",
                "`durable` or `lock`",
            ],
        ),
        config(
            "unknown misfire",
            &format!("{OK_JOB}misfire = \"never\"\n"),
            &["unknown variant `never`", "`latest`, `all`, `none`"],
        ),
        config(
            "no schedule",
            "[[job]]\nname = \"a\"\ncommand = [\"true\"]\n",
            &["job \"a\"", "give exactly one of cron or every"],
        ),
        config(
            "cron and every",
            &job("cron = \"* * * * *\"\nevery = \"1m\""),
            &["job \"a\"", "give exactly one of cron or every"],
        ),
        config(
            "duplicate job",
            &format!("{OK_JOB}{OK_JOB}"),
            &["job \"a\": name: is declared twice"],
        ),
        config(
            "empty job name",
            "[[job]]\nname = \"\"\nevery = \"1m\"\ncommand = [\"true\"]\n",
            &["job #1: name: is empty"],
        ),
        config(
            "empty command",
            "[[job]]\nname = \"a\"\nevery = \"1m\"\ncommand = []\n",
            &["job \"a\": command: is empty", "[\"sh\", \"-c\", \"…\"]"],
        ),
        config(
            "command over the payload limit",
            &big,
            &["job \"big\": command:", "(8 MiB) are accepted"],
        ),
        config(
            "zero queue concurrency",
            "[[queue]]\nname = \"q\"\nconcurrency = 0\n",
            &["queue \"q\": concurrency: 0 is out of range", "1..=10000"],
        ),
        config(
            "zero per-key cap",
            "[[queue]]\nname = \"q\"\nper_key_max_running = 0\n",
            &["queue \"q\": per_key_max_running: 0 is out of range", "1..=10000"],
        ),
        config(
            "malformed queue rate",
            "[[queue]]\nname = \"q\"\nrate = \"fast\"\n",
            &["queue \"q\": rate: \"fast\" is not a rate", "STARTS/PERIOD"],
        ),
        config(
            "queue lease not a duration",
            "[[queue]]\nname = \"q\"\nlease = \"soon\"\n",
            &["queue \"q\": lease:", DURATION_FORM],
        ),
        config(
            "nothing to run",
            "store = \"sqlite://x.db\"\n",
            &["has no [[job]] and no [[queue]]"],
        ),
        config(
            "a good job, then a bad one",
            &format!(
                "{OK_JOB}[[job]]\nname = \"b\"\ncron = \"61 * * * *\"\ncommand = [\"true\"]\n"
            ),
            &["job \"b\": cron:", CRON_FORM],
        ),
        // --- cron expressions and schedules ---
        config(
            "cron minute 61",
            &job("cron = \"61 * * * *\""),
            &[
                "job \"a\": cron: \"61 * * * *\" is not a cron expression",
                CRON_FORM,
            ],
        ),
        config(
            "cron four fields",
            &job("cron = \"* * * *\""),
            &["cron: \"* * * *\" is not a cron expression", CRON_FORM],
        ),
        config(
            "cron step zero",
            &job("cron = \"*/0 * * * *\""),
            &["cron: \"*/0 * * * *\"", CRON_FORM],
        ),
        config(
            "cron never fires",
            &job("cron = \"0 0 31 2 *\""),
            &["cron: \"0 0 31 2 *\" matches no date", CRON_FORM],
        ),
        config(
            "cron word",
            &job("cron = \"@sometimes\""),
            &["cron: \"@sometimes\"", "@hourly / @daily"],
        ),
        config(
            "unknown time zone",
            &job("cron = \"0 9 * * MON\"\ntz = \"Mars/Olympus\""),
            &[
                "tz: \"Mars/Olympus\" is not an IANA time zone",
                "\"Europe/Berlin\"",
            ],
        ),
        config(
            "every zero",
            &job("every = \"0s\""),
            &["every: 0s is too short", "at least 100ms"],
        ),
        config(
            "every not a duration",
            &job("every = \"soon\""),
            &["every: \"soon\" is not a duration", DURATION_FORM],
        ),
    ];
    // Lengths: names, keys, prefixes.
    v.push(Case {
        what: "queue name 300 bytes",
        args: vec![
            "enqueue".into(),
            "--queue".into(),
            n300.clone(),
            "--".into(),
            "true".into(),
        ],
        config: None,
        code: 2,
        want: vec!["queue: is 300 bytes long", "at most 255 bytes"],
    });
    v.push(Case {
        what: "lock name 300 bytes",
        args: vec!["lock".into(), n300, "--".into(), "true".into()],
        config: None,
        code: 2,
        want: vec!["lock name: is 300 bytes long", "at most 255 bytes"],
    });
    v.push(Case {
        what: "concurrency key 300 bytes",
        args: vec![
            "enqueue".into(),
            "--concurrency-key".into(),
            "c".repeat(300),
            "--".into(),
            "true".into(),
        ],
        config: None,
        code: 2,
        want: vec!["concurrency_key: is 300 bytes", "use 1 to 255 bytes"],
    });
    v.push(Case {
        what: "key 2000 bytes",
        args: vec![
            "enqueue".into(),
            "--key".into(),
            k2000,
            "--".into(),
            "true".into(),
        ],
        config: None,
        code: 2,
        want: vec!["unique key: is 2000 bytes", "use 1 to 1024 bytes"],
    });
    v.push(Case {
        what: "prefix 40 bytes",
        args: vec!["locks".into(), "--prefix".into(), p40],
        config: None,
        code: 2,
        want: vec!["--prefix: is 40 bytes long", "at most 32 ASCII letters"],
    });
    v
}

/// What the store holds: task ids with their states, lock names with
/// their tokens, job names.
async fn snapshot(store: &baton::Store) -> (Vec<String>, Vec<String>, Vec<String>) {
    let q = Queue::new(store.clone());
    let tasks = q
        .tasks(&TaskFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .expect("list tasks")
        .iter()
        .map(|t| format!("{} {:?} {}", t.id, t.state, t.attempt))
        .collect();
    let mut locks: Vec<String> = store
        .backend()
        .lock_list()
        .await
        .expect("list locks")
        .iter()
        .map(|l| format!("{} {}", l.name, l.token.0))
        .collect();
    locks.sort();
    let mut jobs: Vec<String> = store
        .backend()
        .job_list()
        .await
        .expect("list jobs")
        .iter()
        .map(|j| j.name.clone())
        .collect();
    jobs.sort();
    (tasks, locks, jobs)
}

/// A case's exit code, stdout and stderr.
type Output = (Option<i32>, String, String);

/// Run `baton ARGS` against `ts`, killed if it is still running after 30 s
/// (a case that was not refused may run for ever: `work`, `serve`).
fn run(ts: &common::TestStore, dir: &std::path::Path, args: &[String]) -> Output {
    let mut child = Command::new(BATON)
        .args(args)
        .env("BATON_STORE", &ts.url)
        .env("BATON_PREFIX", &ts.prefix)
        .env("BATON_LOG", "warn")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("baton starts");
    common::wait_or_kill(&mut child, Duration::from_secs(30));
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The error line: the last `baton: …` line that is not a warning, or
/// clap's `error: …` line.
fn error_line(stderr: &str) -> Option<&str> {
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .or_else(|| {
            stderr
                .lines()
                .rev()
                .find(|l| l.starts_with("baton: ") && !l.starts_with("baton: warning:"))
        })
}

async fn catalogue_on(kind: Kind) {
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Something in the store to stay as it is: a task, a lock, a job.
    let q = Queue::new(ts.store.clone());
    q.enqueue(baton::queue::TaskBuilder::new(
        "seed",
        serde_json::json!({}),
    ))
    .await
    .unwrap();
    let opts = baton::lock::LockOptions::new(Duration::from_secs(10));
    let lease = baton::lock::Locker::new(ts.store.clone())
        .try_lock("seed-lock", &opts)
        .await
        .unwrap()
        .expect("the seed lock is free");
    lease.release().await.unwrap();
    let cases = catalogue();
    assert!(cases.len() >= 40, "the catalogue has {} cases", cases.len());
    // The cases run side by side, each in a directory of its own; the
    // store is compared before and after them all, and only if it changed
    // are they run again one by one to name the case that changed it.
    let before = snapshot(&ts.store).await;
    let outputs = run_side_by_side(&ts, dir.path(), &cases);
    let after = snapshot(&ts.store).await;
    let mut failures = Vec::new();
    for (i, (c, (args, (code, stdout, stderr)))) in cases.iter().zip(&outputs).enumerate() {
        let mut why = Vec::new();
        if *code != Some(c.code) {
            why.push(format!("exit {code:?}, not {}", c.code));
        }
        if stderr.contains("panicked") {
            why.push("panicked".into());
        }
        if !stdout.trim().is_empty() {
            why.push(format!("printed {:?}", stdout.trim()));
        }
        match error_line(stderr) {
            None => why.push("no error line".into()),
            Some(line) => {
                for w in &c.want {
                    if !line.contains(w) {
                        why.push(format!("the error line lacks {w:?}"));
                    }
                }
                // Our own errors are one line (clap adds its usage hint).
                let own: Vec<&str> = stderr
                    .lines()
                    .filter(|l| !l.trim().is_empty() && !l.starts_with("baton: warning:"))
                    .collect();
                if line.starts_with("baton: ") && own.len() != 1 {
                    why.push(format!("{} lines, not one", own.len()));
                }
            }
        }
        if before != after {
            let before = snapshot(&ts.store).await;
            run(&ts, &case_dir(dir.path(), i), args);
            let after = snapshot(&ts.store).await;
            if before != after {
                why.push(format!("the store changed: {before:?} -> {after:?}"));
            }
        }
        if !why.is_empty() {
            failures.push(failure(c.what, args, &why, stderr));
        }
    }
    if before != after && failures.is_empty() {
        failures.push(format!(
            "the store changed while the cases ran, but no case alone changes it: {before:?} -> {after:?}"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed on {kind:?}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The directory of case `i`, holding its config file (`baton.toml`).
fn case_dir(root: &std::path::Path, i: usize) -> std::path::PathBuf {
    root.join(format!("case-{i}"))
}

/// Run every case (its config written to its own directory), a few at a
/// time; each case's arguments (with `{cfg}` filled in) and output, in
/// order.
fn run_side_by_side(
    ts: &common::TestStore,
    root: &std::path::Path,
    cases: &[Case],
) -> Vec<(Vec<String>, Output)> {
    let prepared: Vec<(std::path::PathBuf, Vec<String>)> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let dir = case_dir(root, i);
            std::fs::create_dir_all(&dir).unwrap();
            let cfg = dir.join("baton.toml");
            std::fs::write(&cfg, c.config.as_deref().unwrap_or(OK_JOB)).unwrap();
            let args = c
                .args
                .iter()
                .map(|a| a.replace("{cfg}", &cfg.display().to_string()))
                .collect();
            (dir, args)
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outputs: Vec<std::sync::Mutex<Option<Output>>> =
        cases.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..SIDE_BY_SIDE {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((dir, args)) = prepared.get(i) else {
                    break;
                };
                let out = run(ts, dir, args);
                *outputs[i].lock().unwrap() = Some(out);
            });
        }
    });
    prepared
        .into_iter()
        .zip(outputs)
        .map(|((_, args), out)| (args, out.into_inner().unwrap().expect("every case ran")))
        .collect()
}

/// Cases run at once (each a `baton` process; most exit in milliseconds).
const SIDE_BY_SIDE: usize = 6;

/// A failed case, for the assertion message.
fn failure(what: &str, args: &[String], why: &[String], stderr: &str) -> String {
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.len() > 60 {
                format!("<{} bytes>", a.len())
            } else {
                a.clone()
            }
        })
        .collect();
    let err: String = stderr.chars().take(600).collect();
    format!(
        "{what}: baton {shown:?}: {}\n    stderr: {err}",
        why.join("; ")
    )
}

// ---- the HTTP admin API ---------------------------------------------------------

/// One malformed request to the admin API and the answer it must get.
struct HttpCase {
    /// What is wrong (for the failure message).
    what: &'static str,
    method: &'static str,
    path: String,
    body: Vec<u8>,
    /// The status code.
    status: u16,
    /// The `field` of the JSON error (`None`: no field).
    field: Option<&'static str>,
    /// Substrings of the JSON `error`: what is wrong and the accepted form.
    want: Vec<&'static str>,
}

fn http(
    what: &'static str,
    method: &'static str,
    path: &str,
    body: &str,
    status: u16,
    field: Option<&'static str>,
    want: &[&'static str],
) -> HttpCase {
    HttpCase {
        what,
        method,
        path: path.to_string(),
        body: body.as_bytes().to_vec(),
        status,
        field,
        want: want.to_vec(),
    }
}

/// The admin server's config: one durable job whose only slot a year is
/// far from now, so nothing fires while the cases run.
const HTTP_CONFIG: &str = "[[job]]\nname = \"a\"\ncron = \"0 3 1 1 *\"\ncommand = [\"true\"]\n";

/// What every refused enqueue body names: the accepted shape.
const ENQUEUE_FORM: &str = r#"{"command": ["echo", "hi"]}"#;

fn http_catalogue() -> Vec<HttpCase> {
    let big = |prefix: &str, suffix: &str| {
        // Exactly one byte over the body limit.
        let n = MAX_BODY_BYTES + 1 - prefix.len() - suffix.len();
        format!("{prefix}{}{suffix}", "x".repeat(n))
    };
    let n300 = "n".repeat(300);
    let t = "/api/v1/tasks";
    let mut v = vec![
        // --- the body: JSON, types, fields, size ---
        http(
            "malformed JSON",
            "POST",
            t,
            r#"{"command": ["true""#,
            400,
            Some("body"),
            &["is not JSON", ENQUEUE_FORM],
        ),
        http(
            "not an object",
            "POST",
            t,
            r#"["true"]"#,
            400,
            Some("body"),
            &["not a JSON object", ENQUEUE_FORM],
        ),
        http(
            "command a string",
            "POST",
            t,
            r#"{"command": "echo hi"}"#,
            400,
            Some("command"),
            &["invalid type: string", ENQUEUE_FORM],
        ),
        http(
            "priority a string",
            "POST",
            t,
            r#"{"command": ["true"], "priority": "high"}"#,
            400,
            Some("priority"),
            &["invalid type: string", "-100 to 100"],
        ),
        http(
            "priority out of range",
            "POST",
            t,
            r#"{"command": ["true"], "priority": 101}"#,
            400,
            Some("priority"),
            &["out of range", "-100 to 100"],
        ),
        http(
            "max_attempts negative",
            "POST",
            t,
            r#"{"command": ["true"], "max_attempts": -1}"#,
            400,
            Some("max_attempts"),
            &["invalid value", "1 to 10000"],
        ),
        http(
            "max_attempts zero",
            "POST",
            t,
            r#"{"command": ["true"], "max_attempts": 0}"#,
            400,
            Some("max_attempts"),
            &["out of range", "1 to 10000"],
        ),
        http(
            "key_forever a string",
            "POST",
            t,
            r#"{"command": ["true"], "key": "k", "key_forever": "yes"}"#,
            400,
            Some("key_forever"),
            &["invalid type", "true or false"],
        ),
        http(
            "unknown unique hold",
            "POST",
            t,
            r#"{"command": ["true"], "key": "k", "unique_hold": "always"}"#,
            400,
            Some("unique_hold"),
            &[
                "\"always\" is not a hold",
                "unfinished, until-failed or forever",
            ],
        ),
        http(
            "unique hold and key_forever",
            "POST",
            t,
            r#"{"command": ["true"], "key": "k", "unique_hold": "forever", "key_forever": true}"#,
            400,
            Some("unique_hold"),
            &["not both"],
        ),
        http(
            "unknown field",
            "POST",
            t,
            r#"{"command": ["true"], "colour": "red"}"#,
            400,
            Some("colour"),
            &["unknown field", "expected one of", ENQUEUE_FORM],
        ),
        http(
            "empty command",
            "POST",
            t,
            r#"{"command": []}"#,
            400,
            Some("command"),
            &["is empty; give the program and its arguments"],
        ),
        http(
            "blank program",
            "POST",
            t,
            r#"{"command": [""]}"#,
            400,
            Some("command"),
            &["names no program"],
        ),
        http(
            "NUL byte in an argument",
            "POST",
            t,
            r#"{"command": ["echo", "a\u0000b"]}"#,
            400,
            Some("command"),
            &["element 1 contains a NUL byte"],
        ),
        http(
            "no command",
            "POST",
            t,
            r#"{"queue": "q"}"#,
            400,
            Some("command"),
            &["missing field", ENQUEUE_FORM],
        ),
        http(
            "empty queue",
            "POST",
            t,
            r#"{"command": ["true"], "queue": ""}"#,
            400,
            Some("queue"),
            &["is empty", "1 to 255 bytes"],
        ),
        http(
            "empty key",
            "POST",
            t,
            r#"{"command": ["true"], "key": ""}"#,
            400,
            Some("unique key"),
            &["use 1 to 1024 bytes"],
        ),
        http(
            "unknown unique scope",
            "POST",
            t,
            r#"{"command": ["true"], "key": "k", "unique_scope": "store"}"#,
            400,
            Some("unique_scope"),
            &["use kind-in-queue, queue, kind or global"],
        ),
        http(
            "unique period under a second",
            "POST",
            t,
            r#"{"command": ["true"], "unique_by_args": true, "unique_period": "5ms"}"#,
            400,
            Some("unique_period"),
            &["use 1s to 10 years"],
        ),
        http(
            "empty concurrency key",
            "POST",
            t,
            r#"{"command": ["true"], "concurrency_key": ""}"#,
            400,
            Some("concurrency_key"),
            &["use 1 to 255 bytes"],
        ),
        http(
            "concurrency key 300 bytes",
            "POST",
            t,
            &format!(
                r#"{{"command": ["true"], "concurrency_key": "{}"}}"#,
                "c".repeat(300)
            ),
            400,
            Some("concurrency_key"),
            &["is 300 bytes", "use 1 to 255 bytes"],
        ),
        // --- durations and times ---
        http(
            "bad delay",
            "POST",
            t,
            r#"{"command": ["true"], "delay": "soon"}"#,
            400,
            Some("delay"),
            &[DURATION_FORM],
        ),
        http(
            "delay too long",
            "POST",
            t,
            r#"{"command": ["true"], "delay": "100000d"}"#,
            400,
            Some("delay"),
            &["too long", "at most 10 years"],
        ),
        http(
            "bad timeout",
            "POST",
            t,
            r#"{"command": ["true"], "timeout": "fast"}"#,
            400,
            Some("timeout"),
            &[DURATION_FORM],
        ),
        http(
            "zero timeout",
            "POST",
            t,
            r#"{"command": ["true"], "timeout": "0s"}"#,
            400,
            Some("timeout"),
            &["greater than 0"],
        ),
        http(
            "delay a number",
            "POST",
            t,
            r#"{"command": ["true"], "delay": 30}"#,
            400,
            Some("delay"),
            &["invalid type", "\"delay\" (e.g. \"30s\")"],
        ),
        http(
            "delay and run_at",
            "POST",
            t,
            r#"{"command": ["true"], "delay": "1s", "run_at": "2030-01-01T00:00:00Z"}"#,
            400,
            Some("delay"),
            &["delay or run_at, not both"],
        ),
        http(
            "bad run_at",
            "POST",
            t,
            r#"{"command": ["true"], "run_at": "tomorrow"}"#,
            400,
            Some("run_at"),
            &["RFC 3339", "2026-01-31T06:00:00Z"],
        ),
        // --- task ids, the cursor and the filters ---
        http(
            "task id not a number",
            "GET",
            "/api/v1/tasks/abc",
            "",
            400,
            Some("id"),
            &["not a task id", "positive whole number"],
        ),
        http(
            "task id overflow",
            "GET",
            "/api/v1/tasks/99999999999999999999",
            "",
            400,
            Some("id"),
            &["not a task id", "positive whole number"],
        ),
        http(
            "task id negative",
            "POST",
            "/api/v1/tasks/-3/cancel",
            "",
            400,
            Some("id"),
            &["not a task id", "positive whole number"],
        ),
        http(
            "retry id not a number",
            "POST",
            "/api/v1/tasks/x/retry",
            "",
            400,
            Some("id"),
            &["not a task id"],
        ),
        http(
            "bad cursor",
            "GET",
            "/api/v1/tasks?before=abc",
            "",
            400,
            Some("before"),
            &["not a cursor", "next_before"],
        ),
        http(
            "negative cursor",
            "GET",
            "/api/v1/tasks?before=-1",
            "",
            400,
            Some("before"),
            &["not a cursor", "next_before"],
        ),
        http(
            "bad state filter",
            "GET",
            "/api/v1/tasks?state=runing",
            "",
            400,
            Some("state"),
            &["pending, running, succeeded, failed or cancelled"],
        ),
        http(
            "limit zero",
            "GET",
            "/api/v1/tasks?limit=0",
            "",
            400,
            Some("limit"),
            &["whole number from 1 to 1000"],
        ),
        http(
            "limit not a number",
            "GET",
            "/api/v1/tasks?limit=lots",
            "",
            400,
            Some("limit"),
            &["whole number from 1 to 1000"],
        ),
        http(
            "unknown filter",
            "GET",
            "/api/v1/tasks?colour=red",
            "",
            400,
            Some("colour"),
            &[
                "unknown parameter",
                "kind, key, text, since, until, before or limit",
            ],
        ),
        http(
            "search time not a time",
            "GET",
            "/api/v1/tasks?since=yesterday",
            "",
            400,
            Some("since"),
            &["RFC 3339", "duration ago"],
        ),
        http(
            "search text too long",
            "GET",
            &format!("/api/v1/tasks?text={}", "x".repeat(300)),
            "",
            400,
            Some("text"),
            &["1 to 256 bytes"],
        ),
        http(
            "search range backwards",
            "GET",
            "/api/v1/tasks?since=1h&until=2h",
            "",
            400,
            Some("since"),
            &["is not before the range's end"],
        ),
        http(
            "queue filter control char",
            "GET",
            "/api/v1/tasks?queue=%01",
            "",
            400,
            Some("queue"),
            &["control character", "printable text"],
        ),
        // --- jobs and triggers ---
        http(
            "slot not RFC 3339",
            "POST",
            "/api/v1/jobs/a/trigger",
            r#"{"slot": "yesterday"}"#,
            400,
            Some("slot"),
            &["RFC 3339", "2026-01-31T06:00:00Z"],
        ),
        http(
            "slot off the schedule",
            "POST",
            "/api/v1/jobs/a/trigger",
            r#"{"slot": "2026-01-01T03:00:07Z"}"#,
            400,
            Some("slot"),
            &[
                "is not a slot of job \"a\"",
                "give one of its slots (RFC 3339)",
            ],
        ),
        http(
            "slot a number",
            "POST",
            "/api/v1/jobs/a/trigger",
            r#"{"slot": 5}"#,
            400,
            Some("slot"),
            &["invalid type", r#"{"slot": "2026-01-31T06:00:00Z"}"#],
        ),
        http(
            "trigger unknown field",
            "POST",
            "/api/v1/jobs/a/trigger",
            r#"{"when": "now"}"#,
            400,
            Some("when"),
            &["unknown field", r#"{"slot": "2026-01-31T06:00:00Z"}"#],
        ),
        http(
            "trigger unknown job",
            "POST",
            "/api/v1/jobs/nope/trigger",
            "",
            404,
            None,
            &["no job \"nope\" in this server's config"],
        ),
        http(
            "job name control char",
            "POST",
            "/api/v1/jobs/%01/pause",
            "",
            400,
            Some("job"),
            &["control character", "printable text"],
        ),
        http(
            "pause unknown job",
            "POST",
            "/api/v1/jobs/nope/pause",
            "",
            404,
            None,
            &["no job \"nope\""],
        ),
        http(
            "queue name too long",
            "POST",
            &format!("/api/v1/queues/{n300}/pause"),
            "",
            400,
            Some("queue"),
            &["300 bytes long", "at most 255 bytes"],
        ),
        // --- locks ---
        http(
            "release with a wrong token",
            "POST",
            "/api/v1/locks/held/release",
            r#"{"token": 1}"#,
            409,
            None,
            &["token 1 is not the current one", "was granted token"],
        ),
        http(
            "release without a token",
            "POST",
            "/api/v1/locks/held/release",
            "{}",
            400,
            Some("token"),
            &["is missing", r#"{"token": N}"#],
        ),
        http(
            "release token a string",
            "POST",
            "/api/v1/locks/held/release",
            r#"{"token": "abc"}"#,
            400,
            Some("token"),
            &["invalid type", r#"{"token": N}"#],
        ),
        http(
            "release token negative",
            "POST",
            "/api/v1/locks/held/release",
            r#"{"token": -1}"#,
            400,
            Some("token"),
            &["invalid value", r#"{"token": N}"#],
        ),
        http(
            "release unknown lock",
            "POST",
            "/api/v1/locks/nope/release",
            r#"{"token": 1}"#,
            404,
            None,
            &["no lock \"nope\""],
        ),
        // --- bulk retry ---
        http(
            "bulk retry empty queue",
            "POST",
            "/api/v1/tasks/retry-failed",
            r#"{"queue": ""}"#,
            400,
            Some("queue"),
            &["is empty", "1 to 255 bytes"],
        ),
        http(
            "bulk retry unknown field",
            "POST",
            "/api/v1/tasks/retry-failed",
            r#"{"colour": "red"}"#,
            400,
            Some("colour"),
            &["unknown field", r#""queue"?: NAME"#],
        ),
        http(
            "bulk retry of pending tasks",
            "POST",
            "/api/v1/tasks/retry-failed",
            r#"{"state": "pending"}"#,
            400,
            Some("state"),
            &["a retry takes failed tasks"],
        ),
        http(
            "bulk delete search text empty of meaning",
            "POST",
            "/api/v1/tasks/delete",
            r#"{"key": "a\u0001b"}"#,
            400,
            Some("key"),
            &["control character"],
        ),
        http(
            "no such endpoint",
            "GET",
            "/api/v1/nope",
            "",
            404,
            None,
            &["no such endpoint", "openapi.json"],
        ),
    ];
    // --- sizes: over the body limit (the payload limit, 8 MiB, is larger) ---
    let mut over = http(
        "oversized body",
        "POST",
        t,
        "",
        413,
        Some("body"),
        &["larger than 1048576 bytes (1 MiB)", ENQUEUE_FORM],
    );
    over.body = big("", "").into_bytes();
    v.push(over);
    let mut payload = http(
        "too-large payload",
        "POST",
        t,
        "",
        413,
        Some("body"),
        &["larger than 1048576 bytes (1 MiB)"],
    );
    payload.body = big(r#"{"command": ["sh", "-c", ""#, r#""]}"#).into_bytes();
    v.push(payload);
    v
}

/// The admin API's largest body (`admin::MAX_BODY_BYTES`).
const MAX_BODY_BYTES: usize = 1024 * 1024;

async fn http_catalogue_on(kind: Kind) {
    let Some(ts) = harness::connect(kind).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("baton.toml"), HTTP_CONFIG).unwrap();
    // Something to stay as it is: a task on a queue no worker serves, a
    // held lock, the job.
    Queue::new(ts.store.clone())
        .enqueue(baton::queue::TaskBuilder::new("seed", serde_json::json!({})).queue("parked"))
        .await
        .unwrap();
    let opts = baton::lock::LockOptions::new(Duration::from_secs(600));
    let _held = baton::lock::Locker::new(ts.store.clone())
        .try_lock("held", &opts)
        .await
        .unwrap()
        .expect("the lock is free");
    let log = dir.path().join("serve.log");
    let mut server = Command::new(BATON)
        .args(["serve", "--config", "baton.toml", "--listen", "127.0.0.1:0"])
        .env("BATON_STORE", &ts.url)
        .env("BATON_PREFIX", &ts.prefix)
        .env("BATON_LOG", "info")
        .env_remove("BATON_ADMIN_TOKEN")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("baton serve starts");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let addr = common::admin_addr(30, read_log);
    // The scheduler has registered its job: the store is settled.
    let t0 = Instant::now();
    while snapshot(&ts.store).await.2.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the job was not registered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cases = http_catalogue();
    assert!(
        cases.len() >= 40,
        "the HTTP catalogue has {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    for c in &cases {
        let before = snapshot(&ts.store).await;
        let (status, body) = common::http(&addr, c.method, &c.path, None, &c.body);
        let after = snapshot(&ts.store).await;
        let mut why = Vec::new();
        if status != c.status {
            why.push(format!("status {status}, not {}", c.status));
        }
        match serde_json::from_str::<serde_json::Value>(&body) {
            Err(_) => why.push("the answer is not JSON".into()),
            Ok(v) => {
                let error = v["error"].as_str().unwrap_or_default();
                if error.is_empty() {
                    why.push("no \"error\"".into());
                }
                if error.contains('\n') {
                    why.push("the error is more than one line".into());
                }
                for w in &c.want {
                    if !error.contains(w) {
                        why.push(format!("the error lacks {w:?}"));
                    }
                }
                if v["field"].as_str() != c.field {
                    why.push(format!("field {}, not {:?}", v["field"], c.field));
                }
            }
        }
        if before != after {
            why.push(format!("the store changed: {before:?} -> {after:?}"));
        }
        if !why.is_empty() {
            let shown: String = body.chars().take(600).collect();
            failures.push(format!(
                "{}: {} {}: {}\n    answer: {shown}",
                c.what,
                c.method,
                c.path.chars().take(60).collect::<String>(),
                why.join("; ")
            ));
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        !read_log().contains("panicked"),
        "the server panicked:\n{}",
        read_log()
    );
    assert!(
        failures.is_empty(),
        "{} of {} HTTP cases failed on {kind:?}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_http_catalogue() {
    http_catalogue_on(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_http_catalogue() {
    http_catalogue_on(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_http_catalogue() {
    http_catalogue_on(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_http_catalogue() {
    http_catalogue_on(Kind::Mysql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_catalogue() {
    catalogue_on(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_catalogue() {
    catalogue_on(Kind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_catalogue() {
    catalogue_on(Kind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_catalogue() {
    catalogue_on(Kind::Mysql).await;
}
