//! Issue 26 item 4, checked by: three `baton serve` on one store; a job
//! created through the admin API runs on the shared schedule within
//! seconds, once per slot; an update (at its version, through another
//! instance) applies from the next slot, none run twice or skipped; a
//! delete stops it everywhere. A config job of the same name that says
//! something else is shown as differing and does not run while the store
//! defines the job; it comes back once the definition is deleted.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::common::{self, stderr, stdout, Env, Server};

per_backend! {
    a_job_defined_through_the_api_runs_once_per_slot_on_three_serves,
    the_cli_defines_updates_and_deletes_jobs,
    two_instances_defining_a_job_differently_are_told,
}

const ADMIN: &str = "admin-token-dyn";

fn call(addr: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    common::call(addr, method, path, Some(ADMIN), body)
}

/// `(slot, tag)` of each ledger line, by slot.
fn ledger(e: &Env) -> Vec<(DateTime<Utc>, String)> {
    let mut out: Vec<(DateTime<Utc>, String)> = std::fs::read_to_string(e.path("ledger"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (slot, tag) = l.split_once(' ')?;
            Some((
                DateTime::parse_from_rfc3339(slot).ok()?.to_utc(),
                tag.to_string(),
            ))
        })
        .collect();
    out.sort();
    out
}

fn slots(l: &[(DateTime<Utc>, String)], tag: &str) -> Vec<DateTime<Utc>> {
    l.iter()
        .filter(|(_, t)| t == tag)
        .map(|(s, _)| *s)
        .collect()
}

/// A command appending `$BATON_SLOT TAG` to the ledger.
fn stamp(e: &Env, tag: &str) -> Value {
    let ledger = e.path("ledger");
    json!([
        "sh",
        "-c",
        format!("echo \"$BATON_SLOT {tag}\" >> '{}'", ledger.display())
    ])
}

async fn a_job_defined_through_the_api_runs_once_per_slot_on_three_serves(e: Env) {
    let config = format!(
        "[[queue]]\nname = \"default\"\nconcurrency = 2\nlease = \"10s\"\n\n\
         [[job]]\nname = \"dyn\"\nevery = \"1s\"\ncommand = {}\n",
        stamp(&e, "config")
    );
    std::fs::write(e.path("serve.toml"), config).unwrap();
    let env = [("BATON_ADMIN_TOKEN", ADMIN)];
    let servers: Vec<Server> = (0..3)
        .map(|_| common::serve_listening(&e, "serve.toml", &env))
        .collect();
    let addr = |i: usize| servers[i].addr.as_str();
    common::wait_for(30, "the config job to run", || {
        !slots(&ledger(&e), "config").is_empty()
    });

    // Bad input is refused, naming the field.
    let (status, body) = call(
        addr(0),
        "POST",
        "/api/v1/jobs",
        Some(json!({"name": "dyn", "definition": {"every": "1 sec", "command": ["true"]}})),
    );
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("every")),
        "{body}"
    );
    let (status, body) = call(
        addr(0),
        "POST",
        "/api/v1/jobs",
        Some(
            json!({"name": "dyn", "definition": {"every": "1s", "command": ["true"], "colour": 1}}),
        ),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("colour"),
        "{body}"
    );

    let (status, body) = call(
        addr(0),
        "POST",
        "/api/v1/jobs",
        Some(json!({"name": "dyn", "definition": {"every": "1s", "command": stamp(&e, "store")}})),
    );
    assert_eq!((status, body["version"].as_i64()), (200, Some(1)), "{body}");
    let created = Utc::now();
    let (status, _) = call(
        addr(1),
        "POST",
        "/api/v1/jobs",
        Some(json!({"name": "dyn", "definition": {"every": "1s", "command": ["true"]}})),
    );
    assert_eq!(status, 409, "a second create is refused");
    let t0 = Instant::now();
    common::wait_for(15, "the stored job to run", || {
        !slots(&ledger(&e), "store").is_empty()
    });
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "picked up within seconds"
    );
    std::thread::sleep(Duration::from_secs(5));

    // `baton jobs` says where the job comes from.
    let out = e.run(&["jobs", "--config", "serve.toml", "--json"]);
    let jobs: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let dyn_job = jobs
        .as_array()
        .and_then(|a| a.iter().find(|j| j["name"] == "dyn"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (
            &dyn_job["source"],
            &dyn_job["version"],
            &dyn_job["config_differs"]
        ),
        (&json!("store"), &json!(1), &json!(true)),
        "{jobs}"
    );

    // Update through another instance: a stale version is refused.
    let v2 = json!({"every": "2s", "command": stamp(&e, "store2")});
    let (status, _) = call(
        addr(1),
        "PUT",
        "/api/v1/jobs/dyn",
        Some(json!({"version": 7, "definition": v2})),
    );
    assert_eq!(status, 409);
    let (status, body) = call(
        addr(1),
        "PUT",
        "/api/v1/jobs/dyn",
        Some(json!({"version": 1, "definition": v2})),
    );
    assert_eq!((status, body["version"].as_i64()), (200, Some(2)), "{body}");
    common::wait_for(15, "the new definition to run", || {
        slots(&ledger(&e), "store2").len() >= 3
    });

    let (status, body) = call(addr(2), "DELETE", "/api/v1/jobs/dyn?version=2", None);
    assert_eq!((status, body["version"].as_i64()), (200, Some(3)), "{body}");
    let deleted = Utc::now();
    std::thread::sleep(Duration::from_secs(7));
    let l = ledger(&e);
    drop(servers);
    let shown = format!("{l:?}");

    let (one, two, cfg) = (slots(&l, "store"), slots(&l, "store2"), slots(&l, "config"));
    let mut all: Vec<_> = one.iter().chain(&two).copied().collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(n, all.len(), "each slot once: {shown}");
    assert!(one.len() >= 5 && two.len() >= 3, "{shown}");
    assert!(
        one.last() < two.first(),
        "the change at a slot boundary: {shown}"
    );
    assert!(two
        .iter()
        .all(|s| s.timestamp() % 2 == 0 && s.timestamp_subsec_millis() == 0));
    for w in all.windows(2) {
        assert!(
            w[1] - w[0] <= chrono::Duration::seconds(2),
            "a slot skipped: {w:?} in {shown}"
        );
    }
    // The store refuses a loop that has not reloaded yet the slots a newer
    // definition governs (D2), so the change is exact up to the lead an
    // on-time slot is taken with (150 ms), whatever the reload's lag.
    let slack = chrono::Duration::seconds(1);
    assert!(
        all.iter().all(|s| *s <= deleted + slack),
        "stopped after the delete: {shown}"
    );
    // The config's job gave way while the store defined it, and came back.
    assert!(
        cfg.iter().all(|s| *s < created + slack || *s > deleted),
        "the config's job ran while the store defined it: {shown}"
    );
    assert!(
        cfg.iter().any(|s| *s > deleted + slack),
        "the config job came back: {shown}"
    );
}

/// `baton jobs create|update|delete`: flags or `--file`, a compare-and-set
/// on the version (exit 65 with the current version), bad fields refused
/// naming them (exit 2), shown by `baton jobs`, audited.
async fn the_cli_defines_updates_and_deletes_jobs(e: Env) {
    let run = |args: &[&str]| {
        let out = e.run(args);
        (out.status.code(), stdout(&out), stderr(&out))
    };
    let (code, out, err) = run(&["jobs", "create", "rep", "--every", "5m", "--", "echo", "hi"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("job rep created (version 1)"), "{out}");
    let (code, _, err) = run(&["jobs", "create", "rep", "--every", "5m", "--", "true"]);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("version 1"), "{err}");
    // A job the store defines (no config file here) has its next fires
    // and its backfill like a config job.
    let (code, out, err) = run(&["jobs", "next", "rep", "-n", "2", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let next: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(next["next"].as_array().map(Vec::len), Some(2), "{out}");
    let to = Utc::now().to_rfc3339();
    let from = (Utc::now() - chrono::Duration::minutes(20)).to_rfc3339();
    let (code, out, err) = run(&[
        "jobs",
        "backfill",
        "rep",
        "--from",
        &from,
        "--to",
        &to,
        "--dry-run",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("would run"), "{out}");
    let (code, _, err) = run(&["jobs", "next", "nosuch"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("nor defined in the store"), "{err}");

    for (args, field) in [
        (
            &["jobs", "create", "bad", "--every", "1 sec", "--", "true"][..],
            "every",
        ),
        (&["jobs", "create", "bad", "--every", "5m"][..], "command"),
        (
            &[
                "jobs",
                "create",
                "bad",
                "--cron",
                "0 * * * * * *",
                "--",
                "true",
            ][..],
            "cron",
        ),
        (
            &[
                "jobs",
                "create",
                "bad",
                "--every",
                "5m",
                "--overlap",
                "never",
                "--",
                "true",
            ][..],
            "overlap",
        ),
    ] {
        let (code, _, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(field), "{args:?} should name {field}: {err}");
    }

    let (code, _, err) = run(&[
        "jobs",
        "update",
        "rep",
        "--version",
        "3",
        "--every",
        "1m",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(65), "{err}");
    let (code, out, err) = run(&[
        "jobs",
        "update",
        "rep",
        "--version",
        "1",
        "--every",
        "1m",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("version 2"), "{out}");

    std::fs::write(
        e.path("job.toml"),
        "[[job]]\ncron = \"0 3 * * *\"\ntz = \"Asia/Seoul\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let (code, _, err) = run(&["jobs", "create", "night", "--file", "job.toml"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run(&["jobs", "create", "x", "--file", "job.toml", "--every", "1m"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--file"), "{err}");

    let (code, out, err) = run(&["jobs", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let jobs: Value = serde_json::from_str(&out).unwrap();
    let of = |name: &str| {
        jobs.as_array()
            .and_then(|a| a.iter().find(|j| j["name"] == name))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        (&of("rep")["source"], &of("rep")["version"]),
        (&json!("store"), &json!(2)),
        "{jobs}"
    );
    assert_eq!(
        of("night")["schedule"],
        json!("cron \"0 3 * * *\" in Asia/Seoul"),
        "{jobs}"
    );

    let (code, _, err) = run(&["jobs", "delete", "rep", "--version", "1"]);
    assert_eq!(code, Some(65), "{err}");
    let (code, out, err) = run(&["jobs", "delete", "rep"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("deleted (version 3)"), "{out}");
    let (code, _, err) = run(&["jobs", "delete", "rep"]);
    assert_eq!(code, Some(66), "{err}");

    let (_, out, _) = run(&["audit", "--json"]);
    for action in ["jobs create", "jobs update", "jobs delete"] {
        assert!(out.contains(action), "{action} audited: {out}");
    }
}

/// Two `baton serve` whose config files define one job differently (no
/// definition in the store): the second to start logs a warning naming
/// the job, and `baton jobs --config` of the first says another
/// instance's definition differs.
async fn two_instances_defining_a_job_differently_are_told(e: Env) {
    let config = |cmd: &str| {
        format!(
            "[[queue]]\nname = \"default\"\nconcurrency = 1\nlease = \"10s\"\n\n\
             [[job]]\nname = \"twin\"\nevery = \"1h\"\ncommand = [\"{cmd}\"]\n"
        )
    };
    std::fs::write(e.path("a.toml"), config("true")).unwrap();
    std::fs::write(e.path("b.toml"), config("false")).unwrap();
    let twin = |file: &str| {
        let out = e.run(&["jobs", "--config", file, "--json"]);
        let jobs: Value = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        jobs.as_array()
            .and_then(|a| a.iter().find(|j| j["name"] == "twin"))
            .cloned()
            .unwrap_or_default()
    };
    let _a = common::serve_listening(&e, "a.toml", &[]);
    common::wait_for(30, "the job registered", || {
        twin("a.toml")["last_slot"].is_string()
    });
    assert_eq!(twin("a.toml")["config_differs"], json!(false));
    let _b = common::serve_listening(&e, "b.toml", &[]);
    common::wait_for(30, "the second instance's warning", || {
        e.logs()
            .contains("another instance registered a different definition")
    });
    assert!(e.logs().contains("twin"), "{}", e.logs());
    common::wait_for(30, "the record to hold the second's definition", || {
        twin("a.toml")["config_differs"] == json!(true)
    });
    assert_eq!(twin("b.toml")["config_differs"], json!(false));
    let out = e.run(&["jobs", "--config", "a.toml"]);
    assert!(
        stdout(&out).contains("config (another instance's differs)"),
        "{}",
        stdout(&out)
    );
}
