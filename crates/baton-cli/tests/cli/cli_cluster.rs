//! `baton --store redis+cluster://…` on a private 3-master Redis Cluster
//! (the test kit's [`PrivateCluster`]), as a user runs it (issue 23):
//!
//! - `baton lock` takes locks of a dozen names of varied shapes (braces,
//!   spaces, slashes, colons, non-ASCII), each a hash tag of its own:
//!   while one is held a second `baton lock` of the name exits 75 (busy)
//!   without running its command, `baton locks` lists them held, their
//!   records are on more than one node, and each name is free again once
//!   released;
//! - `baton enqueue` puts 40 tasks on three queues whose hash tags are
//!   served by three different masters, two `baton work` processes run
//!   them all, and each runs exactly once (a line per run in a file), at
//!   its first attempt, from the queue it was enqueued to; `baton tasks
//!   stats --json` agrees, queue by queue; each queue's tasks are on one
//!   node and the queues' on more than one.
//!
//! - what a cluster cannot hold is refused naming it: `baton enqueue`
//!   with a unique scope across queues (`kind`, `global`) exits 2 naming
//!   `unique_scope` and writes nothing, and a `baton work` with a shared
//!   (named) rate limit logs its claims refused naming the limit and the
//!   cluster, and runs nothing.
//!
//! Where a record is, is asked of the nodes themselves (`KEYS` on each,
//! not following the cluster), so a key layout that put every queue or
//! every lock in one slot fails here even though every command works.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::PrivateCluster;
use common::{read, stderr, stdout, BATON};

/// Lock names of varied shapes (all of them valid: 1 to 255 bytes, no
/// control character): braces that would open a hash tag of their own,
/// spaces, slashes, colons, non-ASCII.
const LOCK_NAMES: [&str; 12] = [
    "a",
    "daemon-runner",
    "x{y}",
    "{}",
    "}{",
    "{baton}",
    "with space",
    "nightly/report.sh",
    "a:b:c",
    "ünïcödé 🙂",
    "UPPER_case",
    "0",
];

/// Tasks enqueued, spread over the queues.
const TASKS: usize = 40;

/// The `baton` binary on the cluster, in a scratch directory. Dropped, it
/// kills what it spawned; when the test fails it prints the end of every
/// spawned process's log (after the panic message).
struct Cli {
    url: String,
    dir: tempfile::TempDir,
    kids: Vec<Child>,
}

impl Cli {
    fn new(url: String) -> Cli {
        Cli {
            url,
            dir: tempfile::tempdir().unwrap(),
            kids: Vec::new(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `baton ARGS --store URL` (the URL in `BATON_STORE`).
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BATON);
        c.args(args)
            .env("BATON_STORE", &self.url)
            .env_remove("BATON_PREFIX")
            .env("BATON_LOG", "warn")
            .current_dir(self.dir.path());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("baton runs")
    }

    /// `baton ARGS` in the background, logging at info to `NAME.log`; the
    /// index of the child.
    fn spawn_logged(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        let mut c = self.cmd(args);
        c.env("BATON_LOG", "info").stdout(Stdio::null()).stderr(log);
        for (k, v) in env {
            c.env(k, v);
        }
        self.kids.push(c.spawn().expect("baton starts"));
        self.kids.len() - 1
    }

    /// Wait up to `secs` for child `i` to exit; its exit code.
    fn exit_of(&mut self, i: usize, secs: u64, what: &str) -> Option<i32> {
        let kid = &mut self.kids[i];
        if !common::wait_or_kill(kid, Duration::from_secs(secs)) {
            panic!("{what}: still running after {secs} s");
        }
        kid.wait().unwrap().code()
    }

    /// The last lines of every `*.log` here.
    fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
            .collect();
        files.sort_by_key(|f| f.file_name());
        for f in files {
            let text = read(&f.path());
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(25);
            out.push_str(&format!("---- {}\n", f.file_name().to_string_lossy()));
            for l in &lines[from..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// Assert `out` exited `code`, showing its stderr otherwise.
fn exits(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

#[test]
fn locks_and_queues_spread_over_a_private_three_node_cluster() {
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let t0 = Instant::now();
    let mut cli = Cli::new(cluster.url());
    exits(&cli.run(&["migrate"]), 0, "baton migrate on the cluster");
    locks_of_any_name(&cluster, &mut cli);
    every_task_once_on_queues_of_different_shards(&cluster, &mut cli);
    refusals_name_what_a_cluster_cannot_hold(&mut cli);
    eprintln!("cli cluster: done in {:?}", t0.elapsed());
}

/// Hold a lock of every name at once, see a second taker of each refused
/// with 75, find where each record is, then take each again once released.
fn locks_of_any_name(cluster: &PrivateCluster, cli: &mut Cli) {
    std::fs::write(cli.path("hold"), "").unwrap();
    let hold = cli.path("hold").display().to_string();
    let holders: Vec<usize> = LOCK_NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let script = format!(
                "touch held-{i}; while [ -e '{hold}' ]; do sleep 0.05; done; echo {i} >> done"
            );
            cli.spawn_logged(
                &format!("lock-{i}"),
                &["lock", name, "--", "sh", "-c", &script],
                &[],
            )
        })
        .collect();
    let t0 = Instant::now();
    while !(0..LOCK_NAMES.len()).all(|i| cli.path(&format!("held-{i}")).exists()) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not every `baton lock` started its command within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A second taker of each: busy (75), its command not run.
    for (i, name) in LOCK_NAMES.iter().enumerate() {
        let ran = format!("second-{i}");
        let out = cli.run(&["lock", name, "--", "touch", &ran]);
        exits(&out, 75, &format!("a second `baton lock {name:?}`"));
        assert!(
            stderr(&out).contains("held by"),
            "lock {name:?}: {}",
            stderr(&out)
        );
        assert!(
            !cli.path(&ran).exists(),
            "lock {name:?}: the second taker ran its command"
        );
    }

    // `baton locks` lists every name as held.
    let out = cli.run(&["locks", "--json"]);
    exits(&out, 0, "baton locks --json");
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let held: BTreeSet<&str> = rows
        .as_array()
        .expect("an array")
        .iter()
        .filter(|r| r["state"] == "held")
        .filter_map(|r| r["name"].as_str())
        .collect();
    for name in LOCK_NAMES {
        assert!(held.contains(name), "{name:?} not listed as held: {rows}");
    }

    // Where each record is, as the nodes say (whatever the key layout:
    // the one node with a key ending `lock:NAME` or `lock:NAME}`): the
    // dozen on more than one node, each on the master of the slot of its
    // tag in the Redis store's layout (`{baton:lock:NAME}`).
    let lock_keys: Vec<(u16, Vec<String>)> = cluster
        .ports()
        .into_iter()
        .map(|p| (p, cluster.keys_on(p, "*lock:*")))
        .collect();
    let mut on: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
    for name in LOCK_NAMES {
        let (bare, tagged) = (format!("lock:{name}"), format!("lock:{name}}}"));
        let nodes: Vec<u16> = lock_keys
            .iter()
            .filter(|(_, keys)| {
                keys.iter()
                    .any(|k| k.ends_with(&bare) || k.ends_with(&tagged))
            })
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(
            nodes.len(),
            1,
            "lock {name:?}: its record is on the nodes {nodes:?}; the lock keys by node: {lock_keys:?}"
        );
        on.entry(nodes[0]).or_default().push(name);
    }
    eprintln!("cli cluster: lock records by node: {on:?}");
    assert!(
        on.len() >= 2,
        "every lock record is on one node: {on:?} (a hash tag per lock spreads them over the shards)"
    );
    for (node, names) in &on {
        for name in names {
            let key = format!("{{baton:lock:{name}}}");
            assert_eq!(
                *node,
                cluster.master_of(&key),
                "lock {name:?}: its record is not on the master of the slot of {key:?}"
            );
        }
    }

    // Released: every holder's command ends, and each name is free again.
    std::fs::remove_file(cli.path("hold")).unwrap();
    for (i, h) in holders.into_iter().enumerate() {
        let code = cli.exit_of(h, 20, &format!("the holder of {:?}", LOCK_NAMES[i]));
        assert_eq!(code, Some(0), "the holder of {:?}", LOCK_NAMES[i]);
    }
    for (i, name) in LOCK_NAMES.iter().enumerate() {
        let ran = format!("again-{i}");
        exits(
            &cli.run(&["lock", name, "--", "touch", &ran]),
            0,
            &format!("`baton lock {name:?}` once released"),
        );
        assert!(cli.path(&ran).exists(), "lock {name:?}: not run once free");
    }
}

/// Three queues served by three different masters, 40 tasks over them,
/// two workers: each task runs once.
fn every_task_once_on_queues_of_different_shards(cluster: &PrivateCluster, cli: &mut Cli) {
    let queues = queues_one_per_master(cluster);
    eprintln!("cli cluster: queues {queues:?}");

    let ran = cli.path("ran").display().to_string();
    let mut work = vec!["work", "--poll", "200ms", "--lease", "5s"];
    for q in &queues {
        work.extend(["--queue", q.as_str()]);
    }
    let workers: Vec<usize> = ["w1", "w2"]
        .iter()
        .map(|w| cli.spawn_logged(&format!("work-{w}"), &work, &[("WORKER", w)]))
        .collect();

    let mut enqueued: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ids: BTreeMap<u64, &str> = BTreeMap::new();
    for n in 0..TASKS {
        let q = queues[n % queues.len()].as_str();
        let script = format!(
            "printf '%s|%s|%s|%s\\n' {n} \"$BATON_QUEUE\" \"$WORKER\" \"$BATON_ATTEMPT\" >> '{ran}'"
        );
        let out = cli.run(&["enqueue", "--queue", q, "--", "sh", "-c", &script]);
        exits(&out, 0, &format!("baton enqueue --queue {q} (task {n})"));
        let id: u64 = stdout(&out).trim().parse().expect("enqueue prints the id");
        ids.insert(id, q);
        *enqueued.entry(q).or_default() += 1;
    }

    let ran_file = cli.path("ran");
    let lines = || -> Vec<String> { read(&ran_file).lines().map(str::to_string).collect() };
    let t0 = Instant::now();
    loop {
        let done = stats(cli)
            .values()
            .map(|s| s["succeeded"].as_u64().unwrap_or(0))
            .sum::<u64>();
        if lines().len() >= TASKS && done >= TASKS as u64 {
            break;
        }
        for w in &workers {
            if let Ok(Some(status)) = cli.kids[*w].try_wait() {
                panic!(
                    "a baton work exited ({status}) with {} of {TASKS} tasks run",
                    lines().len()
                );
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "{} of {TASKS} tasks ran, {done} succeeded, within 40 s",
            lines().len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A while longer: a second run of any task would show by now.
    std::thread::sleep(Duration::from_millis(1500));

    // Every task ran exactly once, on its own queue, at its first attempt.
    let lines = lines();
    let mut seen: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    let mut by_worker: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &lines {
        let f: Vec<&str> = l.split('|').collect();
        assert_eq!(f.len(), 4, "a line {l:?}");
        let n: usize = f[0].parse().unwrap_or_else(|_| panic!("a line {l:?}"));
        seen.entry(n).or_default().push(l);
        *by_worker.entry(f[2]).or_default() += 1;
        assert_eq!(
            f[1],
            queues[n % queues.len()],
            "task {n} ran from another queue: {l:?}"
        );
        assert_eq!(f[3], "1", "task {n} ran at a later attempt: {l:?}");
    }
    let twice: Vec<_> = seen.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(twice.is_empty(), "tasks run more than once: {twice:?}");
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..TASKS).collect::<Vec<_>>(),
        "every task ran once"
    );
    eprintln!("cli cluster: runs by worker: {by_worker:?}");

    // The stats agree, queue by queue.
    let s = stats(cli);
    for (q, n) in &enqueued {
        let row = &s[*q];
        assert_eq!(row["succeeded"], *n as u64, "stats of {q}: {row}");
        for state in ["pending", "running", "failed"] {
            assert_eq!(row[state], 0, "stats of {q}: {row}");
        }
    }

    // Where each task is, as the nodes say (whatever the key layout: the
    // node with a key ending `task:ID`): each queue's on one node, the
    // queues' on more than one, and each queue's on the master of the
    // slot of its tag in the Redis store's layout (`{baton:q:QUEUE}`).
    let mut task_node: BTreeMap<u64, u16> = BTreeMap::new();
    for p in cluster.ports() {
        for k in cluster.keys_on(p, "*task:*") {
            let Some(id) = k.rsplit("task:").next().and_then(|i| i.parse().ok()) else {
                continue;
            };
            if let Some(other) = task_node.insert(id, p) {
                panic!("task {id} is on the nodes {other} and {p}");
            }
        }
    }
    let mut queue_nodes: BTreeMap<&str, BTreeSet<u16>> = BTreeMap::new();
    for (id, q) in &ids {
        let node = task_node
            .get(id)
            .unwrap_or_else(|| panic!("no node holds task {id}: {task_node:?}"));
        queue_nodes.entry(q).or_default().insert(*node);
    }
    eprintln!("cli cluster: the queues' tasks by node: {queue_nodes:?}");
    for (q, nodes) in &queue_nodes {
        assert_eq!(
            nodes.len(),
            1,
            "queue {q:?}: its tasks are on several nodes: {nodes:?}"
        );
    }
    let shards: BTreeSet<u16> = queue_nodes.values().flatten().copied().collect();
    assert!(
        shards.len() >= 2,
        "the tasks of every queue are on one node: {queue_nodes:?} (a hash tag per queue spreads them over the shards)"
    );
    for (q, nodes) in &queue_nodes {
        let tag = format!("{{baton:q:{q}}}");
        assert_eq!(
            nodes.first(),
            Some(&cluster.master_of(&tag)),
            "queue {q:?}: its tasks are not on the master of the slot of {tag:?}"
        );
    }

    for w in workers {
        common::signal(&cli.kids[w], libc::SIGTERM);
        let code = cli.exit_of(w, 20, "baton work after SIGTERM");
        assert_eq!(
            code,
            Some(128 + libc::SIGTERM),
            "baton work exits cleanly on SIGTERM, with 128 + SIGTERM"
        );
    }
}

/// `tasks stats --json` keyed by queue.
fn stats(cli: &Cli) -> BTreeMap<String, serde_json::Value> {
    let out = cli.run(&["tasks", "stats", "--json"]);
    exits(&out, 0, "baton tasks stats --json");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    v.as_array()
        .expect("an array")
        .iter()
        .map(|q| {
            (
                q["queue"].as_str().unwrap_or_default().to_string(),
                q.clone(),
            )
        })
        .collect()
}

/// One queue name per master: the first of a list of names of varied
/// shapes whose tag (`{baton:q:NAME}`, the key layout of the Redis
/// store) the master's slots hold.
fn queues_one_per_master(cluster: &PrivateCluster) -> Vec<String> {
    let named = [
        "emails",
        "thumbnails",
        "billing",
        "in{box}",
        "reports.daily",
        "webhooks/out",
        "ünï",
    ];
    let candidates = named
        .iter()
        .map(|s| s.to_string())
        .chain((0..200).map(|i| format!("queue-{i}")));
    let mut by_master: BTreeMap<u16, String> = BTreeMap::new();
    for q in candidates {
        by_master
            .entry(cluster.master_of(&format!("{{baton:q:{q}}}")))
            .or_insert(q);
        if by_master.len() == cluster.ports().len() {
            break;
        }
    }
    assert_eq!(
        by_master.len(),
        cluster.ports().len(),
        "no queue name for some master: {by_master:?}"
    );
    by_master.into_values().collect()
}

/// The refusals of a Redis Cluster, as a user meets them: a unique scope
/// across queues at `baton enqueue` (exit 2, the field named, nothing
/// written), a shared rate limit at `baton work`'s claims (each refused,
/// logged naming the limit; the queue's task stays pending).
fn refusals_name_what_a_cluster_cannot_hold(cli: &mut Cli) {
    for scope in ["kind", "global"] {
        let out = cli.run(&[
            "enqueue",
            "--queue",
            "wide",
            "--key",
            "k",
            "--unique-scope",
            scope,
            "--",
            "true",
        ]);
        exits(&out, 2, &format!("--unique-scope {scope} on a cluster"));
        let err = stderr(&out);
        for word in ["unique_scope", scope, "Redis", "per queue", "kind-in-queue"] {
            assert!(
                err.contains(word),
                "--unique-scope {scope}: {word:?} in {err}"
            );
        }
    }
    let out = cli.run(&["tasks", "list", "--queue", "wide", "--json"]);
    exits(&out, 0, "baton tasks list --queue wide");
    assert_eq!(
        stdout(&out).trim(),
        "[]",
        "a refused enqueue writes nothing"
    );

    let out = cli.run(&["enqueue", "--queue", "rated", "--", "touch", "rated-ran"]);
    exits(&out, 0, "baton enqueue --queue rated");
    let id = stdout(&out).trim().to_string();
    let w = cli.spawn_logged(
        "rated",
        &[
            "work",
            "--queue",
            "rated",
            "--rate",
            "partner-api=10/1s",
            "--poll",
            "100ms",
        ],
        &[],
    );
    let log = cli.path("rated.log");
    let t0 = Instant::now();
    while !read(&log).contains("claim failed") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no refused claim logged within 30 s:\n{}",
            read(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = read(&log);
    for word in [
        "partner-api",
        "shared by queues",
        "Redis Cluster",
        "its own rate limit",
    ] {
        assert!(text.contains(word), "{word:?} in the worker's log:\n{text}");
    }
    let out = cli.run(&["tasks", "show", &id, "--json"]);
    exits(&out, 0, "baton tasks show");
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["state"], "pending", "a refused claim starts nothing: {v}");
    assert!(!cli.path("rated-ran").exists());
    let _ = cli.kids[w].kill();
}
