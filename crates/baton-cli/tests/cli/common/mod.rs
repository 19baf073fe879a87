//! Shared helpers for the CLI tests: run the real `baton` binary against an
//! isolated store of each backend.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The isolated stores per backend (from the test kit).
pub use baton_testkit::harness;

pub use harness::{Kind, TestStore};

/// The fault proxy `baton chaos` uses (from the test kit).
pub use baton_testkit::proxy;

pub mod holder;

pub const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// libfaketime's preload library (`.ci/run` installs the `faketime` package).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Whether a tool a test needs is `present`: when it is not, the test is
/// skipped, or fails when `BATON_REQUIRE_BACKENDS=1` (as in CI).
pub fn have(what: &str, present: bool) -> bool {
    if !present {
        assert!(
            !baton_testkit::required(),
            "{what} is not installed (BATON_REQUIRE_BACKENDS=1)"
        );
        skipped(&format!(
            "{what} is not installed; set BATON_REQUIRE_BACKENDS=1 to fail instead"
        ));
    }
    present
}

/// Print `SKIPPED: why` where it is seen: straight to the process's stderr,
/// past the test harness's capture (which hides `eprintln!` of passing tests).
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {why}");
}

/// An isolated store plus a scratch directory for ledgers.
pub struct Env {
    pub ts: TestStore,
    pub dir: tempfile::TempDir,
    /// Processes started with [`Env::spawn`] / [`Env::spawn_logged`]: killed
    /// when a failing test unwinds, so a daemon it started does not run on
    /// (its command's supervisor then stops the command's tree).
    spawned: std::sync::Mutex<Vec<u32>>,
}

impl Env {
    pub async fn new(kind: Kind) -> Option<Env> {
        let ts = harness::connect(kind).await?;
        Some(Env {
            ts,
            dir: tempfile::tempdir().unwrap(),
            spawned: std::sync::Mutex::new(Vec::new()),
        })
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// Every `*.log` in the scratch directory, one after another.
    pub fn logs(&self) -> String {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
            .map(|f| read(&f.path()))
            .collect()
    }
    /// `baton ARGS` with this store in the environment.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BATON);
        c.args(args)
            .env("BATON_STORE", &self.ts.url)
            .env("BATON_PREFIX", &self.ts.prefix)
            .env("BATON_LOG", "warn")
            .current_dir(self.dir.path());
        c
    }
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("baton runs")
    }
    pub fn spawn(&self, args: &[&str]) -> Child {
        let child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("baton starts");
        self.track(&child);
        child
    }
    fn track(&self, child: &Child) {
        if let Ok(mut v) = self.spawned.lock() {
            v.push(child.id());
        }
    }
    /// Spawn with stderr going to a log file that is printed if the test fails.
    pub fn spawn_logged(&self, args: &[&str]) -> Child {
        let n = std::fs::read_dir(self.dir.path())
            .map(|d| d.count())
            .unwrap_or(0);
        let log = std::fs::File::create(self.path(&format!("baton-{n}.log"))).unwrap();
        let child = self
            .cmd(args)
            .env("BATON_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("baton starts");
        self.track(&child);
        child
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let pids = self.spawned.lock().map(|v| v.clone()).unwrap_or_default();
            for pid in pids {
                // SAFETY: kill(2) on a child this test started (gone already:
                // ESRCH, ignored).
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
            if let Ok(dir) = std::fs::read_dir(self.dir.path()) {
                for f in dir.flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if name.ends_with(".log") {
                        eprintln!("---- {name}\n{}", read(&f.path()));
                    }
                }
            }
        }
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Wait until `f` is true, or panic with `what` after `secs`.
pub fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Send a signal to a child process.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a pid we spawned.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Wait up to `secs` for the child to exit; its exit code (None: a
/// signal). Past that it is killed and the test fails with `what`.
pub fn exit_within(child: &mut Child, secs: u64, what: &str) -> Option<i32> {
    if !wait_or_kill(child, Duration::from_secs(secs)) {
        panic!("{what}: still running after {secs} s");
    }
    child.wait().unwrap().code()
}

/// SIGTERM to the child, then [`exit_within`].
pub fn sigterm_within(child: &mut Child, secs: u64, what: &str) -> Option<i32> {
    signal(child, libc::SIGTERM);
    exit_within(child, secs, what)
}

/// Wait up to `after` for the child to exit, then SIGKILL it: whether it
/// exited by itself (a killed child is still to be reaped with `wait`).
pub fn wait_or_kill(child: &mut Child, after: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < after {
        if child.try_wait().expect("wait").is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    false
}

/// A `baton serve --listen 127.0.0.1:0` and the admin address it logged.
/// Dropped, it is stopped (SIGTERM, SIGKILL 10 s on), so a failing test
/// does not leave it running.
pub struct Server {
    pub kid: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.kid.try_wait() {
            return;
        }
        signal(&self.kid, libc::SIGTERM);
        if !wait_or_kill(&mut self.kid, Duration::from_secs(10)) {
            let _ = self.kid.wait();
        }
    }
}

/// `baton serve --config CONFIG --listen 127.0.0.1:0 --shutdown-grace 1s`
/// in `e`, logging at info to a file of its own, with `env` set (after
/// the store's): running once it has logged its admin address.
pub fn serve_listening(e: &Env, config: &str, env: &[(&str, &str)]) -> Server {
    let log_name = format!("serve-{}.log", fastrand::u32(..));
    let log = std::fs::File::create(e.path(&log_name)).unwrap();
    let mut c = e.cmd(&[
        "serve",
        "--config",
        config,
        "--listen",
        "127.0.0.1:0",
        "--shutdown-grace",
        "1s",
    ]);
    c.env("BATON_LOG", "info").stdout(Stdio::null()).stderr(log);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut srv = Server {
        kid: c.spawn().expect("baton serve starts"),
        addr: String::new(),
    };
    srv.addr = admin_addr(20, || read(&e.path(&log_name)));
    srv
}

/// The admin address a `--listen 127.0.0.1:0` logs (`admin on
/// http://ADDR`) in the text `log()` reads, waited for up to `secs`.
pub fn admin_addr(secs: u64, log: impl Fn() -> String) -> String {
    let t0 = Instant::now();
    loop {
        let text = log();
        if let Some(a) = text
            .lines()
            .find_map(|l| l.split("admin on http://").nth(1))
        {
            return a.trim().to_string();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "no admin address in the log after {secs} s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), with
/// `Authorization: Bearer TOKEN` when a token is given and `body` as
/// JSON: the status and the body. The body is written from another
/// thread, so an answer sent before the body is read (413) is still read.
/// Status 0: not an HTTP answer (the body is then all that came).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the admin server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut w = s.try_clone().unwrap();
    let body = body.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w
            .write_all(head.as_bytes())
            .and_then(|()| w.write_all(&body));
    });
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let _ = writer.join();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .filter(|_| answer.starts_with("HTTP/"));
    match (status, answer.split_once("\r\n\r\n")) {
        (Some(status), Some((_, body))) => (status, body.to_string()),
        (Some(status), None) => (status, String::new()),
        (None, _) => (0, answer),
    }
}

/// [`http`] with a JSON body, if any: the status and the answer as JSON
/// (a JSON string where it is not JSON). Fails on an answer that is not
/// HTTP.
pub fn call(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, body) = http(addr, method, path, token, body.as_bytes());
    assert_ne!(status, 0, "not an HTTP answer: {body:?}");
    let v = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
    (status, v)
}

/// Whether a process is gone (or a zombie nobody has reaped yet).
pub fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// Whether bash with `$EPOCHREALTIME` is here (see [`have`]).
pub fn have_bash() -> bool {
    have(
        "bash",
        Command::new("bash")
            .args(["-c", "[ -n \"$EPOCHREALTIME\" ]"])
            .status()
            .is_ok_and(|s| s.success()),
    )
}

/// Wall-clock seconds written by bash's `$EPOCHREALTIME`, one per line of
/// the file `file` in `e`'s directory.
pub fn stamps(e: &Env, file: &str) -> Vec<f64> {
    read(&e.path(file))
        .lines()
        .filter_map(|l| l.trim().replace(',', ".").parse().ok())
        .collect()
}

/// The last stamp in `ledger-1` and the first in `ledger-2` (see
/// [`stamps`]): the first holder's last write and the second's first
/// (no overlap where the one is below the other).
pub fn ledger_edges(e: &Env) -> (f64, f64) {
    let last1 = stamps(e, "ledger-1").into_iter().fold(0.0, f64::max);
    let first2 = stamps(e, "ledger-2")
        .into_iter()
        .fold(f64::INFINITY, f64::min);
    (last1, first2)
}

/// This machine's wall clock, in seconds since the epoch (as
/// `$EPOCHREALTIME`).
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Run `test` with an [`Env`] on `kind` (skipped when its server does not
/// answer and backends are not required): the runner of [`per_backend!`].
pub async fn run<F, Fut>(kind: Kind, test: F)
where
    F: FnOnce(Env) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    if let Some(e) = Env::new(kind).await {
        test(e).await
    }
}

/// Instantiate `async fn NAME(Env)` tests for every backend (the test
/// kit's macro, with an [`Env`] per test; in scope in every module after
/// `#[macro_use] mod common`).
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        baton_testkit::per_backend! { run: crate::common::run, threads: 2; $($name),* }
    };
}
