//! baton behind PgBouncer in transaction mode, as processes: a private
//! PgBouncer (Debian's 1.18, started by the test on a free port, in front
//! of the test's PostgreSQL) and `baton lock`, `enqueue`, `work` and three
//! `baton serve` through it with `?pool_mode=transaction`. Every task runs
//! once, every slot of a 1-second job once; a URL without `pool_mode`
//! gets the pooler's refusal named, not "wrong protocol".

use crate::common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{read, signal, stderr, stdout, wait_for, Env, Kind};

/// A PgBouncer this test owns: killed on drop.
struct Bouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

use baton_testkit::free_port;

/// `postgres://USER@HOST:PORT/DB` of the test's PostgreSQL, in parts.
fn upstream(url: &str) -> (String, String, u16, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('?').next().unwrap_or(rest);
    let (auth, hostdb) = rest.rsplit_once('@').unwrap_or(("postgres", rest));
    let user = auth.split(':').next().unwrap_or("postgres").to_string();
    let (hostport, db) = hostdb.split_once('/').unwrap_or((hostdb, "test"));
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap_or(5432)),
        None => (hostport.to_string(), 5432),
    };
    (user, host, port, db.to_string())
}

/// Start PgBouncer in transaction mode in front of `url`'s server; `None`
/// (skipped, or failed under `BATON_REQUIRE_BACKENDS=1`) without it.
fn bouncer(url: &str) -> Option<Bouncer> {
    let present = Command::new("pgbouncer")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !common::have("pgbouncer", present) {
        return None;
    }
    let (user, host, port, db) = upstream(url);
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let ini = dir.path().join("pgbouncer.ini");
    let users = dir.path().join("users.txt");
    std::fs::write(&users, format!("\"{user}\" \"\"\n")).unwrap();
    std::fs::write(
        &ini,
        format!(
            "[databases]\n{db} = host={host} port={port} dbname={db}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\n\
             auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
             max_client_conn = 500\ndefault_pool_size = 20\nunix_socket_dir =\n",
            users = users.display()
        ),
    )
    .unwrap();
    // PgBouncer refuses to run as root: as root, switch to `postgres`,
    // which must read the files.
    use std::os::unix::fs::PermissionsExt;
    for p in [dir.path(), ini.as_path(), users.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let mut c = Command::new("pgbouncer");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        c.args(["-u", "postgres"]);
    }
    let child = c
        .arg(&ini)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let b = Bouncer {
        child,
        port: listen,
        _dir: dir,
    };
    wait_for(10, "pgbouncer to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", listen)).is_ok()
    });
    Some(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_enqueue_work_and_serve_through_pgbouncer_in_transaction_mode() {
    let Some(e) = Env::new(Kind::Postgres).await else {
        return;
    };
    let Some(b) = bouncer(&e.ts.url) else {
        return;
    };
    let (user, _, _, db) = upstream(&e.ts.url);
    let plain = format!("postgres://{user}@127.0.0.1:{}/{db}", b.port);
    let url = format!("{plain}?pool_mode=transaction");
    let run = |args: &[&str], store: &str| {
        e.cmd(args)
            .env("BATON_STORE", store)
            .output()
            .expect("baton runs")
    };

    // Without pool_mode the pooler's refusal is named, with the fix.
    let out = run(&["tasks", "list"], &plain);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("connection pooler (PgBouncer)"), "{err}");
    assert!(err.contains("unsupported startup parameter"), "{err}");
    assert!(err.contains("pool_mode=transaction"), "{err}");
    assert!(!err.contains("wrong protocol"), "{err}");

    // baton lock.
    let out = run(
        &[
            "lock",
            "pgb",
            "--at-most",
            "10s",
            "--",
            "sh",
            "-c",
            "echo locked",
        ],
        &url,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("locked"));

    // enqueue 30 tasks; two workers run each once.
    for _ in 0..30 {
        let out = run(
            &["enqueue", "--", "sh", "-c", "echo $BATON_TASK_ID >> ledger"],
            &url,
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let spawn = |args: &[&str]| -> Child {
        let n = std::fs::read_dir(e.dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log = std::fs::File::create(e.path(&format!("baton-{n}.log"))).unwrap();
        e.cmd(args)
            .env("BATON_STORE", &url)
            .env("BATON_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    };
    let workers: Vec<Child> = (0..2)
        .map(|_| spawn(&["work", "--concurrency", "4", "--poll", "100ms"]))
        .collect();
    let ledger = e.path("ledger");
    wait_for(60, "30 tasks through pgbouncer", || {
        read(&ledger).lines().count() >= 30
    });
    for w in &workers {
        signal(w, libc::SIGTERM);
    }
    for mut w in workers {
        let _ = w.wait();
    }
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for l in read(&ledger).lines() {
        *seen.entry(l.trim().to_string()).or_default() += 1;
    }
    assert_eq!(seen.len(), 30, "{seen:?}");
    assert!(seen.values().all(|n| *n == 1), "a task ran twice: {seen:?}");

    // Three instances of serve with a 1-second job: every slot once.
    std::fs::write(
        e.path("baton.toml"),
        r#"
[[queue]]
name = "default"
concurrency = 2
lease = "5s"

[[job]]
name = "tick"
every = "1s"
overlap = "allow"
command = ["sh", "-c", "echo $BATON_SLOT >> slots"]
"#,
    )
    .unwrap();
    let t0 = Instant::now();
    let kids: Vec<Child> = (0..3)
        .map(|_| spawn(&["serve", "--config", "baton.toml", "--shutdown-grace", "1s"]))
        .collect();
    std::thread::sleep(Duration::from_secs(8));
    for k in &kids {
        signal(k, libc::SIGTERM);
    }
    for mut k in kids {
        let _ = k.wait();
    }
    let mut slots: BTreeMap<String, usize> = BTreeMap::new();
    for l in read(&e.path("slots")).lines() {
        *slots.entry(l.trim().to_string()).or_default() += 1;
    }
    assert!(
        slots.len() >= 5,
        "only {} slots in {:?}: {slots:?}",
        slots.len(),
        t0.elapsed()
    );
    assert!(
        slots.values().all(|n| *n == 1),
        "a slot ran twice: {slots:?}"
    );
    let times: Vec<chrono::DateTime<chrono::Utc>> =
        slots.keys().map(|s| s.parse().unwrap()).collect();
    for w in times.windows(2) {
        assert_eq!((w[1] - w[0]).num_seconds(), 1, "a gap: {slots:?}");
    }
}
