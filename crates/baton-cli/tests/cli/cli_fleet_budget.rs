//! The connection budget of a fleet, on PostgreSQL (issue 23): an idle
//! `baton serve` with one job and one queue holds at most two server
//! connections (one of them LISTEN), named `baton <host>:<pid>`, and makes
//! about one transaction a second; the pool size resolves `--pool-size`,
//! `BATON_POOL_SIZE`, the config's `pool_size`, the URL's `pool_size` in
//! that order, and one given two ways must agree.
//!
//! Each test runs in a database of its own on the test server (created and
//! dropped here), so `pg_stat_database` counts only its own traffic.

use crate::common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{signal, stderr, Env, Kind, BATON};
use sqlx::{Connection, PgConnection};

/// A database of the test's own, dropped at the end.
struct Db {
    admin: String,
    name: String,
    url: String,
}

impl Db {
    async fn new(e: &Env, tag: &str) -> Db {
        let name = format!("baton_{tag}_{}", std::process::id());
        let admin = e.ts.url.clone();
        let mut c = PgConnection::connect(&admin).await.unwrap();
        sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut c)
            .await
            .unwrap();
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await
            .unwrap();
        let base = admin.split('?').next().unwrap_or(&admin);
        let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
        Db { admin, name, url }
    }

    /// `(connections named baton <node>, xact_commit)` of this database.
    async fn sample(&self, node: &str) -> (i64, i64) {
        let mut c = PgConnection::connect(&self.admin).await.unwrap();
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2), \
                    (SELECT xact_commit FROM pg_stat_database WHERE datname = $1)",
        )
        .bind(&self.name)
        .bind(format!("baton {node}"))
        .fetch_one(&mut c)
        .await
        .unwrap()
    }

    async fn drop_it(self) {
        let mut c = PgConnection::connect(&self.admin).await.unwrap();
        let _ = sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&mut c)
        .await;
    }
}

/// This host's node id for a child process: `host:pid`, as
/// `baton::node::node_id` makes it in the child.
fn node_of(child: &Child) -> String {
    let me = baton::node::node_id();
    let host = me.rsplit_once(':').map_or(me.as_str(), |(h, _)| h);
    format!("{host}:{}", child.id())
}

/// The most connections `child` held at once over 2.5 s; then it stops.
async fn most_of(db: &Db, child: Child) -> i64 {
    let node = node_of(&child);
    let t0 = Instant::now();
    let mut most = 0;
    while t0.elapsed() < Duration::from_millis(2_500) {
        most = most.max(db.sample(&node).await.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(child);
    most
}

fn stop(mut child: Child) {
    signal(&child, libc::SIGTERM);
    common::wait_or_kill(&mut child, Duration::from_secs(10));
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_serve_holds_two_connections_and_one_transaction_a_second() {
    let Some(e) = Env::new(Kind::Postgres).await else {
        return;
    };
    let db = Db::new(&e, "idle").await;
    std::fs::write(
        e.path("baton.toml"),
        format!(
            r#"
store = "{url}"

[[queue]]
name = "default"

[[job]]
name = "hourly"
cron = "0 * * * *"
command = ["true"]
"#,
            url = db.url
        ),
    )
    .unwrap();
    let serve = e
        .cmd(&["serve", "--config", "baton.toml"])
        .env_remove("BATON_STORE")
        .env_remove("BATON_PREFIX")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let node = node_of(&serve);
    // Its start needs a few connections at once; the pool gives back what
    // no load needs within one to two idle timeouts (10 s each) after the
    // start's last burst (seen settling after 15 to 45 s).
    let settle = Instant::now();
    let mut seen = 0;
    loop {
        let (n, _) = db.sample(&node).await;
        seen = seen.max(n);
        let started = settle.elapsed() > Duration::from_secs(3);
        if (started && (1..=2).contains(&n)) || settle.elapsed() > Duration::from_secs(75) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // An idle serve's steady state: a 10-second window in which it held at
    // most 2 connections (the pool's one and LISTEN) and made at most one
    // transaction a second (one store call per 2 s poll, its upkeep and the
    // scheduler's standing in for polls: ~0.7/s). On a loaded machine (the
    // suite runs many tests on 2 cores) a starved process's calls can
    // overlap and open a third connection for a while, and the pool gives
    // it back within one to two idle timeouts: so the budget must hold in
    // one of three windows, one after another. A serve that keeps what it
    // opened (the pool's shrink off: 4 or more) fails all three. (A 1 s
    // poll, before the 2 s poll with LISTEN, sat at the edge: 0.98 to
    // 1.05/s; rescues landing on the claims' beat show only in a loaded
    // fleet: scripts/fleet-serve.sh, docs/BENCHMARKS.md.)
    let mut windows = Vec::new();
    let mut within = false;
    for _ in 0..3 {
        // The pg_stat_database counters trail each session's transactions
        // by up to a second: start each window after a pause.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (_, x0) = db.sample(&node).await;
        let t0 = Instant::now();
        let mut most = 0;
        while t0.elapsed() < Duration::from_secs(10) {
            let (n, _) = db.sample(&node).await;
            most = most.max(n);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (_, x1) = db.sample(&node).await;
        let rate = (x1 - x0) as f64 / t0.elapsed().as_secs_f64();
        windows.push(format!("{most} connections, {rate:.2} transactions/s"));
        eprintln!("idle serve window: {}", windows[windows.len() - 1]);
        if most <= 2 && rate <= 1.0 {
            within = true;
            break;
        }
    }
    stop(serve);
    db.drop_it().await;
    assert!(seen >= 1, "no connection named \"baton {node}\" was seen");
    assert!(
        within,
        "an idle serve (connections named \"baton {node}\") was over its budget of at most 2 \
         connections (the pool's one and LISTEN) and 1 transaction/s in every 10-second \
         window: {windows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_resolves_flag_env_config_url() {
    let Some(e) = Env::new(Kind::Postgres).await else {
        return;
    };
    let db = Db::new(&e, "pool").await;
    let config = |pool: &str, url: &str| {
        format!(
            r#"
store = "{url}"
{pool}

[[queue]]
name = "default"
concurrency = 4
"#
        )
    };
    // Four tasks at once that each hold a claim for 1.5 s: with room, the
    // worker's claims, heartbeats and finishes overlap on several
    // connections; with a pool of one they take turns on one.
    let busiest = |args: &[&str], env: &[(&str, &str)], cfg: String| {
        std::fs::write(e.path("baton.toml"), cfg).unwrap();
        let mut enq = std::process::Command::new(BATON);
        enq.args(["enqueue", "--config", "baton.toml", "--", "sleep", "1.5"])
            .current_dir(e.dir.path())
            .env_remove("BATON_STORE")
            .env_remove("BATON_PREFIX")
            .env_remove("BATON_POOL_SIZE");
        for _ in 0..4 {
            assert!(enq.output().unwrap().status.success());
        }
        let mut c = std::process::Command::new(BATON);
        c.arg("work")
            .args(args)
            .args(["--config", "baton.toml", "--poll", "100ms"])
            .current_dir(e.dir.path())
            .env_remove("BATON_STORE")
            .env_remove("BATON_PREFIX")
            .env_remove("BATON_POOL_SIZE")
            .env("BATON_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    };
    let url = db.url.clone();
    let one_url = format!("{url}?pool_size=1");
    // Room for more: the check below can fail.
    let wide = most_of(&db, busiest(&[], &[], config("pool_size = 8", &url))).await;
    // The config's pool_size; the flag over the config; the env over the
    // config; the URL's own.
    let by_config = most_of(&db, busiest(&[], &[], config("pool_size = 1", &url))).await;
    let by_flag = most_of(
        &db,
        busiest(&["--pool-size", "1"], &[], config("pool_size = 8", &url)),
    )
    .await;
    let by_env = most_of(
        &db,
        busiest(
            &[],
            &[("BATON_POOL_SIZE", "1")],
            config("pool_size = 8", &url),
        ),
    )
    .await;
    let by_url = most_of(&db, busiest(&[], &[], config("", &one_url))).await;
    // Given two ways that disagree: refused, naming both.
    std::fs::write(e.path("baton.toml"), config("", &one_url)).unwrap();
    let out = std::process::Command::new(BATON)
        .args(["work", "--config", "baton.toml", "--pool-size", "3"])
        .current_dir(e.dir.path())
        .env_remove("BATON_STORE")
        .env_remove("BATON_PREFIX")
        .env_remove("BATON_POOL_SIZE")
        .output()
        .unwrap();
    db.drop_it().await;
    assert!(wide >= 3, "pool_size = 8 used only {wide} connections");
    for (how, n) in [
        ("pool_size = 1", by_config),
        ("--pool-size 1 over pool_size = 8", by_flag),
        ("BATON_POOL_SIZE=1 over pool_size = 8", by_env),
        ("?pool_size=1", by_url),
    ] {
        assert!(
            (1..=2).contains(&n),
            "{how}: {n} connections (the pool's one and LISTEN)"
        );
    }
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--pool-size") && err.contains("says 3") && err.contains("says 1"),
        "{err}"
    );
}
