//! `baton enqueue`, `baton work` and `baton tasks …`.

use std::time::Duration;

use anyhow::Context;
use baton::queue::{Queue, TaskBuilder, Worker};
use baton::store::{CancelOutcome, TaskFilter, TaskInfo, TaskState};
use baton::Error;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::runtime::{handle_commands, shutdown_on_signals, worker_config};
use crate::{command_task, connect, duration_arg, rfc3339_arg, StoreArg};

/// Arguments of `baton enqueue`.
#[derive(clap::Args, Debug)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Queue name.
    #[arg(long, default_value = baton::queue::DEFAULT_QUEUE)]
    pub queue: String,
    /// Idempotency key: the same key returns the same task while it is unfinished.
    #[arg(long)]
    pub key: Option<String>,
    /// Keep the key taken after the task finished (until pruned).
    #[arg(long, requires = "key")]
    pub key_forever: bool,
    /// Priority from -100 to 100; lower runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    /// Run no sooner than this long from now.
    #[arg(long, value_parser = duration_arg, conflicts_with = "at")]
    pub delay: Option<Duration>,
    /// Run no sooner than this instant (RFC 3339).
    #[arg(long, value_parser = rfc3339_arg)]
    pub at: Option<DateTime<Utc>>,
    /// Attempts in total.
    #[arg(long, default_value_t = baton::queue::DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,
    /// Timeout per attempt.
    #[arg(long, value_parser = duration_arg)]
    pub timeout: Option<Duration>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `baton enqueue`.
pub async fn enqueue(a: EnqueueArgs) -> anyhow::Result<u8> {
    let mut t = TaskBuilder::new(command_task::KIND, command_task::payload(&a.command))
        .queue(&a.queue)
        .priority(a.priority)
        .max_attempts(a.max_attempts);
    if let Some(k) = &a.key {
        t = t.unique_key(k).unique_forever(a.key_forever);
    }
    if let Some(d) = a.delay {
        t = t.delay(d);
    }
    if let Some(at) = a.at {
        t = t.run_at(at);
    }
    if let Some(d) = a.timeout {
        t = t.timeout(d);
    }
    // Validate before connecting, so bad input never touches the store.
    t.clone().build().map_err(Error::from)?;
    let store = connect(&a.store).await.context("connecting to the store")?;
    let e = Queue::new(store).enqueue(t).await?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"id": e.id, "inserted": e.inserted})
        );
    } else {
        println!("{}", e.id);
    }
    Ok(0)
}

/// Arguments of `baton work`.
#[derive(clap::Args, Debug)]
pub struct WorkArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Queues to work on (repeatable).
    #[arg(long = "queue", default_value = baton::queue::DEFAULT_QUEUE)]
    pub queues: Vec<String>,
    /// Commands run at once, per queue.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Cluster-wide cap per queue: at most N of its tasks run at once
    /// across every `baton work`/`serve` that passes it (default: no cap).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running: Option<u32>,
    /// Lease per attempt; heartbeats renew it every third of it.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    pub lease: Duration,
    /// On SIGTERM, how long running commands may finish before they are
    /// stopped and their tasks handed back.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub shutdown_grace: Duration,
    /// After SIGTERM to a command, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    pub grace: Duration,
    /// Idle poll period.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    pub poll: Duration,
    /// A `baton serve` config file: also run its durable jobs' tasks (for
    /// workers that run apart from the schedulers).
    #[arg(long, env = "BATON_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Admin HTTP address (`/health`, `/jobs`, `/stats`, `/metrics` for
    /// Prometheus), e.g. 127.0.0.1:9090.
    #[arg(long)]
    pub listen: Option<String>,
}

/// `baton work`.
pub async fn work(a: WorkArgs) -> anyhow::Result<u8> {
    let queues: Vec<(String, usize)> = a
        .queues
        .iter()
        .map(|q| (q.clone(), a.concurrency))
        .collect();
    let store = connect(&a.store).await.context("connecting to the store")?;
    for w in store.backend().warnings().await.unwrap_or_default() {
        eprintln!("baton: warning: {w}");
    }
    let config = match &a.config {
        Some(path) => Some(
            crate::config::Config::from_file(path)
                .map_err(|e| Error::Invalid(baton::InvalidInput::new("--config", e.to_string())))?,
        ),
        None => None,
    };
    let mut cfg = worker_config(&queues, a.lease, a.poll, a.shutdown_grace, a.grace);
    // Caps: --max-running for every queue served, else the config's.
    for q in &a.queues {
        let from_config = config
            .iter()
            .flat_map(|c| &c.queues)
            .find(|c| &c.name == q)
            .and_then(|c| c.max_running);
        if let Some(m) = a.max_running.or(from_config) {
            cfg = cfg.max_running(q.clone(), m);
        }
    }
    let mut w = Worker::new(store.clone(), cfg);
    handle_commands(&mut w, a.grace);
    for j in config
        .iter()
        .flat_map(|c| &c.jobs)
        .filter(|j| j.mode == crate::config::Mode::Durable)
    {
        w.handle(
            j.name.clone(),
            crate::runtime::durable_handler(j.clone(), a.grace),
        );
    }
    if let Some(addr) = &a.listen {
        crate::runtime::spawn_admin(addr, &store, vec![w.counters()]).await?;
    }
    let token = CancellationToken::new();
    let signals = shutdown_on_signals(token.clone())?;
    eprintln!("baton: worker {} on {:?}", w.id(), a.queues);
    w.run_with(token, signals.urgent.clone()).await?;
    Ok(signals.exit_code().unwrap_or(0))
}

/// `baton tasks …`.
#[derive(clap::Subcommand, Debug)]
pub enum TasksCmd {
    /// List tasks, newest first.
    List {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        queue: Option<String>,
        /// pending, running, succeeded, failed or cancelled.
        #[arg(long, value_parser = state_arg)]
        state: Option<TaskState>,
        #[arg(long)]
        job: Option<String>,
        /// Only tasks with ids below this (the previous page's last id).
        #[arg(long)]
        before: Option<i64>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// Show one task with its attempt history.
    Show {
        #[command(flatten)]
        store: StoreArg,
        id: i64,
        #[arg(long)]
        json: bool,
    },
    /// Put a failed or cancelled task back to pending.
    Retry {
        #[command(flatten)]
        store: StoreArg,
        id: i64,
    },
    /// Cancel a task (a running one stops at its next heartbeat).
    Cancel {
        #[command(flatten)]
        store: StoreArg,
        id: i64,
    },
    /// Counts per queue and state.
    Stats {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long)]
        json: bool,
    },
    /// Delete finished tasks older than the retention.
    Prune {
        #[command(flatten)]
        store: StoreArg,
        #[arg(long, default_value = "7d", value_parser = duration_arg)]
        older_than: Duration,
    },
}

fn state_arg(s: &str) -> Result<TaskState, String> {
    s.parse()
        .map_err(|_| format!("{s:?}: use pending, running, succeeded, failed or cancelled"))
}

fn print_task_line(t: &TaskInfo) {
    let what = match t.payload.get("argv") {
        Some(argv) => argv.to_string(),
        None => t.kind.clone(),
    };
    println!(
        "{:>8}  {:<10} {:<12} {:>3}/{:<3} {:<25} {}",
        t.id,
        t.state,
        t.queue,
        t.attempt,
        t.max_attempts,
        t.run_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        what
    );
}

fn show_task(t: &TaskInfo) {
    let ts = |d: Option<DateTime<Utc>>| d.map(|d| d.to_rfc3339()).unwrap_or_else(|| "-".into());
    println!(
        "task {} ({}) on queue {:?}, kind {:?}",
        t.id, t.state, t.queue, t.kind
    );
    println!("  payload:    {}", t.payload);
    println!("  attempt:    {} of {}", t.attempt, t.max_attempts);
    println!("  priority:   {}", t.priority);
    println!("  created:    {}", t.created_at.to_rfc3339());
    println!("  run at:     {}", t.run_at.to_rfc3339());
    println!("  started:    {}", ts(t.started_at));
    println!("  finished:   {}", ts(t.finished_at));
    println!("  lease until: {}", ts(t.lease_until));
    if let Some(w) = &t.worker {
        println!("  worker:     {w}");
    }
    if let Some(k) = &t.unique_key {
        println!("  key:        {k}");
    }
    if let (Some(j), Some(s)) = (&t.job, t.slot) {
        println!("  job slot:   {j} @ {}", s.to_rfc3339());
    }
    if let Some(p) = &t.progress {
        println!("  progress:   {p}");
    }
    for e in &t.errors {
        println!(
            "  attempt {} failed at {}: {}",
            e.attempt,
            e.at.to_rfc3339(),
            e.error
        );
    }
}

/// Run a `baton tasks` subcommand.
pub async fn tasks(cmd: TasksCmd) -> anyhow::Result<u8> {
    match cmd {
        TasksCmd::List {
            store,
            queue,
            state,
            job,
            before,
            limit,
            json,
        } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let list = q
                .tasks(&TaskFilter {
                    queue,
                    state,
                    job,
                    before_id: before,
                    limit,
                })
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!(
                    "{:>8}  {:<10} {:<12} {:>7} {:<25} COMMAND/KIND",
                    "ID", "STATE", "QUEUE", "ATTEMPT", "RUN_AT"
                );
                list.iter().for_each(print_task_line);
            }
            Ok(0)
        }
        TasksCmd::Show { store, id, json } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let Some(t) = q.task(id).await? else {
                eprintln!("baton: no task {id}");
                return Ok(1);
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                show_task(&t);
            }
            Ok(0)
        }
        TasksCmd::Retry { store, id } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            if q.retry(id).await? {
                println!("task {id} is pending again");
                Ok(0)
            } else {
                eprintln!("baton: task {id} is not failed or cancelled (or does not exist)");
                Ok(1)
            }
        }
        TasksCmd::Cancel { store, id } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            match q.cancel(id).await? {
                CancelOutcome::Cancelled => println!("task {id} cancelled"),
                CancelOutcome::Requested => {
                    println!("task {id} is running; its worker stops it at the next heartbeat")
                }
                CancelOutcome::AlreadyFinished(s) => {
                    eprintln!("baton: task {id} already finished ({s})");
                    return Ok(1);
                }
                CancelOutcome::NotFound => {
                    eprintln!("baton: no task {id}");
                    return Ok(1);
                }
            }
            Ok(0)
        }
        TasksCmd::Stats { store, json } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let stats = q.stats().await?;
            if json {
                let obj: serde_json::Map<String, serde_json::Value> = stats
                    .iter()
                    .map(|s| (s.queue.clone(), serde_json::to_value(s).unwrap_or_default()))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&obj)?);
            } else {
                println!(
                    "{:<16} {:>9} {:>9} {:>10} {:>9} {:>10} {:>12}",
                    "QUEUE", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "OLDEST_DUE"
                );
                for s in stats {
                    let age = s
                        .oldest_pending_ms
                        .map(|ms| baton::format_duration(Duration::from_millis(ms)))
                        .unwrap_or_else(|| "-".into());
                    println!(
                        "{:<16} {:>9} {:>9} {:>10} {:>9} {:>10} {:>12}",
                        s.queue, s.pending, s.running, s.succeeded, s.failed, s.cancelled, age
                    );
                }
            }
            Ok(0)
        }
        TasksCmd::Prune { store, older_than } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let n = q.prune(older_than).await?;
            println!(
                "pruned {n} finished tasks older than {}",
                baton::format_duration(older_than)
            );
            Ok(0)
        }
    }
}
