//! `baton chaos`: a Jepsen-style verifier users run against their own
//! store. A workload of `baton` processes (workers, schedulers, lock
//! loops) runs command tasks, a durable job, a lock-mode job and a
//! contended lock whose commands record their effects in an append-only
//! history ([`history`]) and write a fenced register; a seeded nemesis
//! kills, freezes and cuts them off from the store; the checker
//! ([`check`]) then reads the history and the store and counts violations
//! of L1, L2, T1–T4 and S1.

pub mod check;
pub mod history;
pub mod proxy;
mod sentinel;
mod server;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton::queue::{Queue, TaskBuilder};
use baton::store::TaskFilter;
use tokio_util::sync::CancellationToken;

use crate::duration_arg;
use history::{now_us, History, Record, KILLED_ENV, PROC_ENV};

/// libfaketime's preload library, for client clock offsets.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The queue of the workload's tasks and the durable job.
const QUEUE: &str = "chaos";
/// The contended lock's name.
const LOCK: &str = "chaos-lock";
/// Every fault kind, in the order `--faults` documents.
const FAULTS: [&str; 9] = [
    "kill-9", "pause", "cut", "dark", "latency", "restart", "skew", "freeze", "failover",
];

/// Arguments of `baton chaos`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ChaosArgs {
    #[command(subcommand)]
    internal: Option<Internal>,
    /// The store to test (its own `--prefix` keeps the run apart from your data).
    #[arg(long, conflicts_with = "private")]
    store: Option<String>,
    /// Table or key prefix [default: chaos_SEED_PID].
    #[arg(long)]
    prefix: Option<String>,
    /// Start a private store for the run: sqlite, postgres, redis, mysql
    /// (a `mariadbd`; the nemesis may then crash and restart it) or
    /// redis-sentinel (a master, two replicas and three sentinels; the
    /// nemesis then fails the master over).
    #[arg(long, value_parser = server::kind_arg)]
    private: Option<server::Kind>,
    /// How long faults are injected (then the run drains and is checked).
    #[arg(long, default_value = "20s", value_parser = duration_arg)]
    duration: Duration,
    /// `baton work` processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// `baton serve` processes (schedulers, with workers of their own).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=64))]
    schedulers: u32,
    /// The nemesis' and workload's random seed (same seed, same schedule).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Faults to inject, comma-separated: kill-9, pause (an instance and
    /// its commands), cut, dark, latency, restart, skew, freeze (the baton
    /// process alone, its commands run on), failover (`--private
    /// redis-sentinel`: a forced switchover or a master killed and
    /// replaced) [default: all that apply to the store].
    #[arg(long, value_delimiter = ',')]
    faults: Option<Vec<String>>,
    /// Turn off fencing and compare-and-set in the workload (the register
    /// takes any token, lock loops skip the lock, tasks and jobs run twice,
    /// keys are not unique): the checker must report violations.
    #[arg(long = "unsafe")]
    unsafe_: bool,
    /// Run directory (history, registers, logs) [default: a new temporary one].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// How long the drain after the faults may go without a task ending
    /// before it gives up (what is left then counts as lost, T1). It goes
    /// on as long as tasks keep ending: on a starved machine a backlog
    /// takes long to drain but is not lost.
    #[arg(long, default_value = "90s", value_parser = duration_arg)]
    drain: Duration,
}

#[derive(clap::Subcommand, Debug)]
enum Internal {
    /// The workload's effect recorder (run by the generated commands).
    #[command(name = "__effect", hide = true)]
    Effect(history::EffectArgs),
}

/// A small seeded generator (splitmix64): the same seed gives the same
/// fault schedule and workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

/// An instance: its label, `baton` arguments and extra environment.
type Instance = (String, Vec<String>, Vec<(&'static str, String)>);

/// Everything the run's tasks share.
struct Run {
    exe: PathBuf,
    dir: PathBuf,
    url: String,
    prefix: String,
    unsafe_: bool,
    /// Live processes the nemesis may hit: label → pid.
    live: Mutex<HashMap<String, u32>>,
    history: Mutex<History>,
}

impl Run {
    fn record(&self, r: Record) {
        let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = h.append(&r) {
            tracing::warn!("chaos: {e:#}");
        }
    }

    /// The shell wrapper that records an effect (twice at once, unfenced,
    /// with `--unsafe`).
    fn wrapper(&self, kind: &str, name: &str, hold_ms: u64) -> String {
        let one = format!(
            "env -u LD_PRELOAD -u FAKETIME '{}' chaos __effect --dir '{}' --kind {kind} --name '{name}' --hold-ms {hold_ms}",
            self.exe.display(),
            self.dir.display()
        );
        if self.unsafe_ {
            format!("{one} --unfenced & {one} --unfenced; wait")
        } else {
            format!("exec {one}")
        }
    }

    /// Spawn `baton ARGS` (or `argv` itself when `raw`) as instance `label`.
    fn spawn(
        &self,
        label: &str,
        argv: &[String],
        raw: bool,
        env: &[(&str, String)],
    ) -> anyhow::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("logs").join(format!("{label}.log")))?;
        let mut c = if raw {
            let mut c = tokio::process::Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        } else {
            let mut c = tokio::process::Command::new(&self.exe);
            c.args(argv);
            c
        };
        c.env("BATON_STORE", &self.url)
            .env("BATON_PREFIX", &self.prefix)
            .env("BATON_LOG", "info")
            .env(PROC_ENV, label)
            .env(KILLED_ENV, self.dir.join(history::HISTORY))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true);
        let child = c.spawn().with_context(|| format!("starting {label}"))?;
        if let Some(pid) = child.id() {
            self.lock_live().insert(label.to_string(), pid);
        }
        Ok(child)
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `baton chaos`.
pub async fn chaos(a: ChaosArgs) -> anyhow::Result<u8> {
    if let Some(Internal::Effect(e)) = a.internal {
        return history::effect(e).await;
    }
    let enabled = faults_of(&a)?;
    if a.store.is_none() && a.private.is_none() {
        return Err(baton::Error::from(baton::InvalidInput::new(
            "--store",
            "is missing; give --store URL (with a --prefix of its own) or --private sqlite|postgres|redis|mysql",
        ))
        .into());
    }
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.canonicalize()?
        }
        None => {
            let d =
                std::env::temp_dir().join(format!("baton-chaos-{}-{}", a.seed, std::process::id()));
            std::fs::create_dir_all(&d)?;
            d
        }
    };
    if dir.to_string_lossy().contains('\'') {
        bail!(
            "--dir {}: a path without single quotes, please",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    let exe = std::env::current_exe().context("finding the baton binary")?;
    // The store: private (which we may restart) or the user's.
    let mut private = match a.private {
        Some(k) => {
            let mut p = server::Private::new(k, &dir)?;
            p.start()?;
            Some(p)
        }
        None => None,
    };
    let url = match (&private, &a.store) {
        (Some(p), _) => p.url(),
        (None, Some(u)) => u.clone(),
        (None, None) => bail!("no store"),
    };
    let prefix = a
        .prefix
        .clone()
        .unwrap_or_else(|| format!("chaos_{}_{}", a.seed, std::process::id()));
    let sqlite = url.starts_with("sqlite:");
    let opts = baton::StoreOptions {
        prefix: Some(prefix.clone()),
        ..Default::default()
    };
    let store = baton::Store::connect_with(&url, opts.clone())
        .await
        .with_context(|| format!("store {}", baton::store::redact(&url)))?;
    // Network stores: every instance goes through the fault proxy (not a
    // Sentinel deployment: the sentinels name the master's own address).
    let proxy = if sqlite || url.starts_with("redis+sentinel:") {
        None
    } else {
        Some(proxy::Proxy::try_start(&proxy::host_port(&url)).context("starting the fault proxy")?)
    };
    let via = proxy.as_ref().map_or(url.clone(), |p| p.url(&url));
    let mut enabled = enabled;
    enabled.retain(|f| match f.as_str() {
        "cut" | "dark" | "latency" => proxy.is_some(),
        "restart" => private.as_ref().is_some_and(|p| p.restartable()),
        "failover" => private.as_ref().is_some_and(|p| p.fails_over()),
        _ => true,
    });
    let skew = enabled.iter().any(|f| f == "skew");
    let skew_lib = skew && !sqlite && Path::new(LIBFAKETIME).exists();
    if skew && !sqlite && !skew_lib {
        crate::note!(
            "baton chaos: SKIPPED clock skew: {LIBFAKETIME} not found (apt-get install faketime)"
        );
    }
    enabled.retain(|f| f != "skew");
    let run = Arc::new(Run {
        exe,
        dir: dir.clone(),
        url: via,
        prefix: prefix.clone(),
        unsafe_: a.unsafe_,
        live: Mutex::new(HashMap::new()),
        history: Mutex::new(History::open(&dir)?),
    });
    let kind = if sqlite {
        "sqlite"
    } else if url.starts_with("redis") {
        "redis"
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        "mysql"
    } else {
        "postgres"
    };
    crate::outln!(
        "baton chaos: {kind} store{}, prefix {prefix}, seed {}, {} of faults ({}), {} workers, {} schedulers{}; history in {}",
        if private.is_some() { " (private)" } else { "" },
        a.seed,
        baton::format_duration(a.duration),
        if enabled.is_empty() { "none".to_string() } else { enabled.join(", ") },
        a.workers,
        a.schedulers,
        if a.unsafe_ { ", UNSAFE workload" } else { "" },
        dir.display()
    );
    let config = dir.join("chaos.toml");
    std::fs::write(&config, config_text(&run)).context("writing the run's config")?;
    let cfg = config.display().to_string();

    // The instances: workers and schedulers, restarted when killed.
    let mut instances: Vec<Instance> = Vec::new();
    for i in 1..=a.workers {
        let args = [
            "work",
            "--config",
            &cfg,
            "--queue",
            QUEUE,
            "--concurrency",
            "2",
            "--lease",
            "3s",
            "--poll",
            "300ms",
            // An unconfirmed attempt gets SIGTERM min(grace + 1 s,
            // lease/3) = 1 s before its lease's local end and SIGKILL at
            // that end at the latest: with a 3 s lease a longer grace would
            // not give a starved command more time (issue #15).
            "--grace",
            "1s",
            "--shutdown-grace",
            "5s",
        ];
        instances.push((
            format!("w{i}"),
            args.iter().map(|s| s.to_string()).collect(),
            vec![],
        ));
    }
    for i in 1..=a.schedulers {
        let args = [
            "serve",
            "--config",
            &cfg,
            "--grace",
            "1s",
            "--shutdown-grace",
            "5s",
        ];
        instances.push((
            format!("s{i}"),
            args.iter().map(|s| s.to_string()).collect(),
            vec![],
        ));
    }
    if skew_lib {
        // Client clocks off by ±45 s: the store's clock decides (C1).
        for (n, offset) in [(0usize, "+45s"), (instances.len() - 1, "-45s")] {
            let inst = &mut instances[n];
            inst.2 = vec![
                ("LD_PRELOAD", LIBFAKETIME.to_string()),
                ("FAKETIME", offset.to_string()),
            ];
            run.record(Record {
                op: "fault".into(),
                kind: "skew".into(),
                proc: inst.0.clone(),
                t: now_us(),
                note: offset.into(),
                ..Default::default()
            });
        }
    }
    let stop = CancellationToken::new();
    let drained = CancellationToken::new();
    let quiesce = CancellationToken::new();
    let (schedulers_gone, mut schedulers_gone_rx) = tokio::sync::oneshot::channel();
    let supervisor = {
        let (run, drained, quiesce) = (run.clone(), drained.clone(), quiesce.clone());
        tokio::spawn(
            async move { supervise(run, instances, quiesce, schedulers_gone, drained).await },
        )
    };
    let mut rng = Rng(a.seed);
    let mut loops = tokio::task::JoinSet::new();
    for i in 1..=3u64 {
        let (run, stop) = (run.clone(), stop.clone());
        let seed = rng.next() ^ i;
        loops.spawn(async move { lock_loop(run, i, seed, stop).await });
    }
    {
        let (run, stop, store) = (run.clone(), stop.clone(), store.clone());
        let seed = rng.next();
        loops.spawn(async move { produce(run, store, seed, stop).await });
    }
    let private_shared = Arc::new(Mutex::new(private.take()));
    // Kept here until the end: the instances reach the store through it.
    let proxy = proxy.map(Arc::new);
    let nemesis = {
        let (run, stop, ps) = (run.clone(), stop.clone(), private_shared.clone());
        let seed = rng.next();
        let proxy = proxy.clone();
        tokio::spawn(async move { nemesis(run, proxy, ps, enabled, seed, stop).await })
    };
    tokio::time::sleep(a.duration).await;
    stop.cancel();
    let _ = nemesis.await;
    while loops.join_next().await.is_some() {}

    // Quiesce: the schedulers stop (they would go on enqueuing slots
    // while the drain waits, and a slot enqueued after the last look
    // would be left pending); their running tasks are handed back.
    quiesce.cancel();
    let t0 = Instant::now();
    if tokio::time::timeout(a.drain, &mut schedulers_gone_rx)
        .await
        .is_err()
    {
        crate::note!("baton chaos: the schedulers did not stop within the drain");
    }
    // Drain: every task the run made ends (workers keep being restarted),
    // for as long as tasks keep ending; `--drain` without one ending gives up.
    let q = Queue::new(store.clone());
    let mut progress = (t0, usize::MAX);
    let mut tasks = loop {
        match all_tasks(&q).await {
            Ok(t) => {
                let left = t.iter().filter(|t| !t.state.is_terminal()).count();
                if left == 0 {
                    break t;
                }
                if left < progress.1 {
                    progress = (Instant::now(), left);
                } else if progress.0.elapsed() > a.drain {
                    crate::note!(
                        "baton chaos: the drain gave up: {left} task(s) not ended and none ended for {} ({} in all)",
                        baton::format_duration(a.drain),
                        baton::format_duration(t0.elapsed())
                    );
                    break t;
                }
            }
            Err(e) if progress.0.elapsed() > a.drain => {
                return Err(anyhow::Error::from(e).context("listing the store's tasks"))
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    if t0.elapsed() > a.drain {
        crate::note!(
            "baton chaos: the drain took {}",
            baton::format_duration(t0.elapsed())
        );
    }
    drained.cancel();
    let _ = supervisor.await;
    if let Ok(t) = all_tasks(&q).await {
        tasks = t;
    }
    let hist = history::read(&dir)?;
    let report = check::check(&hist, &tasks);
    crate::outln!("{}", report.table().trim_end());
    if let Ok(mut p) = private_shared.lock() {
        if let Some(p) = p.as_mut() {
            p.stop();
        }
    }
    if report.total() > 0 {
        crate::outln!(
            "VIOLATIONS FOUND (seed {}; history in {})",
            a.seed,
            dir.display()
        );
        Ok(1)
    } else {
        crate::outln!("no violations (seed {})", a.seed);
        Ok(0)
    }
}

/// The enabled faults, validated.
fn faults_of(a: &ChaosArgs) -> anyhow::Result<Vec<String>> {
    let list: Vec<String> = match &a.faults {
        None => FAULTS.iter().map(|s| s.to_string()).collect(),
        Some(l) => l
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect(),
    };
    for f in &list {
        if !FAULTS.contains(&f.as_str()) {
            return Err(baton::Error::from(baton::InvalidInput::new(
                "--faults",
                format!(
                    "{f:?} is not a fault; use a comma-separated list of {} (or none)",
                    FAULTS.join(", ")
                ),
            ))
            .into());
        }
    }
    Ok(list)
}

/// The generated config: the workload's queue, a 1-second durable job and
/// a lock-mode job, both recording effects.
fn config_text(run: &Run) -> String {
    let q = |s: String| serde_json::Value::String(s).to_string();
    format!(
        r#"[[queue]]
name = "{QUEUE}"
concurrency = 2
lease = "3s"

[[job]]
name = "chaos-durable"
every = "1s"
mode = "durable"
queue = "{QUEUE}"
max_attempts = 5
command = ["sh", "-c", {durable}]

[[job]]
name = "chaos-lockjob"
every = "2s"
mode = "lock"
at_most = "3s"
command = ["sh", "-c", {lockjob}]
"#,
        durable = q(run.wrapper("job", "chaos-durable", 300)),
        lockjob = q(run.wrapper("lockjob", "chaos-lockjob", 300)),
    )
}

/// Keep every instance running (restart one the nemesis killed) until
/// `drained`; then SIGTERM them all and wait (SIGKILL after 20 s). Once
/// `quiesce` is cancelled the schedulers (`s…`) are stopped the same way
/// and not restarted, and `schedulers_gone` is sent when they have exited.
async fn supervise(
    run: Arc<Run>,
    instances: Vec<Instance>,
    quiesce: CancellationToken,
    schedulers_gone: tokio::sync::oneshot::Sender<()>,
    drained: CancellationToken,
) {
    let mut kids: Vec<(String, u32, Option<tokio::process::Child>)> = instances
        .iter()
        .map(|(l, _, _)| (l.clone(), 0, None))
        .collect();
    let mut schedulers_gone = Some(schedulers_gone);
    loop {
        if quiesce.is_cancelled() && schedulers_gone.is_some() {
            let mut schedulers: Vec<_> = kids
                .iter_mut()
                .filter(|(label, _, _)| label.starts_with('s'))
                .collect();
            stop_all(&run, &mut schedulers).await;
            for (_, _, child) in schedulers {
                *child = None;
            }
            if let Some(tx) = schedulers_gone.take() {
                let _ = tx.send(());
            }
        }
        for (n, (label, gen, child)) in kids.iter_mut().enumerate() {
            if quiesce.is_cancelled() && label.starts_with('s') {
                continue;
            }
            let dead = match child {
                None => true,
                Some(c) => !matches!(c.try_wait(), Ok(None)),
            };
            if dead {
                if child.is_some() {
                    run.lock_live().remove(&format!("{label}.{gen}"));
                    *gen += 1;
                }
                let (_, args, env) = &instances[n];
                match run.spawn(&format!("{label}.{gen}"), args, false, env) {
                    Ok(c) => *child = Some(c),
                    Err(e) => tracing::warn!("chaos: {e:#}"),
                }
            }
        }
        tokio::select! {
            _ = drained.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    let mut all: Vec<_> = kids.iter_mut().collect();
    stop_all(&run, &mut all).await;
}

/// SIGTERM these instances (thawed first) and wait; SIGKILL after 20 s.
async fn stop_all(run: &Run, kids: &mut [&mut (String, u32, Option<tokio::process::Child>)]) {
    for (label, gen, child) in kids.iter_mut().map(|k| &mut **k) {
        run.lock_live().remove(&format!("{label}.{gen}"));
        if let Some(pid) = child.as_ref().and_then(|c| c.id()) {
            signal_tree(pid, libc::SIGCONT);
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }
    for (_, _, child) in kids.iter_mut().map(|k| &mut **k) {
        if let Some(c) = child {
            if tokio::time::timeout(Duration::from_secs(20), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }
}

/// Contend for the lock: `baton lock chaos-lock -- sh -c '…'` in a loop
/// (with `--unsafe`, the command without the lock, and a made-up token).
async fn lock_loop(run: Arc<Run>, i: u64, seed: u64, stop: CancellationToken) {
    let mut rng = Rng(seed);
    let mut n = 0;
    while !stop.is_cancelled() {
        n += 1;
        let label = format!("l{i}.{n}");
        // Mostly short holds; some longer than a keep-alive period, so a
        // holder frozen alone (`freeze`) may have its command outlive the
        // lease unless its supervisor kills it.
        let hold = if rng.range(0, 4) == 0 {
            rng.range(3000, 5000)
        } else {
            rng.range(200, 600)
        };
        let wrapper = run.wrapper("lock", LOCK, hold);
        let child = if run.unsafe_ {
            let argv = ["sh".to_string(), "-c".to_string(), wrapper];
            let token = rng.range(1, 1000).to_string();
            run.spawn(&label, &argv, true, &[("BATON_FENCING_TOKEN", token)])
        } else {
            let argv: Vec<String> = [
                "lock",
                LOCK,
                "--at-most",
                "3s",
                "--grace",
                "1s",
                "--wait",
                "5s",
                "--",
                "sh",
                "-c",
                &wrapper,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            run.spawn(&label, &argv, false, &[])
        };
        match child {
            Ok(mut c) => {
                tokio::select! {
                    _ = c.wait() => {}
                    // A stuck holder (frozen, store dark) is waited for
                    // only so long after the run; then it is killed.
                    _ = async { stop.cancelled().await; tokio::time::sleep(Duration::from_secs(15)).await } => {
                        if let Some(pid) = c.id() { signal_tree(pid, libc::SIGCONT); }
                        let _ = c.kill().await;
                    }
                }
            }
            Err(e) => tracing::warn!("chaos: {e:#}"),
        }
        run.lock_live().remove(&label);
        tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
    }
}

/// Enqueue unique-keyed command tasks, re-sending some keys (T4).
async fn produce(run: Arc<Run>, store: baton::Store, seed: u64, stop: CancellationToken) {
    let mut rng = Rng(seed);
    let q = Queue::new(store);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        let key = if n > 0 && rng.range(0, 3) == 0 {
            format!("chaos-k{}", rng.range(1, n + 1))
        } else {
            n += 1;
            format!("chaos-k{n}")
        };
        // Mostly short tasks; some longer than a heartbeat interval.
        let hold = if rng.range(0, 4) == 0 {
            rng.range(1500, 4000)
        } else {
            rng.range(100, 800)
        };
        let argv = serde_json::json!({ "argv": ["sh", "-c", run.wrapper("task", &key, hold)] });
        // Kind "command": a task `baton work` runs as a command.
        let mut t = TaskBuilder::new("command", argv)
            .queue(QUEUE)
            .max_attempts(5);
        if !run.unsafe_ {
            t = t.unique_key(&key).unique_forever(true);
        }
        let t0 = now_us();
        let res = tokio::time::timeout(Duration::from_secs(10), q.enqueue(t)).await;
        let task = match res {
            Ok(Ok(e)) => Some(e.id),
            Ok(Err(e)) => {
                tracing::warn!("chaos: enqueue {key}: {e}");
                None
            }
            Err(_) => None,
        };
        run.record(Record {
            op: "enqueue".into(),
            proc: "producer".into(),
            name: key,
            task,
            t: t0,
            until: Some(now_us()),
            ..Default::default()
        });
        tokio::time::sleep(Duration::from_millis(rng.range(100, 300))).await;
    }
}

/// Inject the enabled faults on a seeded schedule until `stop`; leave
/// everything healed.
async fn nemesis(
    run: Arc<Run>,
    proxy: Option<Arc<proxy::Proxy>>,
    private: Arc<Mutex<Option<server::Private>>>,
    enabled: Vec<String>,
    seed: u64,
    stop: CancellationToken,
) {
    let mut rng = Rng(seed);
    if enabled.is_empty() {
        return;
    }
    // Sleep `ms`, or less if the run ends.
    let nap = |ms: u64| {
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            }
        }
    };
    nap(1500).await;
    // Faults come in rounds: each round is every enabled kind once, in a
    // seeded random order, so a short run still meets each kind.
    let mut round: Vec<String> = Vec::new();
    while !stop.is_cancelled() {
        if round.is_empty() {
            round = enabled.clone();
            for i in (1..round.len()).rev() {
                let j = rng.range(0, i as u64 + 1) as usize;
                round.swap(i, j);
            }
        }
        let Some(kind) = round.pop() else { return };
        let t = now_us();
        let mut target = String::new();
        match kind.as_str() {
            "kill-9" | "pause" | "freeze" => {
                let mut live: Vec<(String, u32)> = run
                    .lock_live()
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                live.sort();
                if kind == "freeze" {
                    // Freeze one that is running a command (it has a
                    // supervisor child): the case the fault is for.
                    let busy: Vec<(String, u32)> = live
                        .iter()
                        .filter(|(_, pid)| signal_tree(*pid, 0).len() > 1)
                        .cloned()
                        .collect();
                    if !busy.is_empty() {
                        live = busy;
                    }
                }
                if live.is_empty() {
                    nap(500).await;
                    continue;
                }
                let (label, pid) = live[rng.range(0, live.len() as u64) as usize].clone();
                target = label;
                if kind == "kill-9" {
                    // SAFETY: kill(2) on a process this run started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                } else if kind == "freeze" {
                    // Freeze the baton process alone, past its lease: its
                    // commands run on, and only their supervisors' own
                    // deadlines can stop them before the lease lapses (a
                    // command outliving it would overlap the next holder,
                    // which the checker does not excuse).
                    // SAFETY: kill(2) on a process this run started.
                    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                    tokio::time::sleep(Duration::from_millis(rng.range(3500, 5000))).await;
                    // SAFETY: as above.
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                } else {
                    // Freeze the instance and its commands past the lease.
                    let pids = signal_tree(pid, libc::SIGSTOP);
                    tokio::time::sleep(Duration::from_millis(rng.range(3500, 5000))).await;
                    for p in pids {
                        // SAFETY: kill(2) on processes we froze.
                        unsafe { libc::kill(p, libc::SIGCONT) };
                    }
                }
            }
            "cut" | "dark" | "latency" => {
                let Some(p) = &proxy else { continue };
                match kind.as_str() {
                    "cut" => p.set(proxy::Mode::Cut),
                    "dark" => p.set(proxy::Mode::Dark),
                    _ => p.latency(Duration::from_millis(rng.range(20, 200))),
                }
                let ms = if kind == "dark" {
                    rng.range(3000, 5000)
                } else {
                    rng.range(1000, 3000)
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                p.set(proxy::Mode::Pass);
                p.latency(Duration::ZERO);
            }
            "restart" => {
                let ps = private.clone();
                let down = rng.range(500, 2000);
                let res = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let mut g = ps.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(p) = g.as_mut() {
                        p.stop();
                        std::thread::sleep(Duration::from_millis(down));
                        p.start()?;
                    }
                    Ok(())
                })
                .await;
                if let Ok(Err(e)) | Err(e) = res.map_err(anyhow::Error::from) {
                    tracing::warn!("chaos: restart: {e:#}");
                }
            }
            "failover" => {
                let ps = private.clone();
                let crash = rng.range(0, 2) == 1;
                let down = Duration::from_millis(rng.range(500, 2000));
                let res = tokio::task::spawn_blocking(move || -> anyhow::Result<u16> {
                    let mut g = ps.lock().unwrap_or_else(|p| p.into_inner());
                    match g.as_mut() {
                        Some(p) => p.failover(crash, down),
                        None => Ok(0),
                    }
                })
                .await;
                match res.map_err(anyhow::Error::from) {
                    Ok(Ok(old)) => {
                        target = format!(
                            "{} master :{old}",
                            if crash { "crashed" } else { "switched over" }
                        );
                    }
                    Ok(Err(e)) | Err(e) => tracing::warn!("chaos: failover: {e:#}"),
                }
            }
            _ => {}
        }
        run.record(Record {
            op: "fault".into(),
            kind,
            proc: target,
            t,
            until: Some(now_us()),
            ..Default::default()
        });
        nap(rng.range(800, 2500)).await;
    }
}

/// Send `sig` to `pid` and every descendant (parents first; 0 sends
/// nothing, to list them); returns them.
fn signal_tree(pid: u32, sig: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces).
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(pp) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            parent.push((p, pp));
        }
    }
    let mut tree = vec![pid as i32];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    for &p in &tree {
        // SAFETY: kill(2) on a process of this run's tree.
        unsafe { libc::kill(p, sig) };
    }
    tree
}

/// Every task in the run's store (all pages).
async fn all_tasks(q: &Queue) -> Result<Vec<baton::store::TaskInfo>, baton::Error> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = q
            .tasks(&TaskFilter {
                before_id: before,
                limit: 500,
                ..Default::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        out.extend(page);
    }
    Ok(out)
}
