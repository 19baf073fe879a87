//! A private Redis Sentinel setup: one master, one replica and three
//! sentinels (quorum 2) on free loopback ports, each process owned by the
//! test (a [`Guard`]) and killed with it, in a temporary directory.
//!
//! Controlled with `redis-cli` (the kit has no Redis client of its own):
//! [`SentinelSet::failover`] forces a failover and waits until the
//! sentinels name the new master and it answers as one;
//! [`SentinelSet::lose_the_next_writes`] cuts the master off from its
//! replicas so that writes made before the master dies are lost by the
//! failover (what an asynchronous replica can lose).
//!
//! Down-after is 1 s, so a dead master is failed over within a few seconds.
//! The first master refuses writes while its replica is not connected and
//! in sync (`min-replicas-to-write 1`), so once the replica is promoted the
//! old master takes no more writes that the failover would lose; the
//! replica does not require one of its own (after a forced failover the
//! sentinels turn the old master into its replica only up to 10 s later,
//! and it would refuse writes until then).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::Guard;
use crate::{free_port, need};

/// The master name the sentinels monitor.
pub const MASTER: &str = "batonmaster";

/// A master, a replica and three sentinels.
pub struct SentinelSet {
    dir: tempfile::TempDir,
    /// The data nodes, by port (index 0 starts as the master).
    nodes: Vec<(u16, Guard)>,
    /// The sentinels, by port (none while stopped).
    sentinels: Vec<(u16, Guard)>,
    /// The sentinels' ports and config files, to start them again.
    sentinel_confs: Vec<(u16, std::path::PathBuf)>,
}

/// `redis-cli -p port args…`'s output, trimmed (empty when it failed).
pub fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Wait until `f` holds, or panic saying `what` after `within`.
fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl SentinelSet {
    /// Start the set and wait until the sentinels know the replica (a
    /// failover can pick it); `None` (a printed skip) when `redis-server`,
    /// `redis-sentinel` or `redis-cli` is missing, a panic then with
    /// `BATON_REQUIRE_BACKENDS=1`.
    pub fn start() -> Option<SentinelSet> {
        if !need(
            "redis sentinel",
            &["redis-server", "redis-sentinel", "redis-cli"],
        ) {
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mut set = SentinelSet {
            dir,
            nodes: Vec::new(),
            sentinels: Vec::new(),
            sentinel_confs: Vec::new(),
        };
        let master = free_port();
        set.start_node(master, None);
        let replicas = [free_port()];
        for r in replicas {
            set.start_node(r, Some(master));
        }
        for _ in 0..3 {
            let port = free_port();
            let conf = set.dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 2000\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    dir = set.dir.path().display()
                ),
            )
            .expect("write a sentinel config");
            set.sentinel_confs.push((port, conf));
        }
        set.start_sentinels();
        set.ports().wait_settled(master, &replicas);
        Some(set)
    }

    /// Start the sentinels (again: each keeps what it learnt in its config
    /// file).
    pub fn start_sentinels(&mut self) {
        for (port, conf) in self.sentinel_confs.clone() {
            let mut g = Guard::spawn(
                "redis-sentinel",
                Command::new("redis-sentinel")
                    .arg(&conf)
                    .stdout(log(self.dir.path(), &format!("sentinel-{port}")))
                    .stderr(Stdio::null()),
            );
            g.wait_port(port, Duration::from_secs(10));
            self.sentinels.push((port, g));
        }
    }

    /// Kill every sentinel (no failover can happen; asking them is refused).
    pub fn stop_sentinels(&mut self) {
        self.sentinels.clear();
    }

    fn start_node(&mut self, port: u16, replica_of: Option<u16>) {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // A demoted master resyncs at once (the default waits 5 s for
            // more replicas to share the transfer).
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--dbfilename", &format!("dump-{port}.rdb")])
            .stdout(log(self.dir.path(), &format!("redis-{port}")))
            .stderr(Stdio::null());
        match replica_of {
            Some(m) => {
                cmd.args(["--replicaof", "127.0.0.1", &m.to_string()]);
            }
            // What docs/GUIDE.md recommends: the master refuses writes
            // while its replica is gone or more than 2 s behind.
            None => {
                cmd.args([
                    "--min-replicas-to-write",
                    "1",
                    "--min-replicas-max-lag",
                    "2",
                ]);
            }
        }
        let mut g = Guard::spawn("redis-server", &mut cmd);
        g.wait_port(port, Duration::from_secs(10));
        self.nodes.push((port, g));
    }

    /// The ports, for `redis-cli` calls from another thread.
    pub fn ports(&self) -> Ports {
        Ports {
            sentinels: self.sentinels.iter().map(|(p, _)| *p).collect(),
        }
    }

    /// See [`Ports::rejoin`].
    pub fn rejoin(&self, old: u16, master: u16) {
        self.ports().rejoin(old, master)
    }

    /// See [`Ports::master_port`].
    pub fn master_port(&self) -> u16 {
        self.ports().master_port()
    }

    /// See [`Ports::wait_new_master`].
    pub fn wait_new_master(&self, old: u16) -> u16 {
        self.ports().wait_new_master(old)
    }

    /// The store URL: every sentinel and the master's name.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// The data nodes other than `port` (still running).
    pub fn other_nodes(&self, port: u16) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p != port)
            .collect()
    }

    /// The process of data node `port`.
    pub fn node(&mut self, port: u16) -> &mut Guard {
        &mut self
            .nodes
            .iter_mut()
            .find(|(p, _)| *p == port)
            .expect("a node of the set")
            .1
    }

    /// Force a failover (`SENTINEL FAILOVER`, the old master is demoted
    /// and stays up as a replica); wait until the sentinels name another
    /// node and it answers as a master. Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let old = self.start_failover();
        self.wait_new_master(old)
    }

    /// Ask for a failover (`SENTINEL FAILOVER`) and return at once with the
    /// old master's port ([`SentinelSet::wait_new_master`] waits for the
    /// new one).
    ///
    /// A planned switchover: it first waits until every replica has the
    /// master's writes. `SENTINEL FAILOVER` itself does not wait, and a
    /// replica whose link is up may still be behind (right after its
    /// initial sync it applies the stream only once it has acknowledged
    /// the snapshot); promoting it then loses what it lacks — the store
    /// identity key included, which baton then rightly reports as a store
    /// that lost its data.
    pub fn start_failover(&self) -> u16 {
        let old = self.master_port();
        self.ports().wait_caught_up(old, &self.other_nodes(old));
        let s = self.sentinels[0].0;
        wait_for(
            "SENTINEL FAILOVER accepted",
            Duration::from_secs(20),
            || cli(s, &["SENTINEL", "FAILOVER", MASTER]) == "OK",
        );
        old
    }

    /// Cut the master `master` off from its replicas so that its next
    /// writes reach none: the replicas are frozen (SIGSTOP) and the master
    /// drops their connections. [`SentinelSet::thaw_replicas`] undoes the
    /// freeze; killing the master in between loses those writes. Every
    /// node stops requiring a replica in sync for writes (the master would
    /// refuse them).
    pub fn lose_the_next_writes(&mut self, master: u16) {
        let replicas = self.other_nodes(master);
        for p in replicas.iter().chain([&master]) {
            assert_eq!(
                cli(*p, &["CONFIG", "SET", "min-replicas-to-write", "0"]),
                "OK"
            );
        }
        for r in &replicas {
            self.node(*r).signal(libc::SIGSTOP);
        }
        let killed = cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            killed.parse::<usize>().is_ok_and(|n| n == replicas.len()),
            "the master dropped its replicas: {killed}"
        );
        wait_for(
            "the master without replicas",
            Duration::from_secs(5),
            || cli(master, &["INFO", "replication"]).contains("connected_slaves:0"),
        );
    }

    /// Resume the replicas of `master` frozen by
    /// [`SentinelSet::lose_the_next_writes`].
    pub fn thaw_replicas(&mut self, master: u16) {
        for r in self.other_nodes(master) {
            self.node(r).signal(libc::SIGCONT);
        }
    }

    /// Kill data node `port` (SIGKILL) and forget it.
    pub fn kill_node(&mut self, port: u16) {
        self.nodes.retain(|(p, _)| *p != port);
    }
}

/// The ports of a [`SentinelSet`] (sentinels, then data nodes): what the
/// `redis-cli` calls need, cheap to clone into a thread while the set
/// stays with the test.
#[derive(Clone, Debug)]
pub struct Ports {
    /// The sentinels' ports.
    pub sentinels: Vec<u16>,
}

impl Ports {
    /// Make `old` (a demoted master) a replica of `master` now, as the
    /// sentinels would when they next look at it (up to 10 s after a forced
    /// failover), and wait until it is in sync.
    pub fn rejoin(&self, old: u16, master: u16) {
        let said = cli(old, &["REPLICAOF", "127.0.0.1", &master.to_string()]);
        // "OK", or "OK Already connected to specified master".
        assert!(said.starts_with("OK"), "REPLICAOF: {said}");
        self.wait_settled(master, &[old]);
    }

    /// Wait until every replica in `replicas` has processed the
    /// replication stream up to `master`'s offset as read now.
    pub fn wait_caught_up(&self, master: u16, replicas: &[u16]) {
        let offset = |port: u16| -> Option<u64> {
            cli(port, &["INFO", "replication"])
                .lines()
                .find_map(|l| l.trim().strip_prefix("master_repl_offset:"))
                .and_then(|v| v.parse().ok())
        };
        let target = offset(master).unwrap_or(0);
        for r in replicas {
            wait_for(
                "the replicas caught up with the master",
                Duration::from_secs(20),
                || offset(*r).is_some_and(|o| o >= target),
            );
        }
    }

    /// Wait until the replicas are in sync with `master` and every
    /// sentinel names `master` and knows the replicas (so a failover can
    /// pick one).
    pub fn wait_settled(&self, master: u16, replicas: &[u16]) {
        for r in replicas {
            wait_for("the replicas in sync", Duration::from_secs(20), || {
                cli(*r, &["INFO", "replication"]).contains("master_link_status:up")
            });
        }
        for s in &self.sentinels {
            wait_for(
                "every sentinel knowing the master and the replicas",
                Duration::from_secs(30),
                || {
                    let addr = cli(*s, &["SENTINEL", "get-master-addr-by-name", MASTER]);
                    let known = cli(*s, &["SENTINEL", "replicas", MASTER]);
                    addr.ends_with(&master.to_string())
                        && replicas.iter().all(|r| known.contains(&r.to_string()))
                        && !known.contains("s_down")
                        && !known.contains("disconnected")
                },
            );
        }
    }

    /// The port the (first answering) sentinel names as the master's.
    pub fn master_port(&self) -> u16 {
        for s in &self.sentinels {
            let out = cli(*s, &["SENTINEL", "get-master-addr-by-name", MASTER]);
            if let Some(p) = out.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return p;
            }
        }
        panic!("no sentinel names the master");
    }

    /// Wait until the sentinels name a master other than `old` and it
    /// answers as one; its port.
    pub fn wait_new_master(&self, old: u16) -> u16 {
        let mut new = 0;
        wait_for("a new master", Duration::from_secs(30), || {
            new = self.master_port();
            new != old && cli(new, &["ROLE"]).starts_with("master")
        });
        new
    }
}

/// A log file in `dir` for a process's stdout (kept with the temporary
/// directory; read it when a test fails there).
fn log(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}
