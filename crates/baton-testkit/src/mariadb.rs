//! A private `mariadbd` the test owns: on a free loopback port, in a
//! temporary directory, killed on drop (for tests that reconfigure the
//! server, e.g. `SET GLOBAL read_only`, or need its startup options).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A private `mariadbd` on a free port, in a temporary directory, killed
/// on drop: root without a password (`mysql://root@127.0.0.1:PORT/test`),
/// a database `test`, no binary log.
pub struct PrivateMariadb {
    child: std::process::Child,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl PrivateMariadb {
    /// Start one with `extra` server options, or `None` (a skip, said)
    /// when `mariadbd` is not installed and backends are not required.
    pub fn start(extra: &[&str]) -> Option<PrivateMariadb> {
        if !crate::need(
            "private mariadbd",
            &["mariadbd", "mariadb-install-db", "mariadb"],
        ) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db");
        // mariadbd refuses to run as root unless told to.
        if crate::private::is_root() {
            install.arg("--user=root");
        }
        let ok = install
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mariadb-install-db failed");
        let port = free_port();
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--port={port}"))
            .args(["--bind-address=127.0.0.1", "--skip-log-bin"])
            .arg("--innodb-buffer-pool-size=64M")
            .args(extra);
        if crate::private::is_root() {
            cmd.arg("--user=root");
        }
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mariadbd");
        let me = PrivateMariadb { child, port, dir };
        let t0 = Instant::now();
        while !me.sql("root", "CREATE DATABASE IF NOT EXISTS test") {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "private mariadbd did not start: {}",
                std::fs::read_to_string(me.dir.path().join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(me)
    }

    /// The URL for `user` (no password) on database `test`.
    pub fn url_for(&self, user: &str) -> String {
        format!("mysql://{user}@127.0.0.1:{}/test", self.port)
    }

    /// The URL for root.
    pub fn url(&self) -> String {
        self.url_for("root")
    }

    /// Run `sql` with the `mariadb` client as `user`; whether it worked.
    pub fn sql(&self, user: &str, sql: &str) -> bool {
        Command::new("mariadb")
            .args([
                "-h127.0.0.1",
                &format!("-P{}", self.port),
                &format!("-u{user}"),
            ])
            .args(["-e", sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
