//! A private Redis Sentinel deployment for `baton chaos --private
//! redis-sentinel`: three data nodes (a master and two replicas, each with
//! `appendonly yes`, `appendfsync always`) and three sentinels in the run
//! directory, and the `failover` fault the nemesis injects on it.
//!
//! The run's store URL asks for `wait_replicas=2`, every replica: a write
//! baton was told of is on whichever replica a failover promotes, so the
//! failover keeps it (docs/GUIDE.md, "Redis Sentinel"). One replica is not
//! enough: during a forced failover the old master takes writes until the
//! sentinels reconfigure it, and the replica that acknowledged one may be
//! the one not promoted (this run with `wait_replicas=1` lost tasks). The
//! fault alternates the two ways a master goes:
//!
//! - **forced**: `SENTINEL FAILOVER` (the master is demoted and stays up
//!   as a replica of the promoted one — a planned switchover);
//! - **crash**: the master is killed with SIGKILL, the sentinels notice
//!   (`down-after-milliseconds` 1000) and promote a replica, and the old
//!   node is started again from its AOF a moment later; the sentinels turn
//!   it into a replica of the new master, which discards what it alone had.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// The name the sentinels monitor the master by.
const MASTER: &str = "chaosmaster";

/// The deployment: its data nodes and sentinels.
pub struct SentinelStore {
    dir: PathBuf,
    /// Data nodes: port and process (`None` while crashed).
    nodes: Vec<(u16, Option<Child>)>,
    /// Sentinels: port and process.
    sentinels: Vec<(u16, Child)>,
}

/// `redis-cli -p port args…`, its stdout trimmed ("" when it fails).
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Wait up to `within` for `f`; an error naming `what` after.
fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > within {
            bail!("--private redis-sentinel: {what} did not happen within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

impl SentinelStore {
    /// The binaries it needs, for the "not installed" message.
    pub const NEEDS: [&'static str; 3] = ["redis-server", "redis-sentinel", "redis-cli"];

    /// Start three data nodes and three sentinels under `dir`; return once
    /// the replicas are in sync and every sentinel knows them.
    pub fn start(
        dir: &Path,
        mut free_port: impl FnMut() -> anyhow::Result<u16>,
    ) -> anyhow::Result<SentinelStore> {
        let mut s = SentinelStore {
            dir: dir.to_path_buf(),
            nodes: Vec::new(),
            sentinels: Vec::new(),
        };
        let master = free_port()?;
        let replicas = [free_port()?, free_port()?];
        s.nodes.push((master, None));
        for r in replicas {
            s.nodes.push((r, None));
        }
        for i in 0..s.nodes.len() {
            let port = s.nodes[i].0;
            let child = s.spawn_node(port, (port != master).then_some(master))?;
            s.nodes[i].1 = Some(child);
        }
        for _ in 0..3 {
            let port = free_port()?;
            let conf = s.dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 3000\n\
                     sentinel parallel-syncs {MASTER} 2\n",
                    dir = s.dir.display()
                ),
            )
            .context("writing a sentinel config")?;
            let child = Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(log(&s.dir, &format!("sentinel-{port}")))
                .stderr(Stdio::null())
                .spawn()
                .context("starting redis-sentinel")?;
            s.sentinels.push((port, child));
            wait_port(port)?;
        }
        for r in replicas {
            wait_for("a replica's sync", Duration::from_secs(30), || {
                cli(r, &["INFO", "replication"]).contains("master_link_status:up")
            })?;
        }
        let ports: Vec<u16> = s.sentinels.iter().map(|(p, _)| *p).collect();
        for p in ports {
            wait_for(
                "every sentinel knowing both replicas",
                Duration::from_secs(30),
                || {
                    let known = cli(p, &["SENTINEL", "replicas", MASTER]);
                    replicas.iter().all(|r| known.contains(&r.to_string()))
                        && !known.contains("s_down")
                        && !known.contains("disconnected")
                },
            )?;
        }
        Ok(s)
    }

    fn spawn_node(&self, port: u16, replica_of: Option<u16>) -> anyhow::Result<Child> {
        let mut c = Command::new("redis-server");
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--appenddirname", &format!("aof-{port}")])
            .args(["--dbfilename", &format!("dump-{port}.rdb")])
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(log(&self.dir, &format!("redis-{port}")))
            .stderr(Stdio::null());
        if let Some(m) = replica_of {
            c.args(["--replicaof", "127.0.0.1", &m.to_string()]);
        }
        let child = c.spawn().context("starting redis-server")?;
        wait_port(port)?;
        Ok(child)
    }

    /// The store URL: every sentinel, and `wait_replicas` = every replica.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "redis+sentinel://{}/{MASTER}?wait_replicas={}",
            hosts.join(","),
            self.nodes.len().saturating_sub(1)
        )
    }

    /// The master's port as the first answering sentinel names it.
    fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|(p, _)| {
            cli(*p, &["SENTINEL", "get-master-addr-by-name", MASTER])
                .lines()
                .nth(1)
                .and_then(|l| l.trim().parse().ok())
        })
    }

    /// One failover: `crash` kills the master (and starts it again after
    /// `down`), else `SENTINEL FAILOVER`. Returns once the sentinels name
    /// another master that answers as one (and, after a crash, the old
    /// node is back). The old master's port, for the history.
    pub fn failover(&mut self, crash: bool, down: Duration) -> anyhow::Result<u16> {
        let Some(old) = self.master_port() else {
            bail!("no sentinel names the master");
        };
        if crash {
            if let Some((_, child)) = self.nodes.iter_mut().find(|(p, _)| *p == old) {
                if let Some(mut c) = child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        } else {
            let ports: Vec<u16> = self.sentinels.iter().map(|(p, _)| *p).collect();
            wait_for(
                "SENTINEL FAILOVER accepted",
                Duration::from_secs(15),
                || {
                    ports
                        .iter()
                        .any(|p| cli(*p, &["SENTINEL", "FAILOVER", MASTER]) == "OK")
                },
            )?;
        }
        wait_for("a new master", Duration::from_secs(30), || {
            self.master_port()
                .is_some_and(|m| m != old && cli(m, &["ROLE"]).starts_with("master"))
        })?;
        if crash {
            std::thread::sleep(down);
            // Back from its AOF as a master of its own config; the sentinels
            // make it a replica of the new master.
            let child = self.spawn_node(old, None)?;
            if let Some(n) = self.nodes.iter_mut().find(|(p, _)| *p == old) {
                n.1 = Some(child);
            }
            wait_for(
                "the old master turned into a replica",
                Duration::from_secs(30),
                || cli(old, &["INFO", "replication"]).contains("master_link_status:up"),
            )?;
        }
        Ok(old)
    }

    /// Kill every process.
    pub fn stop(&mut self) {
        for (_, c) in &mut self.sentinels {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.sentinels.clear();
        for (_, c) in &mut self.nodes {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for SentinelStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait until `port` accepts connections.
fn wait_port(port: u16) -> anyhow::Result<()> {
    wait_for(
        &format!("port {port} listening"),
        Duration::from_secs(15),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    )
}

/// A log file in `dir` for a process's stdout.
fn log(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}
