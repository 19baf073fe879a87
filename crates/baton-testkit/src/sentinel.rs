//! A private Redis Sentinel setup: one master, one replica and three
//! sentinels (quorum 2) on free loopback ports, each process owned by the
//! test (a [`Guard`]) and killed with it, in a temporary directory.
//!
//! Controlled with `redis-cli` (the kit has no Redis client of its own):
//! [`SentinelSet::failover`] forces a failover and waits until the
//! sentinels name the new master and it answers as one;
//! [`SentinelSet::lose_the_next_writes`] cuts the master off from its
//! replica so that writes made before the master dies are lost by the
//! failover (what an asynchronous replica can lose).
//!
//! Down-after is 1 s, so a dead master is failed over within a few seconds.

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
    /// The two data nodes, by port (index 0 starts as the master).
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
        let replica = free_port();
        set.start_node(replica, Some(master));
        for _ in 0..3 {
            let port = free_port();
            let conf = set.dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {MASTER} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER} 1000\n\
                     sentinel failover-timeout {MASTER} 10000\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    dir = set.dir.path().display()
                ),
            )
            .expect("write a sentinel config");
            set.sentinel_confs.push((port, conf));
        }
        set.start_sentinels();
        set.wait_settled(master, replica);
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
            // What docs/GUIDE.md recommends: a master refuses writes while
            // its replica is not in sync, so a failover loses (almost)
            // nothing acknowledged.
            .args([
                "--min-replicas-to-write",
                "1",
                "--min-replicas-max-lag",
                "2",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--dbfilename", &format!("dump-{port}.rdb")])
            .stdout(log(self.dir.path(), &format!("redis-{port}")))
            .stderr(Stdio::null());
        if let Some(m) = replica_of {
            cmd.args(["--replicaof", "127.0.0.1", &m.to_string()]);
        }
        let mut g = Guard::spawn("redis-server", &mut cmd);
        g.wait_port(port, Duration::from_secs(10));
        self.nodes.push((port, g));
    }

    /// Wait until `replica` is in sync with `master` and every sentinel
    /// names `master` and knows `replica` (so a failover can pick it).
    fn wait_settled(&self, master: u16, replica: u16) {
        wait_for("the replica in sync", Duration::from_secs(20), || {
            cli(replica, &["INFO", "replication"]).contains("master_link_status:up")
        });
        for (s, _) in &self.sentinels {
            wait_for(
                "every sentinel knowing the master and the replica",
                Duration::from_secs(30),
                || {
                    let addr = cli(*s, &["SENTINEL", "get-master-addr-by-name", MASTER]);
                    let replicas = cli(*s, &["SENTINEL", "replicas", MASTER]);
                    addr.ends_with(&master.to_string())
                        && replicas.contains(&replica.to_string())
                        && !replicas.contains("s_down")
                        && !replicas.contains("disconnected")
                },
            );
        }
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

    /// The port the (first answering) sentinel names as the master's.
    pub fn master_port(&self) -> u16 {
        for (s, _) in &self.sentinels {
            let out = cli(*s, &["SENTINEL", "get-master-addr-by-name", MASTER]);
            if let Some(p) = out.lines().nth(1).and_then(|p| p.trim().parse().ok()) {
                return p;
            }
        }
        panic!("no sentinel names the master");
    }

    /// The data node other than `port`.
    pub fn other_node(&self, port: u16) -> u16 {
        self.nodes
            .iter()
            .map(|(p, _)| *p)
            .find(|p| *p != port)
            .expect("two nodes")
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
    /// and stays up as a replica); wait until the sentinels name the other
    /// node and it answers as a master. Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let new = self.start_failover();
        self.wait_master(new);
        new
    }

    /// Ask for a failover (`SENTINEL FAILOVER`) and return at once with the
    /// port of the node that will be the master ([`SentinelSet::wait_master`]
    /// waits for it).
    pub fn start_failover(&self) -> u16 {
        let new = self.other_node(self.master_port());
        let s = self.sentinels[0].0;
        wait_for(
            "SENTINEL FAILOVER accepted",
            Duration::from_secs(20),
            || cli(s, &["SENTINEL", "FAILOVER", MASTER]) == "OK",
        );
        new
    }

    /// Wait until the sentinels name `port` as the master and it answers as one.
    pub fn wait_master(&self, port: u16) {
        wait_for("the new master", Duration::from_secs(30), || {
            self.master_port() == port && cli(port, &["ROLE"]).starts_with("master")
        });
    }

    /// Cut the master `master` off from its replica so that its next writes
    /// reach no replica: the replica is frozen (SIGSTOP) and the master
    /// drops its replica connection. [`SentinelSet::thaw_replica`] undoes
    /// the freeze; killing the master in between loses those writes.
    /// Both nodes stop requiring a replica in sync for writes (the master
    /// would refuse them, and the promoted replica would have none).
    pub fn lose_the_next_writes(&mut self, master: u16) {
        let replica = self.other_node(master);
        for p in [master, replica] {
            assert_eq!(
                cli(p, &["CONFIG", "SET", "min-replicas-to-write", "0"]),
                "OK"
            );
        }
        self.node(replica).signal(libc::SIGSTOP);
        let killed = cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            killed.parse::<u32>().is_ok_and(|n| n >= 1),
            "the master dropped its replica: {killed}"
        );
        wait_for(
            "the master without replicas",
            Duration::from_secs(5),
            || cli(master, &["INFO", "replication"]).contains("connected_slaves:0"),
        );
    }

    /// Resume a replica frozen by [`SentinelSet::lose_the_next_writes`].
    pub fn thaw_replica(&mut self, replica: u16) {
        self.node(replica).signal(libc::SIGCONT);
    }
}

/// A log file in `dir` for a process's stdout (kept with the temporary
/// directory; read it when a test fails there).
fn log(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}
