//! A force-release (`POST /api/v1/locks/{name}/release`, the dashboard's
//! Release button) never makes two holders: the running `baton lock`
//! holder learns of it within its confirm period (5 s) and kills its
//! command's tree, and a second `baton lock --wait` is granted the lock
//! only after that tree is gone — for a lease longer than the release
//! bound (30 s; the holder confirms its lease between extensions) and for
//! a shorter one (its refused extension). On every store that answers.

use crate::common;

use std::time::{Duration, Instant};

use common::holder::TREE;
use common::{
    dead, epoch_now, exit_within, have_bash, ledger_edges, read, sigterm_within, stamps, wait_for,
    Env, Server,
};
use serde_json::{json, Value};

per_backend! {
    force_release_of_a_long_lease_stops_the_holder_before_the_next_grant,
    force_release_of_a_short_lease_stops_the_holder_before_the_next_grant,
}

const ADMIN: &str = "admin-token-r";

/// `baton serve --listen 127.0.0.1:0` (a queue, no jobs) with the admin
/// token.
fn serve(e: &Env) -> Server {
    std::fs::write(
        e.path("serve.toml"),
        "[[queue]]\nname = \"default\"\nconcurrency = 1\nlease = \"5s\"\n",
    )
    .unwrap();
    common::serve_listening(e, "serve.toml", &[("BATON_ADMIN_TOKEN", ADMIN)])
}

/// One request with the admin token; the status and the JSON body.
fn call(addr: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    common::call(addr, method, path, Some(ADMIN), body)
}

/// The scenario, for a lease of `at_most`: holder 1 runs [`TREE`] (a
/// SIGTERM-ignoring grandchild writing `ledger-TAG`), holder 2
/// waits; the lock is force-released through the admin API. Holder 1's
/// tree must be gone within `learn_within` of the release, holder 2's
/// command must start only after it (no overlapping lines), and holder 1
/// exits 70 (lease lost).
async fn force_release_stops_the_holder(e: Env, at_most: &str, learn_within: Duration) {
    if !have_bash() {
        return;
    }
    let mut server = serve(&e);
    let addr = server.addr.clone();
    let name = "released";
    let lock = |tag: &str, wait: bool| {
        let mut args = vec!["lock", name, "--at-most", at_most, "--grace", "1s"];
        if wait {
            args.extend_from_slice(&["--wait", "90s"]);
        }
        args.extend_from_slice(&["--", "bash", "-c", TREE, "_", tag]);
        e.spawn_logged(&args)
    };
    let mut first = lock("1", false);
    wait_for(20, "the first holder's grandchild to write", || {
        !stamps(&e, "ledger-1").is_empty()
    });
    let pid = |f: &str| read(&e.path(f)).trim().to_string();
    let (child, gc) = (pid("child-1.pid"), pid("gc-1.pid"));
    let mut second = lock("2", true);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        stamps(&e, "ledger-2").is_empty(),
        "the second holder waits while the first holds the lock"
    );
    let (code, locks) = call(&addr, "GET", "/api/v1/locks", None);
    assert_eq!(code, 200, "{locks}");
    let token = locks
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .and_then(|l| l["token"].as_u64())
        .expect("the lock is listed");
    let released = epoch_now();
    let t0 = Instant::now();
    let (code, body) = call(
        &addr,
        "POST",
        &format!("/api/v1/locks/{name}/release"),
        Some(json!({ "token": token })),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body["free_at"].is_string(), "the answer says when: {body}");
    while !(dead(&child) && dead(&gc)) {
        assert!(
            t0.elapsed() < learn_within,
            "the released holder's tree still runs {:?} after the release (child dead: {}, grandchild dead: {})",
            t0.elapsed(),
            dead(&child),
            dead(&gc)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = epoch_now();
    eprintln!(
        "{at_most}: the released holder's tree was gone {:.3} s after the release",
        gone - released
    );
    assert_eq!(
        exit_within(&mut first, 15, "the released baton lock"),
        Some(70),
        "the released holder exits 70 (lease lost)"
    );
    wait_for(60, "the second holder's command to write", || {
        !stamps(&e, "ledger-2").is_empty()
    });
    let (last1, first2) = ledger_edges(&e);
    assert!(
        last1 < first2,
        "the released holder's grandchild wrote {:.3} s after the second holder's first write: two holders",
        last1 - first2
    );
    assert!(
        first2 > gone,
        "the second command started after the tree was gone"
    );
    sigterm_within(&mut second, 15, "the second baton lock after SIGTERM");
    sigterm_within(&mut server.kid, 15, "baton serve after SIGTERM");
}

/// A lease longer than the release bound: the holder confirms its lease
/// every 5 s at most and sees the revocation there (not at its next
/// extension, 20 s away); the lock is free 30 s after the release.
async fn force_release_of_a_long_lease_stops_the_holder_before_the_next_grant(e: Env) {
    force_release_stops_the_holder(e, "60s", Duration::from_secs(8)).await;
}

/// A lease shorter than the bound keeps its own end; the holder's next
/// extension (every ~1.95 s) is refused.
async fn force_release_of_a_short_lease_stops_the_holder_before_the_next_grant(e: Env) {
    force_release_stops_the_holder(e, "6s", Duration::from_secs(5)).await;
}

/// A lock longer than the release bound is bounded by its last
/// confirmation + 30 s: a `--grace` longer than 20 s is refused up front.
#[test]
fn a_grace_too_long_for_the_release_bound_is_refused() {
    let out = std::process::Command::new(common::BATON)
        .args([
            "lock",
            "x",
            "--store",
            "sqlite:///nonexistent-dir/never.db",
            "--at-most",
            "15m",
            "--grace",
            "25s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--grace") && err.contains("20s"), "{err}");
}
