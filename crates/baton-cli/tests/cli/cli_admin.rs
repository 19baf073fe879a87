//! The admin server of `baton serve --listen`, as a process (issue #13):
//! bearer auth (401 without, 403 for the read-only token on a write), the
//! `/api/v1` endpoints acting and `GET` showing the effect, the OpenAPI
//! document listing every route served, `/readyz` 503 with the store
//! stopped, `/metrics` still 200 then (the store's last view marked stale)
//! and clean under `promtool check metrics`, a 1 MiB header refused with 431 and RSS flat, and a
//! non-loopback `--listen` refused without a token.

use crate::common;

use baton_testkit as support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::Child;
use std::time::{Duration, Instant};

use common::{call, read, signal, wait_for, Env, Kind, Server};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-1";
const READER: &str = "reader-token-2";

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 2
lease = "5s"
per_key_max_running = 2
per_key_rate = "1/1h"

[[job]]
name = "nightly"
cron = "0 3 * * *"
tz = "Asia/Seoul"
command = ["true"]
"#;

/// `baton serve --listen 127.0.0.1:0` with [`CONFIG`], on `store` if one
/// is given (else the test's), with `env` set.
fn start(e: &Env, store: Option<&str>, env: &[(&str, &str)]) -> Server {
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    let mut env = env.to_vec();
    if let Some(url) = store {
        env.push(("BATON_STORE", url));
    }
    common::serve_listening(e, "baton.toml", &env)
}

fn get(addr: &str, path: &str) -> (u16, Value) {
    call(addr, "GET", path, Some(ADMIN), None)
}

fn post(addr: &str, path: &str, body: Value) -> (u16, Value) {
    call(addr, "POST", path, Some(ADMIN), Some(body))
}

fn tokens() -> Vec<(&'static str, &'static str)> {
    vec![
        ("BATON_ADMIN_TOKEN", ADMIN),
        ("BATON_ADMIN_READ_TOKEN", READER),
    ]
}

macro_rules! sqlite_and_redis {
    ($($name:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { if let Some(e) = crate::common::Env::new(crate::common::Kind::Sqlite).await { super::$name(e).await } } )* }
        mod redis { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { if let Some(e) = crate::common::Env::new(crate::common::Kind::Redis).await { super::$name(e).await } } )* }
    };
}

sqlite_and_redis! {
    auth_is_required_and_read_only_token_only_reads,
    named_tokens_have_roles_rotate_and_are_audited,
    mutating_endpoints_act_and_get_shows_the_effect,
    openapi_lists_every_route_served,
}

/// 401 without a token (JSON with a reason), 403 for the read-only token
/// on a write, the probes open.
async fn auth_is_required_and_read_only_token_only_reads(e: Env) {
    let srv = start(&e, None, &tokens());
    let a = &srv.addr;
    for path in ["/api/v1/jobs", "/api/v1/tasks", "/metrics", "/health"] {
        let (code, body) = call(a, "GET", path, None, None);
        assert_eq!(code, 401, "{path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("Bearer"), "{body}");
        let (code, body) = call(a, "GET", path, Some("wrong"), None);
        assert_eq!(code, 401, "{path}: {body}");
        assert!(body["error"].is_string(), "{body}");
    }
    let (code, _) = call(a, "GET", "/livez", None, None);
    assert_eq!(code, 200);
    let (code, body) = call(a, "GET", "/readyz", None, None);
    assert_eq!((code, &body["status"]), (200, &json!("ready")), "{body}");
    // The read-only token reads, and may not write.
    let (code, body) = call(a, "GET", "/api/v1/jobs", Some(READER), None);
    assert_eq!(code, 200, "{body}");
    let enqueue = json!({"command": ["true"], "queue": "parked"});
    let (code, body) = call(
        a,
        "POST",
        "/api/v1/tasks",
        Some(READER),
        Some(enqueue.clone()),
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("has the role read"),
        "{body}"
    );
    let (code, body) = call(a, "POST", "/api/v1/tasks", None, Some(enqueue.clone()));
    assert_eq!(code, 401, "{body}");
    // Nothing was written by the refused requests.
    let (_, list) = get(a, "/api/v1/tasks?queue=parked");
    assert_eq!(list["tasks"], json!([]), "{list}");
    let (code, body) = post(a, "/api/v1/tasks", enqueue);
    assert_eq!(code, 201, "{body}");
    // The tokens never reach the log.
    let logs: String = std::fs::read_dir(e.dir.path())
        .unwrap()
        .flatten()
        .map(|f| read(&f.path()))
        .collect();
    assert!(!logs.contains(ADMIN) && !logs.contains(READER));
}

/// Named tokens from a tokens file: a read token cannot pause, an operate
/// token can but may not delete, the admin token may; the audit log names
/// which token did each write (the refused ones are not recorded), the
/// same through the API and `baton audit`; a rotated secret takes effect
/// without a restart.
async fn named_tokens_have_roles_rotate_and_are_audited(e: Env) {
    let file = e.path("tokens");
    std::fs::write(
        &file,
        "# who may steer\nops operate ops-secret-00000001\nviewer read viewer-secret-000001\n",
    )
    .unwrap();
    let file_s = file.to_str().unwrap().to_string();
    let srv = start(
        &e,
        None,
        &[
            ("BATON_ADMIN_TOKEN", ADMIN),
            ("BATON_ADMIN_TOKENS_FILE", &file_s),
        ],
    );
    let a = &srv.addr;
    const OPS: &str = "ops-secret-00000001";
    const VIEWER: &str = "viewer-secret-000001";
    let (code, _) = call(a, "GET", "/api/v1/queues", Some(VIEWER), None);
    assert_eq!(code, 200);
    let (code, body) = call(
        a,
        "POST",
        "/api/v1/queues/q1/pause",
        Some(VIEWER),
        Some(json!({})),
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("\"viewer\" has the role read"),
        "{body}"
    );
    let (code, body) = call(
        a,
        "POST",
        "/api/v1/queues/q1/pause",
        Some(OPS),
        Some(json!({})),
    );
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(
        a,
        "POST",
        "/api/v1/tasks",
        Some(OPS),
        Some(json!({"command": ["true"], "queue": "q1"})),
    );
    assert_eq!(code, 201, "{body}");
    let id = body["id"].as_i64().unwrap();
    let (code, body) = call(a, "DELETE", &format!("/api/v1/tasks/{id}"), Some(OPS), None);
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("needs admin"),
        "{body}"
    );
    let (code, body) = call(
        a,
        "DELETE",
        &format!("/api/v1/tasks/{id}"),
        Some(ADMIN),
        None,
    );
    assert_eq!(code, 200, "{body}");

    let (code, log) = call(a, "GET", "/api/v1/audit", Some(VIEWER), None);
    assert_eq!(code, 200, "{log}");
    let rows: Vec<(String, String, String, String, String)> = log["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap().to_string();
            (
                f("actor"),
                f("action"),
                f("target"),
                f("source"),
                f("outcome"),
            )
        })
        .collect();
    let want = |actor: &str, action: &str, target: &str| {
        (
            actor.into(),
            action.into(),
            target.into(),
            "api".into(),
            "".into(),
        )
    };
    let got: Vec<_> = rows
        .iter()
        .map(|(a, b, c, d, _)| (a.clone(), b.clone(), c.clone(), d.clone(), String::new()))
        .collect();
    assert_eq!(
        got,
        [
            want(
                "api:admin",
                "DELETE /api/v1/tasks/{id}",
                &format!("id={id}")
            ),
            want("api:ops", "POST /api/v1/tasks", "-"),
            want("api:ops", "POST /api/v1/queues/{name}/pause", "name=q1"),
        ],
        "newest first, only what was allowed: {log}"
    );
    assert_eq!(rows[0].4, "200");
    let out = e.run(&["audit", "--json", "--limit", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let cli: Value = serde_json::from_str(&common::stdout(&out)).unwrap();
    assert_eq!(cli[0]["actor"], "api:admin", "{cli}");

    // Rotation: a new secret for ops in the file works within seconds and
    // the old one stops, without a restart.
    std::fs::write(&file, "ops operate ops-secret-00000002\n").unwrap();
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(later)
        .unwrap();
    wait_for(10, "the rotated secret to work", || {
        call(
            a,
            "GET",
            "/api/v1/queues",
            Some("ops-secret-00000002"),
            None,
        )
        .0 == 200
    });
    assert_eq!(call(a, "GET", "/api/v1/queues", Some(OPS), None).0, 401);
    assert_eq!(call(a, "GET", "/api/v1/queues", Some(VIEWER), None).0, 401);
}

/// With the token, each mutating endpoint acts and a GET shows it: tasks
/// (enqueue, cancel, retry, bulk retry, pagination), jobs (pause, resume,
/// trigger) and locks (force-release naming the current token only).
async fn mutating_endpoints_act_and_get_shows_the_effect(e: Env) {
    let out = e.run(&[
        "lock",
        "held-lock",
        "--at-most",
        "2h",
        "--at-least",
        "1h",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let srv = start(&e, None, &tokens());
    let a = &srv.addr;

    // Tasks on a queue no worker serves stay where the API puts them.
    let mut ids = Vec::new();
    for i in 0..3 {
        let (code, body) = post(
            a,
            "/api/v1/tasks",
            json!({"command": ["echo", i.to_string()], "queue": "parked", "priority": 5}),
        );
        assert_eq!(code, 201, "{body}");
        assert_eq!(body["inserted"], true);
        ids.push(body["id"].as_i64().unwrap());
    }
    let (code, body) = post(a, "/api/v1/tasks", json!({"queue": "parked"}));
    assert_eq!((code, &body["field"]), (400, &json!("command")), "{body}");
    // A concurrency key is kept on the task and shown by the API.
    let (code, body) = post(
        a,
        "/api/v1/tasks",
        json!({"command": ["true"], "queue": "keyed", "concurrency_key": "customer:42"}),
    );
    assert_eq!(code, 201, "{body}");
    let keyed = body["id"].as_i64().unwrap();
    let (code, body) = get(a, &format!("/api/v1/tasks/{keyed}"));
    assert_eq!(
        (code, &body["concurrency_key"]),
        (200, &json!("customer:42")),
        "{body}"
    );
    // The queue's keys' load (issue 25 item 5): the pending key, no cap
    // declared (no worker serves the queue); a bad limit names the field.
    let (code, body) = get(a, "/api/v1/queues/keyed/keys");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body["keys"],
        json!([{"key": "customer:42", "running": 0, "pending": 1}]),
        "{body}"
    );
    assert_eq!(
        (&body["keys_pending"], &body["per_key_max_running"]),
        (&json!(1), &json!(null))
    );
    let (code, body) = get(a, "/api/v1/queues/keyed/keys?limit=0");
    assert_eq!((code, &body["field"]), (400, &json!("limit")), "{body}");
    // A unique hold is kept on the task and shown, with the key.
    let held =
        json!({"command": ["true"], "queue": "keyed", "key": "h", "unique_hold": "until-failed"});
    let (code, body) = post(a, "/api/v1/tasks", held.clone());
    assert_eq!(code, 201, "{body}");
    let id = body["id"].as_i64().unwrap();
    let (code, body) = get(a, &format!("/api/v1/tasks/{id}"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["unique_hold"], "until-failed", "{body}");
    assert_eq!(
        body["unique"]["text"], "h [kind-in-queue] (until-failed)",
        "{body}"
    );
    let (_, body) = post(a, "/api/v1/tasks", held);
    assert_eq!(
        (body["id"].as_i64(), &body["inserted"]),
        (Some(id), &json!(false))
    );
    let (code, body) = post(
        a,
        "/api/v1/tasks",
        json!({"command": ["x"], "delay": "soon"}),
    );
    assert_eq!((code, &body["field"]), (400, &json!("delay")), "{body}");
    // Cursor pagination: two, then the rest.
    let (code, page) = get(a, "/api/v1/tasks?queue=parked&limit=2");
    assert_eq!(code, 200, "{page}");
    let got: Vec<i64> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![ids[2], ids[1]]);
    let cursor = page["next_before"].as_i64().unwrap();
    let (_, page) = get(
        a,
        &format!("/api/v1/tasks?queue=parked&limit=2&before={cursor}"),
    );
    let got: Vec<i64> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, vec![ids[0]]);
    assert_eq!(page["next_before"], Value::Null);
    let (code, body) = get(a, "/api/v1/tasks?limit=0");
    assert_eq!((code, &body["field"]), (400, &json!("limit")), "{body}");
    let (code, body) = get(a, "/api/v1/tasks?state=done");
    assert_eq!((code, &body["field"]), (400, &json!("state")), "{body}");

    // Cancel, then retry, then the state conflicts.
    let t = ids[0];
    let (code, body) = post(a, &format!("/api/v1/tasks/{t}/cancel"), json!({}));
    assert_eq!(
        (code, &body["outcome"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let (_, task) = get(a, &format!("/api/v1/tasks/{t}"));
    assert_eq!(task["state"], "cancelled", "{task}");
    let (code, body) = post(a, &format!("/api/v1/tasks/{t}/cancel"), json!({}));
    assert_eq!(code, 409, "{body}");
    let (code, body) = post(a, &format!("/api/v1/tasks/{t}/retry"), json!({}));
    assert_eq!(code, 200, "{body}");
    let (_, task) = get(a, &format!("/api/v1/tasks/{t}"));
    assert_eq!(task["state"], "pending", "{task}");
    let (code, body) = post(a, &format!("/api/v1/tasks/{t}/retry"), json!({}));
    assert_eq!(code, 409, "{body}");
    let (code, body) = get(a, "/api/v1/tasks/999999999");
    assert_eq!(code, 404, "{body}");
    let (code, body) = post(a, "/api/v1/tasks/999999999/retry", json!({}));
    assert_eq!(code, 404, "{body}");

    // A failing task on the served queue fails; bulk retry runs it again.
    let (_, body) = post(
        a,
        "/api/v1/tasks",
        json!({"command": ["sh", "-c", "exit 3"], "max_attempts": 1}),
    );
    let f = body["id"].as_i64().unwrap();
    wait_for(20, "the failing task to fail", || {
        get(a, &format!("/api/v1/tasks/{f}")).1["state"] == "failed"
    });
    let (_, failed) = get(a, "/api/v1/tasks?state=failed&queue=default");
    assert!(
        failed["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == f),
        "{failed}"
    );
    let (code, body) = post(a, "/api/v1/tasks/retry-failed", json!({"queue": "default"}));
    assert_eq!(code, 200, "{body}");
    assert!(
        body["ids"].as_array().unwrap().contains(&json!(f)),
        "{body}"
    );
    wait_for(20, "the retried task to fail a second time", || {
        let t = get(a, &format!("/api/v1/tasks/{f}")).1;
        t["state"] == "failed" && t["errors"].as_array().map_or(0, Vec::len) >= 2
    });

    // Delete: the read-only token may not; a bulk delete counts first and
    // deletes only with confirm; one task goes by id, then is gone.
    let (code, body) = call(
        a,
        "DELETE",
        &format!("/api/v1/tasks/{f}"),
        Some(READER),
        None,
    );
    assert_eq!(code, 403, "{body}");
    let (_, c) = post(
        a,
        "/api/v1/tasks",
        json!({"command": ["true"], "queue": "parked"}),
    );
    let c = c["id"].as_i64().unwrap();
    let (code, _) = post(a, &format!("/api/v1/tasks/{c}/cancel"), json!({}));
    assert_eq!(code, 200);
    let (code, body) = post(
        a,
        "/api/v1/tasks/delete",
        json!({"queue": "parked", "state": "cancelled"}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, json!({"dry_run": true, "matched": 1, "deleted": 0}));
    assert_eq!(get(a, &format!("/api/v1/tasks/{c}")).0, 200);
    let (code, body) = post(a, "/api/v1/tasks/delete", json!({"state": "pending"}));
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("state"), "{body}");
    let (code, body) = post(
        a,
        "/api/v1/tasks/delete",
        json!({"queue": "parked", "confirm": true}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, json!({"dry_run": false, "matched": 1, "deleted": 1}));
    assert_eq!(get(a, &format!("/api/v1/tasks/{c}")).0, 404);
    let (code, body) = call(
        a,
        "DELETE",
        &format!("/api/v1/tasks/{f}"),
        Some(ADMIN),
        None,
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, json!({"id": f, "deleted": true}));
    assert_eq!(get(a, &format!("/api/v1/tasks/{f}")).0, 404);
    let (code, _) = call(
        a,
        "DELETE",
        &format!("/api/v1/tasks/{f}"),
        Some(ADMIN),
        None,
    );
    assert_eq!(code, 404);

    // Jobs: pause and resume show in the list; trigger runs a slot.
    wait_for(20, "the job to be registered", || {
        get(a, "/api/v1/jobs")
            .1
            .as_array()
            .is_some_and(|j| j.iter().any(|j| j["name"] == "nightly"))
    });
    let job = |a: &str| -> Value {
        get(a, "/api/v1/jobs")
            .1
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"] == "nightly")
            .cloned()
            .unwrap()
    };
    let j = job(a);
    assert_eq!(j["paused"], false, "{j}");
    assert_eq!(j["overlap"], "skip", "the default policy, shown: {j}");
    assert!(
        j["next_fire"].as_str().unwrap().ends_with("+09:00"),
        "next fire in the job's zone: {j}"
    );
    assert_eq!(j["misfire"], "latest", "{j}");
    assert_eq!(j["pause_change"], Value::Null, "never paused: {j}");
    let fires = j["next_fires"].as_array().unwrap();
    assert_eq!(fires.len(), 3, "{j}");
    for f in fires {
        assert!(
            f["local"].as_str().unwrap().ends_with("T03:00:00+09:00") && f["zone"] == "KST",
            "3 am in Seoul: {f}"
        );
    }
    // Pause with a note and a name: recorded with the credential and the
    // source, shown by the list.
    let (code, body) = post(
        a,
        "/api/v1/jobs/nightly/pause",
        json!({"note": "disk swap", "by": "alice"}),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["by"], "alice (api:admin via api)", "{body}");
    let j = job(a);
    assert_eq!(j["paused"], true);
    assert_eq!(j["pause_change"]["note"], "disk swap", "{j}");
    assert_eq!(j["pause_change"]["by"], "alice (api:admin via api)", "{j}");
    assert!(
        j["pause_change"]["at"].as_str().unwrap().ends_with('Z'),
        "{j}"
    );
    // A note over the bound, or a field the body does not take: 400
    // naming it, nothing changed.
    let long = "x".repeat(1001);
    let (code, body) = post(a, "/api/v1/jobs/nightly/resume", json!({"note": long}));
    assert_eq!((code, &body["field"]), (400, &json!("note")), "{body}");
    let (code, body) = post(a, "/api/v1/jobs/nightly/resume", json!({"why": "x"}));
    assert_eq!((code, &body["field"]), (400, &json!("why")), "{body}");
    assert_eq!(job(a)["paused"], true);
    let (code, _) = post(a, "/api/v1/jobs/nightly/resume", json!({}));
    assert_eq!(code, 200);
    let j = job(a);
    assert_eq!(j["paused"], false);
    assert_eq!(j["pause_change"]["note"], Value::Null, "{j}");
    assert_eq!(j["pause_change"]["by"], "api:admin via api", "{j}");
    let (code, body) = post(a, "/api/v1/jobs/nope/pause", json!({}));
    assert_eq!(code, 404, "{body}");
    let (code, body) = post(
        a,
        "/api/v1/jobs/nightly/trigger",
        json!({"slot": "yesterday"}),
    );
    assert_eq!((code, &body["field"]), (400, &json!("slot")), "{body}");
    let (code, body) = post(
        a,
        "/api/v1/jobs/nightly/trigger",
        json!({"slot": "2026-01-30T18:00:00Z"}),
    );
    assert_eq!(code, 200, "{body}");
    // The answer says what became of the slot: just enqueued (and maybe
    // claimed already by this server's worker).
    assert_eq!(body["inserted"], true, "{body}");
    assert!(
        body["outcome"] == "pending" || body["outcome"] == "running",
        "{body}"
    );
    let run = body["id"].as_i64().unwrap();
    // Again (with run_skipped: the slot was not skipped, so the same run).
    let (code, again) = post(
        a,
        "/api/v1/jobs/nightly/trigger",
        json!({"slot": "2026-01-30T18:00:00Z", "run_skipped": true}),
    );
    assert_eq!(code, 200, "{again}");
    assert_eq!(
        (
            again["id"].as_i64(),
            again["inserted"].clone(),
            again["rerun"].clone()
        ),
        (Some(run), json!(false), json!(false)),
        "{again}"
    );
    let (_, runs) = get(a, "/api/v1/tasks?job=nightly");
    assert!(
        runs["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == run),
        "{runs}"
    );
    wait_for(20, "the triggered run to succeed", || {
        get(a, &format!("/api/v1/tasks/{run}")).1["state"] == "succeeded"
    });
    // Backfill three days of slots around the triggered one: the two
    // without a run are enqueued, the triggered one is left alone.
    let range = json!({"from": "2026-01-28T12:00:00Z", "to": "2026-01-31T12:00:00Z"});
    let mut dry = range.clone();
    dry["dry_run"] = json!(true);
    let (code, body) = post(a, "/api/v1/jobs/nightly/backfill", dry);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["slots"], &body["would_enqueue"], &body["left_alone"]),
        (&json!(3), &json!(2), &json!(1)),
        "{body}"
    );
    let mut capped = range.clone();
    capped["max"] = json!(2);
    let (code, body) = post(a, "/api/v1/jobs/nightly/backfill", capped);
    assert_eq!((code, &body["field"]), (400, &json!("max")), "{body}");
    let (code, body) = post(
        a,
        "/api/v1/jobs/nightly/backfill",
        json!({"from": "2026-01-31T12:00:00Z", "to": "2026-01-28T12:00:00Z"}),
    );
    assert_eq!((code, &body["field"]), (400, &json!("from")), "{body}");
    let (code, body) = post(a, "/api/v1/jobs/nightly/backfill", range);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (&body["enqueued"], &body["left_alone"]),
        (&json!(2), &json!(1)),
        "{body}"
    );
    let ran = body["runs"].as_array().unwrap();
    assert_eq!(ran[2]["id"].as_i64(), Some(run), "{body}");
    assert_eq!(ran[2]["outcome"], "succeeded", "{body}");

    // Locks: force-release needs the current token.
    let (_, locks) = get(a, "/api/v1/locks");
    let l = locks
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "held-lock")
        .cloned()
        .unwrap();
    assert_eq!(l["state"], "held", "{l}");
    let token = l["token"].as_u64().unwrap();
    let (code, body) = post(
        a,
        "/api/v1/locks/held-lock/release",
        json!({"token": token + 1}),
    );
    assert_eq!(code, 409, "{body}");
    let (code, body) = post(a, "/api/v1/locks/held-lock/release", json!({}));
    assert_eq!((code, &body["field"]), (400, &json!("token")), "{body}");
    let (_, locks) = get(a, "/api/v1/locks");
    assert!(
        locks
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["name"] == "held-lock" && l["state"] == "held"),
        "{locks}"
    );
    let (code, body) = post(
        a,
        "/api/v1/locks/held-lock/release",
        json!({"token": token}),
    );
    assert_eq!(code, 200, "{body}");
    // Revoked, not freed at once: free within the release bound (30 s,
    // not the 1 h at_least), its holder marked, its token no longer
    // releasable.
    let free_at = chrono::DateTime::parse_from_rfc3339(body["free_at"].as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert!(
        free_at <= chrono::Utc::now() + chrono::Duration::seconds(31),
        "{body}"
    );
    let (_, locks) = get(a, "/api/v1/locks");
    assert!(
        locks
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["name"] == "held-lock"
                && l["holder"].as_str().unwrap().starts_with("revoked:")
                && l["token"].as_u64() == Some(token + 1)),
        "{locks}"
    );
    let (code, body) = post(
        a,
        "/api/v1/locks/held-lock/release",
        json!({"token": token}),
    );
    assert_eq!(code, 409, "{body}");
    let (code, _) = post(a, "/api/v1/locks/no-such-lock/release", json!({"token": 1}));
    assert_eq!(code, 404);

    // Queues: counts by state.
    let (code, queues) = get(a, "/api/v1/queues");
    assert_eq!(code, 200, "{queues}");
    let parked = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "parked")
        .cloned()
        .unwrap();
    assert_eq!(parked["pending"], 3, "{parked}");
    assert_eq!(parked["paused"], false, "{parked}");

    // Queues: pause and resume, shown by GET (also a queue with no tasks).
    let paused_flag = |name: &str| {
        let (_, queues) = get(a, "/api/v1/queues");
        queues
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == name)
            .map(|q| q["paused"].clone())
    };
    let (code, body) = post(a, "/api/v1/queues/parked/pause", json!({}));
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        json!({"queue": "parked", "paused": true, "note": null, "by": "api:admin via api"})
    );
    assert_eq!(paused_flag("parked"), Some(json!(true)));
    let (code, _) = post(
        a,
        "/api/v1/queues/idle-q/pause",
        json!({"note": "not yet", "by": "bob"}),
    );
    assert_eq!(code, 200);
    assert_eq!(paused_flag("idle-q"), Some(json!(true)));
    let idle = get(a, "/api/v1/queues").1;
    let idle = idle
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "idle-q")
        .unwrap()
        .clone();
    assert_eq!(idle["pause_change"]["note"], "not yet", "{idle}");
    assert_eq!(
        idle["pause_change"]["by"], "bob (api:admin via api)",
        "{idle}"
    );
    let (code, body) = post(a, "/api/v1/queues/idle-q/resume", json!({"by": "a\u{7}"}));
    assert_eq!((code, &body["field"]), (400, &json!("by")), "{body}");
    let (code, body) = post(a, "/api/v1/queues/parked/resume", json!({}));
    assert_eq!((code, &body["paused"]), (200, &json!(false)), "{body}");
    assert_eq!(paused_flag("parked"), Some(json!(false)));
    let (code, body) = post(a, "/api/v1/queues/%01/pause", json!({}));
    assert_eq!((code, &body["field"]), (400, &json!("queue")), "{body}");

    // Debounce: 201 inserted, then 200 debounced with the same id and the
    // new command; bad periods are 400 naming the field.
    let db =
        |cmd: &str| json!({"command": ["echo", cmd], "queue": "dbq", "key": "d", "debounce": "5s"});
    let (code, first) = post(a, "/api/v1/tasks", db("v1"));
    assert_eq!(
        (code, &first["outcome"]),
        (201, &json!("inserted")),
        "{first}"
    );
    let (code, again) = post(a, "/api/v1/tasks", db("v2"));
    assert_eq!(
        (code, &again["outcome"], &again["id"]),
        (200, &json!("debounced"), &first["id"]),
        "{again}"
    );
    let (_, t) = get(a, &format!("/api/v1/tasks/{}", first["id"]));
    assert_eq!(t["payload"]["argv"], json!(["echo", "v2"]), "{t}");
    for (body, field) in [
        (
            json!({"command": ["true"], "key": "d", "debounce": "0s"}),
            "debounce",
        ),
        (json!({"command": ["true"], "throttle": "1h"}), "throttle"),
        (
            json!({"command": ["true"], "key": "d", "debounce": "1s", "throttle": "1h"}),
            "debounce",
        ),
    ] {
        let (code, b) = post(a, "/api/v1/tasks", body);
        assert_eq!((code, &b["field"]), (400, &json!(field)), "{b}");
    }
}

/// Every route in `/api/v1/openapi.json` is served (not the 404 fallback)
/// and the document lists every route this test knows of.
async fn openapi_lists_every_route_served(e: Env) {
    let srv = start(&e, None, &tokens());
    let a = &srv.addr;
    let (code, doc) = get(a, "/api/v1/openapi.json");
    assert_eq!(code, 200, "{doc}");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut listed = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            assert!(op["summary"].is_string(), "{method} {path}");
            listed.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    let expected: BTreeSet<String> = [
        "GET /livez",
        "GET /readyz",
        "GET /health",
        "GET /jobs",
        "GET /stats",
        "GET /metrics",
        "GET /api/v1/jobs",
        "POST /api/v1/jobs",
        "PUT /api/v1/jobs/{name}",
        "DELETE /api/v1/jobs/{name}",
        "POST /api/v1/jobs/{name}/pause",
        "POST /api/v1/jobs/{name}/resume",
        "POST /api/v1/jobs/{name}/trigger",
        "POST /api/v1/jobs/{name}/backfill",
        "GET /api/v1/tasks",
        "POST /api/v1/tasks",
        "POST /api/v1/tasks/retry-failed",
        "GET /api/v1/tasks/{id}",
        "POST /api/v1/tasks/{id}/retry",
        "POST /api/v1/tasks/{id}/cancel",
        "DELETE /api/v1/tasks/{id}",
        "POST /api/v1/tasks/delete",
        "GET /api/v1/queues",
        "GET /api/v1/queues/history",
        "GET /api/v1/queues/{name}/keys",
        "POST /api/v1/queues/{name}/pause",
        "POST /api/v1/queues/{name}/resume",
        "GET /api/v1/locks",
        "GET /api/v1/locks/history",
        "POST /api/v1/locks/{name}/release",
        "GET /api/v1/audit",
        "GET /api/v1/stats/series",
        "GET /api/v1/openapi.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(listed, expected);
    for route in &listed {
        let (method, path) = route.split_once(' ').unwrap();
        let path = path.replace("{name}", "nope").replace("{id}", "1");
        let (code, body) = call(a, method, &path, Some(ADMIN), Some(json!({})));
        let fallback = body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("no such endpoint"));
        assert!(!fallback && code != 405, "{route}: {code} {body}");
    }
    let (code, body) = get(a, "/api/v1/nope");
    assert_eq!(code, 404, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .starts_with("no such endpoint"));
}

/// `/readyz` answers 503 with the reason while the store is stopped (a
/// private redis-server killed), and `/livez` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_when_the_store_stops() {
    let Some((mut redis, _e, srv)) = serve_on_private_redis().await else {
        return;
    };
    let a = &srv.addr;
    let (code, body) = call(a, "GET", "/readyz", None, None);
    assert_eq!(code, 200, "{body}");
    redis.stop();
    wait_for(20, "/readyz to answer 503", || {
        call(a, "GET", "/readyz", None, None).0 == 503
    });
    let (_, body) = call(a, "GET", "/readyz", None, None);
    assert_eq!(body["status"], "unavailable", "{body}");
    assert!(
        body["error"].as_str().unwrap().starts_with("store"),
        "{body}"
    );
    let (code, _) = call(a, "GET", "/health", None, None);
    assert_eq!(code, 503);
    let (code, _) = call(a, "GET", "/livez", None, None);
    assert_eq!(code, 200);
}

/// `GET /metrics` as `curl` asks (no `Accept`: the classic text format):
/// the status and the body.
/// `baton serve` (with the test config) on a private redis-server the
/// test may stop and start again: the server, the test's env and the
/// serve; `None` (a printed skip) without redis-server.
async fn serve_on_private_redis() -> Option<(support::Private, Env, Server)> {
    let mut redis = support::Private::new(support::Kind::Redis)?;
    redis.start();
    let e = Env::new(Kind::Sqlite).await?;
    let srv = start(&e, Some(&redis.url()), &[]);
    Some((redis, e, srv))
}

fn metrics_text(addr: &str) -> (u16, String) {
    common::http(addr, "GET", "/metrics", None, b"")
}

/// The value of the sample `series` (name and labels as written) in
/// `text`, if there is one.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// The sum of every sample of the family `name` in `text`.
fn family_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

/// `/metrics` keeps answering 200 while the store is stopped (a private
/// redis-server killed): this process's worker counters (its store errors
/// counting up), `baton_build_info`, and the store's gauges from the last
/// read with `baton_store_up 0` and the read's time unchanged; once the
/// store is back the gauges are read afresh (`baton_store_up 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_through_a_store_outage_marked_stale() {
    let Some((mut redis, _e, srv)) = serve_on_private_redis().await else {
        return;
    };
    let a = &srv.addr;
    let (code, m) = metrics_text(a);
    assert_eq!(code, 200, "{m}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        m.contains(&format!("baton_build_info{{version=\"{version}\"}} 1\n")),
        "{m}"
    );
    assert_eq!(sample(&m, "baton_store_up"), Some(1.0), "{m}");
    let fresh = sample(&m, "baton_store_time_seconds").expect("the store's time");
    assert!(
        sample(&m, "baton_store_last_read_timestamp_seconds").is_some(),
        "{m}"
    );

    redis.stop();
    let mut stale = String::new();
    wait_for(20, "/metrics to mark the store down", || {
        let (code, m) = metrics_text(a);
        assert_eq!(code, 200, "/metrics during the outage: {m}");
        stale = m;
        sample(&stale, "baton_store_up") == Some(0.0)
    });
    // The store's gauges are the last view read, with when it was read.
    let then = sample(&stale, "baton_store_time_seconds").expect("the last view's time");
    assert!(then >= fresh, "{stale}");
    let read_at = sample(&stale, "baton_store_last_read_timestamp_seconds").unwrap();
    assert!(stale.contains("# TYPE baton_queue_paused gauge"), "{stale}");
    // This process's own metrics are all there, its workers' store errors
    // counting the outage.
    assert!(stale.contains("baton_build_info{"), "{stale}");
    assert!(
        sample(&stale, "baton_worker_heartbeat_failures_total").is_some(),
        "{stale}"
    );
    assert!(
        sample(
            &stale,
            r#"baton_worker_store_errors_total{operation="task_claim"}"#
        )
        .is_some(),
        "{stale}"
    );
    wait_for(20, "the workers' store errors in /metrics", || {
        let (code, m) = metrics_text(a);
        assert_eq!(code, 200, "{m}");
        assert_eq!(sample(&m, "baton_store_up"), Some(0.0), "{m}");
        assert_eq!(sample(&m, "baton_store_time_seconds"), Some(then), "{m}");
        assert_eq!(
            sample(&m, "baton_store_last_read_timestamp_seconds"),
            Some(read_at),
            "{m}"
        );
        family_sum(&m, "baton_worker_store_errors_total") > 0.0
    });

    redis.start();
    wait_for(30, "/metrics to read the store again", || {
        let (code, m) = metrics_text(a);
        assert_eq!(code, 200, "{m}");
        sample(&m, "baton_store_up") == Some(1.0)
            && sample(&m, "baton_store_time_seconds").unwrap() > then
            && sample(&m, "baton_store_last_read_timestamp_seconds").unwrap() > read_at
    });
}

/// `/metrics` answers within its store-read bound while the store stalls
/// (a fault proxy that passes no byte, connections kept open): each scrape
/// 200 in well under 10 s, `baton_store_up 0` once the bound has passed,
/// and fresh again after the path heals — never hung for the scraper's
/// own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_while_the_store_stalls() {
    use common::proxy::{host_port, Mode, Proxy};
    let Some(e) = Env::new(Kind::Redis).await else {
        return;
    };
    let proxy = Proxy::start(&host_port(&e.ts.url));
    let via = proxy.url(&e.ts.url);
    let srv = start(&e, Some(&via), &[]);
    let a = &srv.addr;
    let (code, m) = metrics_text(a);
    assert_eq!(code, 200, "{m}");
    assert_eq!(sample(&m, "baton_store_up"), Some(1.0), "{m}");
    proxy.set(Mode::Dark);
    let scrape = || {
        let t0 = Instant::now();
        let (code, m) = metrics_text(a);
        let took = t0.elapsed();
        assert_eq!(code, 200, "/metrics while the store stalls: {m}");
        assert!(
            took < Duration::from_secs(10),
            "/metrics took {took:?} while the store stalled (the read bound is 5 s)"
        );
        m
    };
    wait_for(30, "/metrics to mark the stalled store down", || {
        sample(&scrape(), "baton_store_up") == Some(0.0)
    });
    assert!(scrape().contains("baton_build_info{"));
    proxy.set(Mode::Pass);
    wait_for(30, "/metrics to read the store again", || {
        sample(&scrape(), "baton_store_up") == Some(1.0)
    });
}

/// `promtool check metrics` (Prometheus' own linter) finds nothing wrong
/// in a real `/metrics` body, with tasks run so the histograms hold
/// samples, and the OpenMetrics text is served to a client asking for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_check() {
    if !support::need("promtool check metrics", &["promtool"]) {
        return;
    }
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let srv = start(&e, None, &[]);
    let a = &srv.addr;
    let (code, body) = post(a, "/api/v1/tasks", json!({"command": ["true"]}));
    assert!(code < 300, "{code} {body}");
    wait_for(20, "the task to run", || {
        let (_, m) = metrics_text(a);
        sample(
            &m,
            r#"baton_worker_run_duration_seconds_count{queue="default"}"#,
        )
        .is_some_and(|n| n >= 1.0)
    });
    let (code, m) = metrics_text(a);
    assert_eq!(code, 200, "{m}");
    // The queue's declared limit and its keys (issue 25 item 5).
    assert_eq!(
        sample(
            &m,
            r#"baton_queue_limit{queue="default",limit="per_key_max_running"}"#
        ),
        Some(2.0),
        "{m}"
    );
    for series in [
        r#"baton_queue_keys{queue="default",state="running"}"#,
        r#"baton_queue_keys{queue="default",state="pending"}"#,
        r#"baton_queue_keys_at_cap{queue="default"}"#,
        r#"baton_queue_keys_rate_held{queue="default"}"#,
    ] {
        assert_eq!(sample(&m, series), Some(0.0), "{series}: {m}");
    }
    // Under the rate per key (1/1h): two tasks of one key, the first
    // starts, the second is held back until an hour after it — in the
    // metrics, the API and `baton queues keys`.
    for _ in 0..2 {
        let (code, body) = post(
            a,
            "/api/v1/tasks",
            json!({"command": ["true"], "concurrency_key": "acme"}),
        );
        assert!(code < 300, "{code} {body}");
    }
    wait_for(30, "the key held back by its rate", || {
        let (_, m) = metrics_text(a);
        sample(&m, r#"baton_queue_keys_rate_held{queue="default"}"#) == Some(1.0)
            && sample(
                &m,
                r#"baton_queue_key_rate_starts{queue="default",key="acme"}"#,
            ) == Some(1.0)
    });
    let (code, k) = get(a, "/api/v1/queues/default/keys");
    assert_eq!(code, 200, "{k}");
    assert_eq!(
        (
            &k["per_key_rate"],
            &k["keys_rate_held"],
            &k["keys"][0]["key"]
        ),
        (&json!("1/1h"), &json!(1), &json!("acme")),
        "{k}"
    );
    let rate = &k["keys"][0]["rate"];
    assert_eq!(
        (&rate["started_in_window"], &rate["max"], &rate["per_ms"]),
        (&json!(1), &json!(1), &json!(3_600_000)),
        "{k}"
    );
    let next = rate["next_start_at"].as_str().expect("a next start");
    let out = common::stdout(&e.run(&["queues", "keys", "default"]));
    assert!(
        out.contains("IN WINDOW") && out.contains("1/1") && out.contains(&next[..16]),
        "{out}"
    );
    assert!(
        out.contains("rate per key 1/1h, 1 listed key(s) held back"),
        "{out}"
    );
    let (code, m) = metrics_text(a);
    assert_eq!(code, 200, "{m}");
    let mut check = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(m.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics: {said}\non:\n{m}"
    );
    // Prometheus asks for OpenMetrics first, and gets it.
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\
         Accept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3\r\n\r\n"
    );
    let mut s = std::net::TcpStream::connect(a).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(
        answer.contains("application/openmetrics-text; version=1.0.0"),
        "{answer}"
    );
    assert!(
        answer.contains("# TYPE baton_worker_attempts counter\n"),
        "{answer}"
    );
    assert!(answer.ends_with("# EOF\n"), "{answer}");
}

fn rss_kib(pid: u32) -> u64 {
    read(std::path::Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A 1 MiB header is answered 431 without being buffered: RSS stays flat
/// over twenty such requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1mib_header_is_refused_with_431_and_rss_stays_flat() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let srv = start(&e, None, &[]);
    let a = srv.addr.clone();
    let (code, _) = call(&a, "GET", "/livez", None, None);
    assert_eq!(code, 200);
    let before = rss_kib(srv.kid.id());
    let big = "a".repeat(1024 * 1024);
    for _ in 0..20 {
        let mut s = std::net::TcpStream::connect(&a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        let head = format!("GET /livez HTTP/1.1\r\nHost: {a}\r\nX-Big: {big}\r\n\r\n");
        // The server stops reading at its limit, so write from another
        // thread and read the answer here.
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(head.as_bytes());
        });
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 431"), "{text:?}");
        drop(s);
        writer.join().unwrap();
    }
    let after = rss_kib(srv.kid.id());
    assert!(
        after < before + 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let (code, _) = call(&a, "GET", "/livez", None, None);
    assert_eq!(code, 200, "the server still answers");
}

/// Without a token, a non-loopback `--listen` is refused with one line
/// naming the fix; with a token it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_listen_needs_a_token() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    let out = e
        .cmd(&["serve", "--config", "baton.toml", "--listen", "0.0.0.0:0"])
        .env_remove("BATON_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = common::stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("--listen"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("BATON_ADMIN_TOKEN") && line.contains("127.0.0.1"),
        "{err}"
    );
    let log = std::fs::File::create(e.path("open.log")).unwrap();
    let mut kid = e
        .cmd(&["serve", "--config", "baton.toml", "--listen", "0.0.0.0:0"])
        .env("BATON_ADMIN_TOKEN", ADMIN)
        .env("BATON_LOG", "info")
        .stderr(log)
        .spawn()
        .unwrap();
    wait_for(20, "the admin server on 0.0.0.0", || {
        read(&e.path("open.log")).contains("admin on http://0.0.0.0:")
    });
    signal(&kid, libc::SIGTERM);
    kid.wait().unwrap();
}

// ---- the dashboard in headless Chromium ------------------------------------------

const CHROMIUM: &str = "/usr/bin/chromium";

/// A page of headless Chromium driven over the DevTools protocol; collects
/// console errors and uncaught exceptions as they arrive.
struct Browser {
    kid: Child,
    ws: tungstenite::WebSocket<std::net::TcpStream>,
    next_id: u64,
    errors: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.kid.kill();
        let _ = self.kid.wait();
    }
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let kid = std::process::Command::new(CHROMIUM)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1400,1200",
                &format!("--remote-debugging-port={port}"),
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The page target's websocket, from the DevTools HTTP endpoint.
        let mut url = String::new();
        wait_for(30, "Chromium's DevTools endpoint", || {
            let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                return false;
            };
            let _ = write!(
                s,
                "GET /json/list HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            );
            // DevTools may keep the connection open: read until the read
            // times out or the peer closes; a partial body is retried.
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            let answer = String::from_utf8_lossy(&raw);
            let Some((_, body)) = answer.split_once("\r\n\r\n") else {
                return false;
            };
            let targets: Value = serde_json::from_str(body).unwrap_or(Value::Null);
            if let Some(u) = targets
                .as_array()
                .into_iter()
                .flatten()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            {
                url = u.to_string();
            }
            !url.is_empty()
        });
        let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (ws, _) = tungstenite::client(url.as_str(), tcp).unwrap();
        let mut b = Browser {
            kid,
            ws,
            next_id: 0,
            errors: Vec::new(),
            _profile: profile,
        };
        b.call("Runtime.enable", json!({}));
        b.call("Log.enable", json!({}));
        b.call("Page.enable", json!({}));
        b
    }

    /// Send one command and wait for its answer, noting events on the way.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.ws
            .send(tungstenite::Message::text(
                json!({"id": id, "method": method, "params": params}).to_string(),
            ))
            .unwrap();
        loop {
            let msg = self.ws.read().unwrap();
            let tungstenite::Message::Text(text) = msg else {
                continue;
            };
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            match v["method"].as_str() {
                Some("Runtime.exceptionThrown") => self
                    .errors
                    .push(v["params"]["exceptionDetails"].to_string()),
                Some("Runtime.consoleAPICalled") if v["params"]["type"] == "error" => {
                    self.errors.push(v["params"]["args"].to_string())
                }
                Some("Log.entryAdded") if v["params"]["entry"]["level"] == "error" => {
                    self.errors.push(v["params"]["entry"].to_string())
                }
                _ => {}
            }
        }
    }

    /// Evaluate a JavaScript expression in the page; its JSON value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }
}

/// The dashboard in a real browser: loads with no console errors, shows a
/// seeded job (with its run), task and lock, and a retry click changes the
/// task's state. Writes a screenshot (to docs/dashboard.png with
/// BATON_UPDATE_SCREENSHOT=1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_chromium_shows_seeded_rows_and_retries() {
    if !common::have("chromium", std::path::Path::new(CHROMIUM).exists()) {
        return;
    }
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    // The lock's release is recorded: its store URL turns the lock
    // history on (off by default).
    let sep = if e.ts.url.contains('?') { '&' } else { '?' };
    let out = e
        .cmd(&[
            "lock",
            "nightly-report",
            "--at-most",
            "2h",
            "--at-least",
            "1h",
            "--",
            "true",
        ])
        .env("BATON_STORE", format!("{}{sep}lock_history=on", e.ts.url))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let srv = start(&e, None, &tokens());
    let a = srv.addr.clone();
    // A run of the job, a failed task, and a cancelled one to retry.
    let (code, run) = post(
        &a,
        "/api/v1/jobs/nightly/trigger",
        json!({"slot": "2026-01-30T18:00:00Z"}),
    );
    assert_eq!(code, 200, "{run}");
    let (_, failed) = post(
        &a,
        "/api/v1/tasks",
        json!({"command": ["sh", "-c", "echo copied 41 files; echo disk full >&2; exit 3"], "max_attempts": 1}),
    );
    let (_, parked) = post(
        &a,
        "/api/v1/tasks",
        json!({"command": ["backup", "--full"], "queue": "parked"}),
    );
    let t = parked["id"].as_i64().unwrap();
    let (code, _) = post(&a, &format!("/api/v1/tasks/{t}/cancel"), json!({}));
    assert_eq!(code, 200);
    let f = failed["id"].as_i64().unwrap();
    wait_for(20, "the failing task to fail", || {
        get(&a, &format!("/api/v1/tasks/{f}")).1["state"] == "failed"
    });

    let mut b = Browser::launch();
    b.call(
        "Page.navigate",
        json!({"url": format!("http://{a}/#token={ADMIN}")}),
    );
    let seeded = format!(
        r#"!!(document.querySelector('[data-job="nightly"] .mark.succeeded') && document.querySelector('[data-task="{t}"]') && document.querySelector('[data-lock="nightly-report"]') && document.querySelector('[data-queue="parked"]'))"#
    );
    let t0 = Instant::now();
    while b.eval(&seeded) != json!(true) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the dashboard never showed the seeded rows: {}",
            b.eval("document.body.innerText")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let state = format!(r#"document.querySelector('[data-task="{t}"] .task-state').textContent"#);
    assert_eq!(b.eval(&state), json!("cancelled"));
    // The charts from the store's rollup: the failed attempt and the job's
    // run counted (workers flush every 10 s; the page refreshes every 3 s),
    // a point a minute over the hour, and the day's 96 once chosen.
    let charted = r#"(() => { const t = document.getElementById('chart-totals').dataset; return [Number(t.succeeded) >= 1, t.failed, t.dead, document.getElementById('chart-throughput').dataset.points]; })()"#;
    wait_for(40, "the charts to count the runs", || {
        b.eval(charted) == json!([true, "1", "1", "60"])
    });
    assert!(
        b.eval("document.getElementById('chart-totals').textContent")
            .as_str()
            .unwrap()
            .contains("1 failed attempts (1 dead)"),
        "{}",
        b.eval("document.getElementById('chart-totals').textContent")
    );
    b.eval("const r = document.getElementById('c-range'); r.value = '1d'; r.dispatchEvent(new Event('change'))");
    wait_for(20, "the day's chart", || {
        b.eval("document.getElementById('chart-throughput').dataset.points") == json!("96")
    });
    assert_eq!(
        b.eval("[...document.getElementById('c-queue').options].map((o) => o.value).includes('default')"),
        json!(true)
    );
    // The job selector: the job's own series, without the failed task
    // (not the job's); back to every job.
    wait_for(20, "the job selector to offer the job", || {
        b.eval(
            "[...document.getElementById('c-job').options].map((o) => o.value).includes('nightly')",
        ) == json!(true)
    });
    let pick_job = |job: &str| {
        format!(
            r#"(() => {{ const j = document.getElementById('c-job'); j.value = {job:?}; j.dispatchEvent(new Event('change')); }})()"#
        )
    };
    let totals = r#"(() => { const t = document.getElementById('chart-totals').dataset; return [Number(t.succeeded) >= 1, t.failed]; })()"#;
    b.eval(&pick_job("nightly"));
    wait_for(20, "the job's own chart", || {
        b.eval(totals) == json!([true, "0"])
    });
    b.eval(&pick_job(""));
    wait_for(20, "every job's chart again", || {
        b.eval(totals) == json!([true, "1"])
    });
    assert_eq!(
        b.eval(
            r#"document.querySelector('[data-lock="nightly-report"]').textContent.includes('held')"#
        ),
        json!(true)
    );
    // The `baton lock` run above released its lease: the lock history
    // has it, in the API and on the page.
    let (code, hist) = get(&a, "/api/v1/locks/history?name=nightly-report");
    assert_eq!(code, 200, "{hist}");
    let recs = hist["records"].as_array().unwrap();
    assert_eq!(recs.len(), 1, "{hist}");
    assert!(
        recs[0]["holder"].as_str().is_some_and(|h| !h.is_empty()),
        "{hist}"
    );
    assert!(recs[0]["held_ms"].as_i64().unwrap() >= 0, "{hist}");
    let release_row = format!(
        r#"!!document.querySelector('[data-lock-release="nightly-report#{}"]')"#,
        recs[0]["token"]
    );
    wait_for(20, "the release in the lock history table", || {
        b.eval(&release_row) == json!(true)
    });
    let (code, body) = get(&a, "/api/v1/locks/history?limit=0");
    assert_eq!((code, &body["field"]), (400, &json!("limit")), "{body}");
    // The Keys panel under a rate per key (the default queue: 1/1h): the
    // key's start in the window against the rate, and its next start.
    for _ in 0..2 {
        let (code, body) = post(
            &a,
            "/api/v1/tasks",
            json!({"command": ["true"], "concurrency_key": "acme"}),
        );
        assert_eq!(code, 201, "{body}");
    }
    b.eval(r#"document.querySelector('[data-queue-keys="default"]').click()"#);
    let key_row = r#"(() => { const r = document.querySelector('[data-key="acme"]'); if (!r) return null; return [r.querySelector('[data-window]').dataset.window, r.children[4].textContent, r.querySelector('[data-next]').dataset.next !== '']; })()"#;
    wait_for(30, "the key's rate in the Keys panel", || {
        b.eval(key_row) == json!(["1", "1/1", true])
    });
    assert!(
        b.eval("document.getElementById('keys-title').textContent")
            .as_str()
            .unwrap_or_default()
            .contains("rate per key 1/1h, 1 held back"),
        "{}",
        b.eval("document.getElementById('keys-title').textContent")
    );
    // The token went from the address into sessionStorage.
    assert_eq!(b.eval("location.hash"), json!(""));
    b.eval(&format!(
        r#"document.querySelector('[data-retry="{t}"]').click()"#
    ));
    let t0 = Instant::now();
    while b.eval(&state) != json!("pending") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the retry click did not change the task's state"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(get(&a, &format!("/api/v1/tasks/{t}")).1["state"], "pending");
    assert_eq!(
        b.eval(r#"document.getElementById('error').hidden"#),
        json!(true)
    );
    // The retry is in the audit log, from the dashboard, by the admin token.
    let audited = r#"[...document.querySelectorAll('#audit-body tr')].some((r) => r.innerText.includes('api:admin') && r.innerText.includes('dashboard') && r.innerText.includes('/retry'))"#;
    wait_for(20, "the retry to show in the audit log", || {
        b.eval(audited) == json!(true)
    });
    // Search by payload text: only the backup task stays listed; cleared,
    // the failed one is back.
    let search = |text: &str| {
        format!(
            r#"document.getElementById('f-text').value = {text:?}; document.getElementById('task-filter').requestSubmit()"#
        )
    };
    let listed = format!(
        r#"[!!document.querySelector('[data-task="{t}"]'), !!document.querySelector('[data-task="{f}"]')]"#
    );
    b.eval(&search("backup"));
    wait_for(20, "the search to leave only the backup task", || {
        b.eval(&listed) == json!([true, false])
    });
    b.eval(&search(""));
    wait_for(20, "the cleared search to list both", || {
        b.eval(&listed) == json!([true, true])
    });
    // The failed task's page: its attempt, with the worker that ran it and
    // the command's stderr in the error; payload; timeline.
    b.eval(&format!(
        r#"document.querySelector('[data-open="{f}"]').click()"#
    ));
    let page = r#"(() => { const d = document.getElementById('task-dialog'); const a = d.querySelector('[data-attempt="1"]'); return d.open && a ? [a.children[1].textContent, d.querySelector('#task-body').innerText] : null; })()"#;
    wait_for(20, "the task's page to open", || b.eval(page).is_array());
    let shown = b.eval(page);
    let worker = shown[0].as_str().unwrap();
    let text = shown[1].as_str().unwrap();
    assert!(!worker.is_empty() && worker != "–", "{shown}");
    for want in [
        "exit 3: disk full",
        "stdout: copied 41 files",
        "echo disk full",
        "enqueued",
        "attempt 1 failed",
        "failed",
    ] {
        assert!(
            text.contains(want),
            "the task's page lacks {want:?}: {text}"
        );
    }
    b.eval("document.getElementById('task-close').click()");
    assert_eq!(
        b.eval("document.getElementById('task-dialog').open"),
        json!(false)
    );
    // Delete asks first: declined, nothing happens; accepted, the task is
    // gone from the store and the table.
    let (_, d) = post(
        &a,
        "/api/v1/tasks",
        json!({"command": ["true"], "queue": "doomed", "delay": "1h"}),
    );
    let t = d["id"].as_i64().unwrap();
    let shown = format!(r#"!!document.querySelector('[data-delete="{t}"]')"#);
    let t0 = Instant::now();
    while b.eval(&shown) != json!(true) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the new task's row never showed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    b.eval("window.confirm = () => false");
    b.eval(&format!(
        r#"document.querySelector('[data-delete="{t}"]').click()"#
    ));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(&a, &format!("/api/v1/tasks/{t}")).0, 200);
    b.eval("window.confirm = () => true");
    b.eval(&format!(
        r#"document.querySelector('[data-delete="{t}"]').click()"#
    ));
    let row = format!(r#"!!document.querySelector('[data-task="{t}"]')"#);
    let t0 = Instant::now();
    while b.eval(&row) != json!(false) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the delete click did not remove the task's row: {}",
            b.eval("document.getElementById('error').textContent")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(get(&a, &format!("/api/v1/tasks/{t}")).0, 404);
    // The queue table's pause button pauses the queue in the store; the
    // row then offers resume, which resumes it.
    let queue_paused = |a: &str| {
        get(a, "/api/v1/queues")
            .1
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == "parked" && q["paused"] == true)
    };
    // The pause asks for a note (cancelled: nothing happens), which is
    // recorded with "via dashboard" and shown in the queue's row.
    b.eval("window.prompt = () => null");
    b.eval(r#"document.querySelector('[data-queue-pause="parked"]').click()"#);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!queue_paused(&a), "a cancelled prompt pauses nothing");
    b.eval("window.prompt = () => 'vendor outage'");
    b.eval(r#"document.querySelector('[data-queue-pause="parked"]').click()"#);
    wait_for(20, "the pause click to pause the queue", || {
        queue_paused(&a)
    });
    let parked = get(&a, "/api/v1/queues").1;
    let parked = parked
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "parked")
        .unwrap()
        .clone();
    assert_eq!(parked["pause_change"]["note"], "vendor outage", "{parked}");
    assert_eq!(
        parked["pause_change"]["by"], "api:admin via dashboard",
        "{parked}"
    );
    let t0 = Instant::now();
    while b.eval(r#"!!document.querySelector('[data-queue-resume="parked"]') && document.querySelector('[data-queue="parked"]').textContent.includes('vendor outage')"#) != json!(true) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the paused queue's row offers no resume or lacks its note: {}",
            b.eval(r#"document.querySelector('[data-queue="parked"]').textContent"#)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    b.eval("window.prompt = () => ''");
    b.eval(r#"document.querySelector('[data-queue-resume="parked"]').click()"#);
    wait_for(20, "the resume click to resume the queue", || {
        !queue_paused(&a)
    });

    // Each job row shows its policies, its next three fire times in its
    // zone, and the last pause's note and author.
    let (code, _) = post(
        &a,
        "/api/v1/jobs/nightly/pause",
        json!({"note": "disk swap", "by": "alice"}),
    );
    assert_eq!(code, 200);
    let shown = r#"(() => {
        const p = document.querySelector('[data-policies="nightly"]');
        const n = document.querySelectorAll('[data-next="nightly"] .fires div');
        const q = document.querySelector('[data-pause="nightly"]');
        return !!(p && p.textContent.includes('overlap skip') && p.textContent.includes('misfire latest')
            && n.length === 3 && Array.from(n).every((d) => d.textContent.includes('03:00:00+09:00 KST'))
            && q && q.textContent.includes('disk swap') && q.textContent.includes('alice (api:admin via api)'));
    })()"#;
    let t0 = Instant::now();
    while b.eval(shown) != json!(true) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the job row lacks its policies, fires or note: {}",
            b.eval(r#"document.querySelector('[data-job="nightly"]').textContent"#)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, _) = post(&a, "/api/v1/jobs/nightly/resume", json!({}));
    assert_eq!(code, 200);

    // Backfill from the jobs section: a dry run says what would run and
    // enqueues nothing; then the backfill enqueues those slots.
    let nightly_tasks = |a: &str| {
        get(a, "/api/v1/tasks?job=nightly&limit=1000").1["tasks"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let before = nightly_tasks(&a);
    let result = r#"document.getElementById('backfill-result').textContent"#;
    b.eval(
        r#"(() => { document.getElementById('backfill-job').value = 'nightly';
            document.getElementById('backfill-from').value = '2026-01-01T12:00:00Z';
            document.getElementById('backfill-to').value = '2026-01-03T12:00:00Z';
            document.getElementById('backfill-form').requestSubmit(); })()"#,
    );
    let t0 = Instant::now();
    while !b
        .eval(result)
        .as_str()
        .unwrap_or("")
        .contains("would be enqueued")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the dry run answered nothing: {} / {}",
            b.eval(result),
            b.eval("document.getElementById('error').textContent")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        b.eval(result),
        json!("2 slots: 2 would be enqueued, 0 left alone (dry run: nothing enqueued)")
    );
    assert_eq!(nightly_tasks(&a), before, "a dry run enqueued");
    b.eval(
        r#"(() => { document.getElementById('backfill-dry').checked = false;
            document.getElementById('backfill-form').requestSubmit(); })()"#,
    );
    let t0 = Instant::now();
    while b.eval(result) != json!("2 slots: 2 enqueued, 0 left alone") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the backfill answered: {}",
            b.eval(result)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(nightly_tasks(&a), before + 2);

    // A phone's width in dark mode: the page itself does not scroll
    // sideways (tables scroll in their sections) and its colours are dark.
    b.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 800, "deviceScaleFactor": 1, "mobile": true}),
    );
    b.call(
        "Emulation.setEmulatedMedia",
        json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        b.eval("document.documentElement.scrollWidth <= 390"),
        json!(true),
        "the page is {} px wide at 390",
        b.eval("document.documentElement.scrollWidth")
    );
    assert_eq!(
        b.eval("getComputedStyle(document.body).backgroundColor"),
        json!("rgb(18, 22, 27)"),
        "dark mode follows the system setting"
    );
    b.call(
        "Emulation.setEmulatedMedia",
        json!({"features": [{"name": "prefers-color-scheme", "value": "light"}]}),
    );
    b.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 1400, "height": 1150, "deviceScaleFactor": 1, "mobile": false}),
    );
    std::thread::sleep(Duration::from_millis(300));
    screenshot(&mut b, "dashboard.png");
    // The failed task's page, over the dashboard.
    b.eval(&format!(
        r#"document.querySelector('[data-open="{f}"]').click()"#
    ));
    wait_for(20, "the task's page to open again", || {
        b.eval(page).is_array()
    });
    std::thread::sleep(Duration::from_millis(300));
    screenshot(&mut b, "task.png");
    // Any console error or exception so far fails the test.
    b.eval("1");
    assert!(b.errors.is_empty(), "console errors: {:#?}", b.errors);
}

/// A PNG of the page into the test's temporary directory, and into
/// docs/ with BATON_UPDATE_SCREENSHOT=1 (`scripts/screenshots.sh`).
fn screenshot(b: &mut Browser, name: &str) {
    use base64::Engine as _;
    let shot = b.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&out, &png).unwrap();
    if std::env::var_os("BATON_UPDATE_SCREENSHOT").is_some() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        std::fs::write(docs.join(name), &png).unwrap();
    }
}

/// Out of file descriptors, the accept loop logs the error and backs off
/// instead of spinning a core, and serves again once descriptors free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_errors_are_logged_and_back_off() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    let log = std::fs::File::create(e.path("emfile.log")).unwrap();
    let kid = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 96 && exec {} serve --config baton.toml --listen 127.0.0.1:0",
            common::BATON
        ))
        .env("BATON_STORE", &e.ts.url)
        .env("BATON_PREFIX", &e.ts.prefix)
        .current_dir(e.dir.path())
        .stderr(log)
        .spawn()
        .unwrap();
    // Stopped (SIGTERM, then SIGKILL) even when an assertion fails.
    let srv = Server {
        kid,
        addr: String::new(),
    };
    let kid = &srv.kid;
    let addr = common::admin_addr(20, || read(&e.path("emfile.log")));
    // Hold more connections than the server has descriptors left.
    let mut held = Vec::new();
    for _ in 0..150 {
        if let Ok(s) = std::net::TcpStream::connect(&addr) {
            held.push(s);
        }
    }
    wait_for(20, "the accept error in the log", || {
        read(&e.path("emfile.log")).contains("accept failed")
    });
    let cpu = |pid: u32| -> u64 {
        let stat = read(std::path::Path::new(&format!("/proc/{pid}/stat")));
        let after = stat
            .rsplit_once(')')
            .map(|(_, r)| r.to_string())
            .unwrap_or_default();
        let f: Vec<&str> = after.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let t0 = cpu(kid.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu(kid.id()) - t0;
    // Clock ticks (100 a second): a spinning loop would use ~200.
    assert!(
        used < 60,
        "the server used {used} ticks in 2 s while out of descriptors"
    );
    drop(held);
    wait_for(20, "the server to answer again", || {
        std::net::TcpStream::connect(&addr).is_ok()
            && call(&addr, "GET", "/livez", None, None).0 == 200
    });
    drop(srv);
}

/// `/readyz` answers 503 naming both versions while the store records a
/// schema version other than this build's (set back, then forward, behind
/// the server's back), and 200 again once it is this build's.
async fn readyz_checks_the_schema_version(kind: Kind) {
    let Some(e) = Env::new(kind).await else {
        return;
    };
    let srv = start(&e, None, &[]);
    let a = &srv.addr;
    let (code, body) = call(a, "GET", "/readyz", None, None);
    assert_eq!(code, 200, "{body}");
    let expected = e.ts.store.backend().schema_status().await.unwrap().expected;
    let p = e.ts.prefix.clone();
    for (found, word) in [(expected - 1, "older"), (expected + 1, "newer")] {
        common::harness::set_schema_version(&e.ts, &p, Some(found)).await;
        let (code, body) = call(a, "GET", "/readyz", None, None);
        assert_eq!(code, 503, "{body}");
        assert_eq!(body["status"], "unavailable", "{body}");
        assert_eq!(
            body["schema"],
            json!({"found": found, "expected": expected}),
            "{body}"
        );
        let why = body["error"].as_str().unwrap();
        assert!(
            why.contains(&format!("version {found}"))
                && why.contains(&format!("this build's {expected}"))
                && why.contains(word),
            "{why}"
        );
        let (code, _) = call(a, "GET", "/health", None, None);
        assert_eq!(code, 503);
    }
    common::harness::set_schema_version(&e.ts, &p, Some(expected)).await;
    let (code, body) = call(a, "GET", "/readyz", None, None);
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_checks_the_schema_version_sqlite() {
    readyz_checks_the_schema_version(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_checks_the_schema_version_postgres() {
    readyz_checks_the_schema_version(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_checks_the_schema_version_mysql() {
    readyz_checks_the_schema_version(Kind::Mysql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_checks_the_schema_version_redis() {
    readyz_checks_the_schema_version(Kind::Redis).await
}
