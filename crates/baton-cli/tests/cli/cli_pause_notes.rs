//! Issue 26 item 5 through the CLI: `baton jobs pause|resume` and `baton
//! queues pause|resume` record a note and who (`--by`, default
//! `$USER@host`, recorded `NAME via cli`); `baton jobs`, `baton jobs show`
//! and `baton queues` show them (text and JSON) with each job's overlap
//! and misfire policies and its next three fire times in its zone.

use crate::cli_serve::{serve, stop};
use crate::common;

use common::{stderr, stdout, Env};
use serde_json::Value;

per_backend! {
    job_pause_notes_and_policies_are_shown,
    queue_pause_notes_are_shown,
}

const CONFIG: &str = r#"
[[queue]]
name = "default"
concurrency = 1
lease = "5s"

[[job]]
name = "nightly"
cron = "0 3 * * *"
tz = "Europe/Berlin"
overlap = "buffer_all"
misfire = "all"
command = ["true"]
"#;

fn json_of(e: &Env, args: &[&str]) -> Value {
    let out = e.run(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|err| panic!("{err}: {}", stdout(&out)))
}

async fn job_pause_notes_and_policies_are_shown(e: Env) {
    // A scheduler registers the job (with its policy) in the store.
    let kid = serve(&e, CONFIG, &[]);
    common::wait_for(60, "the job to be registered", || {
        let out = e.run(&["jobs", "--json"]);
        stdout(&out).contains("\"nightly\"")
    });
    stop(vec![kid]);

    let out = e.run(&[
        "jobs",
        "pause",
        "nightly",
        "--note",
        "disk swap",
        "--by",
        "alice",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("by alice via cli"),
        "{}",
        stdout(&out)
    );

    // `jobs show --json`: the policies, the note, the next fire times.
    let j = json_of(
        &e,
        &[
            "jobs",
            "show",
            "nightly",
            "--json",
            "--config",
            "baton.toml",
        ],
    );
    assert_eq!(j["paused"], true, "{j}");
    assert_eq!(j["overlap"], "buffer_all", "{j}");
    assert_eq!(j["misfire"], "all", "{j}");
    assert_eq!(j["pause_change"]["note"], "disk swap", "{j}");
    assert_eq!(j["pause_change"]["by"], "alice via cli", "{j}");
    let fires = j["next_fires"].as_array().unwrap();
    assert_eq!(fires.len(), 3, "{j}");
    for f in fires {
        let local = f["local"].as_str().unwrap();
        assert!(
            local.contains("T03:00:00+01:00") || local.contains("T03:00:00+02:00"),
            "3 am in Berlin: {f}"
        );
        assert!(
            ["CET", "CEST"].contains(&f["zone"].as_str().unwrap()),
            "{f}"
        );
    }
    // The text: one field a line, three next fires.
    let out = e.run(&["jobs", "show", "nightly", "--config", "baton.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for want in [
        "buffer_all",
        "misfire:",
        "\"disk swap\" by alice via cli at ",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    assert_eq!(text.matches("next fire:").count(), 3, "{text}");
    // Without the config, the store's record: the policy it registered.
    let j = json_of(&e, &["jobs", "show", "nightly", "--json"]);
    assert_eq!(j["overlap"], "buffer_all", "the store's record: {j}");
    assert_eq!(j["next_fires"], serde_json::json!([]), "{j}");
    // The list, text and JSON.
    let out = e.run(&["jobs", "--config", "baton.toml"]);
    let text = stdout(&out);
    assert!(
        text.contains("PAUSE NOTE") && text.contains("\"disk swap\" by alice via cli"),
        "{text}"
    );
    let list = json_of(&e, &["jobs", "--json", "--config", "baton.toml"]);
    assert_eq!(list[0]["pause_change"]["note"], "disk swap", "{list}");

    // Resume without --by: $USER@host; the pause's note is not kept.
    let out = e
        .cmd(&["jobs", "resume", "nightly"])
        .env("USER", "carol")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json_of(&e, &["jobs", "show", "nightly", "--json"]);
    assert_eq!(j["paused"], false, "{j}");
    assert_eq!(j["pause_change"]["note"], Value::Null, "{j}");
    let by = j["pause_change"]["by"].as_str().unwrap();
    assert!(by.starts_with("carol@") && by.ends_with(" via cli"), "{by}");

    // Bad input: exit 2 naming the flag, nothing changed.
    let long = "x".repeat(1001);
    for (args, flag) in [
        (vec!["jobs", "pause", "nightly", "--note", &long], "--note"),
        (vec!["jobs", "pause", "nightly", "--by", "a\u{7}b"], "--by"),
        (vec!["jobs", "pause", "nightly", "--note", " "], "--note"),
    ] {
        let out = e.run(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(flag), "{flag}: {}", stderr(&out));
    }
    assert_eq!(
        json_of(&e, &["jobs", "show", "nightly", "--json"])["paused"],
        false
    );
    // An unknown job: not found.
    let out = e.run(&["jobs", "show", "nope"]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
}

async fn queue_pause_notes_are_shown(e: Env) {
    let out = e.run(&[
        "queues",
        "pause",
        "q1",
        "--note",
        "vendor outage",
        "--by",
        "bob",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list = json_of(&e, &["queues", "--json"]);
    let q1 = list
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "q1")
        .cloned()
        .unwrap_or_else(|| panic!("a paused queue is listed: {list}"));
    assert_eq!(q1["paused"], true, "{q1}");
    assert_eq!(q1["pause_change"]["note"], "vendor outage", "{q1}");
    assert_eq!(q1["pause_change"]["by"], "bob via cli", "{q1}");
    let out = e.run(&["queues"]);
    let text = stdout(&out);
    assert!(
        text.contains("q1") && text.contains("\"vendor outage\" by bob via cli"),
        "{text}"
    );
    // `tasks stats --json` carries it too.
    let stats = json_of(&e, &["tasks", "stats", "--json"]);
    assert_eq!(stats[0]["pause_change"]["note"], "vendor outage", "{stats}");
    let out = e.run(&["queues", "pause", "q1", "--by", ""]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--by"), "{}", stderr(&out));
    let out = e.run(&["queues", "resume", "q1", "--note", "back"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Resumed and empty: no longer listed.
    let list = json_of(&e, &["queues", "--json"]);
    assert!(
        list.as_array().unwrap().iter().all(|q| q["queue"] != "q1"),
        "{list}"
    );
}
