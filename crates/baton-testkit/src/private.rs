//! Private store servers for tests that must stop, crash or reconfigure
//! one: a `redis-server` or `postgres` of its own on a free port, in a
//! temporary directory, optionally serving TLS only (certificates made with
//! the `openssl` command for the test).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{certs, free_port, installed, required};

/// Which kind of private server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Redis,
    Postgres,
}

/// A private server that the test may stop and start.
pub struct Private {
    pub kind: Kind,
    pub port: u16,
    dir: tempfile::TempDir,
    redis: Option<std::process::Child>,
    tls: bool,
}

impl Private {
    /// A plain server, or `None` (a skip) when its binaries are missing
    /// and `BATON_REQUIRE_BACKENDS` is not set.
    pub fn new(kind: Kind) -> Option<Private> {
        Self::build(kind, false)
    }

    /// A server that accepts TLS connections only, with a certificate for
    /// `localhost` and `127.0.0.1` signed by the CA at [`Private::ca`].
    pub fn with_tls(kind: Kind) -> Option<Private> {
        Self::build(kind, true)
    }

    fn build(kind: Kind, tls: bool) -> Option<Private> {
        let bin = match kind {
            Kind::Redis => "redis-server",
            Kind::Postgres => "initdb",
        };
        for b in [bin].into_iter().chain(tls.then_some("openssl")) {
            if !installed(b) {
                assert!(!required(), "{b} is not installed");
                // Past the harness's capture, so a skip is seen.
                let _ = std::io::Write::write_fmt(
                    &mut std::io::stderr(),
                    format_args!("SKIPPED private {kind:?} server: {b} not installed\n"),
                );
                return None;
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let p = Private {
            kind,
            port: free_port(),
            dir,
            redis: None,
            tls,
        };
        if tls {
            certs::make(p.dir.path());
        }
        if kind == Kind::Postgres {
            // initdb refuses to run as root: run the server as `postgres`.
            let data = p.data();
            std::fs::create_dir_all(&data).unwrap();
            as_postgres(
                &format!("chown -R postgres {}", p.dir.path().display()),
                false,
            );
            std::fs::set_permissions(
                p.dir.path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o777),
            )
            .unwrap();
            let ok = as_postgres(
                &format!(
                    "initdb -A trust -U postgres -D {} >/dev/null",
                    data.display()
                ),
                true,
            );
            assert!(ok, "initdb failed");
            if tls {
                // TLS only: every TCP client must come over hostssl.
                let ok = as_postgres(
                    &format!("sed -i 's/^host /hostssl /' {}/pg_hba.conf", data.display()),
                    true,
                );
                assert!(ok, "could not make pg_hba.conf TLS-only");
            }
        }
        Some(p)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The CA certificate (PEM) that signed a TLS server's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA that signed nothing here: trusting only it must fail.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    /// The URL to reach the server (`rediss://` for a TLS Redis; a TLS
    /// PostgreSQL URL needs its `sslmode` added by the test).
    pub fn url(&self) -> String {
        match (self.kind, self.tls) {
            (Kind::Redis, false) => format!("redis://127.0.0.1:{}", self.port),
            (Kind::Redis, true) => format!("rediss://localhost:{}", self.port),
            (Kind::Postgres, false) => {
                format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
            }
            (Kind::Postgres, true) => {
                format!("postgres://postgres@localhost:{}/postgres", self.port)
            }
        }
    }

    pub fn start(&mut self) {
        let d = self.dir.path().display().to_string();
        match self.kind {
            Kind::Redis => {
                let mut cmd = Command::new("redis-server");
                cmd.args(["--bind", "127.0.0.1", "--save", ""])
                    .args(["--appendonly", "yes", "--appendfsync", "always"])
                    .arg("--dir")
                    .arg(self.dir.path());
                if self.tls {
                    cmd.args(["--port", "0", "--tls-port", &self.port.to_string()])
                        .args(["--tls-cert-file", &format!("{d}/server.pem")])
                        .args(["--tls-key-file", &format!("{d}/server.key")])
                        .args(["--tls-ca-cert-file", &format!("{d}/ca.pem")])
                        .args(["--tls-auth-clients", "no"]);
                } else {
                    cmd.args(["--port", &self.port.to_string()]);
                }
                self.redis = Some(cmd.stdout(Stdio::null()).spawn().unwrap());
            }
            Kind::Postgres => {
                if self.tls {
                    as_postgres(
                        &format!("chown postgres {d}/server.key {d}/server.pem"),
                        false,
                    );
                }
                let ssl = if self.tls {
                    format!(
                        " -c ssl=on -c ssl_cert_file={d}/server.pem -c ssl_key_file={d}/server.key"
                    )
                } else {
                    String::new()
                };
                // The WAL writer sleeps 10 s: only a commit that waited for
                // its own flush survives an immediate stop.
                let ok = as_postgres(
                    &format!(
                        "pg_ctl -D {} -o '-p {} -k /tmp -c listen_addresses=127.0.0.1 -c wal_writer_delay=10s{ssl}' -l {d}/log -w start >/dev/null",
                        self.data().display(),
                        self.port,
                    ),
                    true,
                );
                assert!(ok, "pg_ctl start failed");
            }
        }
        let t0 = Instant::now();
        while !self.answers() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the server takes a connection, and a plain Redis answers
    /// `PING` with `+PONG` on it (one that accepts while it still loads,
    /// or another test's server on a port reused, does not).
    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if self.kind != Kind::Redis || self.tls {
            return true;
        }
        let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 7];
        c.write_all(b"PING\r\n").is_ok() && c.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// The pid of a private `redis-server` while it runs (to SIGSTOP it).
    pub fn redis_pid(&self) -> Option<u32> {
        self.redis.as_ref().map(|c| c.id())
    }

    /// Stop like a crash: SIGKILL for Redis (the AOF, fsync always, keeps
    /// the data), `pg_ctl -m immediate` for PostgreSQL.
    pub fn stop(&mut self) {
        match self.kind {
            Kind::Redis => {
                if let Some(mut c) = self.redis.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            Kind::Postgres => {
                as_postgres(
                    &format!(
                        "pg_ctl -D {} -m immediate -w stop >/dev/null 2>&1",
                        self.data().display()
                    ),
                    true,
                );
            }
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn as_postgres(cmd: &str, as_user: bool) -> bool {
    let mut c = if as_user && is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh", "-c", cmd]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        c
    };
    c.env(
        "PATH",
        format!(
            "/usr/lib/postgresql/15/bin:{}",
            std::env::var("PATH").unwrap_or_default()
        ),
    );
    c.status().is_ok_and(|s| s.success())
}
