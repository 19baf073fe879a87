//! `baton chaos`: a Jepsen-style verifier users run against their own
//! store. A workload of `baton` processes (workers, schedulers, lock
//! loops) runs command tasks, durable jobs (two whose runs outlast their
//! interval, under `buffer_one` and `cancel_other`), a lock-mode job and a
//! contended lock whose commands record their effects in an append-only
//! history ([`history`]) and write a fenced register; a seeded nemesis
//! kills, freezes and cuts them off from the store; the checker
//! ([`check`]) then reads the history and the store and counts violations
//! of L1, L2, T1–T4, S1 and S2, and with `--per-key-max-running` / `--rate`
//! (the workers then run with that cap and limit) of T5 and T6.

pub mod check;
pub mod history;
mod key_rate;
mod nemesis;
mod run;
mod sentinel;
mod server;
mod workload;

/// The fault proxy (the `baton-proxy` crate, shared with the test kit).
pub use baton_proxy as proxy;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use baton::queue::{Queue, TaskBuilder};
use baton::store::TaskFilter;
use tokio_util::sync::CancellationToken;

use crate::values::duration_arg;
use history::{now_us, History, Record, KILLED_ENV, PROC_ENV};
use nemesis::*;
use run::*;
use workload::*;

/// libfaketime's preload library, for client clock offsets.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The queue of the workload's tasks and the durable job.
const QUEUE: &str = "chaos";
/// The workload's durable jobs whose overlap policy lets no two runs
/// overlap (every policy but `allow`): S2 holds their effects to it.
pub(super) const EXCLUSIVE_JOBS: [&str; 3] = ["chaos-durable", "chaos-buffer", "chaos-cancel"];
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
    /// Give the workload's command tasks concurrency keys, spread over N
    /// keys (`chaos-c1` … `chaos-cN`, 1 to 64).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    keys: Option<u32>,
    /// Run the workers with a per-key cap (the run's `[[queue]]
    /// per_key_max_running`): at most C tasks of one key running at once,
    /// checked as T5. Needs --keys.
    #[arg(long, value_name = "C", requires = "keys", value_parser = clap::value_parser!(u32).range(1..))]
    per_key_max_running: Option<u32>,
    /// Run the workers with a rate limit on the workload's queue (the
    /// run's `[[queue]] rate`, e.g. `5/1s`): at most N task starts in any
    /// window of PERIOD of the store's clock, checked as T6.
    #[arg(long, value_name = "N/PERIOD", value_parser = rate_arg)]
    rate: Option<baton::queue::RateLimit>,
    /// Run the workers with a rate per concurrency key (the run's
    /// `[[queue]] per_key_rate`, e.g. `2/1s`): at most N starts of one key
    /// in any window of PERIOD of the store's clock, checked as T8. Needs
    /// --keys.
    #[arg(long, value_name = "N/PERIOD", requires = "keys", value_parser = per_key_rate_arg)]
    per_key_rate: Option<baton::queue::RateLimit>,
    /// Turn off fencing and compare-and-set in the workload (the register
    /// takes any token, lock loops skip the lock, tasks and jobs run twice,
    /// keys are not unique, and the workers run without the
    /// --per-key-max-running cap, --rate limit and --per-key-rate the checker still holds
    /// them to): the checker must report violations.
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

/// Parse `--rate`: `N/PERIOD`, the workload queue's own limit.
fn rate_arg(s: &str) -> Result<baton::queue::RateLimit, String> {
    baton::queue::RateLimit::parse("--rate", s).map_err(|e| e.problem)
}

/// Parse `--per-key-rate`: `N/PERIOD`.
fn per_key_rate_arg(s: &str) -> Result<baton::queue::RateLimit, String> {
    baton::queue::RateLimit::parse("--per-key-rate", s).map_err(|e| e.problem)
}

#[derive(clap::Subcommand, Debug)]
enum Internal {
    /// The workload's effect recorder (run by the generated commands).
    #[command(name = "__effect", hide = true)]
    Effect(history::EffectArgs),
    /// A run's instance: `baton ARGS` with the verifier's stop hook
    /// installed (what `baton chaos` starts its instances as).
    #[command(name = INSTANCE, hide = true)]
    Instance {
        /// The instance's own `baton` arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 1..)]
        args: Vec<String>,
    },
}

/// The hidden subcommand `baton chaos` starts its instances with.
const INSTANCE: &str = "__instance";

impl ChaosArgs {
    /// For `baton chaos __instance ARGS`: install the verifier's stop hook
    /// in this process and give back ARGS, the `baton` command it runs.
    /// `None` for every other `baton chaos`.
    pub fn become_instance(&self) -> Option<Vec<String>> {
        let Some(Internal::Instance { args }) = &self.internal else {
            return None;
        };
        history::install_stop_hook();
        Some(args.clone())
    }
}

/// `baton chaos`.
pub async fn chaos(a: ChaosArgs) -> anyhow::Result<u8> {
    match a.internal {
        Some(Internal::Effect(e)) => return history::effect(e).await,
        Some(Internal::Instance { .. }) => {
            anyhow::bail!("chaos {INSTANCE}: handled in main, before the command runs")
        }
        None => {}
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
    let limits = check::Limits {
        queue: QUEUE.to_string(),
        per_key_max_running: a.per_key_max_running,
        rate: a.rate,
        per_key_rate: a.per_key_rate,
        exclusive_jobs: EXCLUSIVE_JOBS.iter().map(|j| j.to_string()).collect(),
    };
    let mut shape = String::new();
    if let Some(k) = a.keys {
        shape += &format!(", {k} concurrency keys");
    }
    if let Some(c) = a.per_key_max_running {
        shape += &format!(", at most {c} running per key");
    }
    if let Some(r) = a.rate {
        shape += &format!(", rate {r}");
    }
    if let Some(r) = a.per_key_rate {
        shape += &format!(", rate {r} per key");
    }
    crate::outln!(
        "baton chaos: {kind} store{}, prefix {prefix}, seed {}, {} of faults ({}), {} workers, {} schedulers{shape}{}; history in {}",
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
    std::fs::write(&config, config_text(&run, &limits)).context("writing the run's config")?;
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
        let keys = a.keys.unwrap_or(0);
        loops.spawn(async move { produce(run, store, keys, seed, stop).await });
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
    let report = check::check(&hist, &tasks, &limits);
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

/// The generated config: the workload's queue (with the run's per-key cap
/// and rate limit, unless `--unsafe`), 1-second durable jobs — one of
/// short runs (overlap `skip`), two whose runs outlast the interval
/// (`buffer_one`, `cancel_other`: S2) — and a lock-mode job, all
/// recording effects. [`EXCLUSIVE_JOBS`] names the jobs whose runs must
/// never overlap.
fn config_text(run: &Run, limits: &check::Limits) -> String {
    let q = |s: String| serde_json::Value::String(s).to_string();
    let mut caps = String::new();
    if !run.unsafe_ {
        if let Some(c) = limits.per_key_max_running {
            caps += &format!("per_key_max_running = {c}\n");
        }
        if let Some(r) = limits.rate {
            caps += &format!("rate = {}\n", q(r.to_string()));
        }
        if let Some(r) = limits.per_key_rate {
            caps += &format!("per_key_rate = {}\n", q(r.to_string()));
        }
    }
    format!(
        r#"[[queue]]
name = "{QUEUE}"
concurrency = 2
lease = "3s"
{caps}
[[job]]
name = "chaos-durable"
every = "1s"
mode = "durable"
queue = "{QUEUE}"
max_attempts = 5
command = ["sh", "-c", {durable}]

[[job]]
name = "chaos-buffer"
every = "1s"
mode = "durable"
queue = "{QUEUE}"
overlap = "{buffer_policy}"
max_attempts = 5
command = ["sh", "-c", {buffer}]

[[job]]
name = "chaos-cancel"
every = "1s"
mode = "durable"
queue = "{QUEUE}"
overlap = "{cancel_policy}"
max_attempts = 5
command = ["sh", "-c", {cancel}]

[[job]]
name = "chaos-lockjob"
every = "2s"
mode = "lock"
at_most = "3s"
command = ["sh", "-c", {lockjob}]
"#,
        durable = q(run.wrapper("job", "chaos-durable", 300)),
        lockjob = q(run.wrapper("lockjob", "chaos-lockjob", 300)),
        // Runs longer than the interval: the next slot waits for the
        // running one (buffer_one) or stops it first (cancel_other).
        buffer = q(run.wrapper("job", "chaos-buffer", 1500)),
        cancel = q(run.wrapper("job", "chaos-cancel", 1500)),
        // `--unsafe` lets the runs overlap; the checker still holds them
        // to S2.
        buffer_policy = if run.unsafe_ { "allow" } else { "buffer_one" },
        cancel_policy = if run.unsafe_ { "allow" } else { "cancel_other" },
    )
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
