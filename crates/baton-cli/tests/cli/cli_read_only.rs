//! A read-only store as `baton work` sees it (issue #23, item 5), on
//! private servers the test owns (the shared ones are never reconfigured):
//!
//! - PostgreSQL (`baton_testkit::Private`): `ALTER SYSTEM SET
//!   default_transaction_read_only = on` and a reload turn every session
//!   read-only, as a demoted primary or a standby behind the URL would.
//!   The worker logs one error saying the store refuses writes (not one
//!   per claim), `/readyz` answers 503 with the reason,
//!   `baton_store_read_only` is 1 and claims back off (a handful of
//!   failed claims, not a hot loop). A task enqueued meanwhile (through a
//!   session that may still write) waits. Then only *new* sessions may
//!   write again (the database's own setting, which sessions read at
//!   their start): the worker recovers only because it drops the pooled
//!   connections that met the refusal — as after a failover, where old
//!   connections stay on the demoted server. `/readyz` turns 200, one line
//!   says so, and the waiting task runs once.
//! - MariaDB (`baton_testkit::PrivateMariadb`): `SET GLOBAL read_only = 1` for a
//!   worker whose user lacks `READ ONLY ADMIN`: a task enqueued by root
//!   (who writes through `read_only`) is not claimed, the same one line,
//!   503 and backoff; then 200 and the task runs once after `read_only =
//!   0`.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{read, signal, stderr, stdout, wait_for, BATON};
use serde_json::Value;

const REFUSES: &str = "store refuses writes (read-only)";

fn baton(url: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BATON);
    c.args(args)
        .env("BATON_STORE", url)
        .env_remove("BATON_PREFIX")
        .env("BATON_LOG", "warn")
        .current_dir(dir);
    c
}

fn get(addr: &str, path: &str) -> (u16, String) {
    common::http(addr, "GET", path, None, &[])
}

/// `baton work --listen` on `url`, logging to `log`; its admin address.
fn work(url: &str, dir: &Path, log: &Path) -> (Child, String) {
    let child = baton(
        url,
        dir,
        &["work", "--listen", "127.0.0.1:0", "--poll", "200ms"],
    )
    .env("BATON_LOG", "info")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(log).unwrap())
    .spawn()
    .unwrap();
    let addr = common::admin_addr(30, || read(log));
    (child, addr)
}

fn enqueue(url: &str, dir: &Path, marker: &Path) -> i64 {
    let cmd = format!("echo ran >> {}", marker.display());
    let out = baton(url, dir, &["enqueue", "--", "sh", "-c", &cmd])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out).trim().parse().expect("enqueue prints the id")
}

fn state(url: &str, dir: &Path, id: i64) -> (String, i64) {
    let out = baton(url, dir, &["tasks", "show", &id.to_string(), "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    (
        v["state"].as_str().unwrap_or_default().to_string(),
        v["attempt"].as_i64().unwrap_or(-1),
    )
}

fn claim_errors(addr: &str) -> f64 {
    let (_, m) = get(addr, "/metrics");
    m.lines()
        .find(|l| l.starts_with("baton_worker_store_errors_total{operation=\"task_claim\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The read-only phase and the way back, as the worker shows them.
/// `read_only` turns the server read-only, `enqueue_url` is a URL that
/// can still write meanwhile, `writable` turns it back.
fn read_only_and_back(
    url: &str,
    read_only: impl FnOnce(),
    enqueue_url: &str,
    writable: impl FnOnce(),
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("work.log");
    let marker = d.join("ran");
    let (mut w, addr) = work(url, d, &log);
    let first = enqueue(url, d, &marker);
    wait_for(30, "the first task to run", || {
        state(url, d, first).0 == "succeeded"
    });
    let (code, body) = get(&addr, "/readyz");
    assert_eq!(code, 200, "{body}");

    read_only();
    // A task enqueued meanwhile by a client that may still write: the
    // worker's claim of it is refused (on PostgreSQL every claim is).
    let waiting = enqueue(enqueue_url, d, &marker);
    wait_for(30, "the worker to say the store refuses writes", || {
        read(&log).contains(REFUSES)
    });
    let (code, body) = get(&addr, "/readyz");
    assert_eq!(code, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let why = v["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("store refuses writes") && why.contains("read-only"),
        "{body}"
    );
    let (_, metrics) = get(&addr, "/metrics");
    assert!(metrics.contains("baton_store_read_only 1"), "{metrics}");
    // An enqueue on the read-only URL is refused, saying why.
    let out = baton(url, d, &["enqueue", "--", "true"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stderr(&out).contains("read-only"), "{}", stderr(&out));
    let errors_before = claim_errors(&addr);
    std::thread::sleep(Duration::from_secs(3));
    let errors = claim_errors(&addr) - errors_before;
    // Backing off (50 ms doubling to 5 s): a handful in 3 s, not 15 polls.
    assert!(errors <= 6.0, "{errors} failed claims in 3 s");
    assert_eq!(
        state(enqueue_url, d, waiting).0,
        "pending",
        "not run while read-only"
    );

    writable();
    wait_for(30, "/readyz to answer 200 again", || {
        get(&addr, "/readyz").0 == 200
    });
    wait_for(30, "the task enqueued meanwhile to run", || {
        state(url, d, waiting).0 == "succeeded"
    });
    assert_eq!(state(url, d, waiting).1, 1, "one attempt");
    assert_eq!(read(&marker).lines().count(), 2, "each task ran once");
    let text = read(&log);
    assert_eq!(
        text.lines().filter(|l| l.contains(REFUSES)).count(),
        1,
        "said once: {text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("takes writes again") && l.contains("INFO")),
        "{text}"
    );
    let (_, metrics) = get(&addr, "/metrics");
    assert!(metrics.contains("baton_store_read_only 0"), "{metrics}");
    signal(&w, libc::SIGTERM);
    let _ = w.wait();
}

fn psql(port: u16, sql: &str) {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        // This session may write whatever the server's default.
        .env("PGOPTIONS", "-c default_transaction_read_only=off")
        .output()
        .expect("psql runs");
    assert!(out.status.success(), "{sql}: {}", stderr(&out));
}

#[test]
fn a_read_only_postgres_is_said_and_left_behind() {
    let Some(mut pg) = baton_testkit::Private::new(baton_testkit::Kind::Postgres) else {
        return;
    };
    pg.start();
    let url = pg.url();
    let port = pg.port;
    // Sessions that may write during the read-only phase (the option
    // outranks the server's default).
    let writer = format!("{url}?options=-c%20default_transaction_read_only%3Doff");
    read_only_and_back(
        &url,
        || {
            psql(port, "ALTER SYSTEM SET default_transaction_read_only = on");
            psql(port, "SELECT pg_reload_conf()");
        },
        &writer,
        || {
            // New sessions only: sessions open now keep the server's
            // (read-only) default, so only a reconnect writes again.
            psql(
                port,
                "ALTER DATABASE postgres SET default_transaction_read_only = off",
            );
        },
    );
}

#[test]
fn a_read_only_mariadb_is_said_and_left_behind() {
    let Some(db) = baton_testkit::PrivateMariadb::start(&[]) else {
        return;
    };
    // A user without READ ONLY ADMIN (root has it on MariaDB 10.11 and
    // writes through read_only).
    assert!(db.sql(
        "root",
        "CREATE USER app@'%'; GRANT ALL ON test.* TO app@'%'"
    ));
    let url = db.url_for("app");
    read_only_and_back(
        &url,
        || assert!(db.sql("root", "SET GLOBAL read_only = 1")),
        // root writes through read_only.
        &db.url(),
        || assert!(db.sql("root", "SET GLOBAL read_only = 0")),
    );
}
