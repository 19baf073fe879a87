//! Charts from the store (issue 27): two `baton serve` on one store answer
//! the same throughput series and "finished in the last hour" after tasks
//! ran on either, and a restarted server answers the same again; a job's
//! series (`job=`) counts its runs and only its runs, for a job defined in
//! the store (whose tasks are kind `command`, like every enqueued command)
//! as for one in the config.

use crate::common;

use common::{call, wait_for, Env, Kind, Server};
use serde_json::{json, Value};

const TOKEN: &str = "charts-token";

per_backend! {
    a_stored_jobs_series_counts_its_runs_and_only_its_runs,
}

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 2
lease = "5s"

[[queue]]
name = "mail"
concurrency = 2
lease = "5s"
"#;

fn start(e: &Env) -> Server {
    std::fs::write(e.path("baton.toml"), CONFIG).unwrap();
    common::serve_listening(e, "baton.toml", &[("BATON_ADMIN_TOKEN", TOKEN)])
}

fn get(addr: &str, path: &str) -> Value {
    let (code, body) = call(addr, "GET", path, Some(TOKEN), None);
    assert_eq!(code, 200, "{path}: {body}");
    body
}

/// A series without its read time (`to`), which differs between reads.
fn series(addr: &str, query: &str) -> Value {
    let mut s = get(addr, &format!("/api/v1/stats/series?{query}"));
    s.as_object_mut().unwrap().remove("to");
    s
}

fn finished(addr: &str) -> Vec<(String, i64)> {
    get(addr, "/api/v1/queues")
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["queue"].as_str().unwrap().to_string(),
                q["finished_last_hour"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_show_the_same_charts_and_counts_across_a_restart() {
    let Some(e) = Env::new(Kind::Sqlite).await else {
        return;
    };
    let (a, b) = (start(&e), start(&e));
    // Tasks on both servers' workers: 4 succeed in `default`, 2 in `mail`
    // (one a second attempt after a failure), one fails for good.
    let enqueue = |body: Value| {
        let (code, t) = call(&a.addr, "POST", "/api/v1/tasks", Some(TOKEN), Some(body));
        assert_eq!(code, 201, "{t}");
        t["id"].as_i64().unwrap()
    };
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(enqueue(json!({"command": ["true"]})));
    }
    ids.push(enqueue(json!({"command": ["true"], "queue": "mail"})));
    let flaky = e.path("flaky-once");
    ids.push(enqueue(json!({
        "command": ["sh", "-c", format!("test -e {0} || {{ touch {0}; exit 1; }}", flaky.display())],
        "queue": "mail", "max_attempts": 2,
    })));
    ids.push(enqueue(
        json!({"command": ["sh", "-c", "exit 3"], "max_attempts": 1}),
    ));
    wait_for(60, "every task to finish", || {
        ids.iter().all(|id| {
            let s = get(&a.addr, &format!("/api/v1/tasks/{id}"))["state"].clone();
            s == "succeeded" || s == "failed"
        })
    });
    // Each worker flushes its counts within 10 s.
    let want = json!({"succeeded": 6, "failed": 2, "dead": 1});
    let totals = |addr: &str| {
        let t = &series(addr, "range=1h")["totals"];
        json!({"succeeded": t["succeeded"], "failed": t["failed"], "dead": t["dead"]})
    };
    wait_for(40, "the rollup to count every attempt", || {
        totals(&a.addr) == want
    });
    let queries = [
        "range=1h",
        "range=1d",
        "range=1w",
        "range=1h&queue=mail",
        "range=1d&kind=command",
        "range=1w&job=nothing-of-that-kind",
    ];
    let on = |addr: &str| -> Vec<Value> { queries.iter().map(|q| series(addr, q)).collect() };
    let seen = on(&a.addr);
    assert_eq!(on(&b.addr), seen, "both servers answer the same series");
    assert_eq!(finished(&b.addr), finished(&a.addr));
    assert_eq!(
        finished(&a.addr),
        [("default".to_string(), 5), ("mail".to_string(), 2)]
    );
    let hour = &seen[0];
    assert_eq!(hour["points"].as_array().unwrap().len(), 60);
    assert_eq!(hour["step_secs"], 60);
    let mail = &seen[3]["totals"];
    assert_eq!(
        (&mail["succeeded"], &mail["failed"], &mail["dead"]),
        (&json!(2), &json!(1), &json!(0))
    );
    let command = &seen[4]["totals"];
    assert_eq!(
        (&command["succeeded"], &command["failed"]),
        (&json!(6), &json!(2))
    );
    assert!(command["run_avg_ms"].as_i64().is_some(), "{command}");
    assert_eq!(seen[5]["totals"]["succeeded"], 0, "a kind with no tasks");
    assert!(hour["totals"]["wait_max_ms"].as_i64().unwrap() >= 0);
    // Bad input names the field.
    let (code, body) = call(
        &a.addr,
        "GET",
        "/api/v1/stats/series?range=2h",
        Some(TOKEN),
        None,
    );
    assert_eq!((code, &body["field"]), (400, &json!("range")), "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("1h, 1d or 1w"),
        "{body}"
    );
    let (code, body) = call(
        &a.addr,
        "GET",
        "/api/v1/stats/series?qeue=x",
        Some(TOKEN),
        None,
    );
    assert_eq!((code, &body["field"]), (400, &json!("qeue")), "{body}");

    // Both stopped, one started again: the same series.
    drop((a, b));
    let c = start(&e);
    assert_eq!(on(&c.addr), seen, "the series outlive the servers");
    assert_eq!(
        finished(&c.addr),
        [("default".to_string(), 5), ("mail".to_string(), 2)]
    );
}

/// A command appending a line to the file `name` in `e`'s directory.
fn tally(e: &Env, name: &str) -> Value {
    json!([
        "sh",
        "-c",
        format!("echo run >> '{}'", e.path(name).display())
    ])
}

fn lines(e: &Env, name: &str) -> i64 {
    let text = std::fs::read_to_string(e.path(name)).unwrap_or_default();
    i64::try_from(text.lines().count()).unwrap()
}

async fn a_stored_jobs_series_counts_its_runs_and_only_its_runs(e: Env) {
    let config = format!(
        "{CONFIG}\n[[job]]\nname = \"cfg\"\nevery = \"1s\"\ncommand = {}\n",
        tally(&e, "cfg-runs")
    );
    std::fs::write(e.path("baton.toml"), config).unwrap();
    let s = common::serve_listening(&e, "baton.toml", &[("BATON_ADMIN_TOKEN", TOKEN)]);
    let (code, body) = call(
        &s.addr,
        "POST",
        "/api/v1/jobs",
        Some(TOKEN),
        Some(
            json!({"name": "stored", "definition": {"every": "1s", "command": tally(&e, "stored-runs")}}),
        ),
    );
    assert_eq!(code, 200, "{body}");
    // Plain command tasks beside it: the same kind, no job.
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (code, t) = call(
            &s.addr,
            "POST",
            "/api/v1/tasks",
            Some(TOKEN),
            Some(json!({"command": ["true"]})),
        );
        assert_eq!(code, 201, "{t}");
        ids.push(t["id"].as_i64().unwrap());
    }
    wait_for(30, "both jobs to run twice", || {
        lines(&e, "stored-runs") >= 2 && lines(&e, "cfg-runs") >= 2
    });
    // Stop both jobs so their run counts settle.
    let (code, body) = call(&s.addr, "DELETE", "/api/v1/jobs/stored", Some(TOKEN), None);
    assert_eq!(code, 200, "{body}");
    let (code, body) = call(
        &s.addr,
        "POST",
        "/api/v1/jobs/cfg/pause",
        Some(TOKEN),
        Some(json!({})),
    );
    assert!(code == 200 || code == 204, "{code} {body}");
    let succeeded = |q: &str| series(&s.addr, q)["totals"]["succeeded"].as_i64().unwrap();
    // Each worker flushes its counts within 10 s; a run in flight at the
    // stop ends and is counted too.
    wait_for(60, "the rollup to count every run of each job", || {
        succeeded("range=1h&job=stored") == lines(&e, "stored-runs")
            && succeeded("range=1h&job=cfg") == lines(&e, "cfg-runs")
            && succeeded("range=1h&kind=command") >= lines(&e, "stored-runs") + 3
    });
    let (stored, cfg) = (lines(&e, "stored-runs"), lines(&e, "cfg-runs"));
    let all = series(&s.addr, "range=1h");
    let listed: Vec<(String, Option<String>, i64)> = all["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["kind"].as_str().unwrap().to_string(),
                x["job"].as_str().map(String::from),
                x["succeeded"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(
        listed.contains(&("command".into(), Some("stored".into()), stored)),
        "the stored job's runs are kind command, counted under its name: {listed:?}"
    );
    assert!(
        listed.contains(&("command".into(), None, 3)),
        "the plain command tasks, apart: {listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|(_, job, n)| job.as_deref() == Some("cfg") && *n == cfg),
        "{listed:?}"
    );
    assert_eq!(
        all["totals"]["succeeded"].as_i64().unwrap(),
        stored + cfg + 3,
        "every run counted once"
    );
    // The day and week series agree; another job's series is empty.
    assert_eq!(succeeded("range=1d&job=stored"), stored);
    assert_eq!(succeeded("range=1w&queue=default&job=stored"), stored);
    assert_eq!(succeeded("range=1h&job=nothing"), 0);
    assert_eq!(succeeded("range=1h&queue=mail&job=stored"), 0);
}
