//! Private store servers for `baton chaos --private`: a SQLite file, or a
//! `redis-server` / `postgres` / `mariadbd` of the run's own on a free port
//! in the run directory, which the nemesis may crash and restart; or a
//! Redis Sentinel deployment ([`super::sentinel`]) it fails over.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::sentinel::SentinelStore;

/// The kind of a private store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A SQLite file in the run directory.
    Sqlite,
    /// A private `postgres` (initdb, pg_ctl).
    Postgres,
    /// A private `redis-server` with `appendonly yes`, `appendfsync always`.
    Redis,
    /// A private `mariadbd` (the MySQL backend), `mariadb-install-db`'d.
    Mysql,
    /// Three `redis-server`s (a master, two replicas) and three
    /// `redis-sentinel`s; the nemesis fails the master over.
    Sentinel,
}

/// Parse `--private`.
pub fn kind_arg(s: &str) -> Result<Kind, String> {
    match s {
        "sqlite" => Ok(Kind::Sqlite),
        "postgres" => Ok(Kind::Postgres),
        "redis" => Ok(Kind::Redis),
        "mysql" | "mariadb" => Ok(Kind::Mysql),
        "redis-sentinel" => Ok(Kind::Sentinel),
        _ => Err(format!(
            "{s:?}: use sqlite, postgres, redis, redis-sentinel or mysql"
        )),
    }
}

/// A private store the run started.
pub struct Private {
    kind: Kind,
    port: u16,
    dir: PathBuf,
    /// The server process we spawned ourselves (Redis, MariaDB).
    child: Option<std::process::Child>,
    /// The Sentinel deployment, once started.
    sentinel: Option<SentinelStore>,
}

/// Whether `bin` is on PATH (or in PostgreSQL's usual bin directory).
pub fn installed(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .env("PATH", path())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn path() -> String {
    // mariadbd lives in /usr/sbin, which a non-root PATH may lack.
    let pg = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| format!("{}/bin:", d.path().display()))
        .collect::<String>();
    format!(
        "{pg}{}:/usr/sbin",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A free loopback port (the fault proxy's helper).
pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(baton_proxy::free_port()?)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Run a shell command (as the `postgres` user when we are root, since
/// initdb refuses root).
fn sh(cmd: &str, as_postgres: bool) -> bool {
    let mut c = if as_postgres && is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh", "-c", cmd]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        c
    };
    c.env("PATH", path())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Private {
    /// Prepare (not start) a private server of `kind` under `dir`.
    pub fn new(kind: Kind, dir: &Path) -> anyhow::Result<Private> {
        let dir = dir.join("store");
        std::fs::create_dir_all(&dir)?;
        let need: &[&str] = match kind {
            Kind::Sqlite => &[],
            Kind::Redis => &["redis-server"],
            Kind::Postgres => &["initdb"],
            Kind::Mysql => &["mariadbd"],
            Kind::Sentinel => &SentinelStore::NEEDS,
        };
        for b in need {
            if !installed(b) {
                bail!("--private: {b} is not installed");
            }
        }
        let p = Private {
            kind,
            port: free_port()?,
            dir,
            child: None,
            sentinel: None,
        };
        if kind == Kind::Postgres {
            if is_root() {
                use std::os::unix::fs::PermissionsExt;
                for d in p.dir.ancestors().skip(1).take(1).chain([p.dir.as_path()]) {
                    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777))?;
                }
                sh(&format!("chown -R postgres {}", p.dir.display()), false);
            }
            let ok = sh(
                &format!(
                    "initdb -A trust -U postgres -D {}/data >/dev/null",
                    p.dir.display()
                ),
                true,
            );
            if !ok {
                bail!("--private postgres: initdb failed in {}", p.dir.display());
            }
        }
        if kind == Kind::Mysql {
            let ok = sh(
                &format!(
                    "mariadb-install-db --no-defaults --user={u} --datadir={d}/data \
                     --auth-root-authentication-method=normal --skip-test-db >{d}/install.log 2>&1 \
                     && mkdir -p {d}/data/test",
                    d = p.dir.display(),
                    u = if is_root() { "root" } else { "$(id -un)" },
                ),
                false,
            );
            if !ok {
                bail!(
                    "--private mysql: mariadb-install-db failed (see {}/install.log)",
                    p.dir.display()
                );
            }
        }
        Ok(p)
    }

    /// The store URL.
    pub fn url(&self) -> String {
        match self.kind {
            Kind::Sqlite => format!("sqlite://{}/chaos.db", self.dir.display()),
            Kind::Redis => format!("redis://127.0.0.1:{}", self.port),
            Kind::Postgres => format!("postgres://postgres@127.0.0.1:{}/postgres", self.port),
            Kind::Mysql => format!("mysql://root@127.0.0.1:{}/test", self.port),
            Kind::Sentinel => self
                .sentinel
                .as_ref()
                .map_or_else(String::new, SentinelStore::url),
        }
    }

    /// Whether it is a server that can be restarted (a Sentinel
    /// deployment fails over instead).
    pub fn restartable(&self) -> bool {
        !matches!(self.kind, Kind::Sqlite | Kind::Sentinel)
    }

    /// Whether it can fail over (the `failover` fault).
    pub fn fails_over(&self) -> bool {
        self.kind == Kind::Sentinel
    }

    /// Fail the master over (see [`SentinelStore::failover`]); the old
    /// master's port.
    pub fn failover(&mut self, crash: bool, down: Duration) -> anyhow::Result<u16> {
        match &mut self.sentinel {
            Some(s) => s.failover(crash, down),
            None => bail!("the private store is not a Sentinel deployment"),
        }
    }

    /// Start the server and wait until it accepts connections.
    pub fn start(&mut self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Sqlite => return Ok(()),
            Kind::Sentinel => {
                self.sentinel = Some(SentinelStore::start(&self.dir, free_port)?);
                return Ok(());
            }
            Kind::Redis => {
                let child = Command::new("redis-server")
                    .args(["--bind", "127.0.0.1", "--save", ""])
                    .args(["--appendonly", "yes", "--appendfsync", "always"])
                    .args(["--port", &self.port.to_string()])
                    .arg("--dir")
                    .arg(&self.dir)
                    .stdout(Stdio::null())
                    .spawn()
                    .context("starting redis-server")?;
                self.child = Some(child);
            }
            Kind::Mysql => {
                // No grant tables: root from 127.0.0.1 needs no password.
                // Durable commits (the InnoDB and binlog-less defaults).
                let d = self.dir.display();
                let mut c = Command::new("mariadbd");
                c.arg("--no-defaults")
                    .arg(format!("--datadir={d}/data"))
                    .arg(format!("--socket={d}/mysqld.sock"))
                    .arg(format!("--pid-file={d}/mysqld.pid"))
                    .arg(format!("--log-error={d}/log"))
                    .arg(format!("--port={}", self.port))
                    .args(["--bind-address=127.0.0.1", "--skip-grant-tables"])
                    .args(["--skip-name-resolve", "--innodb-buffer-pool-size=32M"])
                    .args([
                        "--innodb-flush-log-at-trx-commit=1",
                        "--max-connections=500",
                    ]);
                if is_root() {
                    c.arg("--user=root");
                }
                let child = c
                    .env("PATH", path())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting mariadbd")?;
                self.child = Some(child);
            }
            Kind::Postgres => {
                let ok = sh(
                    &format!(
                        "pg_ctl -D {d}/data -o '-p {p} -k /tmp -c listen_addresses=127.0.0.1' -l {d}/log -w start >/dev/null",
                        d = self.dir.display(),
                        p = self.port
                    ),
                    true,
                );
                if !ok {
                    bail!("pg_ctl start failed (see {}/log)", self.dir.display());
                }
            }
        }
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("the private {:?} server did not start in 30 s", self.kind);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stop like a crash: SIGKILL for Redis (the AOF keeps the data) and
    /// MariaDB (InnoDB's redo log does), `pg_ctl -m immediate` for
    /// PostgreSQL.
    pub fn stop(&mut self) {
        match self.kind {
            Kind::Sqlite => {}
            Kind::Sentinel => self.sentinel = None,
            Kind::Redis | Kind::Mysql => {
                if let Some(mut c) = self.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            Kind::Postgres => {
                sh(
                    &format!(
                        "pg_ctl -D {}/data -m immediate -w stop >/dev/null 2>&1",
                        self.dir.display()
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
