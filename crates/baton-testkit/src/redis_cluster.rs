//! A private Redis Cluster: three masters, no replicas, on free loopback
//! ports (each port `p` with its cluster bus port `p + 10000` free too),
//! each `redis-server` owned by the test (a [`Guard`]) and killed with it,
//! in a temporary directory removed then — what
//! `scripts/redis-cluster-ci.sh` starts for the conformance suite, for a
//! test of its own.
//!
//! Inspected with `redis-cli` (as [`crate::sentinel`]): [`PrivateCluster::keys_on`]
//! lists the keys one node holds (where a key really is), and
//! [`PrivateCluster::master_of`] says which node serves a key's slot (where
//! a key would go).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::Guard;
use crate::sentinel::cli;
use crate::{free_port, need};

/// The number of masters.
pub const MASTERS: usize = 3;

/// A running 3-master Redis Cluster.
pub struct PrivateCluster {
    /// The nodes, by port (killed before the directory is removed).
    nodes: Vec<(u16, Guard)>,
    dir: tempfile::TempDir,
    /// Each master's slot ranges, by port, as `CLUSTER NODES` said once
    /// the cluster was up.
    slots: Vec<(u16, Vec<(u16, u16)>)>,
}

impl PrivateCluster {
    /// Start the nodes, join them into a cluster (`redis-cli --cluster
    /// create`, 3 masters, no replicas) and wait until every node says
    /// `cluster_state:ok`. `None` (a printed skip) when `redis-server` or
    /// `redis-cli` is missing; then a panic with `BATON_REQUIRE_BACKENDS=1`.
    pub fn start() -> Option<PrivateCluster> {
        if !need("redis cluster", &["redis-server", "redis-cli"]) {
            return None;
        }
        let mut c = PrivateCluster {
            nodes: Vec::new(),
            dir: tempfile::tempdir().expect("tempdir"),
            slots: Vec::new(),
        };
        while c.nodes.len() < MASTERS {
            c.start_node();
        }
        let hosts: Vec<String> = c.ports().iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&hosts)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create {}: {}{}\n{}",
            hosts.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            c.logs()
        );
        let t0 = Instant::now();
        while !c
            .ports()
            .iter()
            .all(|p| cli(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the cluster on {} never said cluster_state:ok\n{}",
                hosts.join(","),
                c.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        c.slots = c.read_slots();
        Some(c)
    }

    /// Start one node on a port `p` with `p + 10000` free; another pair
    /// when it exits before listening (a port taken meanwhile).
    fn start_node(&mut self) {
        for _ in 0..10 {
            let port = bus_free_port();
            let nd = self.dir.path().join(port.to_string());
            std::fs::create_dir_all(&nd).expect("a node directory");
            let mut g = Guard::spawn(
                "redis-server (cluster node)",
                Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--cluster-enabled", "yes"])
                    .arg("--cluster-config-file")
                    .arg(nd.join("nodes.conf"))
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&nd)
                    .arg("--logfile")
                    .arg(nd.join("redis.log"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            );
            if listens(&mut g, port, Duration::from_secs(10)) {
                self.nodes.push((port, g));
                return;
            }
        }
        panic!("no cluster node started on 10 port pairs\n{}", self.logs());
    }

    /// The nodes' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|(p, _)| *p).collect()
    }

    /// The store URL: `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// One node's own URL (`redis://127.0.0.1:p`): a client of it alone
    /// gets `MOVED` for the keys of other nodes' slots.
    pub fn node_url(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    /// The port of the master serving `key`'s slot (the hash tag's slot
    /// where the key has one).
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = redis::cluster_routing::get_slot(key.as_bytes());
        self.slots
            .iter()
            .find(|(_, ranges)| ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|(p, _)| *p)
            .unwrap_or_else(|| panic!("no master serves slot {slot} ({key:?})"))
    }

    /// The keys node `port` itself holds that match `pattern` (`KEYS` on
    /// that node, without following the cluster).
    pub fn keys_on(&self, port: u16, pattern: &str) -> Vec<String> {
        let out = cli(port, &["KEYS", pattern]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// The port of the node holding `key`, by asking each node (`None`:
    /// no node has it; a panic if two do).
    pub fn holder_of(&self, key: &str) -> Option<u16> {
        let on: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|p| cli(*p, &["EXISTS", key]) == "1")
            .collect();
        assert!(on.len() <= 1, "{key:?} is on several nodes: {on:?}");
        on.first().copied()
    }

    /// `redis-cli -p port args…` on node `port` (its output, trimmed).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, args)
    }

    /// Each master's slot ranges from `CLUSTER NODES` (asked of the first
    /// node).
    fn read_slots(&self) -> Vec<(u16, Vec<(u16, u16)>)> {
        let text = cli(self.nodes[0].0, &["CLUSTER", "NODES"]);
        let mut out = Vec::new();
        // <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch>
        // <link-state> <slot> <slot> …
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") {
                continue;
            }
            let port: u16 = f[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("CLUSTER NODES line {line:?}"));
            let ranges = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            out.push((port, ranges));
        }
        assert_eq!(out.len(), MASTERS, "CLUSTER NODES:\n{text}");
        out
    }

    /// The end of every node's log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for (p, _) in &self.nodes {
            s.push_str(&format!("---- redis node {p}\n"));
            s.push_str(&tail(
                &self.dir.path().join(p.to_string()).join("redis.log"),
            ));
        }
        s
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // Kill the servers (each Guard kills and reaps its process), then
        // the directory goes with `dir`.
        self.nodes.clear();
    }
}

/// A free loopback port `p` whose cluster bus port `p + 10000` is free too.
fn bus_free_port() -> u16 {
    for _ in 0..200 {
        let p = free_port();
        let Some(bus) = p.checked_add(10000) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return p;
        }
    }
    panic!("no free loopback port p with p + 10000 free too");
}

/// Wait until the node listens on `port`: false when it exited first
/// (its port or bus port taken) or did not within `within`.
fn listens(g: &mut Guard, port: u16, within: Duration) -> bool {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if g.exited() || t0.elapsed() > within {
            g.kill();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The last 20 lines of a log file.
fn tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(20);
    lines[from..].iter().map(|l| format!("{l}\n")).collect()
}
